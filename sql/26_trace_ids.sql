-- Trace ids (contract §21).  From a 1.9 catalog, ALTER EXTENSION UPDATE
-- replaces each of the eight writes by the same function with a trailing
-- `trace_id text DEFAULT NULL`: one function per name (older argument
-- lists still resolve, never 42725), its attributes, comment, owner and
-- grants carried over, the extension's initial privileges the fresh
-- install's.  A trace id is kept on the event and its outbox item (a
-- private event's on its outbox item); a retry answered with the original
-- keeps the original's and counts in im_idempotent_retries_total; a trace
-- id that is not 1-64 of [A-Za-z0-9_-] is 22023 and changes nothing.
CREATE DATABASE im_h27_trace;
\c im_h27_trace
SET client_min_messages = warning;
CREATE EXTENSION btree_gist;
CREATE EXTENSION im_sync VERSION '1.9';
RESET client_min_messages;
\i sql/include/try_sql.sql
CREATE ROLE im_h27_app;
GRANT USAGE ON SCHEMA im TO im_h27_app;
GRANT EXECUTE ON FUNCTION im.send_message(bigint, bigint, text, jsonb, text, bigint),
  im.recall_message(bigint, bigint, text, bigint), im.edit_message(bigint, bigint, text, bigint, jsonb),
  im.react(bigint, bigint, bigint, text, boolean, text), im.pin_message(bigint, bigint, bigint, boolean, text),
  im.report_read(bigint, bigint, bigint), im.clear_dirty(bigint, bigint, bigint, bigint),
  im.delete_for_me(bigint, bigint, bigint) TO im_h27_app;
SELECT im.create_conversation('group', ARRAY[1, 2]::bigint[], 1) AS c \gset
SELECT msg_seq, created FROM im.send_message(1, :c, 'before', '{"text": "sent on 1.9"}');

ALTER EXTENSION im_sync UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'im_sync';
SELECT p.proname, count(*) OVER (PARTITION BY p.proname) AS functions, p.pronargs,
       p.proargnames[p.pronargs] AS last_arg, p.proargtypes[p.pronargs - 1]::regtype AS last_type,
       pg_get_function_arg_default(p.oid, p.pronargs) AS last_default,
       p.prosecdef, p.proconfig, has_function_privilege('im_h27_app', p.oid, 'EXECUTE') AS app,
       p.proacl::text NOT LIKE '%{=X%' AND p.proacl::text NOT LIKE '%,=X%' AS public_has_none,
       (SELECT i.initprivs::text FROM pg_init_privs i WHERE i.objoid = p.oid) NOT LIKE '%im_h27_app%' AS initprivs_clean,
       obj_description(p.oid, 'pg_proc') IS NOT NULL AS commented
FROM pg_proc p
WHERE p.pronamespace = 'im'::regnamespace
  AND p.proname IN ('send_message', 'recall_message', 'edit_message', 'react', 'pin_message',
                    'report_read', 'clear_dirty', 'delete_for_me')
ORDER BY p.proname;

-- the writes with and without a trace id, as the granted role
SET ROLE im_h27_app;
SELECT message_id AS a FROM im.send_message(1, :c, 'a', '{"text": "traced"}', 'text', NULL, 't-send') \gset
SELECT message_id AS b FROM im.send_message(2, :c, 'b', '{"text": "untraced"}') \gset
SELECT created FROM im.send_message(2, :c, 'b-reply', '{"text": "reply"}', 'text', :b, 't-reply');
SELECT created FROM im.edit_message(1, :c, 'a-edit', :a, '{"text": "edited"}', 't-edit');
SELECT created FROM im.react(2, :c, :a, 'ok', true, 'a-react', 't-react');
SELECT created FROM im.react(1, :c, :a, 'ok', true, 'a-react-1');
SELECT created FROM im.pin_message(1, :c, :a, true, 'a-pin', 't-pin');
SELECT created FROM im.pin_message(1, :c, :b, true, 'b-pin');
RESET ROLE;
SELECT im.run_fanout(100) > 0 AS fanned_out;
SET ROLE im_h27_app;
SELECT read_msg_seq FROM im.report_read(2, :c, 2, 't-read');
SELECT read_msg_seq FROM im.report_read(2, :c, 3);
SELECT im.delete_for_me(2, :c, :b, 't-delete') AS deleted;
SELECT cleared FROM im.clear_dirty(2, :c, 0, 100, 't-clear');
SELECT cleared FROM im.clear_dirty(2, :c, 0, 100);
-- the recall's own position and the pin list change it makes share its trace id
SELECT created FROM im.recall_message(1, :c, 'a-recall', :a, 't-recall');
SELECT created FROM im.recall_message(2, :c, 'b-recall', :b);
RESET ROLE;
SELECT e.msg_seq, e.kind, e.client_msg_id, e.trace_id AS event_trace, o.trace_id AS outbox_trace
FROM im.event e JOIN im.outbox o ON o.source_event_id = e.message_id
WHERE e.conversation_id = :c ORDER BY e.msg_seq;
SELECT pe.kind, pe.read_msg_seq, o.trace_id AS outbox_trace
FROM im.private_event pe JOIN im.outbox o ON o.source_event_id = pe.private_event_id
ORDER BY pe.private_event_id;

