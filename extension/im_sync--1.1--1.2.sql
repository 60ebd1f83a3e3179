\echo Use "ALTER EXTENSION im_sync UPDATE TO '1.2'" to load this file. \quit

/*
 * im_sync 1.1 -> 1.2: exactly what changed in the catalog (issue 10).
 * im_sync--1.2.sql is the full script of the same catalog; the upgrade
 * suite (test/suites/70-upgrade.sh) checks that both give one catalog.
 *
 * im.event loses its foreign key to im.conversation: its check (a
 * KEY SHARE lock on the conversation row, a WAL record, and a query per
 * send) guarded what the send path already holds.  An event is only
 * written by append.c in the statement after the one that updated (and so
 * locked) its conversation row, and conversation rows are never deleted
 * (membership_period, private_event and user_conversation still reference
 * them, and every conversation has periods).  im.reconcile() reports an
 * event without its conversation as event_without_conversation.
 * No data changes: outbox items, pending or done, stay as they are.
 */
ALTER TABLE im.event DROP CONSTRAINT event_conversation_id_fkey;

/*
 * Single-column value rules become domains, the cross-column rules of a
 * table one CHECK constraint (im_sync--1.2.sql says why: a table CHECK is
 * planned again at every INSERT/UPDATE, a domain's check is compiled once
 * in the type cache and applied to assigned columns only).  The rules are
 * the same; existing rows satisfy them (the old constraints held), and
 * PostgreSQL verifies it: changing a column to a domain with a check
 * rewrites the table (im.event, im.outbox and im.conversation are each
 * rewritten once here, under an ACCESS EXCLUSIVE lock), and the merged
 * constraints are validated on ADD.  Defaults are set again so they read
 * as in a fresh install.
 */
CREATE DOMAIN im.conversation_kind AS text CHECK (VALUE IN ('direct', 'group'));
CREATE DOMAIN im.conversation_mode AS text CHECK (VALUE IN ('fanout', 'shared_log'));
CREATE DOMAIN im.head_seq AS bigint CHECK (VALUE >= 0);
CREATE DOMAIN im.event_kind AS text
    CHECK (VALUE IN ('message', 'create', 'join', 'leave', 'recall', 'edit', 'mode'));
CREATE DOMAIN im.event_seq AS bigint CHECK (VALUE >= 1);
CREATE DOMAIN im.outbox_state AS text CHECK (VALUE IN ('pending', 'done', 'dead'));

ALTER TABLE im.conversation
    DROP CONSTRAINT conversation_kind_check,
    DROP CONSTRAINT conversation_mode_check,
    DROP CONSTRAINT conversation_head_msg_seq_check,
    DROP CONSTRAINT conversation_check,
    DROP CONSTRAINT conversation_check1,
    ALTER COLUMN kind TYPE im.conversation_kind,
    ALTER COLUMN mode TYPE im.conversation_mode,
    ALTER COLUMN mode SET DEFAULT 'fanout',
    ALTER COLUMN head_msg_seq TYPE im.head_seq,
    ALTER COLUMN head_msg_seq SET DEFAULT 0;
ALTER TABLE im.conversation
    ADD CONSTRAINT conversation_direct_pair CHECK (
        ((kind = 'direct') = (direct_user_lo IS NOT NULL AND direct_user_hi IS NOT NULL))
        AND direct_user_lo < direct_user_hi);

ALTER TABLE im.event
    DROP CONSTRAINT event_msg_seq_check,
    DROP CONSTRAINT event_kind_check,
    DROP CONSTRAINT event_check,
    DROP CONSTRAINT event_check1,
    ALTER COLUMN msg_seq TYPE im.event_seq,
    ALTER COLUMN kind TYPE im.event_kind;
ALTER TABLE im.event
    ADD CONSTRAINT event_kind_fields CHECK (
        ((client_msg_id IS NULL) = (sender_id IS NULL OR kind IN ('create', 'join', 'leave', 'mode')))
        AND ((target_message_id IS NOT NULL) = (kind IN ('recall', 'edit'))));

ALTER TABLE im.outbox
    DROP CONSTRAINT outbox_state_check,
    ALTER COLUMN state TYPE im.outbox_state,
    ALTER COLUMN state SET DEFAULT 'pending';

COMMENT ON DOMAIN im.conversation_kind IS 'Kind of a conversation: direct (two members, ordered pair) or group (contract §1)';
COMMENT ON DOMAIN im.conversation_mode IS 'Delivery mode of a conversation: fanout to inboxes or shared_log (contract §4)';
COMMENT ON DOMAIN im.head_seq IS 'A conversation''s head position, 0 before its first event (contract §1)';
COMMENT ON DOMAIN im.event_kind IS 'Kind of a conversation position: message or control event (contract §1, §3)';
COMMENT ON DOMAIN im.event_seq IS 'A conversation position, from 1, gap-free (contract §1)';
COMMENT ON DOMAIN im.outbox_state IS 'State of an outbox item: pending, done or dead (contract §4)';
