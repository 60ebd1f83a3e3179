-- im.reconcile() and im.repair_fanout() (contract §8, design doc §18.3).
-- Each check: a healthy database gives zero rows; then the data is broken
-- ON PURPOSE as superuser inside BEGIN … ROLLBACK and the check must fire.
-- Own database, so rows other test files leave behind cannot leak in.
\set regress_db :DBNAME
CREATE DATABASE im_reconcile_test;
\c im_reconcile_test
SET client_min_messages = warning;
CREATE EXTENSION im_sync CASCADE;
RESET client_min_messages;

-- A small healthy world, written the way send + fanout write it:
-- group 100, members 10, 20, 30; 30 leaves after msg_seq 2.
--   seq 1 create (1001), seq 2 message from 10 (1002),
--   seq 3 leave of 30 (1003), seq 4 message from 20 (1004).
INSERT INTO im.conversation (conversation_id, kind, head_msg_seq) VALUES (100, 'group', 4);
INSERT INTO im.event (message_id, conversation_id, msg_seq, kind, sender_id, client_msg_id, body, subject_user_id, mode) VALUES
  (1001, 100, 1, 'create',  NULL, NULL, '[10,20,30]', NULL, 'fanout'),
  (1002, 100, 2, 'message', 10, 'c1', '{"t":"a"}', NULL, 'fanout'),
  (1003, 100, 3, 'leave',   NULL, NULL, '{"user_id":30}', 30, 'fanout'),
  (1004, 100, 4, 'message', 20, 'c2', '{"t":"b"}', NULL, 'fanout');
INSERT INTO im.membership_period (membership_period_id, conversation_id, user_id, join_seq, leave_seq, join_event_id, leave_event_id) VALUES
  (1, 100, 10, 1, NULL, 1001, NULL),
  (2, 100, 20, 1, NULL, 1001, NULL),
  (3, 100, 30, 1, 2, 1001, 1003);
INSERT INTO im.outbox (outbox_id, conversation_id, msg_seq, source_event_id, state, created_at, processed_at)
SELECT 500 + msg_seq, 100, msg_seq, message_id, 'done',
       '2026-01-01 00:00:00+00'::timestamptz + msg_seq * interval '1 s',
       '2026-01-01 00:00:00.02+00'::timestamptz + msg_seq * interval '1 s'
FROM im.event;
INSERT INTO im.user_head (user_id, high_watermark) VALUES (10, 4), (20, 4), (30, 3);
INSERT INTO im.inbox (user_id, sync_seq, source_event_id, delivery_scope, conversation_id, msg_seq, kind, outbox_id, created_at)
SELECT p.user_id, e.msg_seq, e.message_id, p.membership_period_id, 100, e.msg_seq, e.kind, 500 + e.msg_seq,
       '2026-01-01 00:00:00.02+00'::timestamptz + e.msg_seq * interval '1 s'
FROM im.event e JOIN im.membership_period p
  ON e.msg_seq >= p.join_seq AND (p.leave_seq IS NULL OR e.msg_seq <= p.leave_seq OR p.leave_event_id = e.message_id);
INSERT INTO im.user_conversation (user_id, conversation_id, last_msg_seq, read_msg_seq, unread_count) VALUES
  (10, 100, 4, 0, 1), (20, 100, 4, 0, 1), (30, 100, 2, 0, 1);
INSERT INTO im.device (user_id, device_id, state, acked_sync_seq, acked_at) VALUES
  (10, 'phone', 'ACTIVE', 2, '2026-01-01 00:00:03.02+00');

-- healthy: zero rows
SELECT * FROM im.reconcile();
SELECT * FROM im.repair_fanout(dry_run => true);

-- message_without_outbox: an accepted message whose outbox record is gone
-- (after the collection cutoff: never processed, so the unread recount no
-- longer counts it either: unread_mismatch too)
BEGIN;
DELETE FROM im.outbox WHERE source_event_id = 1004;
SELECT check_name, severity, conversation_id, user_id, detail FROM im.reconcile();
ROLLBACK;

