-- The upgrade to 1.12 (contract §17): before ALTER EXTENSION UPDATE the
-- 1.12 library serves a 1.11 catalog as 1.11 did (sends of members, joins
-- and leaves without roles, conversation_list's 9 columns); the update
-- gives every group its earliest active member as owner (the creator was
-- not recorded), keeps a DBA's grant on conversation_list, and the roles
-- work at once.
CREATE DATABASE im_h29_roles_upgrade;
\c im_h29_roles_upgrade
SET client_min_messages = warning;
CREATE EXTENSION btree_gist;
CREATE EXTENSION im_sync VERSION '1.11';
RESET client_min_messages;
\i sql/include/try_sql.sql
CREATE ROLE im_h29_app;
GRANT USAGE ON SCHEMA im TO im_h29_app;
GRANT EXECUTE ON FUNCTION im.conversation_list(bigint, int, bigint) TO im_h29_app;
-- on 1.11 under the 1.12 library: a group whose first member left, a
-- direct conversation, sends (direct and general path), a leave
SELECT im.create_conversation('group', ARRAY[11, 12, 13]::bigint[], 11) AS g \gset
SELECT im.direct_conversation(11, 14) AS d \gset
SELECT created FROM im.send_message(12, :g, 'before-1', '{"text": "on 1.11"}');
SELECT created FROM im.send_message(12, :g, 'before-2', '{"text": "reply"}', 'text',
       (SELECT message_id FROM im.event WHERE client_msg_id = 'before-1'));
SELECT leave_seq FROM im.leave_conversation(:g, 11);
SELECT created FROM im.join_conversation(:g, 11);
SELECT count(*) AS role_positions FROM im.event WHERE kind NOT IN ('message', 'create', 'join', 'leave');
SELECT * FROM im.conversation_list(12);

ALTER EXTENSION im_sync UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'im_sync';
-- the earliest active member (12: 11 left and came back) owns the group
SELECT user_id, role, leave_seq IS NULL AS active FROM im.membership_period
WHERE conversation_id = :g ORDER BY user_id, join_seq;
SELECT user_id, role FROM im.membership_period WHERE conversation_id = :d ORDER BY user_id;
-- conversation_list's new result, the grant carried over, PUBLIC without
SELECT pg_get_function_result('im.conversation_list(bigint, int, bigint)'::regprocedure) AS result;
SELECT has_function_privilege('im_h29_app', 'im.conversation_list(bigint, int, bigint)', 'EXECUTE') AS app_keeps,
       has_function_privilege('public', 'im.conversation_list(bigint, int, bigint)', 'EXECUTE') AS public_has;
SELECT kind, my_role, head_stale, muted_until FROM im.conversation_list(12) ORDER BY conversation_id;
-- the roles work: the owner mutes 13, whose send is IS403
SELECT created FROM im.mute_member(12, :g, 13, 'infinity', 'up-mute');
SELECT try_sql(format($$SELECT * FROM im.send_message(13, %s, 'up-send', '{"text": "x"}')$$, :g)) AS muted_send;
-- a retry of a send accepted on 1.11 is still recognised
SELECT created FROM im.send_message(12, :g, 'before-1', '{"text": "on 1.11"}');

\c im_regress
DROP DATABASE im_h29_roles_upgrade;
DROP ROLE im_h29_app;
