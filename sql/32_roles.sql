-- Roles, mutes, removals and bans in groups (contract §17): the creator is
-- owner; set_member_role, mute_member, remove_member, unban_member with
-- every step of the check order and its SQLSTATE; replay and IS409 in the
-- actor's client_msg_id namespace; the positions (role, mute, leave with
-- removed_by) at the next msg_seq; a muted member's writes (send on both
-- paths, edit, recall, react, pin, reply) are IS403, reads are not; a
-- timed mute ends by itself; removal ends history as a leave; a ban keeps
-- the user out until unban; the owner's leave names a successor;
-- conversation_list, recent_conversations and snapshot items carry my_role
-- and muted_until; audit rows.
CREATE DATABASE im_h29_roles;
\c im_h29_roles
SET client_min_messages = warning;
CREATE EXTENSION btree_gist;
CREATE EXTENSION im_sync;
RESET client_min_messages;
\i sql/include/try_sql.sql
CREATE VIEW roles AS
  SELECT user_id, role, COALESCE(muted_until > now(), false) AS muted, leave_seq IS NULL AS active
  FROM im.membership_period WHERE conversation_id = (SELECT max(conversation_id) FROM im.conversation WHERE kind = 'group')
  ORDER BY user_id, join_seq;
CREATE VIEW positions AS
  SELECT msg_seq, kind, sender_id, client_msg_id IS NOT NULL AS keyed, subject_user_id, body
  FROM im.event WHERE conversation_id = (SELECT max(conversation_id) FROM im.conversation WHERE kind = 'group')
  ORDER BY msg_seq;

-- a group by 1 with 2, 3, 4; a direct conversation of 1 and 5
SELECT im.create_conversation('group', ARRAY[2, 3, 4]::bigint[], 1) AS g \gset
SELECT im.direct_conversation(1, 5) AS d \gset
SELECT * FROM roles;

-- ---- check order, step by step
-- 1. arguments 22023
SELECT try_sql(format($$SELECT * FROM im.set_member_role(1, %s, 2, 'boss', 'r-1')$$, :g)) AS bad_role;
SELECT try_sql(format($$SELECT * FROM im.set_member_role(1, %s, 1, 'admin', 'r-1')$$, :g)) AS self;
SELECT try_sql(format($$SELECT * FROM im.mute_member(0, %s, 2, NULL, 'm-1')$$, :g)) AS bad_actor;
SELECT try_sql(format($$SELECT * FROM im.remove_member(1, %s, 2, NULL, 'x-1')$$, :g)) AS null_ban;
SELECT try_sql(format($$SELECT * FROM im.mute_member(1, %s, 2, NULL, '')$$, :g)) AS empty_key;
-- 2. unknown conversation P0002; a direct one 22023
SELECT try_sql($$SELECT * FROM im.set_member_role(1, 999999, 2, 'admin', 'r-1')$$) AS unknown;
SELECT try_sql(format($$SELECT * FROM im.mute_member(1, %s, 5, NULL, 'm-d')$$, :d)) AS direct_mute;
SELECT try_sql(format($$SELECT * FROM im.remove_member(1, %s, 5, false, 'x-d')$$, :d)) AS direct_remove;
SELECT try_sql(format($$SELECT * FROM im.unban_member(1, %s, 5)$$, :d)) AS direct_unban;
-- the owner makes 2 admin; 3. a replay answers the original, another
-- request under the key is IS409 (also one of a message)
SELECT msg_seq, created FROM im.set_member_role(1, :g, 2, 'admin', 'r-1');
SELECT msg_seq, created FROM im.set_member_role(1, :g, 2, 'admin', 'r-1');
SELECT try_sql(format($$SELECT * FROM im.set_member_role(1, %s, 2, 'member', 'r-1')$$, :g)) AS other_role;
SELECT try_sql(format($$SELECT * FROM im.mute_member(1, %s, 2, NULL, 'r-1')$$, :g)) AS other_kind;
SELECT msg_seq, created FROM im.send_message(1, :g, 's-1', '{"text": "hi"}');
SELECT try_sql(format($$SELECT * FROM im.set_member_role(1, %s, 2, 'admin', 's-1')$$, :g)) AS key_of_message;
-- 5. the actor's role or active period 42501: a member, a non-member
SELECT try_sql(format($$SELECT * FROM im.mute_member(3, %s, 4, NULL, 'm-3')$$, :g)) AS member_mutes;
SELECT try_sql(format($$SELECT * FROM im.mute_member(9, %s, 4, NULL, 'm-9')$$, :g)) AS outsider_mutes;
SELECT try_sql(format($$SELECT * FROM im.set_member_role(2, %s, 3, 'admin', 'r-2')$$, :g)) AS admin_sets_role;
SELECT try_sql(format($$SELECT * FROM im.unban_member(3, %s, 4)$$, :g)) AS member_unbans;
-- 6. the target's active period P0002
SELECT try_sql(format($$SELECT * FROM im.mute_member(2, %s, 9, NULL, 'm-2a')$$, :g)) AS target_outsider;
-- then what the role allows: an admin acts on members only
SELECT try_sql(format($$SELECT * FROM im.mute_member(2, %s, 1, NULL, 'm-2b')$$, :g)) AS admin_mutes_owner;
-- 4. the actor muted IS403 comes before its role (and before the target):
-- the owner mutes admin 2 for an hour
SELECT msg_seq, created FROM im.mute_member(1, :g, 2, now() + interval '1 hour', 'm-1');
SELECT try_sql(format($$SELECT * FROM im.mute_member(2, %s, 3, NULL, 'm-2c')$$, :g)) AS muted_admin_mutes;
SELECT try_sql(format($$SELECT * FROM im.mute_member(2, %s, 9, NULL, 'm-2d')$$, :g)) AS muted_admin_outsider;
SELECT try_sql(format($$SELECT * FROM im.unban_member(2, %s, 4)$$, :g)) AS muted_admin_unbans;
-- a replay of a muted actor's earlier request still answers (replay first)
SELECT * FROM roles;