-- outbox_pending_too_old: pending longer than im_sync.reconcile_outbox_age
-- (the unread recount then no longer counts 1004: unread_mismatch too)
BEGIN;
UPDATE im.outbox SET state = 'pending', created_at = now() - interval '2 min' WHERE source_event_id = 1004;
SELECT check_name, severity, conversation_id, user_id, detail - 'age_seconds' AS detail FROM im.reconcile();
SET LOCAL im_sync.reconcile_outbox_age = '1h';
SELECT check_name FROM im.reconcile();
ROLLBACK;

-- fanout_missing: user 20 lost its event for 1004 (head moved back: no gap)
BEGIN;
DELETE FROM im.inbox WHERE user_id = 20 AND sync_seq = 4;
UPDATE im.user_head SET high_watermark = 3 WHERE user_id = 20;
SELECT * FROM im.reconcile();
-- repair: dry run first, then requeue the ORIGINAL item (same source_event_id)
SELECT * FROM im.repair_fanout(dry_run => true);
SELECT state FROM im.outbox WHERE outbox_id = 504;
SELECT * FROM im.repair_fanout();
SELECT outbox_id, state, attempts FROM im.outbox WHERE outbox_id = 504;
SELECT action, user_id, detail FROM im.audit WHERE action = 'repair_fanout';
ROLLBACK;

-- fanout_extra: the leaver 30 got a message from after its period
BEGIN;
INSERT INTO im.inbox (user_id, sync_seq, source_event_id, delivery_scope, conversation_id, msg_seq, kind)
  VALUES (30, 4, 1004, 3, 100, 4, 'message');
UPDATE im.user_head SET high_watermark = 4 WHERE user_id = 30;
SELECT * FROM im.reconcile();
-- an extra delivery is never "repaired" automatically
SELECT * FROM im.repair_fanout();
SELECT state FROM im.outbox WHERE outbox_id = 504;
ROLLBACK;

-- delivered under the wrong period: missing for the right one, extra for the wrong one
BEGIN;
UPDATE im.inbox SET delivery_scope = 999 WHERE user_id = 10 AND source_event_id = 1002;
SELECT * FROM im.reconcile();
ROLLBACK;

-- a recall follows its target's periods: the leaver 30 must get the recall of 1002
BEGIN;
INSERT INTO im.event (message_id, conversation_id, msg_seq, kind, sender_id, client_msg_id, target_message_id, mode)
  VALUES (1005, 100, 5, 'recall', 10, 'c3', 1002, 'fanout');
UPDATE im.conversation SET head_msg_seq = 5 WHERE conversation_id = 100;
UPDATE im.event SET body = NULL, recalled = true WHERE message_id = 1002;
INSERT INTO im.outbox (outbox_id, conversation_id, msg_seq, source_event_id, state, processed_at) VALUES (505, 100, 5, 1005, 'done', now());
INSERT INTO im.inbox (user_id, sync_seq, source_event_id, delivery_scope, conversation_id, msg_seq, kind)
  VALUES (10, 5, 1005, 1, 100, 5, 'recall'), (20, 5, 1005, 2, 100, 5, 'recall');
UPDATE im.user_head SET high_watermark = 5 WHERE user_id IN (10, 20);
UPDATE im.user_conversation SET unread_count = 0 WHERE user_id IN (20, 30);
SELECT * FROM im.reconcile();
INSERT INTO im.inbox (user_id, sync_seq, source_event_id, delivery_scope, conversation_id, msg_seq, kind)
  VALUES (30, 4, 1005, 3, 100, 5, 'recall');
UPDATE im.user_head SET high_watermark = 4 WHERE user_id = 30;
SELECT count(*) AS rows_after_fix FROM im.reconcile();
ROLLBACK;

