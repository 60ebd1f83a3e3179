-- Every function of the released API once, on a database fill.sql filled
-- (upgrade suite).  Run by the released library on one copy and by the new
-- library on the released catalog on the other: the two outputs must be
-- equal, or a call must fail with 55000.  Prints no token and no time.
\set QUIET 1
\pset footer off
\i sql/include/sync_helpers.sql
\i sql/include/fails.sql
SELECT conversation_id AS g FROM im.event WHERE client_msg_id = 'fill-1' \gset
SELECT conversation_id AS big FROM im.event WHERE client_msg_id = 'fill-4' \gset
-- §2 conversations and membership
SELECT im.create_conversation('group', ARRAY[9001, 9006]::bigint[], 9001) AS c2 \gset
SELECT :c2 > :big AS new_conversation, im.direct_conversation(9004, 9001) = (SELECT conversation_id FROM im.event WHERE client_msg_id = 'fill-3') AS same_direct;
SELECT * FROM im.join_conversation(:c2, 9003);
SELECT * FROM im.join_conversation(:c2, 9003);
SELECT * FROM im.leave_conversation(:c2, 9003);
SELECT * FROM pg_temp.fails($$SELECT * FROM im.leave_conversation(999999, 9003)$$);
SELECT * FROM im.conversation_members(:g);
SELECT im.set_conversation_mode(:c2, 'shared_log'), im.set_conversation_mode(:c2, 'fanout');
SELECT * FROM pg_temp.fails($$SELECT im.set_conversation_mode(1, 'carrier pigeon')$$);
SELECT * FROM im.members_among(:g, ARRAY[9001, 9003, 9005, 9999]::bigint[]);
-- §3 sending
SELECT message_id AS m8, msg_seq, created FROM im.send_message(9001, :g, 'call-1', '{"t": "on the new library"}') \gset
SELECT :msg_seq AS msg_seq, :'created' AS created;
SELECT msg_seq, created, message_id = :m8 AS same FROM im.send_message(9001, :g, 'call-1', '{"t": "on the new library"}');
SELECT * FROM pg_temp.fails($$SELECT * FROM im.send_message(9001, $$ || :g || $$, 'call-1', '{"t": "other body"}')$$);
SELECT * FROM pg_temp.fails($$SELECT * FROM im.send_message(9003, $$ || :g || $$, 'call-2', '{"t": "left"}')$$);
SELECT * FROM pg_temp.fails($$SELECT * FROM im.send_message(9001, $$ || :g || $$, 'call-3', '{"n": 1e400}')$$);
SELECT msg_seq, created FROM im.edit_message(9001, :g, 'call-4', :m8, '{"t": "edited on the new library"}');
SELECT msg_seq, created FROM im.recall_message(9001, :g, 'call-5', :m8);
SELECT * FROM pg_temp.fails($$SELECT * FROM im.recall_message(9002, $$ || :g || $$, 'call-6', $$ || :m8 || $$)$$);
-- §4 fanout
SELECT im.run_fanout(3) AS first_three, im.run_fanout() AS the_rest;
-- §5 devices and sync
SELECT * FROM im.register_device(9005, 'tab');
SELECT * FROM im.register_device(9001, 'desk');
SELECT im.revoke_device(9002, 'phone'), im.revoke_device(9002, 'phone');
SELECT * FROM pg_temp.fails($$SELECT * FROM im.register_device(9001, 'bad device id')$$);
SELECT * FROM im.device_session(9001, 'phone', 7);
SELECT * FROM im.device_session(9001, 'phone', 6);
SELECT * FROM pg_temp.sync('c1', 9001, 'phone', 1, (SELECT acked FROM pg_temp.dev(9001, 'phone')), 2);
SELECT * FROM pg_temp.page('c2', 9001, 'phone', 'c1', 2);
SELECT * FROM pg_temp.ack(9001, 'phone', 'c2', (SELECT issued FROM pg_temp.dev(9001, 'phone')));
SELECT * FROM pg_temp.ack(9001, 'phone', 'c1', 1);
SELECT * FROM pg_temp.sync('c3', 9001, 'phone', 0, 0);
SELECT * FROM im.ack_sync(9001, 'phone', 'not a token', 1);
SELECT * FROM pg_temp.dev(9001, 'phone');
-- §6 snapshots and history
SELECT b.status, b.sync_generation, b.base_sync_seq, b.page_count, f.status AS page_status, f.page,
       jsonb_array_length(f.items) AS items, a.status AS ack_status, a.acked_sync_seq
