-- im_duplicate_deliveries_total (contract §8): fanout counts
-- a delivery it leaves out because the user's log already holds the event
-- (an item delivered before and queued again), once, when its batch
-- commits.  A redelivery writes no second event.  Own database, so ids are
-- deterministic; the counter is cluster-wide, so only differences are shown.
\set regress_db :DBNAME
CREATE DATABASE im_dup_deliveries_test;
\c im_dup_deliveries_test
SET client_min_messages = warning;
CREATE EXTENSION im_sync CASCADE;
RESET client_min_messages;

CREATE FUNCTION dups() RETURNS bigint LANGUAGE sql AS
  $$SELECT value::bigint FROM im.metrics() WHERE name = 'im_duplicate_deliveries_total'$$;

SELECT im.create_conversation('group', ARRAY[3301, 3302, 3303]::bigint[], 3301) AS c \gset
SELECT count(*) FROM im.send_message(3301, :c, 's33-m1', '{"t": "m1"}');
SELECT dups() AS before \gset
SELECT im.run_fanout() AS delivered;
SELECT dups() - :before AS first_delivery_duplicates;
SELECT user_id, count(*) AS events FROM im.inbox GROUP BY user_id ORDER BY user_id;

-- the message's item queued again (as repair_fanout or an operator would):
-- all three recipients already hold it
UPDATE im.outbox SET state = 'pending', processed_at = NULL
 WHERE source_event_id = (SELECT message_id FROM im.event WHERE client_msg_id = 's33-m1');

-- a batch that rolls back counts nothing ...
BEGIN;
SELECT im.run_fanout() AS delivered;
ROLLBACK;
SELECT dups() - :before AS after_rollback;

-- ... the committed one counts each duplicate once and writes nothing twice
SELECT im.run_fanout() AS delivered;
SELECT dups() - :before AS after_commit;
SELECT user_id, count(*) AS events FROM im.inbox GROUP BY user_id ORDER BY user_id;
SELECT user_id, high_watermark FROM im.user_head ORDER BY user_id;

-- a second message and the first one again in one run: only the old one is
-- a duplicate, the new one is delivered
SELECT count(*) FROM im.send_message(3302, :c, 's33-m2', '{"t": "m2"}');
UPDATE im.outbox SET state = 'pending', processed_at = NULL
 WHERE source_event_id = (SELECT message_id FROM im.event WHERE client_msg_id = 's33-m1');
SELECT im.run_fanout() AS delivered;
SELECT dups() - :before AS after_mixed_run;
SELECT user_id, count(*) AS events FROM im.inbox GROUP BY user_id ORDER BY user_id;

-- a private event (read cursor) queued again: one more duplicate, no second event
SELECT * FROM im.report_read(3303, :c, 3);
SELECT im.run_fanout() AS delivered;
SELECT dups() - :before AS after_private;
UPDATE im.outbox SET state = 'pending', processed_at = NULL WHERE private_user_id = 3303;
SELECT im.run_fanout() AS delivered;
SELECT dups() - :before AS after_private_again;
SELECT user_id, kind, count(*) FROM im.inbox WHERE kind = 'read_cursor' GROUP BY 1, 2;

\c :regress_db
DROP DATABASE im_dup_deliveries_test;
