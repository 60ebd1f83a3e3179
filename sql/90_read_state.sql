-- report_read, delete_for_me, message_status (contract §7, §13).
-- Sequences are pinned so ids in the output are deterministic.
SELECT setval('im.conversation_id_seq', 9000) IS NOT NULL AS pinned,
       setval('im.event_id_seq', 90000) IS NOT NULL AS pinned_events,
       setval('im.membership_period_id_seq', 9000) IS NOT NULL AS pinned_periods;

\i sql/include/err.sql
-- a device installs a snapshot, so it is ACTIVE with a trusted cursor
CREATE FUNCTION pg_temp.activate(u bigint, dev text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE b record; a record;
BEGIN
  PERFORM im.register_device(u, dev);
  SELECT * INTO b FROM im.begin_snapshot(u, dev);
  SELECT * INTO a FROM im.ack_snapshot(u, dev, b.snapshot_token, b.manifest_digest);
  RETURN a.status;
END $$;
-- the user's state row
CREATE FUNCTION pg_temp.state(u bigint, c bigint)
RETURNS TABLE(last_msg_seq bigint, read_msg_seq bigint, unread_count bigint)
LANGUAGE sql AS $$
  SELECT last_msg_seq, read_msg_seq, unread_count FROM im.user_conversation
  WHERE user_id = u AND conversation_id = c $$;

-- 9001 alice (device a1), 9002 bob (phone, laptop, old: revoked), 9003 carol
-- (no device), 9004 never a member
SELECT im.create_conversation('group', ARRAY[9001, 9002, 9003]::bigint[], 9001) AS c \gset
SELECT pg_temp.activate(9001, 'a1'), pg_temp.activate(9002, 'phone'),
       pg_temp.activate(9002, 'laptop'), pg_temp.activate(9002, 'old');
SELECT im.revoke_device(9002, 'old');
SELECT msg_seq FROM im.send_message(9001, :c, 'r-1', '{"text": "one"}');     -- 2
SELECT msg_seq FROM im.send_message(9001, :c, 'r-2', '{"text": "two"}');     -- 3
SELECT msg_seq FROM im.send_message(9001, :c, 'r-3', '{"text": "three"}');   -- 4
SELECT msg_seq FROM im.send_message(9002, :c, 'r-4', '{"text": "mine"}');    -- 5: bob's own
SELECT im.run_fanout() IS NOT NULL AS fanned_out;
SELECT * FROM pg_temp.state(9002, :c);
CREATE TEMP TABLE acks AS SELECT device_id, acked_sync_seq FROM im.device WHERE user_id = 9002;

-- clears only what it covers
SELECT * FROM im.report_read(9002, :c, 3);
-- forward only: a lower cursor changes nothing (no new private event either)
SELECT * FROM im.report_read(9002, :c, 2);
SELECT * FROM pg_temp.state(9002, :c);
-- clamped to the last visible position: a message not fanned out yet (6)
-- is not covered even by a cursor far ahead, and stays unread afterwards
SELECT msg_seq FROM im.send_message(9001, :c, 'r-5', '{"text": "five"}');    -- 6
SELECT * FROM im.report_read(9002, :c, 100);
SELECT im.run_fanout() IS NOT NULL AS fanned_out;
SELECT * FROM pg_temp.state(9002, :c);
SELECT kind, read_msg_seq FROM im.private_event WHERE user_id = 9002 ORDER BY private_event_id;

-- the read cursor reaches the user's log (every device of bob syncs it) ...
SELECT sync_seq, kind, msg_seq, payload FROM im.inbox WHERE user_id = 9002 ORDER BY sync_seq;
-- ... and no device ACK moved (§13.2)
SELECT d.device_id, d.acked_sync_seq = a.acked_sync_seq AS ack_unchanged
FROM im.device d JOIN acks a USING (device_id) WHERE d.user_id = 9002 ORDER BY 1;
-- the other users' cursors are their own
SELECT * FROM pg_temp.state(9003, :c);

-- delete_for_me: carol's unread drops by the deleted message, once
SELECT message_id AS m3 FROM im.event WHERE conversation_id = :c AND msg_seq = 3 \gset
SELECT im.delete_for_me(9003, :c, :m3) AS deleted;
SELECT * FROM pg_temp.state(9003, :c);
SELECT im.delete_for_me(9003, :c, :m3) AS deleted_again;
SELECT * FROM pg_temp.state(9003, :c);
SELECT kind, message_id = :m3 AS is_m3 FROM im.private_event WHERE user_id = 9003;
SELECT im.run_fanout() IS NOT NULL AS fanned_out;
SELECT kind, payload->>'message_id' = :'m3' AS is_m3 FROM im.inbox
WHERE user_id = 9003 AND kind = 'delete_for_me';

-- errors, each changes nothing
SELECT pg_temp.err(format('SELECT im.report_read(9004, %s, 1)', :c)) AS never_member;
SELECT pg_temp.err('SELECT im.report_read(9002, 999999999, 1)') AS unknown_conversation;
SELECT pg_temp.err(format('SELECT im.report_read(9002, %s, NULL)', :c)) AS read_to_null;
SELECT pg_temp.err(format('SELECT im.report_read(9002, %s, -1)', :c)) AS read_to_negative;
SELECT pg_temp.err(format('SELECT im.delete_for_me(9002, %s, 999999999)', :c)) AS delete_unknown;
SELECT pg_temp.err('SELECT im.message_status(999999999)') AS status_unknown;
SELECT * FROM pg_temp.state(9002, :c);

-- message_status: the four facts of §0.1 apart
SELECT message_id AS m7 FROM im.send_message(9001, :c, 'r-7', '{"text": "seven"}') \gset
-- accepted, nothing else (not fanned out); carol has no device, bob's revoked
-- device is not listed; the sender's device is
SELECT * FROM im.message_status(:m7);
SELECT im.run_fanout() IS NOT NULL AS fanned_out;
-- in the sync scope of every recipient, no device has it yet
SELECT * FROM im.message_status(:m7);
-- bob's phone syncs and ACKs: device_synced for the phone only, not read
SELECT sync_generation AS g, server_acked_sync_seq AS a FROM im.device_session(9002, 'phone', 0) \gset
SELECT status, batch_token AS bt, batch_high_watermark AS hw FROM im.sync_changes(9002, 'phone', :g, :a) \gset
SELECT :'status' AS sync_status;
SELECT status FROM im.ack_sync(9002, 'phone', :'bt', :hw);
SELECT * FROM im.message_status(:m7);
-- bob reads on the laptop: user_read for both his devices, the laptop still
-- has not synced
SELECT * FROM im.report_read(9002, :c, 7);
SELECT * FROM im.message_status(:m7) WHERE user_id = 9002;
-- alice deletes it for herself: she no longer sees it (contract §1), so her
-- device is no longer a row; a device revoked later drops out too
SELECT im.delete_for_me(9001, :c, :m7) AS deleted;
SELECT im.revoke_device(9002, 'laptop');
SELECT * FROM im.message_status(:m7);
