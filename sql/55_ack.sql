-- ack_sync (contract §5, §8.3): every status, monotone ACK, recovery
-- completion.  Users 5501..5599 belong to this file.
\i sql/include/fails.sql
\i sql/include/sync_helpers.sql

SELECT im.create_conversation('group', ARRAY[5501, 5502]::bigint[], 5502) AS c \gset
SELECT im.run_fanout() > 0 AS delivered;
SELECT * FROM im.register_device(5501, 'a');
SELECT * FROM im.register_device(5501, 'b');
SELECT * FROM im.register_device(5502, 'a');
SELECT * FROM pg_temp.activate(5501, 'a');
SELECT * FROM pg_temp.activate(5501, 'b');
SELECT * FROM pg_temp.activate(5502, 'a');
SELECT count(*) FROM generate_series(1, 6) i,
       LATERAL im.send_message(5502, :c, 's55-m' || i, jsonb_build_object('t', 'm' || i));
SELECT im.run_fanout() > 0 AS delivered;
SELECT * FROM pg_temp.dev(5501, 'a');

-- a batch (1, 7]; ACKs move forward only
SELECT * FROM pg_temp.sync('k1', 5501, 'a', 2, 1);
SELECT * FROM pg_temp.ack(5501, 'a', 'k1', 4);
SELECT * FROM pg_temp.ack(5501, 'a', 'k1', 3);
SELECT * FROM pg_temp.ack(5501, 'a', 'k1', 4);
SELECT * FROM pg_temp.ack(5501, 'a', 'k1', 0);
-- BEYOND_WATERMARK: above the token's batch watermark, nothing moves
SELECT * FROM pg_temp.ack(5501, 'a', 'k1', 8);
SELECT * FROM pg_temp.ack(5501, 'a', 'k1', 7);
SELECT * FROM pg_temp.dev(5501, 'a');
SELECT acked_at IS NOT NULL AS acked_at_set FROM im.device WHERE user_id = 5501 AND device_id = 'a';
-- a later batch's lower ACK never moves it back
SELECT * FROM pg_temp.sync('k2', 5501, 'a', 2, 7);
SELECT * FROM pg_temp.ack(5501, 'a', 'k2', 5);

-- bad arguments: 22023 / P0002
SELECT * FROM pg_temp.fails(format('SELECT * FROM im.ack_sync(5501, %L, %L, NULL)', 'a', (SELECT tb FROM tok WHERE k = 'k1')));
SELECT * FROM pg_temp.fails(format('SELECT * FROM im.ack_sync(5501, %L, %L, -1)', 'a', (SELECT tb FROM tok WHERE k = 'k1')));
SELECT * FROM pg_temp.fails($$SELECT * FROM im.ack_sync(5501, 'nope', 'x', 1)$$);
SELECT * FROM pg_temp.fails($$SELECT * FROM im.ack_sync(5501, '', 'x', 1)$$);

-- INVALID_TOKEN: malformed, tampered, a cursor, a device token, another
-- device's or another user's batch token
SELECT * FROM pg_temp.sync('kc', 5501, 'b', 2, 1, 1);
SELECT * FROM pg_temp.sync('kb', 5501, 'b', 2, 1);
SELECT * FROM pg_temp.sync('ku', 5502, 'a', 2, 1);
SELECT * FROM im.ack_sync(5501, 'a', NULL, 1);
SELECT * FROM im.ack_sync(5501, 'a', 'garbage', 1);
SELECT * FROM im.ack_sync(5501, 'a', (SELECT overlay(tb PLACING CASE WHEN substr(tb, 9, 1) = 'x' THEN 'y' ELSE 'x' END FROM 9 FOR 1) FROM tok WHERE k = 'k1'), 7);
SELECT * FROM im.ack_sync(5501, 'b', (SELECT tc FROM tok WHERE k = 'kc'), 1);
SELECT * FROM im.ack_sync(5501, 'a', im.issue_device_token(5501, 'a'), 1);
SELECT * FROM pg_temp.ack(5501, 'a', 'kb', 7);
SELECT * FROM pg_temp.ack(5501, 'a', 'ku', 7);
-- flip every character of a batch token: always INVALID_TOKEN, ACK unchanged
SELECT count(*) FILTER (WHERE a.status = 'INVALID_TOKEN') AS refused, count(*) AS variants,
       max(a.acked_sync_seq) AS ack_after
  FROM tok t, generate_series(1, length(t.tb)) i,
       LATERAL im.ack_sync(5501, 'b',
           overlay(t.tb PLACING CASE WHEN substr(t.tb, i, 1) = 'A' THEN 'B' ELSE 'A' END FROM i FOR 1), 7) a
 WHERE t.k = 'kb';