-- GC'd history is not checked: user 20's log was collected past every item
BEGIN;
DELETE FROM im.inbox WHERE user_id = 20;
UPDATE im.user_head SET gc_floor = 4 WHERE user_id = 20;
SELECT count(*) AS rows_after_gc FROM im.reconcile();
-- … but a missing event of another user for the same item cannot be requeued:
-- the redelivery would duplicate user 20's collected event (idempotency record gone)
DELETE FROM im.inbox WHERE user_id = 10 AND sync_seq = 4;
UPDATE im.user_head SET high_watermark = 3 WHERE user_id = 10;
UPDATE im.user_conversation SET unread_count = 0 WHERE user_id = 10;
SELECT * FROM im.reconcile();
SELECT * FROM im.repair_fanout();
SELECT state FROM im.outbox WHERE outbox_id = 504;
ROLLBACK;

-- fanout_quarantined: an item covered by two periods of one user, not delivered
BEGIN;
DELETE FROM im.inbox WHERE user_id = 20 AND sync_seq = 4;
UPDATE im.user_head SET high_watermark = 3 WHERE user_id = 20;
INSERT INTO im.fanout_quarantine (outbox_id, user_id, periods) VALUES (504, 20, '{2,7}');
SELECT * FROM im.reconcile();
SELECT * FROM im.repair_fanout();
ROLLBACK;

-- dead_letter: failed fanout_max_attempts times (a message nobody got yet)
BEGIN;
INSERT INTO im.event (message_id, conversation_id, msg_seq, kind, sender_id, client_msg_id, body, mode)
  VALUES (1005, 100, 5, 'message', 10, 'c3', '{"t":"c"}', 'fanout');
UPDATE im.conversation SET head_msg_seq = 5 WHERE conversation_id = 100;
INSERT INTO im.outbox (outbox_id, conversation_id, msg_seq, source_event_id, state, attempts, last_error)
  VALUES (505, 100, 5, 1005, 'dead', 5, 'injected failure');
SELECT * FROM im.reconcile();
SELECT * FROM im.repair_fanout();
SELECT * FROM im.repair_fanout(retry_dead => true);
SELECT outbox_id, state, attempts, last_error FROM im.outbox WHERE outbox_id = 505;
ROLLBACK;

-- overlapping_periods: only possible if the exclusion constraint is bypassed
BEGIN;
ALTER TABLE im.membership_period DROP CONSTRAINT membership_period_no_overlap;
INSERT INTO im.membership_period (membership_period_id, conversation_id, user_id, join_seq, leave_seq, join_event_id, leave_event_id)
  VALUES (4, 100, 10, 3, 3, 1003, 1003);
SELECT * FROM im.reconcile();
-- the missing rows it causes are overlapping: reported, never requeued
SELECT * FROM im.repair_fanout();
SELECT outbox_id, state FROM im.outbox WHERE outbox_id IN (503, 504) ORDER BY 1;
ROLLBACK;

-- inbox_missing_source: a user event naming a message that does not exist
BEGIN;
INSERT INTO im.inbox (user_id, sync_seq, source_event_id, delivery_scope, conversation_id, msg_seq, kind)
  VALUES (10, 5, 9999, 1, 100, 9, 'message');
UPDATE im.user_head SET high_watermark = 5 WHERE user_id = 10;
SELECT * FROM im.reconcile();
ROLLBACK;

-- ack_beyond_watermark
BEGIN;
UPDATE im.device SET acked_sync_seq = 9 WHERE user_id = 10;
SELECT * FROM im.reconcile();
ROLLBACK;

-- conversation_head_mismatch (head ahead of the facts: a hole in msg_seq)
BEGIN;
UPDATE im.conversation SET head_msg_seq = 7 WHERE conversation_id = 100;
SELECT * FROM im.reconcile();
ROLLBACK;

