-- The push queue (contract §13): queued by fanout in its transaction,
-- coalesced per (target, conversation), claimed under leases, suppressed
-- when the device is online or caught up or the message was recalled,
-- completed with the contract's result -> state mapping.
-- Users 2901..2999 belong to this file.
\i sql/include/fails.sql
\getenv abs_srcdir PG_ABS_SRCDIR
SELECT set_config('im_sync.push_public_key_file', :'abs_srcdir' || '/test/push/relay_pub.pem', false) IS NOT NULL AS set;
SET im_sync.push_delay = 0;
SET im_sync.push_min_interval = 0;
SELECT im.create_conversation('group', ARRAY[2901, 2902, 2903]::bigint[], 2901) AS c \gset
SELECT state FROM im.register_device(2901, 'phone');
SELECT state FROM im.register_device(2902, 'phone');
SELECT state FROM im.register_device(2902, 'tablet');
SELECT state FROM im.register_device(2903, 'phone');
SELECT im.register_push_target(2901, 'phone', 'fcm', 'app', 'tok-2901-phone') > 0 AS t;
SELECT im.register_push_target(2902, 'phone', 'fcm', 'app', 'tok-2902-phone') > 0 AS t;
SELECT im.register_push_target(2902, 'tablet', 'apns', 'app', 'tok-2902-tablet', 'full') > 0 AS t;
CREATE VIEW jobs AS
  SELECT j.user_id, j.device_id, j.msg_seq, j.state, j.coalesced, j.attempts, j.last_result
  FROM im.push_job j WHERE j.user_id BETWEEN 2901 AND 2999 ORDER BY j.job_id;
CREATE FUNCTION pg_temp.send(u bigint, k text, body jsonb DEFAULT '{"text": "hello"}') RETURNS bigint
LANGUAGE sql AS $f$ SELECT msg_seq FROM im.send_message(u, (SELECT max(conversation_id) FROM im.conversation c
  WHERE EXISTS (SELECT 1 FROM im.membership_period p WHERE p.conversation_id = c.conversation_id AND p.user_id = 2903)), k, body) $f$;
