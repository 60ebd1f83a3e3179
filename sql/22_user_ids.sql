-- User ids are 1..2^53-1 in every function that takes one (contract
-- §1): 0, -1 and 2^53 are 22023 before anything is read or
-- written; 2^53-1 is an ordinary user.  One row per argument that names a
-- user, so a function added later without the check shows up here.
\set VERBOSITY terse
\i sql/include/outcome.sql

-- 9007199254740991 = 2^53-1 is a member of c, with a registered device
SELECT im.create_conversation('group', ARRAY[2201, 9007199254740991]::bigint[], 2201) AS c \gset
SELECT state FROM im.register_device(9007199254740991, 'phone');
SELECT msg_seq FROM im.send_message(9007199254740991, :c, 'max-1', '{"text": "from 2^53-1"}');
SELECT message_id AS m FROM im.event WHERE client_msg_id = 'max-1' \gset
SELECT im.run_fanout() > 0 AS fanned_out;

-- every argument that names a user; %1$s is the id under test
CREATE TEMP TABLE user_arg (fn text, arg text, q text);
INSERT INTO user_arg VALUES
 ('create_conversation', 'members[]', $$SELECT im.create_conversation('group', ARRAY[2201, %1$s]::bigint[], 2201)$$),
 ('create_conversation', 'creator',   $$SELECT im.create_conversation('group', ARRAY[2201]::bigint[], %1$s)$$),
 ('direct_conversation', 'user_a',    $$SELECT im.direct_conversation(%1$s, 2201)$$),
 ('direct_conversation', 'user_b',    $$SELECT im.direct_conversation(2201, %1$s)$$),
 ('join_conversation',   'user_id',   $$SELECT * FROM im.join_conversation(:c, %1$s)$$),
 ('leave_conversation',  'user_id',   $$SELECT * FROM im.leave_conversation(:c, %1$s)$$),
 ('send_message',        'sender_id', $$SELECT * FROM im.send_message(%1$s, :c, 'u-' || md5(random()::text), '{"t": 1}')$$),
 ('recall_message',      'sender_id', $$SELECT * FROM im.recall_message(%1$s, :c, 'u-r', 1)$$),
 ('edit_message',        'sender_id', $$SELECT * FROM im.edit_message(%1$s, :c, 'u-e', 1, '{"t": 1}')$$),
 ('register_device',     'user_id',   $$SELECT * FROM im.register_device(%1$s, 'tablet')$$),
 ('revoke_device',       'user_id',   $$SELECT im.revoke_device(%1$s, 'phone')$$),
 ('device_session',      'user_id',   $$SELECT * FROM im.device_session(%1$s, 'phone', 0)$$),
 ('issue_device_token',  'user_id',   $$SELECT im.issue_device_token(%1$s, 'phone')$$),
 ('sync_changes',        'user_id',   $$SELECT * FROM im.sync_changes(%1$s, 'phone', 1, 0)$$),
 ('ack_sync',            'user_id',   $$SELECT * FROM im.ack_sync(%1$s, 'phone', 'x', 0)$$),
 ('begin_snapshot',      'user_id',   $$SELECT * FROM im.begin_snapshot(%1$s, 'phone')$$),
 ('fetch_snapshot',      'user_id',   $$SELECT * FROM im.fetch_snapshot(%1$s, 'phone', 'x', 0)$$),
 ('ack_snapshot',        'user_id',   $$SELECT * FROM im.ack_snapshot(%1$s, 'phone', 'x', 'x')$$),
 ('fetch_messages',      'user_id',   $$SELECT * FROM im.fetch_messages(%1$s, :c, 0)$$),
 ('report_read',         'user_id',   $$SELECT * FROM im.report_read(%1$s, :c, 1)$$),
 ('clear_dirty',         'user_id',   $$SELECT * FROM im.clear_dirty(%1$s, :c, 0, 0)$$),
 ('conversation_list',   'user_id',   $$SELECT * FROM im.conversation_list(%1$s)$$),
 ('delete_for_me',       'user_id',   $$SELECT im.delete_for_me(%1$s, :c, 1)$$),
 ('recent_conversations', 'user_id',  $$SELECT * FROM im.recent_conversations(%1$s)$$),
 ('pin_conversation',    'user_id',   $$SELECT * FROM im.pin_conversation(%1$s, :c, true)$$),
 ('react',               'user_id',   $$SELECT * FROM im.react(%1$s, :c, :m, 'x', true, 'uid-r')$$),
 ('pin_message',         'user_id',   $$SELECT * FROM im.pin_message(%1$s, :c, :m, true, 'uid-p')$$),
 ('set_read_receipts',   'user_id',   $$SELECT * FROM im.set_read_receipts(%1$s, false)$$),
 ('register_push_target', 'user_id',  $$SELECT im.register_push_target(%1$s, 'phone', 'fcm', 'app', 'tok')$$),
 ('remove_push_target',  'user_id',   $$SELECT im.remove_push_target(%1$s, 'phone')$$),
 ('set_notify',          'user_id',   $$SELECT im.set_notify(%1$s, :c, preview => 'none')$$),
 ('set_presence',        'user_id',   $$SELECT im.set_presence(%1$s, 'phone', 0, true)$$),
 ('refresh_presence',    'user_ids[]', $$SELECT im.refresh_presence(ARRAY[%1$s]::bigint[], '{phone}', '{0}')$$),
 ('message_facts',       'sender_id', $$SELECT * FROM im.message_facts(%1$s, :m)$$),
 ('set_member_role',     'user_id',   $$SELECT * FROM im.set_member_role(2201, :c, %1$s, 'admin', 'uid-role')$$),
 ('set_member_role',     'actor_id',  $$SELECT * FROM im.set_member_role(%1$s, :c, 2201, 'admin', 'uid-role')$$),
 ('mute_member',         'user_id',   $$SELECT * FROM im.mute_member(2201, :c, %1$s, NULL, 'uid-mute')$$),
 ('mute_member',         'actor_id',  $$SELECT * FROM im.mute_member(%1$s, :c, 2201, NULL, 'uid-mute')$$),
 ('remove_member',       'user_id',   $$SELECT * FROM im.remove_member(2201, :c, %1$s, false, 'uid-remove')$$),
 ('remove_member',       'actor_id',  $$SELECT * FROM im.remove_member(%1$s, :c, 2201, false, 'uid-remove')$$),
 ('unban_member',        'user_id',   $$SELECT * FROM im.unban_member(2201, :c, %1$s)$$),
 ('unban_member',        'actor_id',  $$SELECT * FROM im.unban_member(%1$s, :c, 2201)$$),
 ('shard_member_roles',  'user_id',   $$SELECT * FROM im.shard_member_roles(%1$s, ARRAY[:c]::bigint[])$$),
 ('suspend_user',        'user_id',   $$SELECT * FROM im.suspend_user('mod', %1$s, NULL, NULL)$$),
 ('reinstate_user',      'user_id',   $$SELECT * FROM im.reinstate_user('mod', %1$s)$$),
 ('shard_received_positions', 'user_ids[]', $$SELECT * FROM im.shard_received_positions(ARRAY[%1$s]::bigint[])$$),
 ('shard_message_status', 'user_ids[]', $$SELECT * FROM im.shard_message_status(:m, ARRAY[%1$s]::bigint[])$$),
 ('shard_message_facts', 'user_ids[]', $$SELECT * FROM im.shard_message_facts(:m, ARRAY[%1$s]::bigint[])$$),
 ('shard_trace_message', 'user_ids[]', $$SELECT * FROM im.shard_trace_message(:m, ARRAY[%1$s]::bigint[])$$);
