-- message_facts (contract §16): the four facts of a message for its sender,
-- one row per recipient user, no device ids; 42501 for anyone else.
SELECT setval('im.conversation_id_seq', 9100) IS NOT NULL AS pinned,
       setval('im.event_id_seq', 91000) IS NOT NULL AS pinned_events,
       setval('im.membership_period_id_seq', 9100) IS NOT NULL AS pinned_periods;

\i sql/include/err.sql
CREATE FUNCTION pg_temp.activate(u bigint, dev text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE b record; a record;
BEGIN
  PERFORM im.register_device(u, dev);
  SELECT * INTO b FROM im.begin_snapshot(u, dev);
  SELECT * INTO a FROM im.ack_snapshot(u, dev, b.snapshot_token, b.manifest_digest);
  RETURN a.status;
END $$;

-- 9101 alice (a1), 9102 bob (phone, laptop), 9103 carol (no device),
-- 9104 never a member
SELECT im.create_conversation('group', ARRAY[9101, 9102, 9103]::bigint[], 9101) AS c \gset
SELECT pg_temp.activate(9101, 'a1'), pg_temp.activate(9102, 'phone'),
       pg_temp.activate(9102, 'laptop');
SELECT message_id AS m FROM im.send_message(9101, :c, 'f-1', '{"text": "hi"}') \gset

-- the result has no device column
SELECT pg_get_function_result('im.message_facts(bigint, bigint)'::regprocedure);
-- accepted, not yet in anyone's sync scope; the sender is not a row
SELECT * FROM im.message_facts(9101, :m);
SELECT im.run_fanout() IS NOT NULL AS fanned_out;
SELECT * FROM im.message_facts(9101, :m);
-- bob's phone syncs and ACKs: bob has it on a device; carol has no device
SELECT sync_generation AS g, server_acked_sync_seq AS a FROM im.device_session(9102, 'phone', 0) \gset
SELECT status, batch_token AS bt, batch_high_watermark AS hw FROM im.sync_changes(9102, 'phone', :g, :a) \gset
SELECT status FROM im.ack_sync(9102, 'phone', :'bt', :hw);
SELECT * FROM im.message_facts(9101, :m);
-- bob reads, carol reads: user_read per user
SELECT read_msg_seq FROM im.report_read(9102, :c, 2);
SELECT read_msg_seq FROM im.report_read(9103, :c, 2);
SELECT * FROM im.message_facts(9101, :m);
-- bob's phone revoked: only non-revoked devices count
SELECT im.revoke_device(9102, 'phone');
SELECT * FROM im.message_facts(9101, :m);

-- errors, each changes nothing
SELECT pg_temp.err(format('SELECT * FROM im.message_facts(9102, %s)', :m)) AS recipient_asks;
SELECT pg_temp.err(format('SELECT * FROM im.message_facts(9104, %s)', :m)) AS stranger_asks;
SELECT message_id AS created FROM im.event WHERE conversation_id = :c AND msg_seq = 1 \gset
SELECT pg_temp.err(format('SELECT * FROM im.message_facts(9101, %s)', :created)) AS system_event;
SELECT pg_temp.err('SELECT * FROM im.message_facts(9101, 999999999)') AS unknown_message;
SELECT pg_temp.err(format('SELECT * FROM im.message_facts(0, %s)', :m)) AS bad_sender;
SELECT pg_temp.err(format('SELECT * FROM im.message_facts(NULL, %s)', :m)) AS null_sender;
SELECT pg_temp.err('SELECT * FROM im.message_facts(9101, NULL)') AS null_message;

-- shared_log: no per-device tracking, any_device_synced is NULL
SELECT im.create_conversation('group', ARRAY[9101, 9102]::bigint[], 9101) AS c2 \gset
SELECT im.set_conversation_mode(:c2, 'shared_log');
SELECT message_id AS m2 FROM im.send_message(9101, :c2, 'f-2', '{"text": "big"}') \gset
SELECT im.run_fanout() IS NOT NULL AS fanned_out;
SELECT * FROM im.message_facts(9101, :m2);
