-- im.metrics() (contract §8, design doc §18.1, §6.3): Prometheus-style names,
-- help texts, counters, and per-stage latency histograms.  Timestamps below
-- are fixed, so even the latencies are deterministic; ages relative to now()
-- are shown as ranges.  Own database, so other test files cannot leak in.
\set regress_db :DBNAME
CREATE DATABASE im_metrics_test;
\c im_metrics_test
SET client_min_messages = warning;
CREATE EXTENSION im_sync CASCADE;
RESET client_min_messages;

-- empty database: every gauge is 0, every histogram empty.  The *_total
-- counters are cluster-wide shared memory (other tests move them): only
-- their presence and sign are pinned here.
SELECT name, value FROM im.metrics() WHERE name NOT LIKE 'im\_stage\_%' AND name NOT LIKE '%\_total' AND type <> 'histogram' ORDER BY name;
SELECT name, labels, value >= 0 AS counter_ok FROM im.metrics() WHERE name LIKE '%\_total' ORDER BY name, labels::text;
SELECT count(*) AS rows_without_help FROM im.metrics() WHERE help IS NULL OR help = '';
SELECT count(*) AS non_zero FROM im.metrics() WHERE value <> 0 AND name NOT LIKE '%\_total';

-- A world with known timestamps (group 100, members 10 and 20):
--   msg 1001 accepted at :00.000, fanned out at :00.020 (20 ms), in both logs at :00.020;
--   msg 1002 accepted at :01.000, fanned out at :03.000 (2 s);
--   msg 1003 pending for 100 s, msg 1004 pending and backing off, msg 1005 dead.
INSERT INTO im.conversation (conversation_id, kind, head_msg_seq) VALUES (100, 'group', 5);
INSERT INTO im.event (message_id, conversation_id, msg_seq, kind, sender_id, client_msg_id, body, mode)
SELECT 1000 + s, 100, s, 'message', 10, 'c' || s, '{}', 'fanout' FROM generate_series(1, 5) s;
INSERT INTO im.outbox (outbox_id, conversation_id, msg_seq, source_event_id, state, created_at, processed_at, next_attempt_at) VALUES
  (1, 100, 1, 1001, 'done', '2026-01-01 00:00:00+00', '2026-01-01 00:00:00.02+00', '2026-01-01 00:00:00+00'),
  (2, 100, 2, 1002, 'done', '2026-01-01 00:00:01+00', '2026-01-01 00:00:03+00', '2026-01-01 00:00:01+00'),
  (3, 100, 3, 1003, 'pending', now() - interval '100 s', NULL, now() - interval '100 s'),
  (4, 100, 4, 1004, 'pending', now() - interval '50 s', NULL, now() + interval '1 h'),
  (5, 100, 5, 1005, 'dead', now(), NULL, now());
INSERT INTO im.fanout_quarantine (outbox_id, user_id, periods) VALUES (2, 20, '{1,2}');
INSERT INTO im.user_head (user_id, high_watermark, gc_floor) VALUES (10, 2, 0), (20, 1501, 1499), (30, 1200, 0);
INSERT INTO im.inbox (user_id, sync_seq, source_event_id, delivery_scope, conversation_id, msg_seq, kind, created_at) VALUES
  (10, 1, 1001, 1, 100, 1, 'message', '2026-01-01 00:00:00.02+00'),
  (10, 2, 1002, 1, 100, 2, 'message', '2026-01-01 00:00:03+00'),
  (20, 1500, 1001, 2, 100, 1, 'message', '2026-01-01 00:00:00.02+00'),
  (20, 1501, 1002, 2, 100, 2, 'message', '2026-01-01 00:00:03+00');
-- device ACKs: 10/phone acked sync 2 0.4 s after it was written; 30/old is 1200 behind;
-- 30/gone is revoked (never "behind")
INSERT INTO im.device (user_id, device_id, state, acked_sync_seq, acked_at) VALUES
  (10, 'phone', 'ACTIVE', 2, '2026-01-01 00:00:03.4+00'),
  (20, 'pad', 'ACTIVE', 1500, '2026-01-01 00:01:00.02+00'),
  (30, 'old', 'ACTIVE', 0, NULL),
  (30, 'gone', 'REVOKED', 0, NULL);
INSERT INTO im.recovery_session (user_id, device_id, sync_generation, resume_from, batch_high_watermark, created_at, expires_at) VALUES
  (10, 'phone', 2, 1, 2, now() - interval '30 s', now() + interval '10 min');
INSERT INTO im.snapshot (user_id, device_id, sync_generation, base_sync_seq, page_count, manifest_digest, state, expires_at) VALUES
  (20, 'pad', 3, 1501, 1, 'x', 'READY', now() + interval '1 h'),
  (20, 'pad', 2, 1500, 1, 'x', 'READY', now() - interval '1 s'),
  (20, 'pad', 4, 1501, 1, 'x', 'BUILDING', now() + interval '1 h');

SELECT name, value FROM im.metrics()
WHERE name NOT LIKE 'im\_stage\_%' AND name NOT LIKE '%age\_seconds' AND name <> 'im_fanout_lag_seconds'
  AND name NOT LIKE '%\_total' AND type <> 'histogram'
ORDER BY name;
-- fanout amplification: items 1 and 2 have two rows each
SELECT name, labels, value FROM im.metrics() WITH ORDINALITY m(name, value, help, type, labels, ord)
WHERE name LIKE 'im\_fanout\_amplification\_%' ORDER BY ord;
-- ages are relative to now(): the oldest pending item is 100 s old; only
-- item 3 is ready to run (item 4 waits for its backoff), so the lag is 100 s too
SELECT name, value BETWEEN 100 AND 150 AS about_100s FROM im.metrics()
WHERE name IN ('im_outbox_oldest_pending_age_seconds', 'im_fanout_lag_seconds') ORDER BY name;
SELECT name, value BETWEEN 30 AND 80 AS about_30s FROM im.metrics()
WHERE name = 'im_recovery_session_oldest_age_seconds';

-- histograms: cumulative buckets, +Inf = _count, _sum; each stage named
SELECT name, labels, value FROM im.metrics() WITH ORDINALITY m(name, value, help, type, labels, ord)
WHERE name LIKE 'im\_stage\_%' ORDER BY ord;
SELECT DISTINCT regexp_replace(name, '_(bucket|sum|count)$', '') AS histogram, help
FROM im.metrics() WHERE name LIKE 'im\_stage\_%' ORDER BY 1;

-- a stage that can only grow: buckets are cumulative (never decrease)
SELECT count(*) AS non_monotonic FROM (
  SELECT value < lag(value) OVER (PARTITION BY name ORDER BY ord) AS bad
  FROM im.metrics() WITH ORDINALITY m(name, value, help, type, labels, ord) WHERE name LIKE '%\_bucket') x
WHERE bad;

\c :regress_db
DROP DATABASE im_metrics_test;
