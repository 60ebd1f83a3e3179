-- Issue 15 (1.7): a quarantined inbound transfer holds the later transfers
-- of its conversation on the destination, as a failing outbox item holds
-- its conversation on one node: they wait (pending, never applied out of
-- msg_seq order) while it is retried with fanout's backoff; other
-- conversations flow; after im_sync.fanout_max_attempts charged attempts it
-- is dead (reconcile: transfer_dead) and the later ones flow past it.  And
-- unread is never counted twice, whatever the order of a dependency copy
-- (the target of an edit reaching the copy with the edit), a recount and
-- the target's own transfer (retried, or arriving late): a copy's event
-- counts only once its own outbox item is processed HERE.
--
-- One database plays both nodes (as in 95_shard_recall_retry): "src" (odd
-- buckets, users 1, 3) runs the conversations and keeps its transfer rows,
-- then "iso" (even buckets, user 2) receives them as its apply worker would.
CREATE DATABASE im_shard_qorder;
\c im_shard_qorder
SET client_min_messages = warning;
CREATE EXTENSION im_sync CASCADE;
RESET client_min_messages;
\set VERBOSITY terse

SELECT im.shard_configure('src', (SELECT array_agg(CASE WHEN b % 2 = 0 THEN 'iso' ELSE 'src' END ORDER BY b)
                                  FROM generate_series(0, 63) b));
CREATE TABLE names (id bigint PRIMARY KEY, name text NOT NULL);
-- a: a message, its edit, its recall, one more message (all later ones wait)
SELECT im.create_conversation('group', ARRAY[1, 2, 3]::bigint[], 1) AS a \gset
SELECT message_id AS am FROM im.send_message(1, :a, 'am', '{"text": "target"}') \gset
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT msg_seq FROM im.edit_message(1, :a, 'ae', :am, '{"text": "target, edited"}');
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT msg_seq FROM im.recall_message(1, :a, 'ar', :am);
SELECT msg_seq FROM im.send_message(1, :a, 'ax', '{"text": "after"}');
-- b: another conversation, flows meanwhile
SELECT im.create_conversation('group', ARRAY[1, 2]::bigint[], 1) AS b \gset
SELECT msg_seq FROM im.send_message(1, :b, 'by', '{"text": "other"}');
-- c: a message that becomes dead, its edit, one more message
SELECT im.create_conversation('group', ARRAY[1, 2]::bigint[], 1) AS c \gset
SELECT message_id AS cm FROM im.send_message(1, :c, 'cm', '{"text": "dies"}') \gset
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT msg_seq FROM im.edit_message(1, :c, 'ce', :cm, '{"text": "dies, edited"}');
SELECT msg_seq FROM im.send_message(1, :c, 'cz', '{"text": "after the dead one"}');
-- e: a message that becomes dead, its recall, one more message
SELECT im.create_conversation('group', ARRAY[1, 2]::bigint[], 1) AS e \gset
SELECT message_id AS em FROM im.send_message(1, :e, 'em', '{"text": "dies, recalled"}') \gset
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT msg_seq FROM im.recall_message(1, :e, 'er', :em);
SELECT msg_seq FROM im.send_message(1, :e, 'ez', '{"text": "after the recalled dead one"}');
-- d: a message whose transfer arrives after its edit's (a dead letter of
-- the source, requeued there later)
SELECT im.create_conversation('group', ARRAY[1, 2]::bigint[], 1) AS d \gset
SELECT message_id AS dm FROM im.send_message(1, :d, 'dm', '{"text": "late"}') \gset
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT msg_seq FROM im.edit_message(1, :d, 'de', :dm, '{"text": "late, edited"}');
SELECT im.run_fanout() > 0 AS fanned_out;
INSERT INTO names VALUES (:a, 'a'), (:b, 'b'), (:c, 'c'), (:d, 'd'), (:e, 'e');
CREATE TABLE wire AS SELECT * FROM im.transfer_out ORDER BY transfer_id;
CREATE TABLE wire_kind AS
  SELECT t.transfer_id, e.kind FROM im.transfer_out t JOIN im.event e ON e.message_id = t.source_event_id;
SELECT n.name, t.msg_seq, k.kind FROM wire t JOIN names n ON n.id = t.conversation_id
  JOIN wire_kind k USING (transfer_id) WHERE t.dest_node = 'iso' ORDER BY 1, 2;

-- now node iso
SELECT im.shard_configure('iso', (SELECT array_agg(CASE WHEN b % 2 = 0 THEN 'iso' ELSE 'src' END ORDER BY b)
                                  FROM generate_series(0, 63) b));
