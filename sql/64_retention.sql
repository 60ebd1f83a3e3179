-- Retention of rows that would otherwise be kept for ever (contract §8):
-- done outbox items and private events after
-- im_sync.inbox_retention, snapshots and recovery sessions after their ttl
-- plus a margin, audit rows after im_sync.audit_retention.  Maintenance
-- (im.gc_inbox() here) never deletes what a fence, a live snapshot or
-- session, a live token, a dead letter or reconcile still needs, and
-- reconcile stays clean.  Users 6401..6499.  Own database; time is moved
-- by backdating rows (superuser), never by sleeping.
\set regress_db :DBNAME
CREATE DATABASE im_retention_test;
\c im_retention_test
SET client_min_messages = warning;
CREATE EXTENSION im_sync CASCADE;
RESET client_min_messages;
\i sql/include/fails.sql
\i sql/include/sync_helpers.sql

SELECT im.create_conversation('group', ARRAY[6401, 6402]::bigint[], 6401) AS c \gset
SELECT im.run_fanout() > 0 AS delivered;
SELECT * FROM im.register_device(6401, 'a');
SELECT * FROM pg_temp.activate(6401, 'a');
SELECT count(*) FROM generate_series(1, 3) i,
       LATERAL im.send_message(6401, :c, 's64-m' || i, jsonb_build_object('t', 'm' || i));
SELECT * FROM im.report_read(6402, :c, 4);
SELECT im.run_fanout() > 0 AS delivered;
SELECT im.issue_device_token(6401, 'a') IS NOT NULL AS issued;
-- all of that happened two hours ago (inbox_retention is shrunk to 1 h)
UPDATE im.event SET created_at = created_at - interval '2 h';
UPDATE im.outbox SET created_at = created_at - interval '2 h', processed_at = processed_at - interval '2 h';
UPDATE im.inbox SET created_at = created_at - interval '2 h';
UPDATE im.private_event SET created_at = created_at - interval '2 h';
-- and one fresh message
SELECT count(*) FROM im.send_message(6402, :c, 's64-m4', '{"t": "m4"}');
SELECT im.run_fanout() > 0 AS delivered;
SELECT * FROM im.reconcile();

CREATE TEMP VIEW sizes AS
SELECT (SELECT count(*) FROM im.outbox) AS outbox,
       (SELECT count(*) FROM im.outbox WHERE state = 'done') AS outbox_done,
       (SELECT count(*) FROM im.private_event) AS private_events,
       (SELECT count(*) FROM im.snapshot) AS snapshots,
       (SELECT count(*) FROM im.snapshot_page) AS snapshot_pages,
       (SELECT count(*) FROM im.recovery_session) AS sessions,
       (SELECT count(*) FROM im.audit) AS audit;
SELECT * FROM sizes;

SET im_sync.inbox_retention = '1h';
-- 1. outbox items: a dead letter and a quarantined item are kept however
-- old; the rest of the old done items go, the fresh one stays
BEGIN;
UPDATE im.outbox SET state = 'dead' WHERE msg_seq = 2;
INSERT INTO im.fanout_quarantine (outbox_id, user_id, periods)
  SELECT outbox_id, 6402, '{1,2}' FROM im.outbox WHERE msg_seq = 3;
SELECT count(*) AS gc_rows FROM im.gc_inbox();
SELECT msg_seq, state, private_user_id FROM im.outbox ORDER BY outbox_id;
ROLLBACK;
SELECT user_id, retained_from FROM im.gc_inbox() ORDER BY user_id;
SELECT msg_seq, state, private_user_id FROM im.outbox ORDER BY outbox_id;
-- 6402's read cursor event left its log with the GC above, and its outbox
-- item is gone: collected.  Reconcile does not miss the collected items ...
SELECT * FROM sizes;
SELECT * FROM im.reconcile();
-- ... but still reports an item that vanished after the cutoff (and the
-- unread it no longer counts: such an item was never processed)
BEGIN;
DELETE FROM im.outbox WHERE msg_seq = 5;
SELECT check_name, detail->'msg_seq' AS msg_seq FROM im.reconcile();
ROLLBACK;
-- unread state and sync are unaffected by the collected items
SELECT user_id, read_msg_seq, unread_count FROM im.user_conversation ORDER BY user_id;
SELECT status, events FROM pg_temp.sync('a1', 6401, 'a', (SELECT gen FROM pg_temp.dev(6401, 'a')), 1);

