-- A member's message is written by the direct path
-- (direct_append.c): its key index is scanned once, by the direct probe
-- (the general path scans it twice: the idempotency lookup before the lock
-- and ON CONFLICT's arbiter check), and its rows equal, column for column,
-- the ones the general path writes; a body it stores out of line (TOAST)
-- reads back whole.  A table the direct path does not serve (an INSERT
-- trigger, a column it cannot fill or one of another type) sends through
-- the general path, which obeys it; so does an owner short of a column
-- privilege the general path's statements need (a grant on another column
-- does not stand in for it).  A request's trace id (contract §21) is kept
-- on the event and its outbox item by both paths alike.
CREATE DATABASE im_h1_send_direct;
\c im_h1_send_direct
SET client_min_messages = warning;
CREATE EXTENSION btree_gist;
CREATE EXTENSION im_sync;
RESET client_min_messages;
\i sql/include/try_sql.sql
SELECT im.create_conversation('group', ARRAY[1, 2]::bigint[]);   -- 1
-- One send's writes: pg_stat_xact_* counts what this backend has not
-- flushed yet, so each block starts with a flush (at the next idle).
CREATE VIEW send_writes AS
  SELECT relname, n_tup_ins, n_tup_upd,
         CASE relname WHEN 'event'
           THEN pg_catalog.pg_stat_get_xact_numscans('im.event_sender_id_client_msg_id_key'::regclass)
         END AS key_index_scans
    FROM pg_catalog.pg_stat_xact_user_tables
   WHERE schemaname = 'im' AND relname IN ('conversation', 'event', 'outbox') ORDER BY relname;
-- Every column of an event and its outbox item but ids and the key.
CREATE VIEW written AS
  SELECT e.client_msg_id, e.conversation_id, e.msg_seq, e.kind, e.sender_id, e.content_type, e.body,
         e.target_message_id, e.subject_user_id, e.mode, e.recalled, e.reply_to_message_id,
         e.pin_message_id, pg_catalog.length(e.request_digest) AS digest_bytes,
         e.created_at = o.created_at AS same_created, o.conversation_id = e.conversation_id AS o_conv,
         o.msg_seq = e.msg_seq AS o_seq, o.private_user_id, o.state, o.attempts,
         o.transient_failures, o.last_error, o.next_attempt_at = o.created_at AS o_due, o.processed_at,
         e.trace_id AS e_trace, o.trace_id AS o_trace
    FROM im.event e JOIN im.outbox o ON o.source_event_id = e.message_id
   WHERE e.kind = 'message' ORDER BY e.msg_seq;

-- the direct path: one head update, one key probe
SELECT pg_catalog.pg_stat_force_next_flush();
BEGIN;
SELECT * FROM im.send_message(1, 1, 'direct-1', '{"text": "direct"}', 'text', NULL, 'tr-direct_1');
SELECT * FROM send_writes;
COMMIT;

-- an INSERT trigger on im.event: the general path, which fires it
CREATE TABLE fired (message_id bigint);
CREATE FUNCTION note_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO public.fired VALUES (NEW.message_id); RETURN NEW; END $$;
CREATE TRIGGER note_event AFTER INSERT ON im.event FOR EACH ROW EXECUTE FUNCTION note_event();
SELECT pg_catalog.pg_stat_force_next_flush();
BEGIN;
SELECT * FROM im.send_message(1, 1, 'general-1', '{"text": "general"}', trace_id => 'tr-general_1');
SELECT * FROM send_writes;
COMMIT;
SELECT f.message_id = e.message_id AS fired_for_it FROM fired f, im.event e WHERE e.client_msg_id = 'general-1';
DROP TRIGGER note_event ON im.event;

-- both paths wrote the same row and item
SELECT * FROM written;

-- the trigger gone, the direct path again
SELECT pg_catalog.pg_stat_force_next_flush();
BEGIN;
SELECT * FROM im.send_message(2, 1, 'direct-2', '{"text": "again"}');
SELECT * FROM send_writes;
COMMIT;

