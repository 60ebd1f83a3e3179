-- Issue 15: a recall on a copy is final.  A transfer dead on the user node
-- (1.7: a quarantined one holds the later ones of its conversation, so only
-- a dead one is passed) and retried after a later transfer already brought
-- the recall (its target travels with it, recalled) must not bring the
-- message's body back: the copy's recall is a tombstone (contract §12.4),
-- and an older payload re-applied by im.shard_retry_quarantined may only add
-- what is missing.
--
-- One database plays both nodes (as in 95_shard_mode_switch): "src" (odd
-- buckets, users 1, 3) runs the conversation and keeps its transfer rows,
-- then "iso" (even buckets, user 2) receives them as its apply worker would.
CREATE DATABASE im_shard_recall;
\c im_shard_recall
SET client_min_messages = warning;
CREATE EXTENSION im_sync CASCADE;
RESET client_min_messages;
\set VERBOSITY terse

SELECT im.shard_configure('src', (SELECT array_agg(CASE WHEN b % 2 = 0 THEN 'iso' ELSE 'src' END ORDER BY b)
                                  FROM generate_series(0, 63) b));
SELECT im.create_conversation('group', ARRAY[1, 2, 3]::bigint[], 1) AS conv \gset
SELECT message_id AS m FROM im.send_message(1, :conv, 'm', '{"text": "to be recalled"}') \gset
-- the message's transfer is written before the recall: it carries the body
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT msg_seq FROM im.recall_message(1, :conv, 'r', :m);
-- a body with nulls inside travels unchanged (only a row's own NULL columns
-- are left out of a payload), here in a direct conversation of src
SELECT im.direct_conversation(1, 2) AS dconv \gset
SELECT message_id AS m2 FROM im.send_message(1, :dconv, 'm2', '{"text": "nulls kept", "n": null, "o": {"p": null}}') \gset
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT t.msg_seq, e.kind FROM im.transfer_out t JOIN im.event e ON e.message_id = t.source_event_id
 WHERE t.dest_node = 'iso' AND t.conversation_id = :conv ORDER BY t.msg_seq;
CREATE TABLE wire AS SELECT * FROM im.transfer_out ORDER BY transfer_id;

-- now node iso
SELECT im.shard_configure('iso', (SELECT array_agg(CASE WHEN b % 2 = 0 THEN 'iso' ELSE 'src' END ORDER BY b)
                                  FROM generate_series(0, 63) b));
SET client_min_messages = warning;
TRUNCATE im.conversation, im.event, im.membership_period, im.user_conversation, im.outbox, im.user_head,
         im.inbox, im.push_job, im.transfer_out CASCADE;
RESET client_min_messages;
-- the message's transfer arrives first: it names a period this node has not
-- received yet, so it fails; with a bound of one attempt it is dead at once
SET session_replication_role = replica;   -- playing the apply worker (transfer_trust.c)
INSERT INTO im.transfer_out SELECT * FROM wire WHERE conversation_id = :conv AND msg_seq = 2;
RESET session_replication_role;
SET im_sync.fanout_max_attempts = 1;
SELECT im.shard_apply_transfers() AS applied;
RESET im_sync.fanout_max_attempts;
SELECT msg_seq, state FROM im.transfer_in WHERE conversation_id = :conv ORDER BY msg_seq;
-- the create and the recall arrive and apply past it; the recall brings its
-- target along, recalled
SET session_replication_role = replica;   -- playing the apply worker (transfer_trust.c)
INSERT INTO im.transfer_out SELECT * FROM wire WHERE NOT (conversation_id = :conv AND msg_seq = 2)
 ORDER BY transfer_id;
RESET session_replication_role;
SELECT im.run_fanout() >= 0 AS ran;
SELECT recalled, body IS NULL AS tombstone FROM im.event WHERE message_id = :m;
-- the older transfer retried: delivered, but the copy stays recalled
SELECT im.shard_retry_quarantined(source_node, transfer_id) FROM im.transfer_in WHERE state = 'dead';
SELECT im.run_fanout() >= 0 AS ran;
SELECT state, count(*) FROM im.transfer_in WHERE conversation_id = :conv GROUP BY 1;
SELECT recalled, body IS NULL AS tombstone FROM im.event WHERE message_id = :m;
SELECT msg_seq, kind FROM im.inbox WHERE user_id = 2 AND conversation_id = :conv ORDER BY sync_seq;
-- The recall's item was fanned out before its target reached the log and
-- changed no unread (its target was never counted here: no item of it was
-- processed); the target, delivered late after its recall, is not counted
-- either.  (Before 1.7 the recall failed on the unread bound, a charged
-- attempt: known gap (5).)
SELECT msg_seq, state, attempts FROM im.outbox WHERE conversation_id = :conv ORDER BY msg_seq;
SELECT unread_count FROM im.user_conversation WHERE user_id = 2 AND conversation_id = :conv;
SELECT body FROM im.event WHERE message_id = :m2;
SELECT check_name, user_id, detail FROM im.reconcile();

\c im_regress
DROP DATABASE im_shard_recall;
