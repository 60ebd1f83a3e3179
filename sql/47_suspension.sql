-- Account standing and the device cap (contract §17): suspend_user,
-- reinstate_user, IS403 on every call made for a suspended user, timed
-- expiry by comparing times, device_session's account_state, pushes, and
-- im_sync.max_devices_per_user.  Users 4701..4799 belong to this file.
\i sql/include/fails.sql
\getenv abs_srcdir PG_ABS_SRCDIR
SELECT set_config('im_sync.push_public_key_file', :'abs_srcdir' || '/test/push/relay_pub.pem', false) IS NOT NULL AS set;
SET im_sync.push_delay = 0;
SET im_sync.push_min_interval = 0;
SELECT im.create_conversation('group', ARRAY[4701, 4702]::bigint[], 4701) AS c \gset
SELECT state FROM im.register_device(4701, 'phone');
SELECT state FROM im.register_device(4701, 'tablet');
SELECT state FROM im.register_device(4702, 'phone');
SELECT im.register_push_target(4701, 'phone', 'fcm', 'app', 'tok-4701-phone') > 0 AS t;
SELECT im.issue_device_token(4701, 'phone') AS tok \gset
SELECT im.issue_device_token(4701, 'tablet') AS tok_tablet \gset
SELECT connection_epoch FROM im.authenticate(:'tok');
SELECT msg_seq FROM im.send_message(4701, :c, 'before', '{"text": "before"}');
SELECT msg_seq FROM im.send_message(4702, :c, 'to-4701-1', '{"text": "queued"}');
SELECT im.run_fanout() >= 0 AS ran;
SELECT count(*) AS pending_pushes FROM im.push_job WHERE user_id = 4701 AND state = 'pending';

-- bad arguments: 22023, nothing changes
SELECT * FROM pg_temp.fails($$SELECT * FROM im.suspend_user(NULL, 4701, NULL, 'spam')$$);
SELECT * FROM pg_temp.fails($$SELECT * FROM im.suspend_user('', 4701, NULL, 'spam')$$);
SELECT * FROM pg_temp.fails($$SELECT * FROM im.suspend_user('mod', 0, NULL, 'spam')$$);
SELECT * FROM pg_temp.fails($$SELECT * FROM im.suspend_user('mod', NULL, NULL, 'spam')$$);
SELECT * FROM pg_temp.fails($$SELECT * FROM im.suspend_user('mod', 4701, now() - interval '1 minute', 'spam')$$);
SELECT * FROM pg_temp.fails($$SELECT * FROM im.suspend_user('mod', 4701, NULL, '')$$);
SELECT * FROM pg_temp.fails($$SELECT * FROM im.reinstate_user(NULL, 4701)$$);
SELECT * FROM pg_temp.fails($$SELECT * FROM im.reinstate_user('mod', -1)$$);
SELECT count(*) AS suspensions FROM im.user_suspension WHERE user_id BETWEEN 4701 AND 4799;
-- nothing to reinstate: false, no audit row
SELECT * FROM im.reinstate_user('mod', 4701);

-- suspend until reinstated: of the user's devices only the one that ever
-- authenticated (phone) is told (sessions_closed 1); the pending push is
-- suppressed
SELECT * FROM im.suspend_user('trust-and-safety', 4701, NULL, 'spam');
SELECT count(*) AS pending_pushes FROM im.push_job WHERE user_id = 4701 AND state IN ('pending', 'retry', 'claimed');
SELECT state FROM im.push_job WHERE user_id = 4701;
-- suspending again: false (already suspended), the new end and reason kept
SELECT * FROM im.suspend_user('trust-and-safety', 4701, NULL, 'spam again');
SELECT suspended_until, moderator, reason FROM im.user_suspension WHERE user_id = 4701;
SELECT action, user_id, device_id, detail FROM im.audit
  WHERE user_id = 4701 AND action IN ('suspend', 'reinstate') ORDER BY audit_id;