-- ---- a muted member writes nothing (IS403), reads everything
SELECT message_id AS m1 FROM im.event WHERE client_msg_id = 's-1' \gset
SELECT msg_seq AS head_before FROM im.event WHERE conversation_id = :g ORDER BY msg_seq DESC LIMIT 1 \gset
SELECT try_sql(format($$SELECT * FROM im.send_message(2, %s, 'w-1', '{"text": "x"}')$$, :g)) AS send;
SELECT try_sql(format($$SELECT * FROM im.send_message(2, %s, 'w-2', '{"text": "x"}', 'text', %s)$$, :g, :m1)) AS reply;
SELECT try_sql(format($$SELECT * FROM im.send_message(2, %s, 'w-3', '{"text": "x"}', 'text', NULL, '0123456789abcdef0123456789abcdef')$$, :g)) AS traced_send;
SELECT try_sql(format($$SELECT * FROM im.react(2, %s, %s, '👍', true, 'w-4')$$, :g, :m1)) AS react;
SELECT try_sql(format($$SELECT * FROM im.pin_message(2, %s, %s, true, 'w-5')$$, :g, :m1)) AS pin;
-- the owner's message: 2 can neither edit nor recall its own, so give 3 one
SELECT message_id AS m3 FROM im.send_message(3, :g, 's-3', '{"text": "three"}') \gset
SELECT msg_seq, created FROM im.mute_member(1, :g, 3, now() + interval '1 hour', 'm-1b');
SELECT try_sql(format($$SELECT * FROM im.edit_message(3, %s, 'w-6', %s, '{"text": "y"}')$$, :g, :m3)) AS edit;
SELECT try_sql(format($$SELECT * FROM im.recall_message(3, %s, 'w-7', %s)$$, :g, :m3)) AS recall;
-- nothing was written by the refused writes; reads and read reports work
SELECT count(*) AS refused_positions FROM im.event WHERE client_msg_id LIKE 'w-%';
SELECT jsonb_array_length(messages) > 0 AS reads FROM im.fetch_messages(3, :g, 0, 100);
SELECT try_sql(format($$SELECT * FROM im.report_read(3, %s, 2)$$, :g)) AS read_report;
-- a mute that ended (a past time) lets the member write again: no job ran
UPDATE im.membership_period SET muted_until = now() - interval '1 second'
WHERE conversation_id = :g AND user_id = 3 AND leave_seq IS NULL;
SELECT created FROM im.send_message(3, :g, 'w-8', '{"text": "free again"}');
-- unmute with NULL and with a past time
SELECT created FROM im.mute_member(1, :g, 2, NULL, 'm-1c');
SELECT created FROM im.send_message(2, :g, 'w-9', '{"text": "unmuted"}');
SELECT created FROM im.mute_member(1, :g, 2, now() - interval '1 day', 'm-1d');
SELECT * FROM roles;

-- ---- handover: one role position names both changes
SELECT msg_seq, created FROM im.set_member_role(1, :g, 3, 'owner', 'r-own');
SELECT * FROM roles;
SELECT kind, sender_id, body - 'muted_until' AS body, body ->> 'muted_until' IS NOT NULL AS until_set
FROM positions WHERE kind IN ('role', 'mute') ORDER BY msg_seq;
-- the old owner is an admin now: it may not set roles
SELECT try_sql(format($$SELECT * FROM im.set_member_role(1, %s, 4, 'admin', 'r-1x')$$, :g)) AS ex_owner_sets_role;

-- ---- removal: a leave with removed_by and banned; history ends there
SELECT msg_seq AS removal_seq FROM im.remove_member(1, :g, 4, true, 'x-1') \gset
SELECT created FROM im.remove_member(1, :g, 4, true, 'x-1');
SELECT try_sql(format($$SELECT * FROM im.remove_member(1, %s, 4, false, 'x-1')$$, :g)) AS other_ban;
SELECT kind, sender_id, keyed, subject_user_id, body FROM positions WHERE msg_seq = :removal_seq;
SELECT leave_seq = :removal_seq - 1 AS period_ends_before FROM im.membership_period
WHERE conversation_id = :g AND user_id = 4;
SELECT created FROM im.send_message(3, :g, 'after-removal', '{"text": "4 does not see this"}');
SELECT max((m ->> 'msg_seq')::bigint) = :removal_seq AS history_ends_at_removal,
       bool_or(m -> 'body' ->> 'text' = '4 does not see this') AS sees_later
