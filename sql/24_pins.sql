-- Pins (contract §14): im.pin_message appends a `pin` position whose body is
-- the conversation's whole list, most recent first; at most 50; check order;
-- never unread; a pin follows its own position; a recall of a pinned
-- message appends the list without it in the same transaction; snapshots
-- carry `pinned`; reconcile checks the lists.
CREATE DATABASE im_h11_pins;
\c im_h11_pins
SET client_min_messages = warning;
CREATE EXTENSION btree_gist;
CREATE EXTENSION im_sync;
RESET client_min_messages;
\i sql/include/try_sql.sql
CREATE VIEW pins AS
  SELECT msg_seq, sender_id, client_msg_id, pin_message_id, target_message_id, body
  FROM im.event WHERE kind = 'pin' ORDER BY conversation_id, msg_seq;

SELECT im.create_conversation('group', ARRAY[1, 2, 3]::bigint[], 1) AS c \gset
SELECT im.create_conversation('group', ARRAY[1]::bigint[], 1) AS other \gset
SELECT message_id AS m1 FROM im.send_message(1, :c, 'm-1', '{"text": "one"}') \gset
SELECT message_id AS m2 FROM im.send_message(2, :c, 'm-2', '{"text": "two"}') \gset
SELECT message_id AS m3 FROM im.send_message(2, :c, 'm-3', '{"text": "three"}') \gset
SELECT message_id AS om FROM im.send_message(1, :other, 'o-1', '{"text": "elsewhere"}') \gset

-- any member pins; the list is most recent first; pinning a pinned message
-- keeps the list, unpinning one that is not pinned appends it unchanged
SELECT msg_seq, created FROM im.pin_message(1, :c, :m1, true, 'p-1');
SELECT msg_seq, created FROM im.pin_message(2, :c, :m2, true, 'p-2');
SELECT msg_seq, created FROM im.pin_message(3, :c, :m3, true, 'p-3');
SELECT msg_seq, created FROM im.pin_message(3, :c, :m1, true, 'p-4');
SELECT msg_seq, created FROM im.pin_message(1, :c, :m2, false, 'p-5');
SELECT msg_seq, created FROM im.pin_message(1, :c, :m2, false, 'p-6');
SELECT * FROM pins;
-- idempotent by client_msg_id; another request under the key is IS409
SELECT msg_seq, created FROM im.pin_message(1, :c, :m2, false, 'p-6');
SELECT try_sql(format($$SELECT * FROM im.pin_message(1, %s, %s, true, 'p-6')$$, :c, :m2));
SELECT try_sql(format($$SELECT * FROM im.react(1, %s, %s, 'x', false, 'p-6')$$, :c, :m2));

-- check order: P0002, 42501, 22023, IS409
SELECT try_sql(format($$SELECT * FROM im.pin_message(1, %s, 999999, true, 'e-1')$$, :c));
SELECT try_sql(format($$SELECT * FROM im.pin_message(1, %s, %s, true, 'e-1')$$, :c, :om));
SELECT try_sql(format($$SELECT * FROM im.pin_message(4, %s, %s, true, 'e-1')$$, :c, :m1));
SELECT try_sql(format($$SELECT * FROM im.pin_message(1, %s, (SELECT message_id FROM im.event WHERE client_msg_id = 'p-1'), true, 'e-1')$$, :c));
SELECT try_sql(format($$SELECT * FROM im.pin_message(1, %s, (SELECT message_id FROM im.event WHERE conversation_id = %s AND kind = 'create'), true, 'e-1')$$, :c, :c));
SELECT try_sql(format($$SELECT * FROM im.pin_message(1, %s, %s, NULL, 'e-1')$$, :c, :m1));

-- never unread; every member gets every pin position (its own position)
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT user_id, last_msg_seq, unread_count FROM im.user_conversation WHERE conversation_id = :c ORDER BY 1;

-- recall of a pinned message: the recall and a system pin position (no
-- sender, no target) with the list without it, in one transaction
SELECT msg_seq, created FROM im.recall_message(2, :c, 'rc-3', :m3);
SELECT * FROM pins WHERE msg_seq > 9;
-- a recalled message can be neither pinned nor unpinned (IS409)
SELECT try_sql(format($$SELECT * FROM im.pin_message(1, %s, %s, true, 'e-2')$$, :c, :m3));
-- recalling an unpinned message appends no pin position
SELECT msg_seq FROM im.recall_message(2, :c, 'rc-2', :m2);
SELECT count(*) AS pin_positions FROM im.event WHERE conversation_id = :c AND kind = 'pin';