-- every call made for the user: IS403 "account suspended"
SELECT * FROM pg_temp.fails($q$SELECT * FROM im.authenticate('$q$ || :'tok' || $q$')$q$);
-- token checks come first: a tampered token is still 28000
SELECT sqlstate FROM pg_temp.fails($q$SELECT * FROM im.authenticate('$q$ || :'tok' || $q$x')$q$);
SELECT sqlstate, message FROM pg_temp.fails($$SELECT im.issue_device_token(4701, 'phone')$$);
SELECT sqlstate FROM pg_temp.fails($$SELECT * FROM im.register_device(4701, 'laptop')$$);
SELECT sqlstate FROM pg_temp.fails($$SELECT * FROM im.register_device(4701, 'phone')$$);
SELECT sqlstate FROM pg_temp.fails($$SELECT * FROM im.sync_changes(4701, 'phone', 1, 0)$$);
SELECT sqlstate FROM pg_temp.fails($$SELECT * FROM im.ack_sync(4701, 'phone', 'x', 0)$$);
SELECT sqlstate FROM pg_temp.fails($$SELECT * FROM im.begin_snapshot(4701, 'tablet')$$);
SELECT sqlstate FROM pg_temp.fails($$SELECT * FROM im.fetch_snapshot(4701, 'tablet', 'x', 1)$$);
SELECT sqlstate FROM pg_temp.fails($$SELECT * FROM im.ack_snapshot(4701, 'tablet', 'x', 'y')$$);
SELECT sqlstate FROM pg_temp.fails(format('SELECT * FROM im.fetch_messages(4701, %s, 0)', :c));
SELECT sqlstate FROM pg_temp.fails($$SELECT * FROM im.conversation_list(4701)$$);
SELECT sqlstate FROM pg_temp.fails($$SELECT * FROM im.recent_conversations(4701)$$);
SELECT sqlstate FROM pg_temp.fails(format('SELECT * FROM im.pin_conversation(4701, %s, true)', :c));
SELECT sqlstate FROM pg_temp.fails(format('SELECT * FROM im.report_read(4701, %s, 1)', :c));
SELECT sqlstate FROM pg_temp.fails(format('SELECT * FROM im.clear_dirty(4701, %s, 0, 0)', :c));
SELECT sqlstate FROM pg_temp.fails(format('SELECT * FROM im.delete_for_me(4701, %s, 1)', :c));
SELECT sqlstate FROM pg_temp.fails($$SELECT * FROM im.set_read_receipts(4701, false)$$);
SELECT sqlstate FROM pg_temp.fails($$SELECT * FROM im.message_facts(4701, 1)$$);
SELECT sqlstate FROM pg_temp.fails($$SELECT im.register_push_target(4701, 'tablet', 'fcm', 'app', 'tok-x')$$);
SELECT sqlstate FROM pg_temp.fails($$SELECT im.set_notify(4701, NULL, NULL, 'none')$$);
SELECT sqlstate, message FROM pg_temp.fails(format('SELECT * FROM im.send_message(4701, %s, %L, %L)', :c, 'during', '{"text": "x"}'));
SELECT sqlstate FROM pg_temp.fails(format('SELECT * FROM im.edit_message(4701, %s, %L, 1, %L)', :c, 'e1', '{"text": "x"}'));
SELECT sqlstate FROM pg_temp.fails(format('SELECT * FROM im.recall_message(4701, %s, %L, 1)', :c, 'r1'));
SELECT sqlstate FROM pg_temp.fails(format('SELECT * FROM im.react(4701, %s, 1, %L, true, %L)', :c, 'x', 'k1'));
SELECT sqlstate FROM pg_temp.fails(format('SELECT * FROM im.pin_message(4701, %s, 1, true, %L)', :c, 'p1'));
-- check order (contract §17): arguments 22023 and an unknown conversation
-- P0002 before IS403; a retry of an earlier send answers with the original
SELECT sqlstate FROM pg_temp.fails(format('SELECT * FROM im.send_message(4701, %s, NULL, %L)', :c, '{"text": "x"}'));
SELECT sqlstate FROM pg_temp.fails(format('SELECT * FROM im.send_message(4701, 999999999, %L, %L)', 'nowhere', '{"text": "x"}'));
SELECT msg_seq, created FROM im.send_message(4701, :c, 'before', '{"text": "before"}');
-- what stays allowed: the gateway's re-check, revoking, presence, another user
SELECT state, current, account_state FROM im.device_session(4701, 'phone', 1);
SELECT account_state FROM im.device_session(4702, 'phone', 0);
SELECT * FROM im.fetch_messages(4702, :c, 0) \gset
SELECT jsonb_array_length(:'messages') AS messages_4702_sees;
-- a push for the suspended user is never queued
SELECT msg_seq FROM im.send_message(4702, :c, 'to-4701-2', '{"text": "not pushed"}');
SELECT im.run_fanout() >= 0 AS ran;
SELECT count(*) AS pending_pushes FROM im.push_job WHERE user_id = 4701 AND state IN ('pending', 'retry');
-- a job queued before a suspension that did not suppress it (a row written
-- directly: the table's trigger still tells the checks) is suppressed at claim
SELECT im.register_push_target(4702, 'phone', 'fcm', 'app', 'tok-4702-phone') > 0 AS t;
SELECT im.create_conversation('group', ARRAY[4702, 4704]::bigint[], 4704) AS c2 \gset
SELECT msg_seq FROM im.send_message(4704, :c2, 'to-4702', '{"text": "for 4702"}');
SELECT im.run_fanout() >= 0 AS ran;
SELECT count(*) AS pending_4702 FROM im.push_job WHERE user_id = 4702 AND state = 'pending';
INSERT INTO im.user_suspension (user_id, moderator) VALUES (4702, 'direct');
SELECT count(*) AS handed_out FROM im.claim_push_jobs('relay-4702', 100) j
  JOIN im.push_job p ON p.job_id = j.job_id WHERE p.user_id = 4702;
SELECT state FROM im.push_job WHERE user_id = 4702;
DELETE FROM im.user_suspension WHERE user_id = 4702;

-- reinstate: true, then everything works again
SELECT * FROM im.reinstate_user('trust-and-safety', 4701);
SELECT * FROM im.reinstate_user('trust-and-safety', 4701);
SELECT account_state FROM im.device_session(4701, 'phone', 1);
SELECT user_id FROM im.authenticate(:'tok');
SELECT created FROM im.send_message(4701, :c, 'after', '{"text": "after"}');
SELECT count(*) > 0 AS lists FROM im.conversation_list(4701);
SELECT action, detail FROM im.audit WHERE user_id = 4701 AND action = 'reinstate';

-- a timed suspension ends by itself: nothing fires, the check compares times
SELECT * FROM im.suspend_user('mod', 4703, now() + interval '1 hour', NULL);
SELECT sqlstate FROM pg_temp.fails($$SELECT * FROM im.conversation_list(4703)$$);
UPDATE im.user_suspension SET suspended_until = now() - interval '1 second' WHERE user_id = 4703;
SELECT count(*) AS lists FROM im.conversation_list(4703);
SELECT account_state FROM im.device_session(4701, 'phone', 2);
-- an expired suspension is not reinstated (false) but its row goes
SELECT * FROM im.reinstate_user('mod', 4703);
SELECT count(*) AS rows_4703 FROM im.user_suspension WHERE user_id = 4703;
-- a suspension of an expired row: suspended true again
SELECT * FROM im.suspend_user('mod', 4703, now() + interval '1 hour', 'again');
UPDATE im.user_suspension SET suspended_until = now() - interval '1 second' WHERE user_id = 4703;
SELECT suspended FROM im.suspend_user('mod', 4703, NULL, 'third');
SELECT * FROM im.reinstate_user('mod', 4703);

-- the device cap: revoked devices do not count, known ones re-register
SET im_sync.max_devices_per_user = 2;
SELECT state FROM im.register_device(4710, 'a');
SELECT state FROM im.register_device(4710, 'b');
SELECT * FROM pg_temp.fails($$SELECT * FROM im.register_device(4710, 'c')$$);
SELECT state FROM im.register_device(4710, 'a');
SELECT im.revoke_device(4710, 'b');
SELECT state FROM im.register_device(4710, 'c');
-- a revoked device registering again counts again: over the cap it is 54000
SELECT sqlstate FROM pg_temp.fails($$SELECT * FROM im.register_device(4710, 'b')$$);
SELECT state FROM im.device WHERE user_id = 4710 AND device_id = 'b';
SELECT im.revoke_device(4710, 'a');
SELECT state FROM im.register_device(4710, 'b');
SELECT device_id, state FROM im.device WHERE user_id = 4710 ORDER BY device_id;
SELECT * FROM pg_temp.fails($$SET im_sync.max_devices_per_user = 0$$);
RESET im_sync.max_devices_per_user;
SHOW im_sync.max_devices_per_user;
-- a maintenance round (run by gc_inbox) with no active suspension lets the
-- checks skip the lookup; a suspension written after it (directly: the
-- table's statement trigger tells shared memory) is still seen at once
SELECT count(*) >= 0 AS collected FROM im.gc_inbox();
INSERT INTO im.user_suspension (user_id, moderator) VALUES (4705, 'direct');
SELECT sqlstate FROM pg_temp.fails($$SELECT * FROM im.conversation_list(4705)$$);
SELECT sqlstate FROM pg_temp.fails($$SELECT * FROM im.register_device(4705, 'phone')$$);
DELETE FROM im.user_suspension WHERE user_id = 4705;
SELECT state FROM im.register_device(4705, 'phone');
-- no item or job of this file is left for the next file's relay
SELECT im.run_fanout() >= 0 AS ran;
DELETE FROM im.push_job WHERE user_id BETWEEN 4701 AND 4799;
-- shared memory is the cluster's, suspensions a database's: a maintenance
-- round in another database that has none never lets this database's
-- checks skip a suspension
SELECT suspended FROM im.suspend_user('mod', 4706, NULL, 'other database');
\set regdb :DBNAME
CREATE DATABASE im_regress_standing;
\c im_regress_standing
SET client_min_messages = warning;
CREATE EXTENSION btree_gist;
CREATE EXTENSION im_sync;
SELECT count(*) >= 0 AS collected FROM im.gc_inbox();
SELECT count(*) AS lists_here FROM im.conversation_list(4706);
\c :regdb
\i sql/include/fails.sql
SELECT sqlstate FROM pg_temp.fails($$SELECT * FROM im.conversation_list(4706)$$);
DROP DATABASE im_regress_standing;
SELECT reinstated FROM im.reinstate_user('mod', 4706);