SELECT * FROM pg_temp.ack(5501, 'b', 'kb', 7);

-- STALE_GENERATION: a bump kills the token; counted in im.metrics()
SELECT value AS stale_before FROM im.metrics() WHERE name = 'im_stale_generation_acks_total' \gset
SELECT * FROM pg_temp.sync('k3', 5501, 'a', 2, 7);
SELECT * FROM pg_temp.sync('r5', 5501, 'a', 2, 99);
SELECT * FROM pg_temp.ack(5501, 'a', 'k3', 7);
-- the common checks come first: stale and beyond → STALE_GENERATION
SELECT * FROM pg_temp.ack(5501, 'a', 'k3', 100);
SELECT value - :stale_before AS stale_acks_counted
  FROM im.metrics() WHERE name = 'im_stale_generation_acks_total';
SELECT * FROM pg_temp.dev(5501, 'a');

-- EXPIRED
SELECT * FROM pg_temp.activate(5501, 'a');
SELECT sync_generation AS g FROM im.device WHERE user_id = 5501 AND device_id = 'a' \gset
SET im_sync.token_ttl = 0;
SELECT * FROM pg_temp.sync('kx', 5501, 'a', :g, 7);
RESET im_sync.token_ttl;
SELECT * FROM pg_temp.ack(5501, 'a', 'kx', 7);

-- recovery batch: below the watermark OK without change; the watermark
-- completes the session (ACTIVE, ACK = max(ACK, watermark)); repeat is OK
SELECT count(*) FROM generate_series(7, 8) i,
       LATERAL im.send_message(5502, :c, 's55-m' || i, jsonb_build_object('t', 'm' || i));
SELECT im.run_fanout() > 0 AS delivered;
SELECT * FROM pg_temp.sync('rc', 5501, 'a', 1, 3);
SELECT * FROM pg_temp.dev(5501, 'a');
SELECT * FROM pg_temp.ack(5501, 'a', 'rc', 5);
SELECT * FROM pg_temp.ack(5501, 'a', 'rc', 10);
SELECT * FROM pg_temp.dev(5501, 'a');
SELECT * FROM pg_temp.ack(5501, 'a', 'rc', 9);
SELECT * FROM pg_temp.dev(5501, 'a');
SELECT state FROM im.recovery_session WHERE user_id = 5501 AND device_id = 'a';
SELECT * FROM pg_temp.ack(5501, 'a', 'rc', 9);
SELECT * FROM pg_temp.ack(5501, 'a', 'rc', 4);
-- the device goes on from its ACK in the same generation
SELECT sync_generation AS g FROM im.device WHERE user_id = 5501 AND device_id = 'a' \gset
SELECT * FROM pg_temp.sync('after', 5501, 'a', :g, 9);

-- RESET_REQUIRED: a recovery token whose session ended without completing.
-- Through the API a session only ends with a generation bump (STALE_GENERATION
-- comes first) or by expiring (EXPIRED comes first: its tokens expire no
-- later than the session), so the state is forced here.
SELECT * FROM pg_temp.sync('rd', 5501, 'a', 1, 6);
UPDATE im.recovery_session SET state = 'EXPIRED', ended_at = now()
 WHERE user_id = 5501 AND device_id = 'a' AND state = 'ACTIVE';
SELECT * FROM pg_temp.ack(5501, 'a', 'rd', 9);
SELECT * FROM pg_temp.dev(5501, 'a');

-- DEVICE_REVOKED comes before the generation check
SELECT im.revoke_device(5501, 'b');
SELECT * FROM pg_temp.ack(5501, 'b', 'kb', 7);
SELECT * FROM im.register_device(5501, 'b');
SELECT * FROM pg_temp.ack(5501, 'b', 'kb', 7);
