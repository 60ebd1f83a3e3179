-- Replies (contract §14): send_message(…, reply_to_message_id) copies only
-- the target's id; the target is checked like a reaction's (P0002, 42501,
-- 22023, IS409); the request digest includes it; message objects carry
-- reply_to_message_id (NULL when none) in sync and fetch_messages.
CREATE DATABASE im_h11_replies;
\c im_h11_replies
SET client_min_messages = warning;
CREATE EXTENSION btree_gist;
CREATE EXTENSION im_sync;
RESET client_min_messages;
\i sql/include/try_sql.sql

SELECT state FROM im.register_device(2, 'phone');
SELECT a.status FROM im.begin_snapshot(2, 'phone') b,
  LATERAL im.ack_snapshot(2, 'phone', b.snapshot_token, b.manifest_digest) a;
SELECT im.create_conversation('group', ARRAY[1, 2, 3]::bigint[], 1) AS c \gset
SELECT im.create_conversation('group', ARRAY[1, 2]::bigint[], 1) AS other \gset
SELECT message_id AS m1 FROM im.send_message(1, :c, 'm-1', '{"text": "question"}') \gset
SELECT message_id AS om FROM im.send_message(1, :other, 'o-1', '{"text": "elsewhere"}') \gset

-- a reply: one message position, the target's id only
SELECT msg_seq, created FROM im.send_message(2, :c, 'r-1', '{"text": "answer"}', 'text', :m1);
-- named argument, any content type
SELECT msg_seq, created FROM im.send_message(3, :c, 'r-2', '{"text": "me too"}', reply_to_message_id => :m1);
SELECT msg_seq, kind, sender_id, body, reply_to_message_id, target_message_id
FROM im.event WHERE conversation_id = :c ORDER BY msg_seq;
-- idempotent; the digest includes the reply target: another target, or none, is IS409
SELECT msg_seq, created FROM im.send_message(2, :c, 'r-1', '{"text": "answer"}', 'text', :m1);
SELECT try_sql(format($$SELECT * FROM im.send_message(2, %s, 'r-1', '{"text": "answer"}')$$, :c));
SELECT try_sql(format($$SELECT * FROM im.send_message(2, %s, 'm-1x', '{"text": "answer"}')$$, :c)) AS fresh_key;
SELECT try_sql(format($$SELECT * FROM im.send_message(2, %s, 'm-1x', '{"text": "answer"}', 'text', %s)$$, :c, :m1));
-- NULL reply_to_message_id is no reply (the same request as without it)
SELECT msg_seq, created FROM im.send_message(2, :c, 'm-1x', '{"text": "answer"}', 'text', NULL);

-- the target's checks, in order
SELECT try_sql(format($$SELECT * FROM im.send_message(2, %s, 'e-1', '{}', 'text', 999999)$$, :c));
SELECT try_sql(format($$SELECT * FROM im.send_message(2, %s, 'e-1', '{}', 'text', %s)$$, :c, :om));
SELECT try_sql(format($$SELECT * FROM im.send_message(2, %s, 'e-1', '{}', 'text', (SELECT message_id FROM im.event WHERE conversation_id = %s AND kind = 'create'))$$, :c, :c));
SELECT try_sql(format($$SELECT * FROM im.send_message(2, %s, 'e-1', '{}', 'text', 0)$$, :c));
-- a non-member: 42501 as for any send
SELECT try_sql(format($$SELECT * FROM im.send_message(4, %s, 'e-1', '{}', 'text', %s)$$, :c, :m1));
-- a member whose periods do not cover the target: 42501
SELECT join_seq FROM im.join_conversation(:c, 5);
SELECT try_sql(format($$SELECT * FROM im.send_message(5, %s, 'e-1', '{}', 'text', %s)$$, :c, :m1));
-- a recalled target: IS409
SELECT msg_seq FROM im.recall_message(1, :c, 'rc-1', :m1);
SELECT try_sql(format($$SELECT * FROM im.send_message(2, %s, 'e-2', '{}', 'text', %s)$$, :c, :m1));
-- replies already sent keep the id; the quoted text was never copied
SELECT msg_seq, body, reply_to_message_id FROM im.event WHERE reply_to_message_id IS NOT NULL ORDER BY 1;

-- a reply is a message: it counts as unread like any other
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT user_id, unread_count FROM im.user_conversation WHERE conversation_id = :c ORDER BY 1;

-- message objects carry reply_to_message_id (NULL when none), in sync and history
SELECT e ->> 'client' AS c, e -> 'reply_to_message_id' AS reply_to
FROM im.sync_changes(2, 'phone', 2, 0, 1000) s,
     jsonb_array_elements(s.events) x, LATERAL (SELECT x || jsonb_build_object('client', x ->> 'msg_seq')) y(e)
WHERE x ->> 'kind' = 'message' ORDER BY (x ->> 'sync_seq')::bigint;
SELECT jsonb_path_query_array(messages, '$[*] ? (@.kind == "message") .reply_to_message_id') AS reply_to,
       jsonb_path_query_array(messages, '$[*] ? (@.kind != "message") .reply_to_message_id') AS other_kinds
FROM im.fetch_messages(1, :c, 0, 100);

\c im_regress
DROP DATABASE im_h11_replies;