FROM im.begin_snapshot(9005, 'tab') b,
     LATERAL im.fetch_snapshot(9005, 'tab', b.snapshot_token, 0) f,
     LATERAL im.ack_snapshot(9005, 'tab', b.snapshot_token, b.manifest_digest) a;
SELECT b.status, a.status AS wrong_digest FROM im.begin_snapshot(9001, 'desk') b,
     LATERAL im.ack_snapshot(9001, 'desk', b.snapshot_token, 'not the digest') a;
SELECT * FROM im.fetch_snapshot(9001, 'desk', 'not a token', 0);
SELECT f.next_after_seq, f.has_more, m - 'created_at' AS message
FROM im.fetch_messages(9001, :g, 0, 100) f, jsonb_array_elements(f.messages) m ORDER BY (m->>'msg_seq')::int;
SELECT f.next_after_seq, f.has_more, jsonb_array_length(f.messages) FROM im.fetch_messages(9005, :g, 0, 2, 4) f;
SELECT * FROM pg_temp.fails($$SELECT * FROM im.fetch_messages(9006, $$ || :g || $$, 0)$$);
-- §7 read state, large groups, message status
SELECT * FROM im.report_read(9001, :g, 3);
SELECT * FROM im.report_read(9001, :g, 2);
SELECT * FROM im.conversation_list(9002);
SELECT c.cleared, c.dirty_target_msg_seq, c.dirty_version
FROM im.conversation_list(9001) l, LATERAL im.clear_dirty(9001, l.conversation_id, l.dirty_version, l.last_msg_seq) c
WHERE l.conversation_id = :big;
SELECT im.delete_for_me(9002, :g, :m8), im.delete_for_me(9002, :g, :m8);
SELECT * FROM im.message_status(:m8);
SELECT im.run_fanout();
-- §8 operations
SELECT * FROM im.gc_inbox();
SELECT * FROM im.gc_inbox(1);
SELECT check_name, severity, conversation_id, user_id FROM im.reconcile();
SELECT * FROM im.repair_fanout(false, true);
SELECT * FROM im.repair_fanout(true, false);
SELECT name FROM im.metrics() ORDER BY name;
SELECT im.issue_device_token(9005, 'tab') AS token \gset
SELECT * FROM im.authenticate(:'token');
SELECT im.revoke_device(9005, 'tab');
SELECT * FROM pg_temp.fails($$SELECT * FROM im.authenticate('$$ || :'token' || $$')$$);
SELECT * FROM pg_temp.fails($$SELECT * FROM im.authenticate('garbage')$$);
SELECT im.rotate_token_key();
SELECT im.retire_token_key(1);
SELECT * FROM pg_temp.fails($$SELECT im.retire_token_key(99)$$);
SELECT * FROM pg_temp.fails($$SELECT im.set_extension_owner('im_upgrade_login')$$);
-- one item left pending: the suite shows the workers leave it alone until
-- ALTER EXTENSION ... UPDATE
SELECT msg_seq, created FROM im.send_message(9002, :g, 'call-7', '{"t": "for the worker"}');
-- the database as the API left it
SELECT * FROM im.reconcile();
SELECT (SELECT count(*) FROM im.event) AS events, (SELECT count(*) FROM im.inbox) AS log_entries,
       (SELECT count(*) FROM im.outbox WHERE state = 'pending') AS pending,
       (SELECT count(*) FROM im.audit) AS audit_rows, (SELECT count(*) FROM im.token_key) AS keys;
