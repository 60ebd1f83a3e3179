-- Fanout retries (contract §4), driven by im.run_fanout with
-- injected faults (triggers raising a chosen SQLSTATE):
--   transient failures (classes 08, 40, 53, 57, 58 and 55P03) back off
--   (1 s, 2 s, ... capped at 1 min) and never count toward
--   im_sync.fanout_max_attempts; any other failure is charged;
--   a batch failing outside any one item is charged (or backed off) as a
--   whole, and run_fanout goes on instead of failing the caller;
--   conversations waiting out a backoff do not take healthy ones' places;
--   metrics and reconcile show what backs off.
-- Own database, so ids are deterministic.
CREATE DATABASE im_h8_fanout_retry;
\c im_h8_fanout_retry
SET client_min_messages = warning;
CREATE EXTENSION btree_gist;
CREATE EXTENSION im_sync;
RESET client_min_messages;
SET im_sync.fanout_max_attempts = 3;
SHOW im_sync.fanout_lock_timeout;

-- Inbox writes of a listed conversation fail with its SQLSTATE (an item fault).
CREATE TABLE fault (conversation_id bigint PRIMARY KEY, sqlstate text NOT NULL);
CREATE FUNCTION fault_trg() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE st text;
BEGIN
  SELECT f.sqlstate INTO st FROM public.fault f WHERE f.conversation_id = NEW.conversation_id;
  IF st IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = st, MESSAGE = 'injected ' || st;
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER fault BEFORE INSERT ON im.inbox FOR EACH ROW EXECUTE FUNCTION fault_trg();
-- Creating the head row of a listed user fails: a fault outside any one
-- item, since a batch creates missing heads while it locks all of them.
CREATE TABLE head_fault (user_id bigint PRIMARY KEY, sqlstate text NOT NULL);
CREATE FUNCTION head_fault_trg() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE st text;
BEGIN
  SELECT f.sqlstate INTO st FROM public.head_fault f WHERE f.user_id = NEW.user_id;
  IF st IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = st, MESSAGE = 'injected head fault ' || st;
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER head_fault BEFORE INSERT ON im.user_head FOR EACH ROW EXECUTE FUNCTION head_fault_trg();

CREATE VIEW items AS
SELECT coalesce(e.client_msg_id, e.kind || '@' || e.conversation_id) AS item, o.state, o.attempts,
       o.transient_failures, o.last_error, o.next_attempt_at > now() AS backing_off
FROM im.outbox o JOIN im.event e ON e.message_id = o.source_event_id;
-- The *_total counters are cluster-wide: the test shows how far it moved them.
CREATE TABLE counters_before AS SELECT name, value FROM im.metrics() WHERE name LIKE 'im\_fanout\_%\_total';
CREATE VIEW counters_moved AS
SELECT m.name, m.value - b.value AS moved FROM im.metrics() m JOIN counters_before b USING (name) ORDER BY 1;

SELECT im.create_conversation('group', '{1,2}') AS a, im.create_conversation('group', '{3,4}') AS b;
SELECT im.run_fanout();

-- 1. a transient item failure: a1 backs off, not charged; b1 goes
INSERT INTO fault VALUES (1, '53100');
SELECT msg_seq FROM im.send_message(1, 1, 'a1', '{"t": "a1"}');
SELECT msg_seq FROM im.send_message(3, 2, 'b1', '{"t": "b1"}');
SELECT im.run_fanout();
SELECT item, state, attempts, transient_failures, last_error FROM items WHERE item IN ('a1', 'b1') ORDER BY 1;
-- Each transient class, one retry each (one transaction, so now() is fixed
-- and the backoff exact): never an attempt, backoff doubles up to 60 s.
-- 40001/40P01 concern the whole transaction, so they fail the batch (WARNING).
CREATE FUNCTION retry_a1(st text, OUT processed bigint, OUT attempts int, OUT transient_failures int,
                         OUT backoff_s numeric, OUT state text) LANGUAGE plpgsql AS $$
