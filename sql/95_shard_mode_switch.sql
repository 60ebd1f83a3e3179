-- Issue 15 (shconc), what a transfer carries.
-- (1) Known gap (6): a mode switch reaches the copies of ex-members.
-- On a user node the switch back to fanout recounts the unread of everyone
-- with state in the conversation (as on one node), but only if the mode
-- event arrives there.  It used to be transferred to current members only:
-- user 2 (node iso) left while the group was in shared_log, the switch
-- back to fanout never reached iso, and a later edit of a message user 2
-- had seen carried the copy's mode 'fanout' — iso's reconcile then
-- reported unread_mismatch (the shared_log bound against the §3 recount).
-- Found by the model test through the router (300 steps, seed 10).
-- (2) A transfer carries only the period rows its item opens or closes and
-- names the other recipients' periods by id; one naming a period the node
-- never received is quarantined (and applies once the create's is applied).
-- (3) The rows of periods whose join item is a dead letter on the source
-- travel with every later transfer.
--
-- One database plays both nodes: first "src" (odd buckets, users 1, 3)
-- runs the conversation and keeps its transfer rows, then it becomes
-- "iso" (even buckets, user 2) and receives them as its apply worker would
-- insert them (the ENABLE ALWAYS trigger fires for ordinary inserts too).
CREATE DATABASE im_shard_mode;
\c im_shard_mode
SET client_min_messages = warning;
CREATE EXTENSION im_sync CASCADE;
RESET client_min_messages;
\set VERBOSITY terse

SELECT im.shard_configure('src', (SELECT array_agg(CASE WHEN b % 2 = 0 THEN 'iso' ELSE 'src' END ORDER BY b)
                                  FROM generate_series(0, 63) b));
SELECT im.create_conversation('group', ARRAY[1, 2, 3]::bigint[], 1) AS conv \gset
SELECT message_id AS m1 FROM im.send_message(1, :conv, 'm1', '{"text": "seen by 2"}') \gset
SELECT im.set_conversation_mode(:conv, 'shared_log');
SELECT msg_seq FROM im.send_message(3, :conv, 'm2', '{"text": "in shared_log"}');
SELECT msg_seq FROM im.send_message(3, :conv, 'm3', '{"text": "in shared_log"}');
SELECT leave_seq FROM im.leave_conversation(:conv, 2);
SELECT im.set_conversation_mode(:conv, 'fanout');
SELECT msg_seq FROM im.send_message(3, :conv, 'm4', '{"text": "after 2 left"}');
SELECT msg_seq FROM im.edit_message(1, :conv, 'e1', :m1, '{"text": "edited"}');
-- (3) a group whose create item became a dead letter here: its transfer never
-- left, so the later transfers carry the period rows themselves
SELECT im.create_conversation('group', ARRAY[1, 2]::bigint[], 1) AS dead_conv \gset
UPDATE im.outbox SET state = 'dead', attempts = 5, last_error = 'made dead by the test'
 WHERE conversation_id = :dead_conv AND msg_seq = 1;
SELECT msg_seq FROM im.send_message(1, :dead_conv, 'd1', '{"text": "after a dead create"}');
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT msg_seq, jsonb_array_length(payload->'periods') AS period_rows,
       jsonb_path_query_array(payload, '$.events[*].kind') AS events
  FROM im.transfer_out WHERE conversation_id = :dead_conv;
-- what src sent to iso: the mode switches reach user 2 although it left
SELECT t.msg_seq, e.kind, e.mode FROM im.transfer_out t JOIN im.event e ON e.message_id = t.source_event_id
 WHERE t.dest_node = 'iso' AND t.conversation_id = :conv ORDER BY t.msg_seq;
CREATE TABLE wire AS SELECT * FROM im.transfer_out ORDER BY transfer_id;

-- now node iso: its copies come from the wire alone
SELECT im.shard_configure('iso', (SELECT array_agg(CASE WHEN b % 2 = 0 THEN 'iso' ELSE 'src' END ORDER BY b)
                                  FROM generate_series(0, 63) b));
SET client_min_messages = warning;
TRUNCATE im.conversation, im.event, im.membership_period, im.user_conversation, im.outbox, im.user_head,
         im.inbox, im.push_job, im.transfer_out CASCADE;
RESET client_min_messages;
-- A transfer names its recipients' periods by id; their rows travelled with
-- the transfer of the item that opened them.  Applied before that one (here:
-- m1's transfer alone, as if the create's were quarantined), it is
-- quarantined with its reason, never delivered to nobody in silence.
SET session_replication_role = replica;   -- playing the apply worker (transfer_trust.c)
INSERT INTO im.transfer_out SELECT * FROM wire WHERE conversation_id = :conv AND msg_seq = 2;
RESET session_replication_role;
SELECT im.shard_apply_transfers() AS applied;
SELECT msg_seq, state, last_error ~ '^23503: .* names membership periods this node never received: \d+$' AS why
  FROM im.transfer_in;
-- once the create's arrives, the quarantined one is retried right after it
-- in the same pass (1.7: an earlier pending transfer of its conversation may
-- be what it missed), and applies; nothing is left to retry by hand
SET session_replication_role = replica;   -- playing the apply worker (transfer_trust.c)
INSERT INTO im.transfer_out SELECT * FROM wire WHERE conversation_id = :conv AND msg_seq = 1;
RESET session_replication_role;
SELECT im.shard_apply_transfers() AS applied;
SELECT im.shard_retry_quarantined(source_node, transfer_id) FROM im.transfer_in WHERE state = 'quarantined';
SELECT msg_seq, state, attempts FROM im.transfer_in ORDER BY msg_seq;
SET session_replication_role = replica;   -- playing the apply worker (transfer_trust.c)
INSERT INTO im.transfer_out SELECT * FROM wire WHERE conversation_id <> :conv OR msg_seq > 2 ORDER BY transfer_id;
RESET session_replication_role;
SELECT im.run_fanout() > 0 AS applied_and_fanned_out;
SELECT state, count(*) FROM im.transfer_in GROUP BY 1;
SELECT c.conversation_id = :dead_conv AS after_dead_create, c.mode, uc.unread_count, uc.read_msg_seq
  FROM im.user_conversation uc JOIN im.conversation c USING (conversation_id) WHERE uc.user_id = 2 ORDER BY 1;
SELECT msg_seq, kind FROM im.inbox WHERE user_id = 2 AND conversation_id = :dead_conv ORDER BY sync_seq;
SELECT check_name, user_id, detail FROM im.reconcile();

\c im_regress
DROP DATABASE im_shard_mode;
