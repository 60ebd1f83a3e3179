-- gc_inbox and its fence (contract §8): device ACKs, recovery leases,
-- snapshot bases, the retention window; a device left behind gets
-- RESET_REQUIRED, never a gap.  Users 6001..6099 belong to this file.
-- gc_inbox works on every user, so each case runs in a transaction that is
-- rolled back (the regression database is shared by every test file).
\i sql/include/fails.sql
\i sql/include/sync_helpers.sql

SELECT im.create_conversation('group', ARRAY[6001, 6002, 6003]::bigint[], 6002) AS c \gset
SELECT im.run_fanout() > 0 AS delivered;
SELECT * FROM im.register_device(6001, 'a');
SELECT * FROM im.register_device(6001, 'b');
SELECT * FROM im.register_device(6001, 'n');
SELECT * FROM im.register_device(6003, 's');
SELECT * FROM im.register_device(6003, 't');
SELECT * FROM pg_temp.activate(6001, 'a');
SELECT * FROM pg_temp.activate(6001, 'b');
SELECT count(*) FROM generate_series(1, 2) i,
       LATERAL im.send_message(6002, :c, 's60-m' || i, jsonb_build_object('t', 'm' || i));
SELECT im.run_fanout() > 0 AS delivered;
-- 6003/s: a snapshot at base 3, never acknowledged (READY, holds the log)
SELECT status, base_sync_seq FROM im.begin_snapshot(6003, 's');
SELECT count(*) FROM generate_series(3, 10) i,
       LATERAL im.send_message(6002, :c, 's60-m' || i, jsonb_build_object('t', 'm' || i));
SELECT im.run_fanout() > 0 AS delivered;
SELECT * FROM pg_temp.activate(6003, 't');
-- 6001: a ACKs 8, b ACKs 5
SELECT * FROM pg_temp.sync('a1', 6001, 'a', 2, 1);
SELECT * FROM pg_temp.ack(6001, 'a', 'a1', 8);
SELECT * FROM pg_temp.sync('b1', 6001, 'b', 2, 1);
SELECT * FROM pg_temp.ack(6001, 'b', 'b1', 5);
SELECT user_id, device_id, state, sync_generation, acked_sync_seq FROM im.device
 WHERE user_id IN (6001, 6003) ORDER BY 1, 2;
SELECT user_id, high_watermark, gc_floor FROM im.user_head WHERE user_id IN (6001, 6003) ORDER BY 1;

-- the retention window (default 7 days) holds everything here
SELECT * FROM im.gc_inbox() WHERE user_id IN (6001, 6003);

-- 1. device ACKs and snapshot bases hold the fence; NEW devices do not
BEGIN;
SET LOCAL im_sync.inbox_retention = 0;
SELECT value AS gc_before FROM im.metrics() WHERE name = 'im_gc_deleted_total' \gset
CREATE TEMP TABLE g1 AS SELECT * FROM im.gc_inbox();
SELECT * FROM g1 WHERE user_id IN (6001, 6003) ORDER BY user_id;
SELECT user_id, gc_floor, (SELECT min(sync_seq) FROM im.inbox i WHERE i.user_id = h.user_id) AS oldest_kept
  FROM im.user_head h WHERE user_id IN (6001, 6003) ORDER BY 1;
-- counted (shared memory) only when the deleting transaction commits, and
-- this one is rolled back: nothing yet (63_gc_counted_at_commit)
SELECT value - :gc_before AS counted_before_commit
  FROM im.metrics() WHERE name = 'im_gc_deleted_total';
-- nobody is left behind: b resumes from its ACK
SELECT * FROM pg_temp.sync('b2', 6001, 'b', 2, 5);
-- a second run finds nothing new
SELECT * FROM im.gc_inbox() WHERE user_id IN (6001, 6003);
ROLLBACK;