BEGIN
  UPDATE public.fault SET sqlstate = st;
  UPDATE im.outbox SET next_attempt_at = now() WHERE outbox_id = (SELECT o.outbox_id FROM im.outbox o
    JOIN im.event e ON e.message_id = o.source_event_id WHERE e.client_msg_id = 'a1');
  processed := im.run_fanout();
  SELECT o.attempts, o.transient_failures, EXTRACT(epoch FROM o.next_attempt_at - now()), o.state
    INTO attempts, transient_failures, backoff_s, state
    FROM im.outbox o JOIN im.event e ON e.message_id = o.source_event_id WHERE e.client_msg_id = 'a1';
END $$;
SELECT s.st, r.* FROM unnest('{08006,57P03,58030,55P03,53200,40001,40P01,53100}'::text[]) WITH ORDINALITY s(st, n),
  LATERAL retry_a1(s.st) r ORDER BY s.n;
SELECT item, state, attempts, transient_failures, last_error FROM items WHERE item = 'a1';
SHOW lock_timeout;   -- run_fanout's own lock_timeout did not leak into the session
-- the outage ends: a1 is delivered, once, to both members
DELETE FROM fault;
UPDATE im.outbox SET next_attempt_at = now() WHERE state = 'pending';
SELECT im.run_fanout();
SELECT item, state, attempts, transient_failures FROM items WHERE item = 'a1';
SELECT user_id, count(*) FROM im.inbox WHERE source_event_id = (SELECT message_id FROM im.event WHERE client_msg_id = 'a1')
GROUP BY 1 ORDER BY 1;

-- 2. a non-transient item failure is charged: a2 (poisoned) backs off
-- 10 s, 20 s, and at the third failure is a dead letter; a3 waits behind it
-- until then and goes in that same call
CREATE TABLE poison (src bigint PRIMARY KEY);
CREATE FUNCTION poison_trg() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM public.poison p WHERE p.src = NEW.source_event_id) THEN
    RAISE EXCEPTION USING ERRCODE = 'P0001', MESSAGE = 'injected P0001';
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER poison BEFORE INSERT ON im.inbox FOR EACH ROW EXECUTE FUNCTION poison_trg();
SELECT msg_seq FROM im.send_message(1, 1, 'a2', '{"t": "a2"}');
SELECT msg_seq FROM im.send_message(1, 1, 'a3', '{"t": "a3"}');
INSERT INTO poison SELECT message_id FROM im.event WHERE client_msg_id = 'a2';
SELECT im.run_fanout();
SELECT item, state, attempts, transient_failures, last_error, backing_off FROM items WHERE item IN ('a2', 'a3') ORDER BY 1;
UPDATE im.outbox SET next_attempt_at = now() WHERE state = 'pending';
SELECT im.run_fanout();
UPDATE im.outbox SET next_attempt_at = now() WHERE state = 'pending';
SELECT im.run_fanout();
SELECT item, state, attempts, transient_failures, last_error FROM items WHERE item IN ('a2', 'a3') ORDER BY 1;
DROP TRIGGER poison ON im.inbox;

-- An outbox item whose source event is gone fails as an item (XX001,
-- charged), not as its batch.
INSERT INTO im.outbox (conversation_id, msg_seq, source_event_id) VALUES (2, 1000, 999999);
SELECT im.run_fanout();
SELECT outbox_id, state, attempts, last_error FROM im.outbox WHERE source_event_id = 999999;
DELETE FROM im.outbox WHERE source_event_id = 999999;

