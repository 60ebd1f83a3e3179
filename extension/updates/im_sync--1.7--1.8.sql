\echo Use "ALTER EXTENSION im_sync UPDATE TO '1.8'" to load this file. \quit

-- ---- 1.7 -> 1.8 (issue 10): no table CHECK is planned under the conversation lock
-- PostgreSQL reads a table's CHECKs from their node text and plans them at
-- the start of every INSERT or UPDATE statement (ExecRelCheck), and a send
-- runs two such statements while it holds its conversation's row lock: the
-- head UPDATE, which paid for conversation_direct_pair although it never
-- writes the columns that CHECK reads, and the outbox insert, which paid
-- for outbox_check (about 5 us each of the 190 us a send spends under the
-- lock on one client, and more when eight share two cores).
-- The pair rule becomes the AFTER trigger conversation_direct_pair on the
-- columns it reads: every insert and every UPDATE naming kind,
-- direct_user_lo or direct_user_hi runs it, a head UPDATE never does (an
-- AFTER trigger, because a BEFORE UPDATE row trigger locks the row first).
-- It answers with the CHECK's SQLSTATE (23514) and message, and is enabled
-- ALWAYS, so a replica session role cannot skip it any more than the CHECK.
-- The outbox's shape rule (a position item has its msg_seq, a private
-- event's item its user and no msg_seq) is kept by the three statements
-- that write the outbox (append.c, read_state.c, transfer_in.c) and checked
-- by im.reconcile() (outbox_item_malformed), as im.event's targets are
-- since 1.6.
CREATE FUNCTION im.conversation_pair_check() RETURNS trigger
AS 'MODULE_PATHNAME', 'im_conversation_pair_check' LANGUAGE C;
REVOKE ALL ON FUNCTION im.conversation_pair_check() FROM PUBLIC;
COMMENT ON FUNCTION im.conversation_pair_check() IS 'Trigger conversation_direct_pair: a direct conversation names its ordered pair, a group none (contract §1)';
ALTER TABLE im.conversation DROP CONSTRAINT conversation_direct_pair;
CREATE TRIGGER conversation_direct_pair
    AFTER INSERT OR UPDATE OF kind, direct_user_lo, direct_user_hi ON im.conversation
    FOR EACH ROW EXECUTE FUNCTION im.conversation_pair_check();
ALTER TABLE im.conversation ENABLE ALWAYS TRIGGER conversation_direct_pair;
ALTER TABLE im.outbox DROP CONSTRAINT outbox_check;
