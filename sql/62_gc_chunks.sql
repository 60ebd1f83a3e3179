-- gc_inbox(max_users) in chunks (contract §8).  Users
-- 6201..6299.  Own database, so the chunks see only these users.  A chunk
-- holds the head locks of its own users only (the isolation spec
-- gc_chunk_lock shows fanout to another user is not blocked); calls resume
-- after the last user the previous chunk reached and wrap around.
\set regress_db :DBNAME
CREATE DATABASE im_gc_chunks_test;
\c im_gc_chunks_test
SET client_min_messages = warning;
CREATE EXTENSION im_sync CASCADE;
RESET client_min_messages;
\i sql/include/fails.sql
\i sql/include/sync_helpers.sql

SELECT im.create_conversation('group', ARRAY[6201, 6202, 6203, 6204, 6205]::bigint[], 6201) AS c \gset
SELECT im.run_fanout() > 0 AS delivered;
-- 6203's device ACKs 1 (the create event): it holds that user's fence
SELECT * FROM im.register_device(6203, 'a');
SELECT * FROM pg_temp.activate(6203, 'a');
SELECT count(*) FROM generate_series(1, 3) i,
       LATERAL im.send_message(6201, :c, 's62-m' || i, jsonb_build_object('t', 'm' || i));
SELECT im.run_fanout() > 0 AS delivered;
SELECT user_id, high_watermark, gc_floor FROM im.user_head ORDER BY user_id;

-- max_users must be positive
SELECT * FROM pg_temp.fails('SELECT * FROM im.gc_inbox(0)');
SELECT * FROM pg_temp.fails('SELECT * FROM im.gc_inbox(-1)');

SET im_sync.inbox_retention = 0;
-- three calls of at most 2 users collect all five, in user order; the
-- cursor is the last user a chunk reached (0: the round is over)
SELECT * FROM im.gc_inbox(2) ORDER BY user_id;
SELECT value AS cursor FROM im.maintenance_state WHERE name = 'gc_cursor';
SELECT * FROM im.gc_inbox(2) ORDER BY user_id;
SELECT value AS cursor FROM im.maintenance_state WHERE name = 'gc_cursor';
SELECT * FROM im.gc_inbox(2) ORDER BY user_id;
SELECT value AS cursor FROM im.maintenance_state WHERE name = 'gc_cursor';
-- the fence held: 6203 keeps everything after its device's ACK
SELECT user_id, high_watermark, gc_floor,
       (SELECT min(sync_seq) FROM im.inbox i WHERE i.user_id = h.user_id) AS oldest_kept
  FROM im.user_head h ORDER BY user_id;
SELECT status, events FROM pg_temp.sync('a1', 6203, 'a', (SELECT gen FROM pg_temp.dev(6203, 'a')), 1);
-- a fourth call only visits 6203 (its device ACKed no more): nothing to collect
SELECT * FROM im.gc_inbox(2);

-- new traffic: the chunks wrap around and collect it again
SELECT count(*) FROM im.send_message(6202, :c, 's62-m4', '{"t": "m4"}');
SELECT im.run_fanout() > 0 AS delivered;
SELECT * FROM pg_temp.ack(6203, 'a', 'a1', 4);
SELECT * FROM im.gc_inbox(3) ORDER BY user_id;
SELECT * FROM im.gc_inbox(3) ORDER BY user_id;
SELECT value AS cursor FROM im.maintenance_state WHERE name = 'gc_cursor';
-- 6203's device ACKed 4 of 5: its fence stops at 4
SELECT user_id, gc_floor FROM im.user_head ORDER BY user_id;

-- NULL: every user in one call (the cursor is left alone)
SELECT count(*) FROM im.send_message(6202, :c, 's62-m5', '{"t": "m5"}');
SELECT im.run_fanout() > 0 AS delivered;
SELECT user_id, retained_from FROM im.gc_inbox() ORDER BY user_id;
SELECT value AS cursor FROM im.maintenance_state WHERE name = 'gc_cursor';
RESET im_sync.inbox_retention;

\c :regress_db
DROP DATABASE im_gc_chunks_test;