-- 3. a batch failing outside any one item (the head of user 6 cannot be
-- created while the batch locks its heads): run_fanout warns and goes on,
-- every item the batch held is charged an attempt, in the caller's
-- transaction; the next call runs the failed conversations one per batch,
-- so the healthy one (d1) is delivered while c keeps failing
SELECT im.create_conversation('group', '{7,8}') AS d;
SELECT im.run_fanout();
SELECT msg_seq FROM im.send_message(7, 3, 'd1', '{"t": "d1"}');
SELECT im.create_conversation('group', '{5,6}') AS c;
DELETE FROM im.user_head WHERE user_id = 6;   -- fanout has not run: nothing of 6 is in a log yet
INSERT INTO head_fault VALUES (6, 'P0001');
SELECT im.run_fanout();
SELECT item, state, attempts, transient_failures, last_error FROM items WHERE item IN ('d1', 'create@4') ORDER BY 1;
UPDATE im.outbox SET next_attempt_at = now() WHERE state = 'pending';
SELECT im.run_fanout();
SELECT item, state, attempts, transient_failures, last_error FROM items WHERE item IN ('d1', 'create@4') ORDER BY 1;
-- the same fault, transient this time: backed off, not charged
UPDATE head_fault SET sqlstate = '53100';
UPDATE im.outbox SET next_attempt_at = now() WHERE state = 'pending';
SELECT im.run_fanout();
SELECT item, state, attempts, transient_failures, last_error FROM items WHERE item = 'create@4';
DELETE FROM head_fault;
UPDATE im.outbox SET next_attempt_at = now() WHERE state = 'pending';
SELECT im.run_fanout();
SELECT item, state, attempts, transient_failures FROM items WHERE item = 'create@4';
SELECT user_id, high_watermark FROM im.user_head WHERE user_id IN (5, 6) ORDER BY 1;

-- 4. conversations waiting out a backoff do not take healthy ones' places:
-- f1 and f2 back off; their later items are due but wait behind their
-- heads; run_fanout(2) still reaches the healthy conversation h (before,
-- the two candidates were f1 and f2 and nothing moved)
SELECT im.create_conversation('group', '{11,12}') AS f1, im.create_conversation('group', '{13,14}') AS f2,
       im.create_conversation('group', '{15,16}') AS h;
SELECT im.run_fanout();
INSERT INTO fault VALUES (5, '55P03'), (6, '55P03');
SELECT msg_seq FROM im.send_message(11, 5, 'f1a', '{"t": "f1a"}');
SELECT msg_seq FROM im.send_message(13, 6, 'f2a', '{"t": "f2a"}');
SELECT im.run_fanout();
-- as if they had failed for a while: a long backoff (the test must not race a 1 s one)
UPDATE im.outbox SET next_attempt_at = now() + interval '1 hour' WHERE state = 'pending';
SELECT msg_seq FROM im.send_message(11, 5, 'f1b', '{"t": "f1b"}');
SELECT msg_seq FROM im.send_message(13, 6, 'f2b', '{"t": "f2b"}');
SELECT msg_seq FROM im.send_message(15, 7, 'h1', '{"t": "h1"}');
SELECT im.run_fanout(2);
SELECT item, state, attempts, transient_failures, backing_off FROM items WHERE item IN ('f1a', 'f1b', 'f2a', 'f2b', 'h1') ORDER BY 1;
SELECT name, value FROM im.metrics()
WHERE name IN ('im_outbox_pending', 'im_outbox_backing_off', 'im_outbox_transient_retrying', 'im_fanout_dead_letters')
ORDER BY 1;
-- reconcile, past reconcile_outbox_age, names them with their last error
SET im_sync.reconcile_outbox_age = 0;
SELECT check_name, severity, conversation_id, detail - 'age_seconds' - 'next_attempt_at' AS detail,
       detail ? 'next_attempt_at' AS has_next_attempt_at
FROM im.reconcile() WHERE check_name = 'outbox_pending_too_old' ORDER BY conversation_id, detail->>'outbox_id';
RESET im_sync.reconcile_outbox_age;

-- the fault ends: everything is delivered; only the deliberate dead letter a2 stays
DELETE FROM fault;
UPDATE im.outbox SET next_attempt_at = now() WHERE state = 'pending';
SELECT im.run_fanout();
SELECT state, count(*) FROM im.outbox GROUP BY 1 ORDER BY 1;
SELECT check_name, conversation_id FROM im.reconcile() ORDER BY 1, 2;
SELECT * FROM counters_moved;

\c im_regress
DROP DATABASE im_h8_fanout_retry;