-- a column the direct path does not know, with a default: the general path
-- writes it
SELECT pg_catalog.pg_stat_force_next_flush();
BEGIN;
ALTER TABLE im.event ADD COLUMN local_note text DEFAULT 'from the default';
SELECT msg_seq, created FROM im.send_message(2, 1, 'general-2', '{"text": "new column"}');
SELECT key_index_scans FROM send_writes WHERE relname = 'event';
SELECT local_note FROM im.event WHERE client_msg_id = 'general-2';
ROLLBACK;

-- a body stored out of line (TOAST) by the direct insert reads back whole
SELECT msg_seq, created FROM im.send_message(1, 1, 'direct-big',
  jsonb_build_object('t', (SELECT string_agg(md5(g::text), '') FROM generate_series(1, 300) g)));
SELECT pg_catalog.length(body->>'t') AS chars,
       body->>'t' = (SELECT string_agg(md5(g::text), '') FROM generate_series(1, 300) g) AS same
  FROM im.event WHERE client_msg_id = 'direct-big';
-- (no other body here is that large, so the TOAST table holds this one)
SELECT pg_catalog.pg_relation_size(c.reltoastrelid) > 0 AS stored_out_of_line
  FROM pg_catalog.pg_class c WHERE c.oid = 'im.event'::regclass;

