-- im_gc_deleted_total (contract §8) counts inbox rows GC
-- deleted when the deleting transaction commits: a rolled-back gc_inbox, or
-- one inside a savepoint that is rolled back, deletes nothing and counts
-- nothing.  Own database; the counter is cluster-wide (shown as differences).
\set regress_db :DBNAME
CREATE DATABASE im_gc_commit_test;
\c im_gc_commit_test
SET client_min_messages = warning;
CREATE EXTENSION im_sync CASCADE;
RESET client_min_messages;

CREATE FUNCTION gc_total() RETURNS bigint LANGUAGE sql AS
  $$SELECT value::bigint FROM im.metrics() WHERE name = 'im_gc_deleted_total'$$;

SELECT im.create_conversation('group', ARRAY[6301, 6302]::bigint[], 6301) AS c \gset
SELECT count(*) FROM generate_series(1, 3) i,
       LATERAL im.send_message(6301, :c, 's63-m' || i, jsonb_build_object('t', 'm' || i));
SELECT im.run_fanout() AS delivered;
SELECT count(*) AS inbox_rows FROM im.inbox;
SET im_sync.inbox_retention = 0;
SELECT gc_total() AS before \gset

-- rolled back: the rows are still there and nothing was counted
BEGIN;
SELECT sum(deleted) AS deleted FROM im.gc_inbox();
ROLLBACK;
SELECT count(*) AS inbox_rows FROM im.inbox;
SELECT gc_total() - :before AS counted_after_rollback;

-- a rolled-back savepoint inside a committed transaction: the same
BEGIN;
SAVEPOINT s;
SELECT sum(deleted) AS deleted FROM im.gc_inbox();
ROLLBACK TO SAVEPOINT s;
COMMIT;
SELECT count(*) AS inbox_rows FROM im.inbox;
SELECT gc_total() - :before AS counted_after_savepoint_rollback;

-- a released savepoint whose transaction commits: counted once, at commit
BEGIN;
SAVEPOINT s;
SELECT sum(deleted) AS deleted FROM im.gc_inbox();
RELEASE SAVEPOINT s;
SELECT gc_total() - :before AS counted_before_commit;
COMMIT;
SELECT count(*) AS inbox_rows FROM im.inbox;
SELECT gc_total() - :before AS counted_after_commit;
RESET im_sync.inbox_retention;

\c :regress_db
DROP DATABASE im_gc_commit_test;