-- event_without_conversation (no foreign key since 1.2: append.c writes an
-- event only under its conversation's row lock)
BEGIN;
INSERT INTO im.event (conversation_id, msg_seq, kind, sender_id, client_msg_id, body)
  VALUES (999999, 1, 'message', 20, 'orphan-1', '{"text": "orphan"}');
SELECT * FROM im.reconcile();
ROLLBACK;

-- relation_target_mismatch: an edit whose target does not exist (no foreign
-- key on target_message_id since 1.6), a reply to a message of
-- another conversation; a healthy recall is not reported
BEGIN;
INSERT INTO im.event (conversation_id, msg_seq, kind, sender_id, client_msg_id, target_message_id, body)
  VALUES (100, 1000, 'edit', 20, 'dangling-edit', 999999, '{"text": "edit of nothing"}');
INSERT INTO im.event (conversation_id, msg_seq, kind, sender_id, client_msg_id, reply_to_message_id, body)
  VALUES (999999, 1, 'message', 20, 'foreign-reply', (SELECT min(message_id) FROM im.event WHERE conversation_id = 100),
          '{"text": "reply across conversations"}');
INSERT INTO im.event (conversation_id, msg_seq, kind, sender_id, client_msg_id, target_message_id)
  VALUES (100, 1001, 'recall', 20, 'healthy-recall', (SELECT min(message_id) FROM im.event WHERE conversation_id = 100 AND kind = 'message'));
SELECT check_name, severity, conversation_id, user_id, detail - 'message_id' - 'target' AS detail
FROM im.reconcile() WHERE check_name = 'relation_target_mismatch';
ROLLBACK;

-- unread_mismatch
BEGIN;
UPDATE im.user_conversation SET unread_count = 5 WHERE user_id = 20;
SELECT * FROM im.reconcile();
ROLLBACK;

-- shared_log conversations are skipped by the unread recount
BEGIN;
UPDATE im.user_conversation SET unread_count = 5 WHERE user_id = 20;
UPDATE im.conversation SET mode = 'shared_log' WHERE conversation_id = 100;
SELECT count(*) AS rows_shared_log FROM im.reconcile();
ROLLBACK;

-- shared_log 'message' positions are checked against the dirty marker
BEGIN;
UPDATE im.event SET mode = 'shared_log' WHERE message_id = 1004;
DELETE FROM im.inbox WHERE source_event_id = 1004;
UPDATE im.user_head SET high_watermark = 3 WHERE user_id IN (10, 20);
UPDATE im.conversation SET mode = 'shared_log' WHERE conversation_id = 100;
UPDATE im.user_conversation SET dirty_target_msg_seq = 4, dirty = true WHERE user_id = 10;
SELECT * FROM im.reconcile();
UPDATE im.user_conversation SET dirty_target_msg_seq = 4, dirty = true WHERE user_id = 20;
SELECT count(*) AS rows_marker_set FROM im.reconcile();
ROLLBACK;

-- sync_seq_gap: the head claims an event the log does not hold
BEGIN;
UPDATE im.user_head SET high_watermark = 6 WHERE user_id = 10;
SELECT * FROM im.reconcile();
ROLLBACK;

-- recovery_session_stuck and snapshot_stuck: expired but never ended (a
-- session counts once its last batch token, token_ttl after the lease, ran
-- out: maintenance ends those)
BEGIN;
INSERT INTO im.recovery_session (recovery_session_id, user_id, device_id, sync_generation, resume_from, batch_high_watermark, expires_at)
  VALUES (1, 10, 'phone', 2, 1, 4, now() - interval '1 h'),
         (2, 10, 'phone', 3, 1, 4, now() - interval '1 s');
INSERT INTO im.snapshot (snapshot_id, user_id, device_id, sync_generation, base_sync_seq, page_count, manifest_digest, state, expires_at)
  VALUES (1, 10, 'phone', 3, 4, 1, 'x', 'READY', now() - interval '1 s'),
         (2, 10, 'phone', 4, 4, 1, 'x', 'READY', now() + interval '1 h');
SELECT * FROM im.reconcile();
ROLLBACK;

-- still healthy after all the rollbacks
SELECT count(*) AS rows_healthy FROM im.reconcile();

\c :regress_db
DROP DATABASE im_reconcile_test;
