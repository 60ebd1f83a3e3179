-- The upgrade to 1.3 (contract §14): from a 1.1 catalog, ALTER EXTENSION
-- UPDATE replaces the 5-argument send_message by the 6-argument one with
-- the same result and attributes, the owner and the grants carried over;
-- old 4- and 5-argument callers still resolve (never 42725); a retry of a
-- send accepted before the update is still recognised (its digest).
-- Before the update the 1.3 library serves the 1.1 catalog as 1.1 did:
-- message objects without the keys of contract §14.
CREATE DATABASE im_h11_upgrade;
\c im_h11_upgrade
SET client_min_messages = warning;
CREATE EXTENSION btree_gist;
CREATE EXTENSION im_sync VERSION '1.1';
RESET client_min_messages;
\i sql/include/try_sql.sql
CREATE ROLE im_h11_app;
GRANT USAGE ON SCHEMA im TO im_h11_app;
GRANT EXECUTE ON FUNCTION im.send_message(bigint, bigint, text, jsonb, text) TO im_h11_app;
SELECT im.create_conversation('group', ARRAY[1, 2]::bigint[], 1) AS c \gset
SELECT msg_seq, created FROM im.send_message(1, :c, 'before-1', '{"text": "sent on 1.1"}');
-- on the 1.1 catalog under the 1.3 library
SELECT (SELECT array_agg(k ORDER BY k) FROM jsonb_object_keys(m) k) AS keys_on_1_1
FROM im.fetch_messages(1, :c, 0) f, jsonb_array_elements(f.messages) m WHERE m ->> 'kind' = 'message';

ALTER EXTENSION im_sync UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'im_sync';
-- one send_message, 7 arguments (contract §21 added trace_id), SECURITY DEFINER with the pinned search_path
SELECT p.oid::regprocedure, p.prosecdef, p.proconfig, pg_get_function_result(p.oid) AS result,
       pg_get_function_arguments(p.oid) AS arguments
FROM pg_proc p WHERE p.proname = 'send_message' AND p.pronamespace = 'im'::regnamespace;
-- the grant is carried over, PUBLIC still has none; the extension's initial
-- privileges are the fresh install's (no grant recorded as initial)
SELECT has_function_privilege('im_h11_app', 'im.send_message(bigint, bigint, text, jsonb, text, bigint, text)', 'EXECUTE') AS app,
       (SELECT proacl FROM pg_proc WHERE oid = 'im.send_message(bigint, bigint, text, jsonb, text, bigint, text)'::regprocedure)::text
         LIKE '%im_h11_app=X/%' AS acl_names_app,
       (SELECT proacl FROM pg_proc WHERE oid = 'im.send_message(bigint, bigint, text, jsonb, text, bigint, text)'::regprocedure)::text
         NOT LIKE '%{=X%' AND
       (SELECT proacl FROM pg_proc WHERE oid = 'im.send_message(bigint, bigint, text, jsonb, text, bigint, text)'::regprocedure)::text
         NOT LIKE '%,=X%' AS public_has_none,
       (SELECT initprivs::text FROM pg_init_privs
        WHERE objoid = 'im.send_message(bigint, bigint, text, jsonb, text, bigint, text)'::regprocedure) NOT LIKE '%im_h11_app%' AS initprivs_clean;
SELECT message_id AS before_1 FROM im.event WHERE client_msg_id = 'before-1' \gset
-- old callers: 4 and 5 arguments, positional and named, as the granted role
SET ROLE im_h11_app;
SELECT msg_seq, created FROM im.send_message(1, :c, 'after-4', '{"text": "four"}');
SELECT msg_seq, created FROM im.send_message(1, :c, 'after-5', '{"text": "five"}', 'markdown');
SELECT msg_seq, created FROM im.send_message(sender_id => 2, conversation_id => :c, client_msg_id => 'after-named',
                                             body => '{"text": "named"}', content_type => 'text');
-- a retry of the send accepted on 1.1: the same message, not IS409
SELECT msg_seq, created FROM im.send_message(1, :c, 'before-1', '{"text": "sent on 1.1"}');
-- and the new arguments
SELECT msg_seq, created FROM im.send_message(2, :c, 'after-reply', '{"text": "reply"}', 'text', :before_1);
SELECT msg_seq, created FROM im.send_message(2, :c, 'after-trace', '{"text": "traced"}', 'text', NULL, 'trace-26');
-- the role was granted nothing else
SELECT try_sql(format($$SELECT * FROM im.react(1, %s, %s, 'x', true, 'no')$$, :c, :before_1));
RESET ROLE;
SELECT client_msg_id, trace_id FROM im.event WHERE conversation_id = :c AND trace_id IS NOT NULL;
SELECT count(*) AS positions FROM im.event WHERE conversation_id = :c;
SELECT (SELECT array_agg(k ORDER BY k) FROM jsonb_object_keys(m) k) AS keys_on_1_3
FROM im.fetch_messages(1, :c, 0) f, jsonb_array_elements(f.messages) m
WHERE m ->> 'kind' = 'message' LIMIT 1;

\c im_regress
DROP DATABASE im_h11_upgrade;
DROP ROLE im_h11_app;
