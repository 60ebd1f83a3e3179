-- trace_message (contract §21): one message's stages in time order for an
-- operator — accepted, fanout per recipient, synced, read, pushed — with
-- the trace id; after maintenance collected its rows, what is still known
-- and which stages are gone.  Times are shown as "timed" (known or NULL);
-- the order check below pins that timed rows come first, in time order.
SELECT setval('im.conversation_id_seq', 9200) IS NOT NULL AS pinned,
       setval('im.event_id_seq', 92000) IS NOT NULL AS pinned_events,
       setval('im.membership_period_id_seq', 9200) IS NOT NULL AS pinned_periods;
\i sql/include/err.sql
\getenv abs_srcdir PG_ABS_SRCDIR
SELECT set_config('im_sync.push_public_key_file', :'abs_srcdir' || '/test/push/relay_pub.pem', false) IS NOT NULL AS set;
SET im_sync.push_delay = 0;
SET im_sync.push_min_interval = 0;
CREATE FUNCTION pg_temp.activate(u bigint, dev text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE b record; a record;
BEGIN
  PERFORM im.register_device(u, dev);
  SELECT * INTO b FROM im.begin_snapshot(u, dev);
  SELECT * INTO a FROM im.ack_snapshot(u, dev, b.snapshot_token, b.manifest_digest);
  RETURN a.status;
END $$;
-- sync and ACK everything one device has
CREATE FUNCTION pg_temp.sync_ack(u bigint, dev text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE s record; c record; a record;
BEGIN
  SELECT * INTO s FROM im.device_session(u, dev, 0);
  SELECT * INTO c FROM im.sync_changes(u, dev, s.sync_generation, s.server_acked_sync_seq);
  SELECT * INTO a FROM im.ack_sync(u, dev, c.batch_token, c.batch_high_watermark);
  RETURN a.status;
END $$;
-- the trace without what differs from run to run (times, row ids)
CREATE FUNCTION pg_temp.trace(m bigint)
RETURNS TABLE(stage text, user_id bigint, timed boolean, detail jsonb) LANGUAGE sql AS $f$
  SELECT t.stage, t.user_id, t.at IS NOT NULL,
         t.detail - 'processed_at' - 'latest_ack_at' - 'queued_at' - 'outbox_id' - 'job_id'
  FROM im.trace_message(m) t $f$;
-- the order rule: no timed row after an untimed one, times never go back
CREATE FUNCTION pg_temp.in_order(m bigint) RETURNS boolean LANGUAGE sql AS $f$
  SELECT COALESCE(bool_and(NOT (x.prev_at IS NULL AND x.n > 1 AND x.at IS NOT NULL)
                           AND (x.at IS NULL OR x.prev_at IS NULL OR x.at >= x.prev_at)), true)
  FROM (SELECT t.at, lag(t.at) OVER w AS prev_at, row_number() OVER w AS n
          FROM im.trace_message(m) WITH ORDINALITY t(stage, at, user_id, detail, ord)
        WINDOW w AS (ORDER BY t.ord)) x $f$;

-- 9201 alice (a1), 9202 bob (phone with a push target, laptop), 9203 carol (no device)
SELECT im.create_conversation('group', ARRAY[9201, 9202, 9203]::bigint[], 9201) AS c \gset
SELECT pg_temp.activate(9201, 'a1'), pg_temp.activate(9202, 'phone'), pg_temp.activate(9202, 'laptop');
SELECT im.register_push_target(9202, 'phone', 'fcm', 'app', 'tok-9202-phone') > 0 AS t;
SELECT message_id AS m FROM im.send_message(9201, :c, 'tr-1', '{"text": "hi"}') \gset
-- the request's trace id, as the gateway's write would store it
UPDATE im.event SET trace_id = 'trace-92-a' WHERE message_id = :m;
UPDATE im.outbox SET trace_id = 'trace-92-a' WHERE source_event_id = :m;

-- accepted, not fanned out yet: every recipient's row says so
SELECT * FROM pg_temp.trace(:m);
SELECT im.run_fanout() > 0 AS fanned_out;
-- fanout per recipient (sync_seq, period), bob's push job pending
SELECT * FROM pg_temp.trace(:m);
-- the relay delivers bob's push; bob's phone ACKs exactly up to it (a
-- known time); alice's device ACKs too; bob reads it
SELECT count(*) AS claimed FROM im.claim_push_jobs('relay-92');
SELECT im.complete_push_job(job_id, 'relay-92', 'delivered', 200) FROM im.push_job WHERE user_id = 9202;
SELECT pg_temp.sync_ack(9202, 'phone'), pg_temp.sync_ack(9201, 'a1');
SELECT read_msg_seq FROM im.report_read(9202, :c, 2);
SELECT * FROM pg_temp.trace(:m);
SELECT pg_temp.in_order(:m) AS in_order;
-- a later message, then bob's laptop ACKs past both: the phone stays the
-- first device, timed; alone, the laptop's time would not be known
SELECT message_id AS m2 FROM im.send_message(9201, :c, 'tr-2', '{"text": "again"}') \gset
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT pg_temp.sync_ack(9202, 'laptop');
SELECT * FROM pg_temp.trace(:m) WHERE stage = 'synced';
SELECT * FROM pg_temp.trace(:m2) WHERE stage = 'synced';
SELECT pg_temp.in_order(:m2) AS in_order;

-- maintenance collects: every device ACKed the first message, so gc_inbox
-- takes the logs' rows, and the done outbox items go (retention 0 here).
-- What is still known stays; the collected stages say gone.
SELECT im.run_fanout() >= 0 AS fanned_out;
SELECT pg_temp.sync_ack(9202, 'phone'), pg_temp.sync_ack(9201, 'a1');
BEGIN;
SET LOCAL im_sync.inbox_retention = 0;
SELECT sum(deleted) > 0 AS collected FROM im.gc_inbox();
COMMIT;
SELECT count(*) AS inbox_rows_left FROM im.inbox WHERE source_event_id = :m;
SELECT count(*) AS outbox_items_left FROM im.outbox WHERE source_event_id = :m;
SELECT * FROM pg_temp.trace(:m);
SELECT pg_temp.in_order(:m) AS in_order;

-- shared_log: no per-user event for a message, said per recipient: the
-- first message's row is the marker going dirty; the second finds the
-- markers dirty and writes no row
SELECT im.create_conversation('group', ARRAY[9201, 9202]::bigint[], 9201) AS c2 \gset
SELECT im.set_conversation_mode(:c2, 'shared_log');
SELECT message_id AS m3 FROM im.send_message(9201, :c2, 'tr-3', '{"text": "big"}') \gset
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT message_id AS m4 FROM im.send_message(9201, :c2, 'tr-4', '{"text": "bigger"}') \gset
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT * FROM pg_temp.trace(:m3) WHERE stage IN ('accepted', 'fanout', 'synced');
SELECT * FROM pg_temp.trace(:m4) WHERE stage IN ('accepted', 'fanout', 'synced');

-- unknown message, bad argument
SELECT pg_temp.err('SELECT * FROM im.trace_message(999999999)') AS unknown_message;
SELECT pg_temp.err('SELECT * FROM im.trace_message(NULL)') AS null_message;
-- operators only: nobody may run it without a grant
SELECT has_function_privilege('public', 'im.trace_message(bigint)', 'EXECUTE') AS public_may_trace,
       has_function_privilege('public', 'im.shard_trace_message(bigint, bigint[])', 'EXECUTE') AS public_may_trace_users;