-- a pin follows its own position: a member who left gets none after it
SELECT leave_seq FROM im.leave_conversation(:c, 2);
SELECT msg_seq FROM im.pin_message(1, :c, :m1, false, 'p-7');
SELECT try_sql(format($$SELECT * FROM im.pin_message(2, %s, %s, true, 'e-3')$$, :c, :m1));
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT i.user_id, pg_catalog.max(i.msg_seq) FILTER (WHERE i.kind = 'pin') AS last_pin_seen
FROM im.inbox i WHERE i.conversation_id = :c GROUP BY 1 ORDER BY 1;
-- a newcomer sees the pins made after it joined, whatever their targets
SELECT join_seq FROM im.join_conversation(:c, 5);
SELECT msg_seq FROM im.pin_message(1, :c, :m1, true, 'p-8');
SELECT jsonb_path_query_array(messages, '$[*] ? (@.kind == "pin") .body.pinned') AS newcomer_pins
FROM im.fetch_messages(5, :c, 0, 100);
SELECT jsonb_path_query_array(messages, '$[*] ? (@.kind == "pin") .target_message_id') AS targets
FROM im.fetch_messages(1, :c, 0, 100);

-- the snapshot's `pinned`: the latest pin position delivered and visible
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT state FROM im.register_device(2, 'tablet');
SELECT state FROM im.register_device(1, 'tablet');
SELECT status, page_count FROM im.begin_snapshot(2, 'tablet');
SELECT i -> 'conversation_id' = to_jsonb(:c) AS is_c, i -> 'pinned' AS pinned
FROM im.snapshot s JOIN im.snapshot_page p USING (snapshot_id), jsonb_array_elements(p.items) i
WHERE s.user_id = 2 ORDER BY 1;
SELECT status, page_count FROM im.begin_snapshot(1, 'tablet');
SELECT i -> 'conversation_id' = to_jsonb(:c) AS is_c, i -> 'pinned' AS pinned
FROM im.snapshot s JOIN im.snapshot_page p USING (snapshot_id), jsonb_array_elements(p.items) i
WHERE s.user_id = 1 ORDER BY 1;
-- a pin not yet fanned out is not in a snapshot
SELECT msg_seq FROM im.pin_message(1, :other, :om, true, 'p-9');
SELECT status FROM im.begin_snapshot(1, 'tablet');
SELECT i -> 'conversation_id' = to_jsonb(:other) AS is_other, i -> 'pinned' AS pinned
FROM im.snapshot s JOIN im.snapshot_page p USING (snapshot_id), jsonb_array_elements(p.items) i
WHERE s.user_id = 1 AND s.snapshot_id = (SELECT max(snapshot_id) FROM im.snapshot) ORDER BY 1;

-- 50 pins per conversation, the 51st is 22023; unpinning makes room
SELECT im.create_conversation('group', ARRAY[7]::bigint[], 7) AS full_c \gset
SELECT count(*) FROM generate_series(1, 51) i, im.send_message(7, :full_c, 'f-' || i, '{}');
SELECT count(*) FROM generate_series(1, 50) i,
  im.pin_message(7, :full_c, (SELECT message_id FROM im.event WHERE client_msg_id = 'f-' || i), true, 'fp-' || i);
SELECT try_sql(format($$SELECT * FROM im.pin_message(7, %s, (SELECT message_id FROM im.event WHERE client_msg_id = 'f-51'), true, 'fp-51')$$, :full_c));
-- re-pinning one of the 50 is fine
SELECT created FROM im.pin_message(7, :full_c, (SELECT message_id FROM im.event WHERE client_msg_id = 'f-1'), true, 'fp-1-again');
SELECT created FROM im.pin_message(7, :full_c, (SELECT message_id FROM im.event WHERE client_msg_id = 'f-1'), false, 'fp-1-off');
SELECT created FROM im.pin_message(7, :full_c, (SELECT message_id FROM im.event WHERE client_msg_id = 'f-51'), true, 'fp-51');
SELECT jsonb_array_length(body -> 'pinned') FROM im.event WHERE client_msg_id = 'fp-51';

SELECT im.run_fanout() >= 0 AS fanned_out;
SELECT check_name FROM im.reconcile();
-- reconcile: a list with a recalled message in it is reported
UPDATE im.event SET body = jsonb_build_object('pinned', jsonb_build_array(:m1, :m3))
WHERE client_msg_id = 'p-8';
SELECT check_name, detail ->> 'msg_seq' AS msg_seq FROM im.reconcile() WHERE check_name LIKE 'pin%';

\c im_regress
DROP DATABASE im_h11_pins;