-- retries answered with the original: created false, the original's trace
-- id kept, each counted once (im.metrics(); shared memory, cluster-wide)
SELECT value AS retries_before FROM im.metrics() WHERE name = 'im_idempotent_retries_total' \gset
SELECT created FROM im.send_message(1, :c, 'a', '{"text": "traced"}', 'text', NULL, 't-retry');
SELECT created FROM im.send_message(2, :c, 'b', '{"text": "untraced"}', 'text', NULL, 't-retry');
SELECT created FROM im.edit_message(1, :c, 'a-edit', :a, '{"text": "edited"}', 't-retry');
SELECT created FROM im.react(2, :c, :a, 'ok', true, 'a-react', 't-retry');
SELECT created FROM im.pin_message(1, :c, :a, true, 'a-pin');
SELECT created FROM im.recall_message(1, :c, 'a-recall', :a, 't-retry');
SELECT value - :retries_before AS retries_counted FROM im.metrics() WHERE name = 'im_idempotent_retries_total';
SELECT count(*) AS traced_by_retry FROM im.event WHERE trace_id = 't-retry';
SELECT count(*) AS traced_by_retry FROM im.outbox WHERE trace_id = 't-retry';
-- a new write is no retry
SELECT created FROM im.send_message(1, :c, 'c', '{"text": "new"}');
SELECT value - :retries_before AS retries_counted FROM im.metrics() WHERE name = 'im_idempotent_retries_total';

-- a trace id outside 1-64 of [A-Za-z0-9_-]: 22023, nothing changes
SELECT count(*) AS events, (SELECT count(*) FROM im.outbox) AS items,
       (SELECT count(*) FROM im.private_event) AS private_events,
       (SELECT read_msg_seq FROM im.user_conversation WHERE user_id = 2 AND conversation_id = :c) AS cursor
FROM im.event \gset before_
SELECT try_sql(format($$SELECT * FROM im.send_message(1, %s, 'x1', '{"text": "x"}', 'text', NULL, 'a.b')$$, :c));
SELECT try_sql(format($$SELECT * FROM im.send_message(1, %s, 'x2', '{"text": "x"}', 'text', NULL, 'é')$$, :c));
SELECT try_sql(format($$SELECT * FROM im.recall_message(1, %s, 'x3', %s, '')$$, :c, :b));
SELECT try_sql(format($$SELECT * FROM im.edit_message(2, %s, 'x4', %s, '{"text": "x"}', '%s')$$, :c, :b, repeat('x', 65)));
SELECT try_sql(format($$SELECT * FROM im.react(2, %s, %s, 'ok', false, 'x5', 'a/b')$$, :c, :b));
SELECT try_sql(format($$SELECT * FROM im.pin_message(1, %s, %s, false, 'x6', 'a b')$$, :c, :b));
SELECT try_sql(format($$SELECT * FROM im.report_read(2, %s, 100, 'new%sline')$$, :c, chr(10)));
SELECT try_sql(format($$SELECT * FROM im.clear_dirty(2, %s, 0, 100, 'x:y')$$, :c));
SELECT try_sql(format($$SELECT im.delete_for_me(1, %s, %s, 'a+b')$$, :c, :b));
SELECT count(*) = :before_events AS events_same, (SELECT count(*) FROM im.outbox) = :before_items AS items_same,
       (SELECT count(*) FROM im.private_event) = :before_private_events AS private_same,
       (SELECT read_msg_seq FROM im.user_conversation WHERE user_id = 2 AND conversation_id = :c) = :before_cursor AS cursor_same
FROM im.event;

\c im_regress
DROP DATABASE im_h27_trace;
DROP ROLE im_h27_app;