SET client_min_messages = warning;
TRUNCATE im.conversation, im.event, im.membership_period, im.user_conversation, im.outbox, im.user_head,
         im.inbox, im.push_job, im.transfer_out CASCADE;
RESET client_min_messages;
-- the poison: applying the transfers of am and cm fails (their own outbox
-- item is refused; their events still reach the copy as a dependency)
CREATE TABLE poison (id bigint PRIMARY KEY);
INSERT INTO poison VALUES (:am), (:cm), (:em);
CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM public.poison p WHERE p.id = NEW.source_event_id) THEN
    RAISE EXCEPTION 'poison item %', NEW.source_event_id;
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER refuse_poison BEFORE INSERT ON im.outbox FOR EACH ROW EXECUTE FUNCTION refuse_poison();
CREATE VIEW transfers AS
  SELECT n.name, t.msg_seq, k.kind, t.state, t.attempts, t.next_attempt_at > now() AS backing_off,
         EXISTS (SELECT 1 FROM im.transfer_ack a
                  WHERE a.source_node = t.source_node AND a.transfer_id = t.transfer_id) AS acked
    FROM im.transfer_in t JOIN names n ON n.id = t.conversation_id JOIN wire_kind k USING (transfer_id);
CREATE VIEW log2 AS
  SELECT n.name, string_agg(i.msg_seq || ':' || i.kind, ' ' ORDER BY i.sync_seq) AS events
    FROM im.inbox i JOIN names n ON n.id = i.conversation_id WHERE i.user_id = 2 GROUP BY n.name;
CREATE VIEW unread2 AS
  SELECT n.name, u.read_msg_seq, u.unread_count
    FROM im.user_conversation u JOIN names n ON n.id = u.conversation_id WHERE u.user_id = 2;
-- (no retry before the test says so, however slow the machine)
SET im_sync.fanout_max_attempts = 1000;

-- 1. everything but dm's transfer arrives: am and cm are quarantined, the
-- later transfers of a and c wait; b and d apply (d's edit brings dm along
-- as its target).  Every one is acknowledged: the held ones too (this node
-- holds them), so their source and the router's run_fanout need not wait.
SET session_replication_role = replica;   -- playing the apply worker (transfer_trust.c)
INSERT INTO im.transfer_out SELECT * FROM wire WHERE source_event_id <> :dm ORDER BY transfer_id;
RESET session_replication_role;
SELECT im.shard_apply_transfers() AS applied;
-- the records go at the next pass, once the pass that settled or marked
-- them is on the synchronous standby (the failover window, transfer_ack.c):
-- none was written by the pass that settled (applied, quarantined) or
-- marked (held) them
SELECT count(*) AS acks_in_settling_pass FROM im.transfer_ack;
SELECT im.shard_apply_transfers() AS applied;
SELECT * FROM transfers ORDER BY name, msg_seq;
-- the held ones are not due work: nothing left to apply now
SELECT inbound_unapplied FROM im.shard_pending();
SELECT im.shard_apply_transfers() AS applied;
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT * FROM log2 ORDER BY name;
-- a recount now (report_read) does not count dm or cm: neither was
-- delivered here (they are only the targets of edits)
SELECT unread_count FROM im.report_read(2, :d, 1);
SELECT unread_count FROM im.report_read(2, :c, 1);
SELECT * FROM unread2 ORDER BY name;
SELECT check_name, n.name, detail->>'msg_seq' AS msg_seq, detail->>'attempts' AS attempts,
       detail->>'holds' AS holds, detail ? 'next_attempt_at' AS retries, detail->>'error' AS error
  FROM im.reconcile() r JOIN names n ON n.id = r.conversation_id ORDER BY 2, 3;

-- 2. the cause of am's failure is repaired; once its backoff is over it is
-- retried and the held ones follow in msg_seq order: the recall after its
-- target, unread right
DELETE FROM poison WHERE id = :am;
UPDATE im.transfer_in SET next_attempt_at = now() WHERE state = 'quarantined' AND conversation_id = :a;
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT * FROM transfers WHERE name = 'a' ORDER BY msg_seq;
SELECT events FROM log2 WHERE name = 'a';
SELECT im.run_fanout() >= 0 AS ran;
SELECT * FROM unread2 WHERE name = 'a';

