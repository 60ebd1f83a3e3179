-- Reactions (contract §14): im.react appends a `reaction` position whose body
-- is the caller's whole set for the target; check order and SQLSTATEs;
-- never unread; visibility (a period covering target and position);
-- fetch_messages counts; a recall drops them; shared_log markers; reconcile.
CREATE DATABASE im_h11_react;
\c im_h11_react
SET client_min_messages = warning;
CREATE EXTENSION btree_gist;
CREATE EXTENSION im_sync;
RESET client_min_messages;
\i sql/include/try_sql.sql
CREATE VIEW reactions AS
  SELECT msg_seq, sender_id, client_msg_id, target_message_id, body, recalled, content_type
  FROM im.event WHERE kind = 'reaction' ORDER BY msg_seq;
-- a message's reactions and my_reactions as user u reads them
CREATE FUNCTION seen(u bigint, c bigint, m bigint) RETURNS jsonb LANGUAGE sql AS $$
  SELECT jsonb_build_object('reactions', x -> 'reactions', 'mine', x -> 'my_reactions')
  FROM im.fetch_messages(u, c, 0, 1000) f, jsonb_array_elements(f.messages) x
  WHERE (x ->> 'message_id')::bigint = m $$;

SELECT state FROM im.register_device(2, 'phone');
SELECT a.status FROM im.begin_snapshot(2, 'phone') b,
  LATERAL im.ack_snapshot(2, 'phone', b.snapshot_token, b.manifest_digest) a;
SELECT im.create_conversation('group', ARRAY[1, 2, 3]::bigint[], 1) AS c \gset
SELECT im.create_conversation('group', ARRAY[1, 4]::bigint[], 1) AS other \gset
SELECT message_id AS m1 FROM im.send_message(1, :c, 'm-1', '{"text": "hello"}') \gset
SELECT message_id AS m2 FROM im.send_message(2, :c, 'm-2', '{"text": "world"}') \gset
SELECT message_id AS om FROM im.send_message(4, :other, 'o-1', '{"text": "elsewhere"}') \gset
SELECT message_id AS create_event FROM im.event WHERE conversation_id = :c AND kind = 'create' \gset

-- one position per call; the body is the caller's whole set after the call
SELECT msg_seq, created FROM im.react(2, :c, :m1, '👍', true, 'r-1');
SELECT msg_seq, created FROM im.react(2, :c, :m1, '🎉', true, 'r-2');
SELECT msg_seq, created FROM im.react(3, :c, :m1, '👍', true, 'r-3');
-- setting a key already set and clearing one not set still append (full state)
SELECT msg_seq, created FROM im.react(2, :c, :m1, '👍', true, 'r-4');
SELECT msg_seq, created FROM im.react(3, :c, :m1, '❤', false, 'r-5');
SELECT msg_seq, created FROM im.react(2, :c, :m1, '👍', false, 'r-6');
SELECT * FROM reactions;

-- idempotent by client_msg_id (the same namespace as messages); a different
-- request under the same key is IS409, also against a message's key
SELECT msg_seq, created FROM im.react(2, :c, :m1, '👍', false, 'r-6');
SELECT try_sql(format($$SELECT * FROM im.react(2, %s, %s, '👍', true, 'r-6')$$, :c, :m1));
SELECT try_sql(format($$SELECT * FROM im.react(2, %s, %s, '🎉', false, 'r-6')$$, :c, :m1));
SELECT try_sql(format($$SELECT * FROM im.react(2, %s, %s, '👍', false, 'm-2')$$, :c, :m1));
SELECT try_sql(format($$SELECT * FROM im.send_message(2, %s, 'r-6', '{}')$$, :c));

-- the check order of contract §14, with every SQLSTATE and message
-- P0002: unknown target, a target of another conversation, unknown conversation
SELECT try_sql(format($$SELECT * FROM im.react(2, %s, 999999, '👍', true, 'e-1')$$, :c));
SELECT try_sql(format($$SELECT * FROM im.react(2, %s, %s, '👍', true, 'e-1')$$, :c, :om));
SELECT try_sql(format($$SELECT * FROM im.react(2, 999999, %s, '👍', true, 'e-1')$$, :m1));
-- 42501 before 22023: a non-member, even with a bad key on a control event
SELECT try_sql(format($$SELECT * FROM im.react(4, %s, %s, '', true, 'e-1')$$, :c, :create_event));
SELECT try_sql(format($$SELECT * FROM im.react(4, %s, %s, '👍', true, 'e-1')$$, :c, :m1));
-- 22023: a control event, a reaction position, a key of 0 or 33 characters
SELECT try_sql(format($$SELECT * FROM im.react(2, %s, %s, '👍', true, 'e-1')$$, :c, :create_event));
SELECT try_sql(format($$SELECT * FROM im.react(2, %s, (SELECT message_id FROM im.event WHERE client_msg_id = 'r-1'), '👍', true, 'e-1')$$, :c));
SELECT try_sql(format($$SELECT * FROM im.react(2, %s, %s, '', true, 'e-1')$$, :c, :m1));
SELECT try_sql(format($$SELECT * FROM im.react(2, %s, %s, NULL, true, 'e-1')$$, :c, :m1));
SELECT try_sql(format($$SELECT * FROM im.react(2, %s, %s, repeat('x', 33), true, 'e-1')$$, :c, :m1));
SELECT msg_seq > 0 AS ok_32 FROM im.react(2, :c, :m2, repeat('é', 32), true, 'k-32');
-- bad arguments: 22023 before anything is read
SELECT try_sql(format($$SELECT * FROM im.react(2, %s, %s, '👍', NULL, 'e-1')$$, :c, :m1));
SELECT try_sql(format($$SELECT * FROM im.react(2, %s, %s, '👍', true, '')$$, :c, :m1));
SELECT try_sql(format($$SELECT * FROM im.react(0, %s, %s, '👍', true, 'e-1')$$, :c, :m1));
-- 20 distinct keys per user and target; the 21st is 22023, another user is fine
SELECT count(*) FROM generate_series(1, 20) i, im.react(3, :c, :m2, 'k' || i, true, 'many-' || i);
SELECT jsonb_array_length(body -> 'reactions') FROM im.event WHERE client_msg_id = 'many-20';
SELECT try_sql(format($$SELECT * FROM im.react(3, %s, %s, 'k21', true, 'many-21')$$, :c, :m2));
-- re-setting one of the 20 is fine
SELECT created FROM im.react(3, :c, :m2, 'k5', true, 'many-5-again');
-- nothing of the refused calls was written
SELECT count(*) AS positions, max(msg_seq) AS head FROM im.event WHERE conversation_id = :c;