-- 2. a private event a log still holds stays: 6401's device holds its log
SELECT * FROM im.report_read(6401, :c, 5);
SELECT im.run_fanout() > 0 AS delivered;
UPDATE im.private_event SET created_at = created_at - interval '2 h';
UPDATE im.outbox SET processed_at = processed_at - interval '2 h', created_at = created_at - interval '2 h'
 WHERE private_user_id = 6401;
SELECT count(*) AS gc_rows FROM im.gc_inbox();
SELECT user_id, kind FROM im.private_event ORDER BY private_event_id;

-- 3. snapshots: the installed one, past its expiry by more than
-- snapshot_ttl, goes with its pages; an expired READY one is abandoned
-- (no longer stuck) and kept a while; an unexpired READY one is untouched
SELECT * FROM im.register_device(6402, 'b');
SELECT * FROM im.register_device(6402, 'c');
SELECT status FROM im.begin_snapshot(6402, 'b');
SELECT status FROM im.begin_snapshot(6402, 'c');
UPDATE im.snapshot SET expires_at = now() - interval '2 h' WHERE device_id = 'a';
UPDATE im.snapshot SET expires_at = now() - interval '1 min' WHERE device_id = 'b';
SELECT device_id, state FROM im.snapshot ORDER BY snapshot_id;
SELECT count(*) AS stuck FROM im.reconcile() WHERE check_name = 'snapshot_stuck';
SELECT count(*) AS snapshot_pages FROM im.snapshot_page;
SELECT count(*) AS gc_rows FROM im.gc_inbox();
SELECT device_id, state FROM im.snapshot ORDER BY snapshot_id;
SELECT count(*) AS snapshot_pages FROM im.snapshot_page;
SELECT count(*) AS stuck FROM im.reconcile() WHERE check_name = 'snapshot_stuck';

-- 4. recovery sessions: ACTIVE past its lease by more than token_ttl (no
-- batch token of it can be live) becomes EXPIRED; ACTIVE just past its
-- lease is left to sync_changes; ended ones go after the largest of
-- token_ttl and recovery_ttl (15 min)
INSERT INTO im.recovery_session (user_id, device_id, sync_generation, resume_from, batch_high_watermark, state, expires_at, ended_at) VALUES
  (6401, 'a', 101, 1, 2, 'ACTIVE', now() - interval '1 h', NULL),
  (6401, 'a', 102, 1, 2, 'ACTIVE', now() - interval '1 min', NULL),
  (6401, 'a', 103, 1, 2, 'COMPLETED', now() - interval '1 h', now() - interval '1 h'),
  (6401, 'a', 104, 1, 2, 'ENDED', now() + interval '1 h', now() - interval '1 min'),
  (6401, 'a', 105, 1, 2, 'ACTIVE', now() + interval '10 min', NULL);
SELECT count(*) AS stuck FROM im.reconcile() WHERE check_name = 'recovery_session_stuck';
SELECT count(*) AS gc_rows FROM im.gc_inbox();
SELECT sync_generation, state, ended_at IS NOT NULL AS ended FROM im.recovery_session ORDER BY sync_generation;
SELECT count(*) AS stuck FROM im.reconcile() WHERE check_name = 'recovery_session_stuck';
UPDATE im.recovery_session SET ended_at = ended_at - interval '1 h' WHERE sync_generation = 101;
SELECT count(*) AS gc_rows FROM im.gc_inbox();
SELECT sync_generation, state FROM im.recovery_session ORDER BY sync_generation;
DELETE FROM im.recovery_session;

-- 5. audit rows older than im_sync.audit_retention (90 days) go
SELECT action, device_id FROM im.audit ORDER BY audit_id;
UPDATE im.audit SET at = now() - interval '91 days' WHERE device_id = 'a';
SELECT count(*) AS gc_rows FROM im.gc_inbox();
SELECT action, device_id FROM im.audit ORDER BY audit_id;
SET im_sync.audit_retention = 0;
SELECT count(*) AS gc_rows FROM im.gc_inbox();
SELECT count(*) AS audit_rows FROM im.audit;
RESET im_sync.audit_retention;

-- healthy at the end
SELECT * FROM im.reconcile();
RESET im_sync.inbox_retention;

\c :regress_db
DROP DATABASE im_retention_test;
