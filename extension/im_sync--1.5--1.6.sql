\echo Use "ALTER EXTENSION im_sync UPDATE TO '1.6'" to load this file. \quit

/*
 * ---- 1.5 -> 1.6.  The blocks below are appended verbatim, without this
 * file's \echo line, to the 1.5 full script to make im_sync--1.6.sql, so the
 * two reach the same catalog (test/suites/70-upgrade.sh compares them).
 */

-- ---- 1.5 -> 1.6 (issue 10): one CHECK per send-path table, its rule in C
-- PostgreSQL reads each table CHECK from its stored node text and plans it
-- again at every INSERT or UPDATE statement (ExecRelCheck): the event's three
-- CHECKs (4.5 kB of node text) at every send, the conversation's at every
-- head UPDATE.  Each becomes one CHECK calling an immutable C function with
-- the columns as arguments (row_rules.c: the same rules, NULL passes as
-- before).  Adding a constraint validates the existing rows (one scan of
-- each table under its ACCESS EXCLUSIVE lock).  The functions run no SQL, so
-- they are not SECURITY DEFINER (a pinned search_path would cost a GUC
-- save and restore per row); PUBLIC cannot execute them.
CREATE FUNCTION im.event_fields_valid(kind text, sender bigint, idempotency_key text,
                                      target bigint, reply_to bigint, pin bigint) RETURNS boolean
AS 'MODULE_PATHNAME', 'im_event_fields_valid' LANGUAGE C IMMUTABLE PARALLEL SAFE;
CREATE FUNCTION im.conversation_pair_valid(kind text, lo bigint, hi bigint)
RETURNS boolean
AS 'MODULE_PATHNAME', 'im_conversation_pair_valid' LANGUAGE C IMMUTABLE PARALLEL SAFE;
REVOKE ALL ON FUNCTION im.event_fields_valid(text, bigint, text, bigint, bigint, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION im.conversation_pair_valid(text, bigint, bigint) FROM PUBLIC;
COMMENT ON FUNCTION im.event_fields_valid(text, bigint, text, bigint, bigint, bigint) IS 'CHECK event_kind_fields: which kinds carry an idempotency key, a target, a reply or pin target (contract §3, §14)';
COMMENT ON FUNCTION im.conversation_pair_valid(text, bigint, bigint) IS 'CHECK conversation_direct_pair: a direct conversation names its ordered pair, a group none (contract §1)';
ALTER TABLE im.event
    DROP CONSTRAINT event_kind_fields,
    DROP CONSTRAINT event_reply_to_check,
    DROP CONSTRAINT event_pin_check,
    ADD CONSTRAINT event_kind_fields CHECK (im.event_fields_valid(kind, sender_id, client_msg_id,
        target_message_id, reply_to_message_id, pin_message_id));
ALTER TABLE im.conversation
    DROP CONSTRAINT conversation_direct_pair,
    ADD CONSTRAINT conversation_direct_pair CHECK (im.conversation_pair_valid(kind, direct_user_lo,
        direct_user_hi));

-- ---- 1.5 -> 1.6 (issue 10): no foreign key on im.event.target_message_id
-- Its check was an AFTER trigger queued and fired for every event insert
-- (every send), and on a recall, edit or reaction a FOR KEY SHARE lock of
-- the target (a WAL record and a dirtied page).  The target is checked
-- under the conversation lock by the function that writes the event
-- (send.c check_target, relation.c), events are never deleted, and
-- im.reconcile() reports a missing or foreign target (relation_target_mismatch),
-- as for reply and pin targets since 1.3.
ALTER TABLE im.event DROP CONSTRAINT event_target_message_id_fkey;