-- 3. cm and em reach the bound: dead, and the later ones of c and e flow
-- past them; e's recall of a target never delivered here changes no unread
-- (it fanned out on the unread bound before: former known gap (5))
SET im_sync.fanout_max_attempts = 2;
UPDATE im.transfer_in SET next_attempt_at = now() WHERE state = 'quarantined' AND conversation_id IN (:c, :e);
SELECT im.shard_apply_transfers() AS applied;
SELECT * FROM transfers WHERE name IN ('c', 'e') ORDER BY name, msg_seq;
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT * FROM transfers WHERE name IN ('c', 'e') ORDER BY name, msg_seq;
SELECT name, events FROM log2 WHERE name IN ('c', 'e') ORDER BY name;
SELECT msg_seq, state, attempts FROM im.outbox
 WHERE conversation_id = :e ORDER BY msg_seq;
SELECT unread_count FROM im.report_read(2, :c, 1);
SELECT * FROM unread2 WHERE name = 'e';
SELECT check_name, n.name, detail->>'msg_seq' AS msg_seq, detail->>'attempts' AS attempts,
       detail->>'holds' AS holds, detail ? 'next_attempt_at' AS retries, detail->>'error' AS error
  FROM im.reconcile() r JOIN names n ON n.id = r.conversation_id ORDER BY 2, 3;
RESET im_sync.fanout_max_attempts;

-- 4. the repair path of a dead transfer: fix the cause, retry it; it is
-- delivered late (after the later positions, as a repaired dead letter),
-- counted once in c, not at all in e (its recall was processed before)
DELETE FROM poison;
SELECT im.shard_retry_quarantined(source_node, transfer_id) FROM im.transfer_in WHERE state = 'dead';
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT name, events FROM log2 WHERE name IN ('c', 'e') ORDER BY name;

-- 5. dm's own transfer arrives after its edit's (and after the recount
-- above): delivered, counted once
SET session_replication_role = replica;   -- playing the apply worker (transfer_trust.c)
INSERT INTO im.transfer_out SELECT * FROM wire WHERE source_event_id = :dm;
RESET session_replication_role;
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT events FROM log2 WHERE name = 'd';

SELECT im.run_fanout() >= 0 AS ran;
SELECT * FROM unread2 ORDER BY name;
SELECT state, count(*) FROM im.transfer_in GROUP BY 1;
SELECT check_name, user_id, detail FROM im.reconcile();

-- 6. an event with no outbox item here counts as delivered only once it is
-- older than the collection cutoff (IM_ITEM_PROCESSED_SQL): a copy's event
-- that came only as a dependency of a later transfer has no item and was
-- not delivered.  Simulated on b's last message: its item removed, it is in
-- neither the snapshot nor the sync scope; once older than the cutoff (as
-- an item collected after processing) it is in both.
SELECT message_id AS bm, msg_seq AS bseq FROM im.event
 WHERE conversation_id = :b AND kind = 'message' ORDER BY msg_seq DESC LIMIT 1 \gset
SELECT state FROM im.register_device(2, 'qphone');
CREATE FUNCTION pg_temp.snapshot_last(conv bigint) RETURNS bigint LANGUAGE sql AS $$
  SELECT (x->>'last_msg_seq')::bigint
    FROM im.begin_snapshot(2, 'qphone') b, im.fetch_snapshot(2, 'qphone', b.snapshot_token, 0) f,
         jsonb_array_elements(f.items) x
   WHERE (x->>'conversation_id')::bigint = conv $$;
SELECT :bseq AS b_last, pg_temp.snapshot_last(:b) AS in_snapshot,
       (SELECT bool_and(in_sync_scope) FROM im.shard_message_status(:bm, ARRAY[2]::bigint[])) AS in_scope;
BEGIN;
DELETE FROM im.outbox WHERE source_event_id = :bm;
SELECT pg_temp.snapshot_last(:b) AS in_snapshot_without_item,
       (SELECT bool_and(in_sync_scope) FROM im.shard_message_status(:bm, ARRAY[2]::bigint[])) AS in_scope_without_item;
INSERT INTO im.maintenance_state (name, at) VALUES ('outbox_collected_before', now() + interval '1 minute')
  ON CONFLICT (name) DO UPDATE SET at = EXCLUDED.at;
SELECT pg_temp.snapshot_last(:b) AS in_snapshot_collected,
       (SELECT bool_and(in_sync_scope) FROM im.shard_message_status(:bm, ARRAY[2]::bigint[])) AS in_scope_collected;
ROLLBACK;

\c im_regress
DROP DATABASE im_shard_qorder;
