-- The blockers an apply pass marks held transfers behind are the ones
-- after its applies (transfer_in.c, blockers_after_pass), derived from
-- what it read before them: a quarantined transfer with a pending one
-- before it holds nothing until that one is taken; then it holds the later
-- ones in the same pass, whether the pass took the pending one and stopped
-- (max_transfers) or the pending one died (its later ones were not taken).
--
-- One database plays both nodes (as in 95_shard_quarantine_order): "src"
-- sends, then "iso" receives the transfers as its apply worker would; the
-- states before each pass are set by hand.
CREATE DATABASE im_shard_held;
\c im_shard_held
SET client_min_messages = warning;
CREATE EXTENSION im_sync CASCADE;
RESET client_min_messages;
\set VERBOSITY terse

SELECT im.shard_configure('src', (SELECT array_agg(CASE WHEN b % 2 = 0 THEN 'iso' ELSE 'src' END ORDER BY b)
                                  FROM generate_series(0, 63) b));
SELECT im.create_conversation('group', ARRAY[1, 2]::bigint[], 1) AS a \gset
SELECT count(*) FROM (SELECT im.send_message(1, :a, 'a' || i, jsonb_build_object('text', i))
                        FROM generate_series(1, 3) i) s;
SELECT im.create_conversation('group', ARRAY[1, 2]::bigint[], 1) AS c \gset
SELECT count(*) FROM (SELECT im.send_message(1, :c, 'c' || i, jsonb_build_object('text', i))
                        FROM generate_series(1, 3) i) s;
SELECT im.run_fanout() > 0 AS fanned_out;
CREATE TABLE wire AS SELECT * FROM im.transfer_out WHERE dest_node = 'iso' ORDER BY transfer_id;
SELECT conversation_id = :a AS in_a, msg_seq FROM wire ORDER BY conversation_id, msg_seq;

SELECT im.shard_configure('iso', (SELECT array_agg(CASE WHEN b % 2 = 0 THEN 'iso' ELSE 'src' END ORDER BY b)
                                  FROM generate_series(0, 63) b));
SET client_min_messages = warning;
TRUNCATE im.conversation, im.event, im.membership_period, im.user_conversation, im.outbox, im.user_head,
         im.inbox, im.push_job, im.transfer_out CASCADE;
RESET client_min_messages;
CREATE VIEW transfers AS
  SELECT CASE t.conversation_id WHEN :a THEN 'a' ELSE 'c' END AS conv, t.msg_seq, t.state, t.attempts,
         t.held_at IS NOT NULL AS held
    FROM im.transfer_in t;
-- the creations first: both apply
SET session_replication_role = replica;   -- playing the apply worker (transfer_trust.c)
INSERT INTO im.transfer_out SELECT * FROM wire WHERE msg_seq = 1 ORDER BY transfer_id;
RESET session_replication_role;
SELECT im.shard_apply_transfers() AS applied;
-- a poison: c's msg_seq 2 fails to apply
CREATE TABLE poison (id bigint PRIMARY KEY);
INSERT INTO poison SELECT source_event_id FROM wire WHERE conversation_id = :c AND msg_seq = 2;
CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM public.poison p WHERE p.id = NEW.source_event_id) THEN
    RAISE EXCEPTION 'poison item %', NEW.source_event_id;
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER refuse_poison BEFORE INSERT ON im.outbox FOR EACH ROW EXECUTE FUNCTION refuse_poison();
SET session_replication_role = replica;
INSERT INTO im.transfer_out SELECT * FROM wire WHERE msg_seq > 1 ORDER BY transfer_id;
RESET session_replication_role;

-- 1. a: msg_seq 2 pending, 3 quarantined waiting out its backoff, 4 pending.
-- A pass that takes one transfer (a's 2: a was created first, the pass
-- takes a before c) stops before 3: 3 now holds 4.  c holds nothing yet.
UPDATE im.transfer_in SET state = 'quarantined', attempts = 1, last_error = 'XX000: by hand',
       next_attempt_at = now() + interval '1 hour'
 WHERE conversation_id = :a AND msg_seq = 3;
-- c: msg_seq 2 pending and poisoned at its last attempt, 3 quarantined
-- waiting out its backoff, 4 pending
UPDATE im.transfer_in SET attempts = 1 WHERE conversation_id = :c AND msg_seq = 2;
UPDATE im.transfer_in SET state = 'quarantined', attempts = 1, last_error = 'XX000: by hand',
       next_attempt_at = now() + interval '1 hour'
 WHERE conversation_id = :c AND msg_seq = 3;
SELECT * FROM transfers ORDER BY conv, msg_seq;
SELECT im.shard_apply_transfers(1) AS applied;
SELECT * FROM transfers ORDER BY conv, msg_seq;

-- 2. c: its 2 dies (the bound is 2 attempts); 3, skipped after it in the
-- same pass, now holds 4
SET im_sync.fanout_max_attempts = 2;
SELECT im.shard_apply_transfers() AS applied;
RESET im_sync.fanout_max_attempts;
SELECT * FROM transfers ORDER BY conv, msg_seq;

\c im_regress
DROP DATABASE im_shard_held;