UPDATE user_arg SET q = replace(replace(q, ':c', :'c'), ':m', :'m');

-- every im function with an argument that names a user is listed above
SELECT p.proname, a.name
FROM pg_proc p, unnest(p.proargnames, p.proargmodes) WITH ORDINALITY AS a(name, mode, i)
WHERE p.pronamespace = 'im'::regnamespace
  AND (a.mode IS NULL OR a.mode IN ('i', 'b'))
  AND a.name IN ('user_id', 'sender_id', 'creator', 'members', 'user_a', 'user_b', 'user_ids')
  AND NOT EXISTS (SELECT 1 FROM user_arg u WHERE u.fn = p.proname AND split_part(u.arg, '[', 1) = a.name)
ORDER BY 1, 2;

-- refused before anything happens (each call rolls back on its own anyway)
SELECT u.fn, u.arg, v.id, pg_temp.outcome(format(u.q, v.id)) AS outcome
FROM user_arg u, (VALUES ('0'), ('-1'), ('9007199254740992'), ('-9223372036854775808')) AS v(id)
ORDER BY u.fn, u.arg, v.id;
-- the detail, once
\set VERBOSITY default
SELECT * FROM im.register_device(9007199254740992, 'phone');
\set VERBOSITY terse

-- 2^53-1 passes the check in every function: whatever they answer, it is
-- not 22023 (the calls run in a transaction that is rolled back)
BEGIN;
SELECT u.fn, u.arg, pg_temp.outcome(format(u.q, '9007199254740991')) NOT LIKE '22023%' AS passes_check
FROM user_arg u ORDER BY u.fn, u.arg;
ROLLBACK;

-- and it reads its conversation like any other user
SELECT jsonb_path_query_array(messages, '$[*].sender_id') AS senders
FROM im.fetch_messages(9007199254740991, :c, 0);