FROM im.fetch_messages(4, :g, 0, 100) f, jsonb_array_elements(f.messages) m;
SELECT try_sql(format($$SELECT * FROM im.send_message(4, %s, 'x-4', '{"text": "x"}')$$, :g)) AS removed_sends;
-- banned: join is 42501 until unban; an admin cannot remove the owner
SELECT try_sql(format($$SELECT * FROM im.join_conversation(%s, 4)$$, :g)) AS banned_join;
SELECT try_sql(format($$SELECT * FROM im.remove_member(1, %s, 3, false, 'x-2')$$, :g)) AS admin_removes_owner;
SELECT unbanned FROM im.unban_member(1, :g, 4);
SELECT unbanned FROM im.unban_member(1, :g, 4);
SELECT created FROM im.join_conversation(:g, 4);
-- a removal without a ban: the user may join again at once
SELECT created FROM im.remove_member(3, :g, 4, false, 'x-3');
SELECT created FROM im.join_conversation(:g, 4);
SELECT * FROM roles;

-- ---- the owner leaves: the longest-serving admin (1) becomes owner right after
SELECT leave_seq AS owner_leave FROM im.leave_conversation(:g, 3) \gset
SELECT msg_seq - :owner_leave AS after_leave, kind, sender_id, body FROM positions WHERE msg_seq > :owner_leave + 1;
SELECT * FROM roles;
-- no admin left: the longest-serving member; nobody left: no role position
SELECT leave_seq AS l2 FROM im.leave_conversation(:g, 1) \gset
SELECT kind, body FROM positions WHERE msg_seq = :l2 + 2;
SELECT leave_seq AS l3 FROM im.leave_conversation(:g, 2) \gset
SELECT leave_seq AS l4 FROM im.leave_conversation(:g, 4) \gset
SELECT count(*) AS role_after_last_leave FROM positions WHERE msg_seq > :l4 + 1;
-- the first to join the empty group owns it, in a role position right after the join
SELECT join_seq AS j5 FROM im.join_conversation(:g, 5) \gset
SELECT msg_seq - :j5 AS after_join, kind, sender_id, body FROM positions WHERE msg_seq > :j5;
SELECT created FROM im.join_conversation(:g, 6);
SELECT user_id, role FROM roles WHERE active;

-- ---- my_role and muted_until: conversation_list, recent_conversations, snapshot
SELECT im.create_conversation('group', ARRAY[7]::bigint[], 6) AS g2 \gset
SELECT created FROM im.set_member_role(6, :g2, 7, 'admin', 'r-6');
SELECT created FROM im.mute_member(6, :g2, 7, 'infinity', 'm-6');
SELECT conversation_id = :g2 AS g2, kind, head_stale, my_role, muted_until FROM im.conversation_list(7);
SELECT kind, my_role, muted_until FROM im.conversation_list(1) ORDER BY conversation_id;
SELECT kind, my_role, muted_until, left_conversation FROM im.recent_conversations(7);
-- what the router's conversation_list asks each conversation's node
SELECT conversation_id = :g2 AS g2, my_role, muted_until FROM im.shard_member_roles(7, ARRAY[:g2, :d, 999999]::bigint[]);
SELECT state FROM im.register_device(7, 'phone');
SELECT im.run_fanout() > 0 AS fanned_out;
-- fanout delivers the role and mute positions as inbox events (what sync
-- reads), in shared_log mode too: control events
SELECT set_conversation_mode AS mode FROM im.set_conversation_mode(:g2, 'shared_log');
SELECT created FROM im.mute_member(6, :g2, 7, NULL, 'm-6b');
SELECT created FROM im.send_message(6, :g2, 'plain-6', '{"text": "marker, no inbox event"}');
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT i.kind, e.mode FROM im.inbox i JOIN im.event e ON e.message_id = i.source_event_id
WHERE i.user_id = 7 AND i.conversation_id = :g2 ORDER BY i.sync_seq;
SELECT m ->> 'kind' AS kind, m -> 'body' AS body
FROM im.fetch_messages(7, :g2, 0, 100) f, jsonb_array_elements(f.messages) m
WHERE m ->> 'kind' IN ('role', 'mute');
SELECT snapshot_token AS tok FROM im.begin_snapshot(7, 'phone') \gset
SELECT i ->> 'my_role' AS my_role, i ->> 'muted_until' AS muted_until
FROM im.fetch_snapshot(7, 'phone', :'tok', 0) f, jsonb_array_elements(f.items) i;

-- ---- audit rows, one per action
SELECT action, user_id, detail - 'conversation_id' - 'message_id' - 'muted_until' AS detail,
       detail ->> 'muted_until' IS NOT NULL AS until_set,
       detail ? 'conversation_id' AS has_conversation
FROM im.audit WHERE action IN ('set_role', 'mute', 'remove', 'unban') ORDER BY audit_id;

\c im_regress
DROP DATABASE im_h29_roles;
