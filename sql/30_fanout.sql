-- Fanout (contract §1, §3, §4): recipients from membership periods, late
-- fanout after a leave, re-join, recall/edit following their target,
-- idempotent redelivery, unread = recount, quarantine, retry, dead letters,
-- private events and hints.  Own fresh database so ids are deterministic.
CREATE DATABASE im_h1_fanout;
\c im_h1_fanout
SET client_min_messages = warning;
CREATE EXTENSION btree_gist;
CREATE EXTENSION im_sync;
RESET client_min_messages;
CREATE FUNCTION try_sql(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE st text; msg text;
BEGIN
  EXECUTE q;
  RETURN 'ok';
EXCEPTION WHEN others THEN
  GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
  RETURN st || ': ' || msg;
END $$;
-- A copy of IM_UNREAD_RECOUNT_SQL (im_sync.h): the unread rule of contract §3.
CREATE FUNCTION recount(uid bigint, cid bigint, rd bigint) RETURNS bigint LANGUAGE sql AS $$
SELECT count(*) FROM im.event e
WHERE e.conversation_id = cid AND e.kind = 'message' AND e.msg_seq > rd AND e.sender_id <> uid
  AND EXISTS (SELECT 1 FROM im.outbox o WHERE o.source_event_id = e.message_id AND o.state = 'done')
  AND EXISTS (SELECT 1 FROM im.membership_period p WHERE p.conversation_id = e.conversation_id
              AND p.user_id = uid AND p.join_seq <= e.msg_seq AND (p.leave_seq IS NULL OR p.leave_seq >= e.msg_seq))
  AND NOT EXISTS (SELECT 1 FROM im.event r JOIN im.outbox ro ON ro.source_event_id = r.message_id
              WHERE r.target_message_id = e.message_id AND r.kind = 'recall' AND ro.state = 'done')
  AND NOT EXISTS (SELECT 1 FROM im.deleted_for_me d WHERE d.user_id = uid AND d.message_id = e.message_id)
$$;
-- Everything that must hold after every step; one row, all true.
CREATE VIEW invariants AS SELECT
  (SELECT count(*) = 0 FROM im.user_conversation u
    WHERE u.unread_count <> recount(u.user_id, u.conversation_id, u.read_msg_seq)) AS unread_eq_recount,
  (SELECT bool_and(h.high_watermark = (SELECT count(*) FROM im.inbox i WHERE i.user_id = h.user_id)
                   AND h.high_watermark = coalesce((SELECT max(sync_seq) FROM im.inbox i WHERE i.user_id = h.user_id), 0))
     FROM im.user_head h) AS sync_seq_gap_free,
  (SELECT count(*) = 0 FROM im.inbox i JOIN im.membership_period p ON p.membership_period_id = i.delivery_scope
     JOIN im.event e ON e.message_id = i.source_event_id
     LEFT JOIN im.event t ON t.message_id = e.target_message_id
    WHERE NOT (p.join_seq <= coalesce(t.msg_seq, e.msg_seq)
               AND (p.leave_seq IS NULL OR p.leave_seq >= coalesce(t.msg_seq, e.msg_seq)))
      AND p.leave_event_id IS DISTINCT FROM e.message_id) AS inbox_in_period,
  (SELECT count(*) = 0 FROM im.user_conversation u
    WHERE u.last_msg_seq <> coalesce((SELECT max(i.msg_seq) FROM im.inbox i WHERE i.user_id = u.user_id
                                       AND i.conversation_id = u.conversation_id), 0)) AS last_msg_seq_ok,
  (SELECT count(*) = 0 FROM im.inbox i GROUP BY i.user_id, i.conversation_id
   HAVING array_agg(i.msg_seq ORDER BY i.sync_seq) FILTER (WHERE i.msg_seq IS NOT NULL)
       <> array_agg(i.msg_seq ORDER BY i.msg_seq) FILTER (WHERE i.msg_seq IS NOT NULL)) IS NOT FALSE AS msg_seq_order;
CREATE VIEW log AS
  SELECT i.user_id, i.sync_seq, i.conversation_id AS conv, i.msg_seq, i.kind, i.source_event_id AS src,
         i.delivery_scope AS scope, i.payload
  FROM im.inbox i ORDER BY 1, 2;
CREATE VIEW st AS
  SELECT user_id, conversation_id AS conv, last_msg_seq, read_msg_seq, unread_count, version
  FROM im.user_conversation ORDER BY 1, 2;
CREATE VIEW fingerprint AS
  SELECT md5((SELECT string_agg(l::text, ';') FROM log l) || (SELECT string_agg(s::text, ';') FROM st s)
             || (SELECT string_agg(h::text, ';' ORDER BY user_id) FROM im.user_head h)) AS fp;

-- run_fanout arguments
SELECT try_sql('SELECT im.run_fanout(NULL)');
SELECT try_sql('SELECT im.run_fanout(0)');
SELECT im.run_fanout();                                                  -- nothing to do

-- 1. a group of 1, 2, 3 with two messages
SELECT im.create_conversation('group', ARRAY[1, 2, 3]::bigint[]);      -- conv 1
SELECT message_id, msg_seq FROM im.send_message(1, 1, 'm1', '{"t": "m1"}');
SELECT message_id, msg_seq FROM im.send_message(2, 1, 'm2', '{"t": "m2"}');
SELECT im.run_fanout(2);                                                -- a partial batch
SELECT msg_seq, state FROM im.outbox ORDER BY outbox_id;
SELECT im.run_fanout();
SELECT * FROM log;
SELECT * FROM st;
SELECT * FROM invariants;

-- 2. late fanout after a leave: 3 leaves after m3 was sent but before it was
-- fanned out; it still gets m3 (its period) and its own leave, not m4
SELECT message_id, msg_seq FROM im.send_message(1, 1, 'm3', '{"t": "m3"}');
SELECT * FROM im.leave_conversation(1, 3);
SELECT message_id, msg_seq FROM im.send_message(1, 1, 'm4', '{"t": "m4"}');
SELECT im.run_fanout();
SELECT * FROM log WHERE user_id = 3;
SELECT * FROM invariants;

-- 3. re-join: a new period; nothing from the gap, join and later messages
-- delivered with the new period as scope
SELECT * FROM im.join_conversation(1, 3);
SELECT message_id, msg_seq FROM im.send_message(2, 1, 'm5', '{"t": "m5"}');
SELECT im.run_fanout();
SELECT * FROM log WHERE user_id = 3;
SELECT * FROM st;
SELECT * FROM invariants;

-- 4. recall and edit follow the target's periods: 3 (left and re-joined)
-- gets the recall of m3 under its old period but not the edit of m4 (sent
-- in its gap); 4, who joins now, gets neither.  User 2 has read past m3
-- (as report_read would leave it), so the recall does not lower its count.
UPDATE im.user_conversation SET read_msg_seq = 4, unread_count = recount(2, 1, 4)
WHERE user_id = 2 AND conversation_id = 1;
SELECT * FROM im.join_conversation(1, 4);
SELECT message_id, msg_seq FROM im.recall_message(1, 1, 'r3', 4);
SELECT message_id, msg_seq FROM im.edit_message(1, 1, 'e4', 6, '{"t": "m4 edited"}');
SELECT im.run_fanout();
SELECT * FROM log WHERE kind IN ('recall', 'edit');
SELECT * FROM log WHERE user_id = 4;
SELECT * FROM st;
SELECT * FROM invariants;

-- 5. redelivery changes nothing (outbox items set back to pending)
CREATE TEMP TABLE fp_before AS SELECT * FROM fingerprint;
UPDATE im.outbox SET state = 'pending' WHERE source_event_id IN (2, 4, 10, 11);
SELECT im.run_fanout();
SELECT fp = (SELECT fp FROM fp_before) AS unchanged FROM fingerprint;
SELECT count(*) AS pending FROM im.outbox WHERE state <> 'done';

-- 6. private events travel through the outbox into the user's log (scope 0)
WITH pe AS (INSERT INTO im.private_event (user_id, conversation_id, kind, read_msg_seq)
            VALUES (1, 1, 'read_cursor', 5) RETURNING *)
INSERT INTO im.outbox (conversation_id, source_event_id, private_user_id)
SELECT conversation_id, private_event_id, user_id FROM pe;
WITH pe AS (INSERT INTO im.private_event (user_id, conversation_id, kind, message_id)
            VALUES (1, 1, 'delete_for_me', 5) RETURNING *)
INSERT INTO im.outbox (conversation_id, source_event_id, private_user_id)
SELECT conversation_id, private_event_id, user_id FROM pe;
SELECT im.run_fanout();
SELECT * FROM log WHERE user_id = 1 AND msg_seq IS NULL;
SELECT * FROM invariants;

-- 7. hints: one NOTIFY im_sync_hint per batch with user:high_watermark
-- (psql prints notifications to its \o target, a file in pg_regress's results
-- directory that psql reads back, so the server needs no access to it; the
-- PID is normalized)
\getenv abs_builddir PG_ABS_BUILDDIR
LISTEN im_sync_hint;
SELECT message_id, msg_seq FROM im.send_message(4, 1, 'h1', '{"t": "hint"}');
\o :abs_builddir/results/h1_hints_1.out
SELECT im.run_fanout();
\o
\set psql_output `cat :'abs_builddir'/results/h1_hints_1.out`
SELECT regexp_replace(:'psql_output', 'PID \d+', 'PID N', 'g') AS psql_output;
-- a large batch is split at commas into chunks of at most 7000 bytes
SELECT im.create_conversation('group', ARRAY(SELECT g FROM generate_series(100001, 101500) g)) AS big;
\o :abs_builddir/results/h1_hints_2.out
SELECT im.run_fanout();
\o
\set psql_output `cat :'abs_builddir'/results/h1_hints_2.out`
WITH n AS (SELECT m[1] AS payload, ord FROM regexp_matches(:'psql_output',
                          'with payload "([^"]*)"', 'g') WITH ORDINALITY AS r(m, ord))
SELECT count(*) AS notifies, max(length(payload)) <= 7000 AS chunks_fit,
       bool_and(payload ~ '^(\d+:\d+)(,\d+:\d+)*$') AS format_ok,
       string_agg(payload, ',' ORDER BY ord)
         = (SELECT string_agg(g || ':1', ',' ORDER BY g) FROM generate_series(100001, 101500) g) AS all_users_once
FROM n;
UNLISTEN im_sync_hint;

-- 8. quarantine: a user covered by two periods is not delivered, the item
-- is kept in im.fanout_quarantine (the database normally forbids this, so
-- the constraint is dropped inside a rolled-back transaction)
BEGIN;
ALTER TABLE im.membership_period DROP CONSTRAINT membership_period_no_overlap;
INSERT INTO im.membership_period (conversation_id, user_id, join_seq, leave_seq, join_event_id, leave_event_id)
VALUES (1, 1, 2, 100, 1, 1);
SELECT message_id, msg_seq FROM im.send_message(2, 1, 'q1', '{"t": "q"}');
-- two messages make a run: the lean run path finds the doubly covered user,
-- fails, and the items are retried one by one through the quarantining path
SELECT message_id, msg_seq FROM im.send_message(2, 1, 'q2', '{"t": "q"}');
SELECT im.run_fanout();
SELECT o.msg_seq, q.user_id, cardinality(q.periods) AS periods FROM im.fanout_quarantine q
JOIN im.outbox o USING (outbox_id) ORDER BY 1, 2;
SELECT user_id, msg_seq, kind FROM log WHERE msg_seq = (SELECT head_msg_seq FROM im.conversation WHERE conversation_id = 1)
  AND conv = 1;
ROLLBACK;

-- 9. a failing item is retried and holds back later items of its
-- conversation (not of others); after fanout_max_attempts it is a dead
-- letter and the conversation moves on
CREATE TABLE poison (src bigint PRIMARY KEY);
CREATE FUNCTION poison_trg() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM public.poison WHERE src = NEW.source_event_id) THEN
    RAISE EXCEPTION 'poisoned item';
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER poison BEFORE INSERT ON im.inbox FOR EACH ROW EXECUTE FUNCTION poison_trg();
SET im_sync.fanout_max_attempts = 2;
SELECT im.direct_conversation(1, 2) AS direct;
SELECT im.run_fanout();
SELECT message_id, msg_seq FROM im.send_message(1, 1, 'p1', '{"t": "p1"}');
SELECT message_id, msg_seq FROM im.send_message(1, 1, 'p2', '{"t": "p2"}');
SELECT message_id, msg_seq FROM im.send_message(1, 3, 'p3', '{"t": "p3"}');
INSERT INTO poison SELECT message_id FROM im.event WHERE client_msg_id = 'p1';
SELECT im.run_fanout();                                  -- p1 fails, p2 waits, p3 goes
SELECT e.client_msg_id, o.state, o.attempts, o.last_error, o.next_attempt_at > now() AS backing_off
FROM im.outbox o JOIN im.event e ON e.message_id = o.source_event_id
WHERE e.client_msg_id IN ('p1', 'p2', 'p3') ORDER BY 1;
SELECT im.run_fanout();                                  -- p1 not due yet: nothing moves
SELECT * FROM invariants;
-- the fault goes away: p1 then p2, in msg_seq order
DELETE FROM poison;
UPDATE im.outbox SET next_attempt_at = now() WHERE state = 'pending';
SELECT im.run_fanout();
SELECT user_id, sync_seq, msg_seq FROM log WHERE src IN (SELECT message_id FROM im.event WHERE client_msg_id IN ('p1', 'p2'))
ORDER BY 1, 2;
SELECT e.client_msg_id, o.state, o.attempts FROM im.outbox o JOIN im.event e ON e.message_id = o.source_event_id
WHERE e.client_msg_id IN ('p1', 'p2') ORDER BY 1;
-- dead letter: d1 fails twice, then d2 is delivered in the same batch
SELECT message_id, msg_seq FROM im.send_message(1, 1, 'd1', '{"t": "d1"}');
SELECT message_id, msg_seq FROM im.send_message(2, 1, 'd2', '{"t": "d2"}');
INSERT INTO poison SELECT message_id FROM im.event WHERE client_msg_id = 'd1';
SELECT im.run_fanout();
UPDATE im.outbox SET next_attempt_at = now() WHERE state = 'pending';
SELECT im.run_fanout();
SELECT e.client_msg_id, o.state, o.attempts, o.last_error FROM im.outbox o
JOIN im.event e ON e.message_id = o.source_event_id WHERE e.client_msg_id IN ('d1', 'd2') ORDER BY 1;
SELECT count(*) FILTER (WHERE src = (SELECT message_id FROM im.event WHERE client_msg_id = 'd1')) AS d1_rows,
       count(*) FILTER (WHERE src = (SELECT message_id FROM im.event WHERE client_msg_id = 'd2')) AS d2_rows
FROM log;
SELECT * FROM invariants;
DROP TRIGGER poison ON im.inbox;
RESET im_sync.fanout_max_attempts;

SELECT * FROM im.conversation_list(3);

\c im_regress
DROP DATABASE im_h1_fanout;