-- 2. a device silent longer than device_inactive_after no longer holds:
-- its next sync is RESET_REQUIRED (rule 6), never a gap
BEGIN;
SET LOCAL im_sync.inbox_retention = 0;
SET LOCAL im_sync.device_inactive_after = 0;
SELECT * FROM im.gc_inbox() WHERE user_id IN (6001, 6003) ORDER BY user_id;
SELECT * FROM pg_temp.sync('b3', 6001, 'b', 2, 5);
SELECT * FROM pg_temp.dev(6001, 'b');
ROLLBACK;

-- 3. a RESETTING device does not hold (it will snapshot)
BEGIN;
SET LOCAL im_sync.inbox_retention = 0;
SELECT * FROM pg_temp.sync('r5', 6001, 'b', 2, 99);
SELECT * FROM im.gc_inbox() WHERE user_id = 6001;
ROLLBACK;

-- 4. a recovery session's lease holds (resume_from) ...
BEGIN;
SET LOCAL im_sync.inbox_retention = 0;
SELECT * FROM pg_temp.sync('rc', 6001, 'a', 2, 2);
SELECT * FROM im.gc_inbox() WHERE user_id = 6001;
SELECT * FROM pg_temp.sync('rc2', 6001, 'a', 3, 2);
ROLLBACK;
-- ... until it expires: then the range goes and the device must reset
BEGIN;
SET LOCAL im_sync.inbox_retention = 0;
SET LOCAL im_sync.recovery_ttl = 0;
SELECT * FROM pg_temp.sync('rx', 6001, 'a', 2, 2);
SELECT * FROM im.gc_inbox() WHERE user_id = 6001;
SELECT * FROM pg_temp.sync('rx2', 6001, 'a', 3, 2);
SELECT * FROM pg_temp.dev(6001, 'a');
ROLLBACK;

-- 5. an expired or abandoned snapshot no longer holds
BEGIN;
SET LOCAL im_sync.inbox_retention = 0;
UPDATE im.snapshot SET expires_at = now() - interval '1 second' WHERE user_id = 6003;
SELECT * FROM im.gc_inbox() WHERE user_id = 6003;
ROLLBACK;
BEGIN;
SET LOCAL im_sync.inbox_retention = 0;
SELECT im.revoke_device(6003, 's');
SELECT * FROM im.gc_inbox() WHERE user_id = 6003;
ROLLBACK;

-- 6. 游标过期: a cursor whose rest of the batch was collected answers
-- RESET_REQUIRED, never a page with a gap
BEGIN;
SET LOCAL im_sync.inbox_retention = 0;
SET LOCAL im_sync.device_inactive_after = 0;
SELECT * FROM pg_temp.sync('p1', 6001, 'b', 2, 5, 2);
SELECT * FROM im.gc_inbox() WHERE user_id = 6001;
SELECT * FROM pg_temp.page('p2', 6001, 'b', 'p1', 2);
SELECT * FROM pg_temp.dev(6001, 'b');
ROLLBACK;

-- 6b. only part of the rest collected (a, seen lately, holds the log at its
-- ACK 8): rows remain after the cursor, but behind a hole, so the page
-- (read without locks, sync.c) is RESET_REQUIRED too, never 9..11
BEGIN;
SET LOCAL im_sync.inbox_retention = 0;
SET LOCAL im_sync.device_inactive_after = 3600;
SELECT * FROM pg_temp.sync('p1', 6001, 'b', 2, 5, 2);
UPDATE im.device SET last_seen_at = now() - interval '2 hours' WHERE user_id = 6001 AND device_id = 'b';
SELECT * FROM im.gc_inbox() WHERE user_id = 6001;
SELECT * FROM pg_temp.page('p2', 6001, 'b', 'p1', 2);
SELECT * FROM pg_temp.dev(6001, 'b');
ROLLBACK;

-- 7. the retention window: events younger than inbox_retention stay
BEGIN;
SET LOCAL im_sync.inbox_retention = 0;
SET LOCAL im_sync.device_inactive_after = 0;
UPDATE im.inbox SET created_at = now() - interval '2 hours' WHERE user_id = 6001 AND sync_seq <= 4;
SET LOCAL im_sync.inbox_retention = '1h';
SELECT * FROM im.gc_inbox() WHERE user_id = 6001;
ROLLBACK;
