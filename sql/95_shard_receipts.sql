-- Receipts carried between nodes (contract §20, sharding.md "Receipts"): a
-- receipt is produced on the reader's node and carried to the sender's node
-- by a transfer; there it is applied (direct: GREATEST; a group: the node's
-- part) and emitted as on one node.  A redelivered one changes nothing; a
-- bad one (refused at arrival, or failing its apply) changes nothing either.
--
-- One database plays both nodes (as in 95_shard_recall_retry): "rdr" (odd
-- buckets, users 1, 3) holds the conversations and the readers, then "snd"
-- (even buckets, user 2, the sender) receives the transfer rows as its
-- apply worker would.
CREATE DATABASE im_shard_receipts;
\c im_shard_receipts
SET client_min_messages = warning;
CREATE EXTENSION im_sync CASCADE;
RESET client_min_messages;
\set VERBOSITY terse
SET im_sync.receipt_interval = 0;
CREATE FUNCTION pg_temp.activate(u bigint, dev text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE b record; a record;
BEGIN
  PERFORM im.register_device(u, dev);
  SELECT * INTO b FROM im.begin_snapshot(u, dev);
  SELECT * INTO a FROM im.ack_snapshot(u, dev, b.snapshot_token, b.manifest_digest);
  RETURN a.status;
END $$;
CREATE FUNCTION pg_temp.sync_ack(u bigint, dev text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE s record; p record;
BEGIN
  SELECT * INTO s FROM im.device_session(u, dev, 0);
  SELECT * INTO p FROM im.sync_changes(u, dev, s.sync_generation, s.server_acked_sync_seq);
  RETURN (SELECT status FROM im.ack_sync(u, dev, p.batch_token, p.batch_high_watermark));
END $$;

SELECT im.shard_configure('rdr', (SELECT array_agg(CASE WHEN b % 2 = 0 THEN 'snd' ELSE 'rdr' END ORDER BY b)
                                  FROM generate_series(0, 63) b));
-- direct 1-2 has the pair bucket (1 + 2) % 64 = 3: rdr's
SELECT im.direct_conversation(1, 2) AS d \gset
SELECT im.create_conversation('group', ARRAY[1, 2, 3]::bigint[], 2) AS g \gset
SELECT :d % 2 = 1 AS d_on_rdr, :g % 2 = 1 AS g_on_rdr;
SELECT pg_temp.activate(1, 'p1'), pg_temp.activate(3, 'p3');
SELECT msg_seq AS dseq FROM im.send_message(2, :d, 'd1', '{"text": "hi"}') \gset
SELECT message_id AS gm, msg_seq AS gseq FROM im.send_message(2, :g, 'g1', '{"text": "all"}') \gset
SELECT im.run_fanout() > 0 AS fanned_out;
-- the readers ACK, 1 reads both, 3 turned read receipts off and reads
SELECT pg_temp.sync_ack(1, 'p1'), pg_temp.sync_ack(3, 'p3');
SELECT * FROM im.set_read_receipts(3, false);
SELECT read_msg_seq FROM im.report_read(1, :d, :dseq);
SELECT read_msg_seq FROM im.report_read(1, :g, :gseq);
SELECT read_msg_seq FROM im.report_read(3, :g, :gseq);
SELECT im.run_receipts() AS written_here;
-- nothing for sender 2 in rdr's logs: carried, one transfer per pending row
SELECT count(*) AS receipts_here FROM im.private_event WHERE kind = 'receipt' AND user_id = 2;
SELECT t.dest_node, t.conversation_id = :d AS direct, t.outbox_id, t.source_event_id,
       (t.payload->'receipt') - 'parts'::text AS receipt, t.payload->'receipt'->'parts' AS parts
  FROM im.transfer_out t WHERE t.payload ? 'receipt' ORDER BY t.conversation_id = :d DESC;
CREATE TABLE wire AS SELECT * FROM im.transfer_out ORDER BY transfer_id;

-- now node snd
SELECT im.shard_configure('snd', (SELECT array_agg(CASE WHEN b % 2 = 0 THEN 'snd' ELSE 'rdr' END ORDER BY b)
                                  FROM generate_series(0, 63) b));
SET client_min_messages = warning;
TRUNCATE im.conversation, im.event, im.membership_period, im.user_conversation, im.outbox, im.user_head,
         im.inbox, im.push_job, im.transfer_out, im.private_event, im.receipt_pending, im.receipt_source,
         im.receipt_setting, im.device CASCADE;
RESET client_min_messages;
SET session_replication_role = replica;   -- playing the apply worker (transfer_trust.c)
INSERT INTO im.transfer_out SELECT * FROM wire ORDER BY transfer_id;
RESET session_replication_role;
SELECT pg_temp.activate(2, 'p2');
SELECT im.run_fanout() >= 0 AS applied;
SELECT im.run_receipts() AS written;
SELECT im.run_fanout() >= 0 AS fanned_out;
SELECT state, count(*) FROM im.transfer_in GROUP BY 1;
-- the sender's device: direct delivered and read; the group's counts are
-- rdr's part (1 and 3: both delivered, one read that counts) plus snd's own
-- members (none but the sender)
SELECT i.conversation_id = :d AS direct, i.payload FROM im.inbox i
 WHERE i.user_id = 2 AND i.kind = 'receipt' ORDER BY i.sync_seq;
SELECT node_name, delivered_count, read_count, member_count FROM im.receipt_part WHERE message_id = :gm;

-- redelivered: the exact keys again are duplicates; nothing new is emitted
SET session_replication_role = replica;
INSERT INTO im.transfer_out SELECT * FROM wire WHERE payload ? 'receipt' ORDER BY transfer_id;
RESET session_replication_role;
SELECT im.run_fanout() >= 0 AS applied, im.run_receipts() AS written;
SELECT state, duplicates, count(*) FROM im.transfer_in WHERE source_event_id = 0 GROUP BY 1, 2;
-- an older direct receipt and the same part again under new keys: nothing
CREATE FUNCTION pg_temp.carry(tid bigint, conv bigint, receipt jsonb) RETURNS void LANGUAGE sql AS $$
  INSERT INTO im.transfer_out (transfer_id, source_node, dest_node, outbox_id, conversation_id, msg_seq,
                               source_event_id, payload)
  VALUES (tid, 'rdr', 'snd', 0, conv, 1, 0, jsonb_build_object('receipt', receipt)) $$;
SET session_replication_role = replica;
SELECT pg_temp.carry(9000000001, :d, jsonb_build_object('kind', 'direct', 'sender_id', 2, 'reader_id', 1,
                     'delivered_through_seq', 1, 'read_through_seq', 0));
SELECT pg_temp.carry(9000000002, :g, (SELECT payload->'receipt' FROM wire WHERE conversation_id = :g
                                       AND payload ? 'receipt'));
RESET session_replication_role;
SELECT im.run_fanout() >= 0 AS applied, im.run_receipts() AS written;
SELECT user_id, delivered_through_seq, read_through_seq, read_hidden FROM im.receipt_pending
 WHERE conversation_id = :d;
SELECT count(*) AS receipts FROM im.inbox WHERE user_id = 2 AND kind = 'receipt';

-- refused at arrival: a receipt for a sender snd does not place (1 is rdr's)
SET session_replication_role = replica;
SELECT pg_temp.carry(9000000010, :d, jsonb_build_object('kind', 'direct', 'sender_id', 1, 'reader_id', 2,
                     'delivered_through_seq', 5, 'read_through_seq', 5));
SELECT pg_temp.carry(9000000011, :d, '{"kind": "direct"}');
RESET session_replication_role;
-- failing their apply (quarantined, nothing applied), one per check
SET session_replication_role = replica;
SELECT pg_temp.carry(9000000020 + n, c, r) FROM (VALUES
  (1, :d, '{"kind": "someday", "sender_id": 2}'::jsonb),
  (2, :d, '{"kind": "direct", "sender_id": 2, "reader_id": 1, "delivered_through_seq": -1}'),
  (3, :d, '{"kind": "direct", "sender_id": 2, "reader_id": 1, "delivered_through_seq": "x"}'),
  (4, :d, '{"kind": "direct", "sender_id": 2, "reader_id": 4, "delivered_through_seq": 9}'),
  (5, :d, '{"kind": "direct", "sender_id": 2, "reader_id": 3, "delivered_through_seq": 9}'),
  (6, :g, '{"kind": "direct", "sender_id": 2, "reader_id": 1, "delivered_through_seq": 9}'),
  (7, :g, '{"kind": "group", "sender_id": 2, "parts": []}'),
  (8, :g, '{"kind": "group", "sender_id": 2, "parts": {"message_id": 1}}'),
  (9, :g, jsonb_build_object('kind', 'group', 'sender_id', 2, 'parts', jsonb_build_array(jsonb_build_object(
          'message_id', :gm, 'delivered_count', 3, 'read_count', 0, 'member_count', 2)))),
  (10, :g, jsonb_build_object('kind', 'group', 'sender_id', 2, 'parts', jsonb_build_array(jsonb_build_object(
          'message_id', :gm + 1, 'delivered_count', 0, 'read_count', 0, 'member_count', 2)))),
  (11, :d, jsonb_build_object('kind', 'group', 'sender_id', 2, 'parts', jsonb_build_array(jsonb_build_object(
          'message_id', :gm, 'delivered_count', 0, 'read_count', 0, 'member_count', 2))))) v(n, c, r);
RESET session_replication_role;
SELECT im.run_fanout() >= 0 AS applied;
SELECT transfer_id - 9000000020 AS n, state, last_error FROM im.transfer_in
 WHERE transfer_id BETWEEN 9000000021 AND 9000000031 ORDER BY transfer_id;
-- none of them changed a pending row, a part or the sender's log
SELECT user_id, delivered_through_seq, read_through_seq, read_hidden FROM im.receipt_pending
 WHERE conversation_id = :d;
SELECT node_name, delivered_count, read_count, member_count FROM im.receipt_part ORDER BY message_id;
SELECT count(*) AS receipts FROM im.inbox WHERE user_id = 2 AND kind = 'receipt';
SELECT count(*) AS refused FROM im.transfer_refused;
-- maintenance (here gc_inbox) collects the parts a sync window
-- (im_sync.inbox_retention) after their last change, and no newer one
UPDATE im.receipt_part SET updated_at = now() - interval '8 days' WHERE message_id = :gm;
INSERT INTO im.receipt_part (message_id, node_name, sender_id, conversation_id, delivered_count, read_count, member_count)
SELECT message_id, 'fresh', sender_id, conversation_id, delivered_count, read_count, member_count
FROM im.receipt_part WHERE message_id = :gm;
SELECT count(*) AS parts_before FROM im.receipt_part;
SELECT count(*) >= 0 AS ran FROM im.gc_inbox();
SELECT node_name, updated_at > now() - interval '1 day' AS recent FROM im.receipt_part ORDER BY node_name;

\c im_regress
DROP DATABASE im_shard_receipts;
