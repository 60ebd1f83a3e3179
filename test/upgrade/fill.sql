-- Fills a database of the released version through its API (upgrade
-- suite): conversations of both kinds and modes, sends, fanout, devices
-- (ACTIVE through a snapshot, synced and ACKed, one with an open snapshot
-- lease, one revoked), read state, delete-for-me, membership changes,
-- tokens and a second signing key.  Users 9001-9006 (the model test's
-- users are seed * 100 + 1..5).
\set ON_ERROR_STOP 1
\set QUIET 1
\i sql/include/sync_helpers.sql
SELECT im.create_conversation('group', ARRAY[9001, 9002, 9003]::bigint[], 9001) AS g \gset
SELECT im.direct_conversation(9001, 9004) AS d \gset
SELECT im.create_conversation('group', ARRAY[9001, 9002, 9005]::bigint[], 9002) AS big \gset
SELECT im.set_conversation_mode(:big, 'shared_log');
SELECT message_id AS m1 FROM im.send_message(9001, :g, 'fill-1', '{"t": "hello"}') \gset
SELECT msg_seq FROM im.send_message(9002, :g, 'fill-2', '{"t": "hi"}');
SELECT msg_seq FROM im.send_message(9004, :d, 'fill-3', '{"t": "direct"}');
SELECT msg_seq FROM im.send_message(9005, :big, 'fill-4', '{"t": "large group"}');
SELECT * FROM im.register_device(9001, 'phone');
SELECT * FROM im.register_device(9001, 'desk');
SELECT * FROM im.register_device(9002, 'phone');
SELECT * FROM im.register_device(9004, 'phone');
SELECT im.run_fanout();
SELECT * FROM pg_temp.activate(9001, 'phone');
SELECT * FROM pg_temp.activate(9004, 'phone');
SELECT status FROM im.begin_snapshot(9002, 'phone');
SELECT message_id AS m5 FROM im.send_message(9003, :g, 'fill-5', '{"t": "after the snapshot"}') \gset
SELECT msg_seq FROM im.edit_message(9003, :g, 'fill-6', :m5, '{"t": "edited"}');
SELECT msg_seq FROM im.recall_message(9002, :g, 'fill-7', (SELECT message_id FROM im.event WHERE client_msg_id = 'fill-2'));
SELECT * FROM im.report_read(9002, :g, 2);
SELECT im.delete_for_me(9001, :g, :m1);
SELECT * FROM im.leave_conversation(:g, 9003);
SELECT * FROM im.join_conversation(:g, 9005);
SELECT im.run_fanout();
SELECT * FROM pg_temp.sync('f1', 9001, 'phone', 1, (SELECT acked FROM pg_temp.dev(9001, 'phone')), 2);
SELECT * FROM pg_temp.ack(9001, 'phone', 'f1', (SELECT issued FROM pg_temp.dev(9001, 'phone')));
SELECT im.revoke_device(9001, 'desk');
SELECT im.issue_device_token(9004, 'phone') IS NOT NULL;
SELECT im.rotate_token_key() > 0;
