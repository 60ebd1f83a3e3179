-- Snapshots do not need their rows for ever: once
-- retention (maintenance) has collected a snapshot, a still-valid token
-- answers EXPIRED from fetch_snapshot and ack_snapshot instead of an
-- internal error, and a repeated ack of an installed snapshot stays OK.
-- The cut itself (S and every item from one MVCC snapshot, no head lock)
-- is shown by the isolation spec snapshot_cut.
SELECT im.create_conversation('group', ARRAY[7201, 7202]::bigint[], 7202) AS c \gset
SELECT msg_seq FROM im.send_message(7202, :c, 'sc-1', '{"t": "one"}');
SELECT state FROM im.register_device(7201, 'phone');
SELECT state FROM im.register_device(7201, 'tablet');
SELECT im.run_fanout() > 0 AS fanned_out;

-- phone: installed, then its snapshot is collected
SELECT snapshot_id AS s1, snapshot_token AS t1, manifest_digest AS d1, base_sync_seq AS b1
FROM im.begin_snapshot(7201, 'phone') \gset
SELECT status, acked_sync_seq = :b1 AS ack_is_base FROM im.ack_snapshot(7201, 'phone', :'t1', :'d1');
DELETE FROM im.snapshot WHERE snapshot_id = :s1;
SELECT status, page, items FROM im.fetch_snapshot(7201, 'phone', :'t1', 0);
SELECT status, acked_sync_seq = :b1 AS ack_is_base FROM im.ack_snapshot(7201, 'phone', :'t1', :'d1');
SELECT state, acked_sync_seq = :b1 AS ack_is_base FROM im.device WHERE user_id = 7201 AND device_id = 'phone';

-- tablet: collected before it was installed; it stays RESETTING and must
-- begin again
SELECT snapshot_id AS s2, snapshot_token AS t2, manifest_digest AS d2
FROM im.begin_snapshot(7201, 'tablet') \gset
DELETE FROM im.snapshot WHERE snapshot_id = :s2;
SELECT status, page FROM im.fetch_snapshot(7201, 'tablet', :'t2', 0);
SELECT status, acked_sync_seq FROM im.ack_snapshot(7201, 'tablet', :'t2', :'d2');
SELECT state, acked_sync_seq FROM im.device WHERE user_id = 7201 AND device_id = 'tablet';
SELECT status FROM im.sync_changes(7201, 'tablet', NULL, 0);

-- a user who never had anything: S = 0 and one empty page, no head needed
SELECT state FROM im.register_device(7203, 'phone');
SELECT status, base_sync_seq, page_count FROM im.begin_snapshot(7203, 'phone');