-- never unread, in any count: fanout leaves unread as the messages made it
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT user_id, last_msg_seq, unread_count FROM im.user_conversation WHERE conversation_id = :c ORDER BY 1;
SELECT check_name FROM im.reconcile();

-- fetch_messages: counts per key and the reader's own keys
SELECT seen(1, :c, :m1), seen(2, :c, :m1), seen(3, :c, :m1);

-- a member who left sees no reaction made after it left
SELECT leave_seq FROM im.leave_conversation(:c, 3);
SELECT created FROM im.react(1, :c, :m1, '👍', true, 'after-leave-1');
SELECT created FROM im.react(2, :c, :m1, '🎉', false, 'after-leave-2');
SELECT seen(1, :c, :m1) AS member_sees, seen(3, :c, :m1) AS leaver_sees;
-- and cannot react (42501): no active period
SELECT try_sql(format($$SELECT * FROM im.react(3, %s, %s, '👍', true, 'left-1')$$, :c, :m1));
-- fanout delivers to it neither position; its log ends at its leave
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT i.user_id, count(*) FILTER (WHERE e.client_msg_id LIKE 'after-leave%') AS after_leave
FROM im.inbox i JOIN im.event e ON e.message_id = i.source_event_id
WHERE i.conversation_id = :c GROUP BY 1 ORDER BY 1;
-- a user who joins later reacts to what its period covers only
SELECT join_seq FROM im.join_conversation(:c, 4);
SELECT try_sql(format($$SELECT * FROM im.react(4, %s, %s, '👍', true, 'late-1')$$, :c, :m1));
SELECT message_id AS m3 FROM im.send_message(1, :c, 'm-3', '{"text": "for the newcomer"}') \gset
SELECT created FROM im.react(4, :c, :m3, '👍', true, 'late-2');
SELECT seen(4, :c, :m3), seen(1, :c, :m3);

-- up_to_seq bounds the counts: as of that position
SELECT jsonb_path_query(f.messages, '$[*] ? (@.message_id == $m).reactions', jsonb_build_object('m', :m1))
FROM im.fetch_messages(1, :c, 0, 1000, (SELECT msg_seq FROM im.event WHERE client_msg_id = 'r-3')) f;

-- recall drops the target's reactions from every view, in its transaction
SELECT created FROM im.recall_message(1, :c, 'recall-1', :m1);
SELECT count(*) FILTER (WHERE body IS NULL AND recalled) AS tombstones, count(*) AS reactions
FROM im.event WHERE kind = 'reaction' AND target_message_id = :m1;
SELECT seen(1, :c, :m1), seen(2, :c, :m1), seen(3, :c, :m1);
-- and a recalled target takes no reaction (IS409, after the key checks)
SELECT try_sql(format($$SELECT * FROM im.react(2, %s, %s, '👍', true, 'rc-1')$$, :c, :m1));
SELECT try_sql(format($$SELECT * FROM im.react(2, %s, %s, '', true, 'rc-1')$$, :c, :m1));

-- sync events carry kind, target and body; run_fanout delivered them
SELECT im.run_fanout() >= 0 AS fanned_out;
SELECT jsonb_path_query(events, '$[*] ? (@.kind == "reaction")') - 'created_at' AS reaction_events
FROM im.sync_changes(2, 'phone', 2, 0, 1000);

-- shared_log: reactions move the marker's target, never the unread bound's m
SELECT im.create_conversation('group', ARRAY[10, 11]::bigint[], 10) AS big \gset
SELECT im.set_conversation_mode(:big, 'shared_log');
SELECT message_id AS bm FROM im.send_message(10, :big, 'big-1', '{"text": "large"}') \gset
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT * FROM im.report_read(11, :big, (SELECT msg_seq FROM im.event WHERE message_id = :bm));
SELECT created FROM im.react(10, :big, :bm, '👍', true, 'big-r1');
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT user_id, dirty, dirty_target_msg_seq, unread_count FROM im.user_conversation
WHERE conversation_id = :big ORDER BY 1;
SELECT seen(11, :big, :bm);
SELECT kind, count(*) FROM im.inbox WHERE conversation_id = :big GROUP BY 1 ORDER BY 1;
SELECT check_name FROM im.reconcile();

-- reconcile: a reaction set that is not built on the previous one is reported
UPDATE im.event SET body = '{"user_id": 2, "reactions": ["a", "b", "c"]}'
WHERE client_msg_id = 'k-32';
SELECT check_name, detail ->> 'msg_seq' AS msg_seq FROM im.reconcile() WHERE check_name LIKE 'reaction%';

\c im_regress
DROP DATABASE im_h11_react;
