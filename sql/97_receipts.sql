-- receipts (contract §20): cumulative delivered/read receipts in direct
-- conversations, coalesced counts per message in fanout groups, none in
-- shared_log groups, set_read_receipts, the private event's shape.
SELECT setval('im.conversation_id_seq', 9300) IS NOT NULL AS pinned,
       setval('im.event_id_seq', 93000) IS NOT NULL AS pinned_events,
       setval('im.membership_period_id_seq', 9300) IS NOT NULL AS pinned_periods;

\i sql/include/err.sql
CREATE FUNCTION pg_temp.activate(u bigint, dev text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE b record; a record;
BEGIN
  PERFORM im.register_device(u, dev);
  SELECT * INTO b FROM im.begin_snapshot(u, dev);
  SELECT * INTO a FROM im.ack_snapshot(u, dev, b.snapshot_token, b.manifest_digest);
  RETURN a.status;
END $$;
-- a device syncs everything it has and ACKs it
CREATE FUNCTION pg_temp.sync_ack(u bigint, dev text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE s record; p record;
BEGIN
  SELECT * INTO s FROM im.device_session(u, dev, 0);
  SELECT * INTO p FROM im.sync_changes(u, dev, s.sync_generation, s.server_acked_sync_seq);
  RETURN (SELECT status FROM im.ack_sync(u, dev, p.batch_token, p.batch_high_watermark));
END $$;
-- the receipts in a user's log, oldest first
CREATE FUNCTION pg_temp.receipts(u bigint) RETURNS TABLE(conversation_id bigint, payload jsonb)
LANGUAGE sql AS $$
  SELECT i.conversation_id, i.payload FROM im.inbox i
  WHERE i.user_id = u AND i.kind = 'receipt' ORDER BY i.sync_seq $$;

SET im_sync.receipt_interval = 0;
-- what earlier tests' ACKs and reads queued
SELECT im.run_receipts() >= 0 AS drained, im.run_fanout() IS NOT NULL AS fanned_out;

-- ---- direct: 9301 alice (a1), 9302 bob (phone, laptop)
SELECT im.create_conversation('direct', ARRAY[9301, 9302]::bigint[], 9301) AS d \gset
SELECT pg_temp.activate(9301, 'a1'), pg_temp.activate(9302, 'phone'),
       pg_temp.activate(9302, 'laptop');
SELECT msg_seq FROM im.send_message(9301, :d, 'd-1', '{"text": "one"}');
SELECT msg_seq FROM im.send_message(9301, :d, 'd-2', '{"text": "two"}');
SELECT im.run_fanout() IS NOT NULL AS fanned_out;
-- nothing ACKed or read yet: no receipt
SELECT im.run_receipts() AS written;
-- bob's phone ACKs: delivered through the newest position it covers
SELECT pg_temp.sync_ack(9302, 'phone');
SELECT count(*) AS queued FROM im.receipt_source;
SELECT im.run_receipts() AS written;
SELECT im.run_fanout() IS NOT NULL AS fanned_out;
SELECT * FROM pg_temp.receipts(9301);
-- bob's laptop ACKs the same: delivered does not move, no new receipt
SELECT pg_temp.sync_ack(9302, 'laptop');
SELECT im.run_receipts() AS written;
-- bob reads (99 is clamped to his last position, 3): read_through_seq
SELECT read_msg_seq FROM im.report_read(9302, :d, 99);
SELECT im.run_receipts() AS written;
SELECT im.run_fanout() IS NOT NULL AS fanned_out;
SELECT * FROM pg_temp.receipts(9301);
-- a lower read report changes nothing and queues nothing
SELECT read_msg_seq FROM im.report_read(9302, :d, 1);
SELECT count(*) AS queued FROM im.receipt_source;

-- the private event as a device syncs it (contract §11 shape + §20 keys)
SELECT sync_generation AS g, server_acked_sync_seq AS a FROM im.device_session(9301, 'a1', 0) \gset
SELECT jsonb_agg(ev - 'sync_seq') AS events
FROM im.sync_changes(9301, 'a1', :g, :a) s, jsonb_array_elements(s.events) ev
WHERE ev->>'kind' = 'receipt';

-- bob's receipt about alice goes to bob: alice's device ACKs
SELECT pg_temp.sync_ack(9301, 'a1');
SELECT im.run_receipts() AS written;
SELECT im.run_fanout() IS NOT NULL AS fanned_out;
SELECT * FROM pg_temp.receipts(9302);

-- ---- set_read_receipts: bob off reports delivery but no read state
SELECT * FROM im.set_read_receipts(9302, false);
SELECT msg_seq FROM im.send_message(9301, :d, 'd-3', '{"text": "three"}');
SELECT im.run_fanout() IS NOT NULL AS fanned_out;
SELECT pg_temp.sync_ack(9302, 'phone');
SELECT read_msg_seq FROM im.report_read(9302, :d, 4);
SELECT im.run_receipts() AS written;
SELECT im.run_fanout() IS NOT NULL AS fanned_out;
SELECT * FROM pg_temp.receipts(9301) OFFSET 2;
SELECT * FROM im.set_read_receipts(9302, true, 'trace-on');
SELECT pg_temp.err('SELECT * FROM im.set_read_receipts(9302, NULL)') AS null_enabled;
SELECT pg_temp.err('SELECT * FROM im.set_read_receipts(0, true)') AS bad_user;

-- ---- fanout group: 9303 carol sends; 9304 dan (d1), 9305 erin (e1),
-- 9306 frank (no device)
SELECT im.create_conversation('group', ARRAY[9303, 9304, 9305, 9306]::bigint[], 9303) AS g \gset
SELECT pg_temp.activate(9303, 'c1'), pg_temp.activate(9304, 'd1'), pg_temp.activate(9305, 'e1');
SELECT message_id AS m1 FROM im.send_message(9303, :g, 'g-1', '{"text": "hi all"}') \gset
SELECT message_id AS m2 FROM im.send_message(9303, :g, 'g-2', '{"text": "again"}') \gset
SELECT message_id AS mdan FROM im.send_message(9304, :g, 'g-3', '{"text": "dan here"}') \gset
SELECT im.run_fanout() IS NOT NULL AS fanned_out;
SELECT pg_temp.sync_ack(9304, 'd1');
SELECT im.run_receipts() AS written;
SELECT im.run_fanout() IS NOT NULL AS fanned_out;
-- one receipt per message of carol's that dan's ACK covered; dan's own
-- message has no receipt for carol (its receipts go to dan)
SELECT payload - 'message_id' AS counts, (payload->>'message_id')::bigint = :m1 AS is_m1
FROM pg_temp.receipts(9303);
SELECT count(*) AS dan_receipts FROM pg_temp.receipts(9304);

-- coalescing: with an interval, two reads within it give one event
SET im_sync.receipt_interval = '1h';
SELECT read_msg_seq FROM im.report_read(9304, :g, 2);
SELECT im.run_receipts() AS written_within_interval;
SELECT read_msg_seq FROM im.report_read(9305, :g, 2);
SELECT im.run_receipts() AS written_within_interval;
-- the interval passes (the stored time moves back by it)
UPDATE im.receipt_pending SET emitted_at = emitted_at - interval '1h' WHERE user_id = 9303;
SELECT im.run_receipts() AS written_after_interval;
SELECT im.run_fanout() IS NOT NULL AS fanned_out;
SELECT payload - 'message_id' AS counts, (payload->>'message_id')::bigint = :m1 AS is_m1
FROM pg_temp.receipts(9303) OFFSET 1;
-- the counts are message_facts' (contract §7) counted
SELECT count(*) AS member_count,
       count(*) FILTER (WHERE any_device_synced) AS delivered_count,
       count(*) FILTER (WHERE user_read) AS read_count
FROM im.message_facts(9303, :m1);
-- a group switched to shared_log while its receipt waits for the interval
-- gets none (the pending row is cleaned)
SELECT pg_temp.sync_ack(9305, 'e1');
-- (1: dan's message, whose first receipt goes at once; carol's waits)
SELECT im.run_receipts() AS written_within_interval;
SELECT im.set_conversation_mode(:g, 'shared_log');
UPDATE im.receipt_pending SET emitted_at = emitted_at - interval '1h' WHERE user_id = 9303;
SELECT im.run_receipts() AS written_after_switch;
SELECT dirty FROM im.receipt_pending WHERE user_id = 9303 AND conversation_id = :g;
SET im_sync.receipt_interval = 0;

-- ---- shared_log group: no receipts at all
SELECT im.create_conversation('group', ARRAY[9303, 9304]::bigint[], 9303) AS s \gset
SELECT im.set_conversation_mode(:s, 'shared_log');
SELECT msg_seq FROM im.send_message(9303, :s, 's-1', '{"text": "big"}');
SELECT im.run_fanout() IS NOT NULL AS fanned_out;
SELECT pg_temp.sync_ack(9304, 'd1');
SELECT read_msg_seq FROM im.report_read(9304, :s, 2);
SELECT im.run_receipts() AS written;
SELECT count(*) AS shared_log_receipts FROM im.private_event
WHERE kind = 'receipt' AND conversation_id = :s;
SELECT count(*) AS pending_rows FROM im.receipt_pending WHERE conversation_id = :s;

SELECT pg_temp.err('SELECT im.run_receipts(0)') AS bad_max_rows;
RESET im_sync.receipt_interval;