-- a column of another type of the same length and by-value flag (body as
-- json instead of jsonb): the general path, whose INSERT coerces the body
-- (the direct insert would store jsonb's bytes as json)
SELECT pg_catalog.pg_stat_force_next_flush();
BEGIN;
DROP VIEW written;   -- it reads the column; back at ROLLBACK
ALTER TABLE im.event ALTER COLUMN body TYPE json USING body::json;
SELECT msg_seq, created FROM im.send_message(2, 1, 'general-json', '{"text": "json column"}');
SELECT body::text FROM im.event WHERE client_msg_id = 'general-json';
ROLLBACK;

-- column privileges count as the general path's statements need them.  The
-- extension handed to a NOLOGIN role (contract §12) that holds on im.event,
-- im.outbox and im.membership_period only the columns those statements read
-- and name in their INSERTs: the direct path writes.  One of those columns
-- short, while a grant on another column of the same table remains: the
-- general path runs, and its statement is refused (42501), nothing written.
SELECT pg_catalog.pg_stat_force_next_flush();
BEGIN;
CREATE ROLE im_h25_owner NOLOGIN;
SELECT im.set_extension_owner('im_h25_owner') > 0 AS handed_over;
REVOKE ALL ON im.event, im.outbox, im.membership_period FROM im_h25_owner;
GRANT SELECT (message_id, conversation_id, msg_seq, kind, sender_id, client_msg_id, request_digest),
      INSERT (message_id, conversation_id, msg_seq, kind, sender_id, client_msg_id, request_digest,
              content_type, body, target_message_id, subject_user_id, mode)
   ON im.event TO im_h25_owner;
GRANT INSERT (conversation_id, msg_seq, source_event_id) ON im.outbox TO im_h25_owner;
GRANT SELECT (conversation_id, user_id, leave_seq, muted_until) ON im.membership_period TO im_h25_owner;
SELECT msg_seq, created FROM im.send_message(1, 1, 'direct-columns', '{"text": "column grants"}');
SELECT key_index_scans FROM send_writes WHERE relname = 'event';
-- im.outbox: INSERT on conversation_id and msg_seq, not source_event_id
REVOKE INSERT (source_event_id) ON im.outbox FROM im_h25_owner;
SELECT try_sql($$SELECT * FROM im.send_message(1, 1, 'no-outbox-column', '{"text": "x"}')$$);
GRANT INSERT (source_event_id) ON im.outbox TO im_h25_owner;
-- im.event: SELECT on every column the key lookup reads but kind
REVOKE SELECT (kind) ON im.event FROM im_h25_owner;
SELECT try_sql($$SELECT * FROM im.send_message(1, 1, 'no-event-column', '{"text": "x"}')$$);
GRANT SELECT (kind) ON im.event TO im_h25_owner;
-- im.membership_period: SELECT on user_id and leave_seq, not conversation_id
REVOKE SELECT (conversation_id) ON im.membership_period FROM im_h25_owner;
SELECT try_sql($$SELECT * FROM im.send_message(1, 1, 'no-period-column', '{"text": "x"}')$$);
GRANT SELECT (conversation_id) ON im.membership_period TO im_h25_owner;
SELECT client_msg_id FROM im.event WHERE client_msg_id IN
  ('direct-columns', 'no-outbox-column', 'no-event-column', 'no-period-column');
ROLLBACK;

-- a traced send needs INSERT on both trace_id columns, as the general
-- path's traced statement names them: with them the direct path writes
-- (one key probe); without the outbox's, the general path runs and is
-- refused (42501), nothing written
SELECT pg_catalog.pg_stat_force_next_flush();
BEGIN;
CREATE ROLE im_h27_owner NOLOGIN;
SELECT im.set_extension_owner('im_h27_owner') > 0 AS handed_over;
REVOKE ALL ON im.event, im.outbox, im.membership_period FROM im_h27_owner;
GRANT SELECT (message_id, conversation_id, msg_seq, kind, sender_id, client_msg_id, request_digest),
      INSERT (message_id, conversation_id, msg_seq, kind, sender_id, client_msg_id, request_digest,
              content_type, body, target_message_id, subject_user_id, mode, trace_id)
   ON im.event TO im_h27_owner;
GRANT INSERT (conversation_id, msg_seq, source_event_id, trace_id) ON im.outbox TO im_h27_owner;
GRANT SELECT (conversation_id, user_id, leave_seq, muted_until) ON im.membership_period TO im_h27_owner;
SELECT msg_seq, created FROM im.send_message(1, 1, 'traced-columns', '{"text": "y"}', 'text', NULL, 't2');
SELECT key_index_scans FROM send_writes WHERE relname = 'event';
REVOKE INSERT (trace_id) ON im.outbox FROM im_h27_owner;
SELECT try_sql($$SELECT * FROM im.send_message(1, 1, 'traced-no-column', '{"text": "x"}', 'text', NULL, 't1')$$);
SELECT client_msg_id, trace_id FROM im.event WHERE client_msg_id IN ('traced-no-column', 'traced-columns');
ROLLBACK;

-- the direct path's refusals write nothing: a non-member (42501), a retry
-- (the original), a key reused for another request (IS409), a trace id
-- that is not 1-64 of [A-Za-z0-9_-] (22023)
SELECT try_sql($$SELECT * FROM im.send_message(3, 1, 'x-1', '{"text": "not a member"}')$$);
SELECT try_sql($$SELECT * FROM im.send_message(1, 1, 'x-2', '{"text": "bad trace"}', 'text', NULL, 'a b')$$);
SELECT try_sql($$SELECT * FROM im.send_message(1, 1, 'x-3', '{"text": "bad trace"}', 'text', NULL, '')$$);
SELECT try_sql(format($$SELECT * FROM im.send_message(1, 1, 'x-4', '{"text": "bad trace"}', 'text', NULL, '%s')$$, repeat('a', 65)));
SELECT msg_seq, created FROM im.send_message(1, 1, 'x-5', '{"text": "longest trace"}', 'text', NULL, repeat('Az09_-', 10) || 'abcd');
SELECT pg_catalog.length(trace_id) AS longest FROM im.event WHERE client_msg_id = 'x-5';
SELECT msg_seq, created FROM im.send_message(1, 1, 'direct-1', '{"text": "direct"}');
SELECT try_sql($$SELECT * FROM im.send_message(1, 1, 'direct-1', '{"text": "other"}')$$);
SELECT head_msg_seq FROM im.conversation WHERE conversation_id = 1;
SELECT count(*) AS events, (SELECT count(*) FROM im.outbox) AS items FROM im.event;

\c im_regress
DROP DATABASE im_h1_send_direct;
