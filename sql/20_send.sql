-- send/recall/edit (contract §3): idempotency, conflicts, tombstones, every
-- error path.  Own fresh database so ids are deterministic.
CREATE DATABASE im_h1_send;
\c im_h1_send
SET client_min_messages = warning;
CREATE EXTENSION btree_gist;
CREATE EXTENSION im_sync;
RESET client_min_messages;
\i sql/include/try_sql.sql
CREATE VIEW events AS
  SELECT conversation_id, msg_seq, message_id, kind, sender_id, client_msg_id, content_type,
         body, target_message_id, recalled, request_digest IS NOT NULL AS has_digest
  FROM im.event ORDER BY 1, 2;
CREATE VIEW state AS
  SELECT (SELECT count(*) FROM im.event) AS events, (SELECT count(*) FROM im.outbox) AS outbox,
         (SELECT sum(head_msg_seq) FROM im.conversation) AS heads,
         (SELECT md5(string_agg(message_id || ':' || coalesce(body::text, '-') || recalled, ',' ORDER BY message_id))
          FROM im.event) AS bodies;

SELECT im.create_conversation('group', ARRAY[1, 2, 3]::bigint[]);   -- 1
SELECT im.direct_conversation(1, 4);                                -- 2
SELECT im.create_conversation('group', ARRAY[5]::bigint[]);         -- 3

-- send: positions follow the head, outbox item in the same transaction
SELECT * FROM im.send_message(1, 1, 'a-1', '{"text": "hello"}');
SELECT * FROM im.send_message(2, 1, 'b-1', '{"text": "hi", "n": 1}', 'markdown');
SELECT * FROM im.send_message(4, 2, 'd-1', '{"text": "direct"}');
-- idempotent replay: same key and request (JSON whitespace and key order do not matter)
SELECT * FROM im.send_message(2, 1, 'b-1', '{"n": 1,   "text": "hi"}', 'markdown');
-- the same client_msg_id is a separate namespace per sender
SELECT * FROM im.send_message(1, 1, 'b-1', '{"text": "mine"}');
-- key reuse with a different request: IS409 (body, content type, conversation)
SELECT try_sql($$SELECT * FROM im.send_message(2, 1, 'b-1', '{"text": "other"}', 'markdown')$$);
SELECT try_sql($$SELECT * FROM im.send_message(2, 1, 'b-1', '{"n": 1, "text": "hi"}')$$);
SELECT try_sql($$SELECT * FROM im.send_message(1, 3, 'a-1', '{"text": "hello"}')$$);
SELECT try_sql($$SELECT * FROM im.recall_message(1, 1, 'a-1', 4)$$);
-- a client_msg_id 128 characters long is fine, 129 is not
SELECT msg_seq, created FROM im.send_message(3, 1, repeat('k', 128), '{}');
SELECT * FROM events;
SELECT conversation_id, msg_seq, source_event_id, private_user_id, state FROM im.outbox ORDER BY outbox_id;
SELECT conversation_id, head_msg_seq FROM im.conversation ORDER BY 1;

-- errors: argument checks (22023), unknown conversation (P0002), non-member (42501)
CREATE TEMP TABLE before AS SELECT * FROM state;
SELECT try_sql($$SELECT * FROM im.send_message(NULL, 1, 'x', '{}')$$);
SELECT try_sql($$SELECT * FROM im.send_message(0, 1, 'x', '{}')$$);
SELECT try_sql($$SELECT * FROM im.send_message(1, NULL, 'x', '{}')$$);
SELECT try_sql($$SELECT * FROM im.send_message(1, -1, 'x', '{}')$$);
SELECT try_sql($$SELECT * FROM im.send_message(1, 1, NULL, '{}')$$);
SELECT try_sql($$SELECT * FROM im.send_message(1, 1, '', '{}')$$);
SELECT try_sql($$SELECT * FROM im.send_message(1, 1, repeat('k', 129), '{}')$$);
SELECT try_sql($$SELECT * FROM im.send_message(1, 1, 'x', NULL)$$);
SELECT try_sql($$SELECT * FROM im.send_message(1, 1, 'x', '[1, 2]')$$);
SELECT try_sql($$SELECT * FROM im.send_message(1, 1, 'x', '"text"')$$);
SELECT try_sql($$SELECT * FROM im.send_message(1, 1, 'x', 'null')$$);
SELECT try_sql($$SELECT * FROM im.send_message(1, 1, 'x', '{}', NULL)$$);
SELECT try_sql($$SELECT * FROM im.send_message(1, 1, 'x', '{}', '')$$);
SELECT try_sql($$SELECT * FROM im.send_message(1, 1, 'x', '{}', repeat('t', 65))$$);
-- text that is not JSON fails at the cast, before the function runs
SELECT try_sql($$SELECT * FROM im.send_message(1, 1, 'x', 'not json')$$);
-- body size: octet_length(body::text) against im_sync.max_body_bytes
SET im_sync.max_body_bytes = 21;
SELECT octet_length('{"t": "0123456789ab"}'::jsonb::text) AS twenty_one;
SELECT msg_seq, created FROM im.send_message(1, 1, 'size-ok', '{"t": "0123456789ab"}');
SELECT try_sql($$SELECT * FROM im.send_message(1, 1, 'size-big', '{"t": "0123456789abc"}')$$);
SELECT try_sql($$SELECT * FROM im.edit_message(1, 1, 'size-big', 4, '{"t": "0123456789abc"}')$$);
RESET im_sync.max_body_bytes;
SELECT try_sql($$SELECT * FROM im.send_message(1, 999, 'x', '{}')$$);
SELECT try_sql($$SELECT * FROM im.send_message(4, 1, 'x', '{}')$$);
SELECT try_sql($$SELECT * FROM im.send_message(5, 2, 'x', '{}')$$);
-- only the one accepted send ('size-ok') changed anything
SELECT (SELECT events FROM state) = events + 1 AND (SELECT outbox FROM state) = outbox + 1
       AND (SELECT heads FROM state) = heads + 1 AS only_size_ok_changed
