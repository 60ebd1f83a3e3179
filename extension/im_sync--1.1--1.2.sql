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