-- claim(relay): what a relay is handed, without ids and tokens
CREATE FUNCTION pg_temp.claim(relay text, n int DEFAULT 100)
RETURNS TABLE(device text, provider text, ids boolean, notification jsonb)
LANGUAGE sql AS $f$
  SELECT j.device_id, c.provider,
         c.notification->'notification'->>'event_id' = (SELECT e.message_id::text FROM im.event e
           WHERE e.conversation_id = j.conversation_id
             AND e.msg_seq = (c.notification #>> '{notification,devices,0,data,default_payload,msg_seq}')::bigint)
         AND c.notification->'notification'->>'room_id' = j.conversation_id::text,
         c.notification #- '{notification,event_id}' #- '{notification,room_id}'
  FROM im.claim_push_jobs(relay, n) c JOIN im.push_job j USING (job_id) ORDER BY c.job_id $f$;
CREATE FUNCTION pg_temp.complete_all(relay text, result text, status int DEFAULT NULL, retry_ms int DEFAULT NULL)
RETURNS SETOF text LANGUAGE sql AS $f$
  SELECT im.complete_push_job(job_id, relay, result, status, retry_ms) FROM im.push_job
  WHERE state = 'claimed' AND relay_id = relay AND user_id BETWEEN 2901 AND 2999 ORDER BY job_id $f$;

-- a message of 2901: one job per target of the other users; none for the sender's own devices
SELECT pg_temp.send(2901, 'q-1');
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT * FROM jobs;
-- a second message before the claim coalesces into the same jobs (nothing written: the claim
-- sends the latest message, and records it in the job)
SELECT pg_temp.send(2901, 'q-2', '{"text": "second"}');
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT * FROM jobs;
-- the claim: preview none (phone) has no sender and no content; full (tablet) both;
-- the badge is the user's total unread; default_payload names conversation and msg_seq
SELECT * FROM pg_temp.claim('relay-a');
SELECT count(*) AS claimed_again FROM im.claim_push_jobs('relay-b');
SELECT * FROM pg_temp.complete_all('relay-a', 'delivered', 200);
SELECT * FROM jobs;

-- a rolled-back fanout queues nothing
SELECT pg_temp.send(2901, 'q-3');
BEGIN;
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT count(*) AS jobs_inside FROM im.push_job WHERE state = 'pending' AND user_id = 2902;
ROLLBACK;
SELECT count(*) AS jobs_after_rollback FROM im.push_job WHERE state = 'pending' AND user_id = 2902;
-- an online device gets no job (presence of its current connection epoch)
SELECT im.set_presence(2902, 'tablet', 0, true) AS online;
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT * FROM jobs WHERE state = 'pending';
-- ... and a device that comes online before the claim is suppressed
SELECT im.set_presence(2902, 'phone', 0, true) AS online;
SELECT count(*) AS handed_out FROM im.claim_push_jobs('relay-a');
SELECT * FROM jobs WHERE msg_seq = (SELECT max(msg_seq) FROM im.push_job);
SELECT im.set_presence(2902, 'phone', 0, false) AS offline, im.set_presence(2902, 'tablet', 0, false) AS offline;
-- a device whose ACK covers the event: no job; ACK past a queued job: suppressed
UPDATE im.device SET acked_sync_seq = (SELECT high_watermark FROM im.user_head WHERE user_id = 2902) + 1
WHERE user_id = 2902 AND device_id = 'tablet';
SELECT pg_temp.send(2901, 'q-4');
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT device_id, state FROM im.push_job WHERE user_id = 2902 AND state = 'pending';
UPDATE im.device SET acked_sync_seq = (SELECT high_watermark FROM im.user_head WHERE user_id = 2902)
WHERE user_id = 2902;
SELECT count(*) AS handed_out FROM im.claim_push_jobs('relay-a');
SELECT device_id, state FROM im.push_job WHERE user_id = 2902 ORDER BY job_id DESC LIMIT 1;
-- a message recalled before the claim: suppressed
SELECT message_id AS m5 FROM im.send_message(2901, :c, 'q-5', '{"text": "oops"}') \gset
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT msg_seq FROM im.recall_message(2901, :c, 'q-5r', :m5);
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT count(*) AS handed_out FROM im.claim_push_jobs('relay-a');
SELECT device_id, state FROM im.push_job WHERE message_id = :m5 ORDER BY 1;
-- reactions and control events queue nothing
SELECT count(*) AS jobs_before FROM im.push_job WHERE user_id = 2902 \gset
SELECT message_id AS m6 FROM im.send_message(2903, :c, 'q-6', '{"text": "by 2903"}') \gset
SELECT im.run_fanout() > 0 AS fanned_out;
DELETE FROM im.push_job WHERE user_id = 2902;
SELECT msg_seq > 0 AS reacted FROM im.react(2901, :c, :m6, 'like', true, 'q-6r');
SELECT im.join_conversation(:c, 2904) IS NOT NULL AS joined;
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT count(*) AS jobs_for_reaction_and_join FROM im.push_job WHERE user_id = 2902;

-- mute: no job while muted; a past time unmutes; a preview-only change keeps the mute;
-- an override beats the account; clear drops the override
CREATE FUNCTION pg_temp.queued(k text) RETURNS bigint LANGUAGE plpgsql AS $f$
BEGIN
  DELETE FROM im.push_job WHERE user_id = 2902;
  PERFORM pg_temp.send(2901, k);
  PERFORM im.run_fanout();
  RETURN (SELECT count(*) FROM im.push_job WHERE user_id = 2902);
END $f$;
SELECT im.set_notify(2902, :c, mute_until => 'infinity');
SELECT pg_temp.queued('m-1') AS jobs_muted;
SELECT im.set_notify(2902, :c, preview => 'full');
SELECT pg_temp.queued('m-2') AS jobs_muted_after_preview_change;
SELECT im.set_notify(2902, :c, mute_until => now() - interval '1 second');
SELECT pg_temp.queued('m-3') AS jobs_unmuted;
SELECT im.set_notify(2902, mute_until => 'infinity');
SELECT pg_temp.queued('m-4') AS jobs_account_muted_override_unmuted;
SELECT im.set_notify(2902, :c, clear => true);
SELECT pg_temp.queued('m-5') AS jobs_account_muted_override_cleared;
SELECT im.set_notify(2902, mute_until => now() + interval '1 hour');
SELECT im.set_notify(2902, :c, mute_until => now() + interval '2 hours');
SELECT pg_temp.queued('m-6') AS jobs_muted_both;
SELECT im.set_notify(2902, mute_until => '-infinity');
SELECT im.set_notify(2902, :c, clear => true);
-- a mute set after the job was queued: suppressed at claim
SELECT pg_temp.queued('m-7') AS jobs;
SELECT im.set_notify(2902, :c, mute_until => 'infinity');
SELECT count(*) AS handed_out FROM im.claim_push_jobs('relay-a');
SELECT im.set_notify(2902, :c, clear => true);

-- preview: the least revealing of the target's and the settings'
SELECT im.set_notify(2902, preview => 'sender');
SELECT pg_temp.queued('p-1') AS jobs;
SELECT device, notification->'notification' ? 'sender' AS sender, notification->'notification' ? 'content' AS content
FROM pg_temp.claim('relay-p');
SELECT im.set_notify(2902, :c, preview => 'full');
SELECT pg_temp.queued('p-2') AS jobs;
SELECT device, notification->'notification'->>'sender' AS sender, notification->'notification'->'content' AS content
FROM pg_temp.claim('relay-p');
-- full: the body if its JSON text is at most 1,024 bytes (506 two-byte characters: 1,024), else {"truncated": true}
DELETE FROM im.push_job WHERE user_id = 2902;
SELECT pg_temp.send(2901, 'p-3', jsonb_build_object('text', repeat('é', 506))) > 0 AS sent;
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT device, octet_length((notification->'notification'->'content')::text) AS content_bytes
FROM pg_temp.claim('relay-p') WHERE device = 'tablet';
DELETE FROM im.push_job WHERE user_id = 2902;
SELECT pg_temp.send(2901, 'p-4', jsonb_build_object('text', repeat('é', 507))) > 0 AS sent;
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT device, notification->'notification'->'content' AS content FROM pg_temp.claim('relay-p') WHERE device = 'tablet';
SELECT im.set_notify(2902, preview => 'full');
SELECT im.set_notify(2902, :c, clear => true);

-- results: the contract's mapping to job and target states
DELETE FROM im.push_job WHERE user_id = 2902;
SELECT im.remove_push_target(2902, 'tablet');
CREATE FUNCTION pg_temp.outcome(result text, status int DEFAULT NULL, retry_ms int DEFAULT NULL)
RETURNS TABLE(state text, rejections int, disabled boolean, retry_in_s int)
LANGUAGE plpgsql AS $f$
DECLARE j bigint; s text;
BEGIN
  DELETE FROM im.push_job WHERE user_id = 2902;
  PERFORM pg_temp.send(2901, 'r-' || md5(random()::text));
  PERFORM im.run_fanout();
  SELECT job_id INTO j FROM im.claim_push_jobs('relay-r');
  s := im.complete_push_job(j, 'relay-r', result, status, retry_ms);
  RETURN QUERY SELECT s, t.rejections, t.disabled_at IS NOT NULL,
    (SELECT round(extract(epoch FROM pj.not_before - now()))::int FROM im.push_job pj WHERE pj.job_id = j AND pj.state = 'retry')
  FROM im.push_target t WHERE t.user_id = 2902 AND t.device_id = 'phone';
END $f$;
SELECT * FROM pg_temp.outcome('delivered', 200);
SELECT * FROM pg_temp.outcome('rejected', 200);
SELECT * FROM pg_temp.outcome('delivered', 200);
SELECT * FROM pg_temp.outcome('permanent', 400);
SELECT * FROM pg_temp.outcome('transient', 502);
SELECT * FROM pg_temp.outcome('rate_limited', 429, 60000);
SELECT * FROM pg_temp.outcome('rate_limited', 429, 1000);
SELECT * FROM pg_temp.outcome('rejected', 410);
SELECT * FROM pg_temp.outcome('rejected', 200);
SELECT * FROM pg_temp.outcome('rejected', 200);
-- a disabled target gets no more jobs; a new registration enables it again
SELECT pg_temp.queued('r-x') AS jobs_for_disabled_target;
SELECT im.register_push_target(2902, 'phone', 'fcm', 'app', 'tok-2902-phone') > 0 AS t;
-- a rejection of the token sent before the target was registered again
-- does not count against the new token
DELETE FROM im.push_job WHERE user_id = 2902;
SELECT pg_temp.send(2901, 'r-y') > 0 AS sent;
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT job_id AS rj FROM im.claim_push_jobs('relay-r') \gset
UPDATE im.push_job SET claimed_at = claimed_at - interval '1 minute' WHERE job_id = :rj;
SELECT im.register_push_target(2902, 'phone', 'fcm', 'app', 'tok-2902-phone-new') > 0 AS registered_again;
SELECT im.complete_push_job(:rj, 'relay-r', 'rejected', 200) AS state;
SELECT rejections, disabled_at IS NULL AS enabled FROM im.push_target WHERE user_id = 2902 AND device_id = 'phone';
-- retries back off 10 s doubling per attempt, capped at 1 h
DELETE FROM im.push_job WHERE user_id = 2902;
SELECT pg_temp.send(2901, 'b-1') > 0 AS sent;
SELECT im.run_fanout() > 0 AS fanned_out;
CREATE FUNCTION pg_temp.fail_again() RETURNS int LANGUAGE plpgsql AS $f$
DECLARE j bigint;
BEGIN
  UPDATE im.push_job SET not_before = now() WHERE user_id = 2902 AND state = 'retry';
  SELECT job_id INTO j FROM im.claim_push_jobs('relay-r');
  PERFORM im.complete_push_job(j, 'relay-r', 'transient');
  RETURN (SELECT round(extract(epoch FROM not_before - now()))::int FROM im.push_job WHERE job_id = j);
END $f$;
SELECT pg_temp.fail_again() AS s1, pg_temp.fail_again() AS s2, pg_temp.fail_again() AS s3;
UPDATE im.push_job SET attempts = 20 WHERE user_id = 2902;
SELECT pg_temp.fail_again() AS capped;
-- a message queued while the job was out merges into the retrying job
UPDATE im.push_job SET not_before = now() WHERE user_id = 2902;
SELECT count(*) AS claimed FROM im.claim_push_jobs('relay-r');
SELECT pg_temp.send(2901, 'b-2') AS latest;
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT state, count(*) FROM im.push_job WHERE user_id = 2902 GROUP BY 1 ORDER BY 1;
SELECT pg_temp.complete_all('relay-r', 'transient', 500);
SELECT state, msg_seq = (SELECT max(msg_seq) FROM im.event WHERE conversation_id = :c) AS latest, coalesced
FROM im.push_job WHERE user_id = 2902;
-- too old: expired instead of retried
UPDATE im.push_job SET not_before = now(), queued_at = now() - interval '2 hours' WHERE user_id = 2902;
SELECT count(*) AS claimed FROM im.claim_push_jobs('relay-r');
UPDATE im.push_job SET state = 'retry', not_before = now(), finished_at = NULL WHERE user_id = 2902;
UPDATE im.push_job SET queued_at = now() - interval '59 minutes' WHERE user_id = 2902;
SELECT count(*) AS claimed FROM im.claim_push_jobs('relay-r');
UPDATE im.push_job SET queued_at = now() - interval '2 hours' WHERE user_id = 2902;
SELECT pg_temp.complete_all('relay-r', 'transient', 503);
-- a lapsed lease: the job is claimable again, and the old relay's result is stale
DELETE FROM im.push_job WHERE user_id = 2902;
SELECT pg_temp.send(2901, 'l-1') > 0 AS sent;
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT job_id AS lj FROM im.claim_push_jobs('relay-old', 1, '1 second') \gset
SELECT count(*) AS claimed_while_leased FROM im.claim_push_jobs('relay-new');
UPDATE im.push_job SET lease_until = now() - interval '1 second' WHERE job_id = :lj;
SELECT im.complete_push_job(:lj, 'relay-old', 'delivered') AS lapsed;
SELECT count(*) AS claimed_after_lapse FROM im.claim_push_jobs('relay-new');
SELECT im.complete_push_job(:lj, 'relay-old', 'delivered') AS other_relay;
SELECT im.complete_push_job(:lj, 'relay-new', 'delivered') AS current;
SELECT im.complete_push_job(:lj, 'relay-new', 'delivered') AS twice;
SELECT im.complete_push_job(999999999, 'relay-new', 'delivered') AS unknown_job;
-- a lapsed lease beside a newer job of the same pair, claimed together:
-- one push (the newer job's, with the latest message); the lapsed one is
-- suppressed, so the claim's pacing row is written once
DELETE FROM im.push_job WHERE user_id = 2902;
SELECT pg_temp.send(2901, 'l-2') > 0 AS sent;
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT job_id AS lj2 FROM im.claim_push_jobs('relay-old', 1, '1 second') \gset
SELECT pg_temp.send(2901, 'l-3') > 0 AS sent;
SELECT im.run_fanout() > 0 AS fanned_out;
UPDATE im.push_job SET lease_until = now() - interval '1 second', not_before = now() WHERE user_id = 2902;
SELECT job_id > :lj2 AS newer_claimed, notification->'notification'->'devices'->0->'data'->'default_payload'->'msg_seq'
       = to_jsonb((SELECT max(msg_seq) FROM im.event WHERE conversation_id = :c)) AS latest
FROM im.claim_push_jobs('relay-new');
SELECT job_id = :lj2 AS lapsed_one, state FROM im.push_job WHERE user_id = 2902 ORDER BY job_id;
SELECT count(*) AS completed FROM pg_temp.complete_all('relay-new', 'delivered', 200);
-- min_interval: the next claim of the pair waits for it
SET im_sync.push_min_interval = '1h';
SELECT pg_temp.send(2901, 'i-1') > 0 AS sent;
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT round(extract(epoch FROM not_before - now()) / 60) AS minutes_to_claim FROM im.push_job
WHERE user_id = 2902 AND state = 'pending';
SELECT count(*) AS handed_out FROM im.claim_push_jobs('relay-r');
SET im_sync.push_min_interval = 0;
SET im_sync.push_delay = '3s';
DELETE FROM im.push_job WHERE user_id = 2902;
SELECT pg_temp.send(2901, 'i-2') > 0 AS sent;
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT round(extract(epoch FROM not_before - now())) AS seconds_to_claim, count(*) FILTER (WHERE true) AS n
FROM im.push_job WHERE user_id = 2902 AND state = 'pending' GROUP BY 1;
SELECT count(*) AS handed_out_before_delay FROM im.claim_push_jobs('relay-r');
SET im_sync.push_delay = 0;

-- shared_log: one job per clean -> dirty marker caused by a message
DELETE FROM im.push_job WHERE user_id = 2902;
SELECT im.set_conversation_mode(:c, 'shared_log');
SELECT im.run_fanout() >= 0 AS fanned_out;
SELECT pg_temp.send(2901, 's-1') > 0 AS sent, pg_temp.send(2901, 's-2') > 0 AS sent;
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT device_id, state, coalesced FROM im.push_job WHERE user_id = 2902;
DELETE FROM im.push_job WHERE user_id = 2902;
SELECT pg_temp.send(2901, 's-3') > 0 AS sent;
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT count(*) AS jobs_while_dirty FROM im.push_job WHERE user_id = 2902;
SELECT im.set_conversation_mode(:c, 'fanout');
SELECT im.run_fanout() >= 0 AS fanned_out;

-- trace ids (contract §21): a job carries the trace id of the message it
-- names and claim_push_jobs returns it; a message coalesced into the job
-- brings its own (none if it has none: never an older message's); a retry
-- that takes in a newer job takes its trace id too
DELETE FROM im.push_job WHERE user_id = 2902;
CREATE FUNCTION pg_temp.traced(k text, trace text) RETURNS boolean LANGUAGE sql AS $f$
  SELECT msg_seq > 0 FROM im.send_message(2901, (SELECT max(conversation_id) FROM im.conversation c
    WHERE EXISTS (SELECT 1 FROM im.membership_period p WHERE p.conversation_id = c.conversation_id AND p.user_id = 2903)),
    k, '{"text": "hello"}', trace_id => trace) $f$;
-- what the relay is handed, then what the job records (the claim's own statement cannot see that)
CREATE FUNCTION pg_temp.claim_traced(relay text)
RETURNS TABLE(device text, msg_seq_is_latest boolean, claimed_trace text, job_trace text)
LANGUAGE plpgsql AS $f$
BEGIN
  CREATE TEMP TABLE claimed ON COMMIT DROP AS SELECT c.job_id, c.trace_id FROM im.claim_push_jobs(relay) c;
  RETURN QUERY
    SELECT j.device_id, j.msg_seq = (SELECT max(e.msg_seq) FROM im.event e WHERE e.conversation_id = j.conversation_id),
           c.trace_id, j.trace_id
    FROM claimed c JOIN im.push_job j USING (job_id) ORDER BY c.job_id;
  DROP TABLE claimed;
END $f$;
SELECT pg_temp.traced('tr-1', 'trace-one') AS sent;
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT device_id, state, trace_id FROM im.push_job WHERE user_id = 2902;
SELECT * FROM pg_temp.claim_traced('relay-t');
SELECT * FROM pg_temp.complete_all('relay-t', 'delivered', 200);
-- two messages coalesced: the claim sends the second and names its trace id
SELECT pg_temp.traced('tr-2', 'trace-two') AS sent;
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT pg_temp.traced('tr-3', 'trace-three') AS sent;
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT device_id, state, coalesced, trace_id FROM im.push_job WHERE user_id = 2902 AND state = 'pending';
SELECT * FROM pg_temp.claim_traced('relay-t');
SELECT * FROM pg_temp.complete_all('relay-t', 'delivered', 200);
-- the latest message has no trace id: the claim names none
SELECT pg_temp.traced('tr-4', 'trace-four') AS sent;
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT pg_temp.send(2901, 'tr-5') > 0 AS sent;
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT * FROM pg_temp.claim_traced('relay-t');
-- while that job is out a traced message queues a new one; the retry takes it in
SELECT pg_temp.traced('tr-6', 'trace-six') AS sent;
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT state, trace_id FROM im.push_job WHERE user_id = 2902 ORDER BY job_id DESC LIMIT 2;
SELECT * FROM pg_temp.complete_all('relay-t', 'transient', 503);
SELECT state, trace_id, msg_seq = (SELECT max(msg_seq) FROM im.event WHERE conversation_id = :c) AS latest
  FROM im.push_job WHERE user_id = 2902 AND state IN ('pending', 'retry', 'claimed');
DELETE FROM im.push_job WHERE user_id = 2902;

-- bad arguments
SELECT * FROM pg_temp.fails($$SELECT * FROM im.claim_push_jobs('')$$);
SELECT * FROM pg_temp.fails($$SELECT * FROM im.claim_push_jobs(NULL)$$);
SELECT * FROM pg_temp.fails($$SELECT * FROM im.claim_push_jobs('r', 0)$$);
SELECT * FROM pg_temp.fails($$SELECT * FROM im.claim_push_jobs('r', 10001)$$);
SELECT * FROM pg_temp.fails($$SELECT * FROM im.claim_push_jobs('r', 10, '0 seconds')$$);
SELECT * FROM pg_temp.fails($$SELECT * FROM im.claim_push_jobs('r', 10, '2 hours')$$);
SELECT * FROM pg_temp.fails($$SELECT * FROM im.claim_push_jobs('r', 10, NULL)$$);
SELECT * FROM pg_temp.fails($$SELECT im.complete_push_job(1, 'r', 'ok')$$);
SELECT * FROM pg_temp.fails($$SELECT im.complete_push_job(1, 'r', NULL)$$);
SELECT * FROM pg_temp.fails($$SELECT im.complete_push_job(0, 'r', 'delivered')$$);
SELECT * FROM pg_temp.fails($$SELECT im.complete_push_job(1, '', 'delivered')$$);
SELECT * FROM pg_temp.fails($$SELECT im.complete_push_job(1, 'r', 'delivered', 99)$$);
SELECT * FROM pg_temp.fails($$SELECT im.complete_push_job(1, 'r', 'rate_limited', 429, -1)$$);
SELECT * FROM pg_temp.fails($$SELECT im.complete_push_job(1, 'r', 'delivered', 200, NULL, repeat('x', 257))$$);
-- the metrics of contract §13
SELECT name, type, labels FROM im.metrics() WHERE name LIKE 'im\_push\_%' ORDER BY name, labels::text;
SELECT value > 0 AS counted FROM im.metrics() WHERE name IN ('im_push_suppressed_total', 'im_push_targets_disabled_total')
  OR (name = 'im_push_results_total' AND labels = '{"result": "rejected"}') ORDER BY name;
DELETE FROM im.push_job WHERE user_id BETWEEN 2901 AND 2999;
RESET im_sync.push_public_key_file;