FROM before;
DROP TABLE before;
CREATE TEMP TABLE before AS SELECT * FROM state;

-- recall/edit argument and target errors
SELECT try_sql($$SELECT * FROM im.recall_message(1, 1, 'r', NULL)$$);
SELECT try_sql($$SELECT * FROM im.recall_message(1, 1, 'r', 0)$$);
SELECT try_sql($$SELECT * FROM im.recall_message(1, 1, 'r', 99999)$$);
SELECT try_sql($$SELECT * FROM im.recall_message(1, 1, 'r', 1)$$);       -- the create event
SELECT try_sql($$SELECT * FROM im.recall_message(4, 2, 'r', 4)$$);       -- another conversation's message
SELECT try_sql($$SELECT * FROM im.recall_message(1, 1, 'r', 5)$$);       -- sent by user 2
SELECT try_sql($$SELECT * FROM im.recall_message(4, 1, 'r', 4)$$);       -- not a member
SELECT try_sql($$SELECT * FROM im.recall_message(1, 999, 'r', 4)$$);
SELECT try_sql($$SELECT * FROM im.edit_message(1, 1, 'e', 4, NULL)$$);
SELECT try_sql($$SELECT * FROM im.edit_message(1, 1, 'e', 4, '[]')$$);
SELECT try_sql($$SELECT * FROM im.edit_message(1, 1, 'e', NULL, '{}')$$);
SELECT try_sql($$SELECT * FROM im.edit_message(1, 1, 'e', 5, '{}')$$);
SELECT try_sql($$SELECT * FROM im.edit_message(2, 1, 'e', 1, '{}')$$);
SELECT (SELECT events FROM state) = events AND (SELECT outbox FROM state) = outbox
       AND (SELECT heads FROM state) = heads AND (SELECT bodies FROM state) = bodies AS nothing_changed
FROM before;

-- edit replaces the target's body; the edit event carries the new body
SELECT * FROM im.edit_message(1, 1, 'a-edit-1', 4, '{"text": "hello (edited)"}');
SELECT * FROM im.edit_message(1, 1, 'a-edit-2', 4, '{"text": "hello (edited twice)"}');
SELECT * FROM im.edit_message(1, 1, 'a-edit-1', 4, '{"text": "hello (edited)"}');     -- replay
SELECT try_sql($$SELECT * FROM im.edit_message(1, 1, 'a-edit-1', 4, '{"text": "changed"}')$$);
-- replaying the original send after the edit still answers with the original row
SELECT * FROM im.send_message(1, 1, 'a-1', '{"text": "hello"}');
SELECT msg_seq, kind, body, target_message_id, recalled FROM events WHERE message_id = 4 OR target_message_id = 4;

-- recall: a new position; target and every edit of it become tombstones
SELECT * FROM im.recall_message(1, 1, 'a-recall', 4);
SELECT msg_seq, kind, body, content_type, target_message_id, recalled FROM events
WHERE message_id = 4 OR target_message_id = 4;
-- replay of the recall, the edits and the original send: created = false
SELECT * FROM im.recall_message(1, 1, 'a-recall', 4);
SELECT * FROM im.edit_message(1, 1, 'a-edit-2', 4, '{"text": "hello (edited twice)"}');
SELECT * FROM im.send_message(1, 1, 'a-1', '{"text": "hello"}');
-- recalled: recall again and edit are IS409 (with a new key)
SELECT try_sql($$SELECT * FROM im.recall_message(1, 1, 'a-recall-2', 4)$$);
SELECT try_sql($$SELECT * FROM im.edit_message(1, 1, 'a-edit-3', 4, '{"text": "zombie"}')$$);

-- after leaving: new sends are 42501, replays still answer
SELECT * FROM im.leave_conversation(1, 2);
SELECT try_sql($$SELECT * FROM im.send_message(2, 1, 'b-2', '{"text": "gone"}')$$);
SELECT * FROM im.send_message(2, 1, 'b-1', '{"text": "hi", "n": 1}', 'markdown');
SELECT try_sql($$SELECT * FROM im.recall_message(2, 1, 'b-recall', 5)$$);
-- the key is answered before membership and existence: a used key with
-- another request is IS409 even where the sender may not send
SELECT try_sql($$SELECT * FROM im.send_message(2, 1, 'b-1', '{"text": "other"}')$$);
SELECT try_sql($$SELECT * FROM im.send_message(2, 999, 'b-1', '{"text": "hi", "n": 1}', 'markdown')$$);

-- msg_seq is gap-free and every position has exactly one outbox item
SELECT conversation_id, count(*) AS positions, max(msg_seq) AS max_seq,
       max(msg_seq) = count(*) AS gap_free,
       bool_and(EXISTS (SELECT 1 FROM im.outbox o WHERE o.source_event_id = e.message_id
                        AND o.msg_seq = e.msg_seq)) AS outbox_for_each
FROM im.event e GROUP BY 1 ORDER BY 1;
SELECT c.conversation_id, c.head_msg_seq = (SELECT max(msg_seq) FROM im.event e
                                            WHERE e.conversation_id = c.conversation_id) AS head_ok
FROM im.conversation c ORDER BY 1;

\c im_regress
DROP DATABASE im_h1_send;
