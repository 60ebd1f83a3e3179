-- Issue 15, placement on one node (contract §15): the shard map, ids that
-- carry their bucket, IS421 for a key placed elsewhere, local fanout for
-- local users and transfer records for the others, the arrival trigger's
-- exact-key duplicate filter, apply, quarantine, and reconcile.  In a
-- database of its own: the regression database stays unsharded.
CREATE DATABASE im_shard_regress;
\c im_shard_regress
SET client_min_messages = warning;
CREATE EXTENSION im_sync CASCADE;
RESET client_min_messages;
\set VERBOSITY terse
\i sql/include/outcome.sql

-- unsharded: no name, ids as before
SELECT im.shard_self() IS NULL AS not_sharded;

-- bad maps change nothing
SELECT pg_temp.outcome($$SELECT im.shard_configure('node1', array_fill('node1'::text, ARRAY[63]))$$);
SELECT pg_temp.outcome($$SELECT im.shard_configure('node1', NULL)$$);
SELECT pg_temp.outcome($$SELECT im.shard_configure('node1', array_fill(NULL::text, ARRAY[64]))$$);
SELECT pg_temp.outcome($$SELECT im.shard_configure('node3', (SELECT array_agg('node' || (b % 2 + 1)) FROM generate_series(0, 63) b))$$);
SELECT pg_temp.outcome($$SELECT im.shard_configure('Node 1', array_fill('Node 1'::text, ARRAY[64]))$$);
SELECT pg_temp.outcome($$SELECT im.shard_configure('', array_fill(''::text, ARRAY[64]))$$);
SELECT im.shard_self() IS NULL AS still_not_sharded;

-- node1 owns the even buckets, node2 the odd ones; configuring twice is a no-op
SELECT im.shard_configure('node1', (SELECT array_agg('node' || (b % 2 + 1) ORDER BY b) FROM generate_series(0, 63) b));
SELECT configured_at AS first_configured FROM im.shard_config \gset
SELECT im.shard_configure('node1', (SELECT array_agg('node' || (b % 2 + 1) ORDER BY b) FROM generate_series(0, 63) b));
SELECT im.shard_self(), configured_at = :'first_configured' AS unchanged FROM im.shard_config;

-- groups take the node's own buckets, round robin; users 2 and 4 are
-- local (even), 3 and 5 remote (odd)
SELECT im.create_conversation('group', ARRAY[2, 3, 4], 2) AS g \gset
SELECT im.create_conversation('group', ARRAY[2, 5]) AS g2 \gset
SELECT :g % 64 % 2 AS g_bucket_parity, :g2 % 64 % 2 AS g2_bucket_parity, :g % 64 <> :g2 % 64 AS round_robin,
       :g < 2^53 AS below_2_53;
-- a direct pair lives in bucket (lo + hi) % 64, whoever asks
SELECT im.direct_conversation(2, 4) AS d \gset
SELECT :d % 64 AS d_bucket, im.direct_conversation(4, 2) = :d AS same_pair;
SELECT pg_temp.outcome($$SELECT im.direct_conversation(2, 5)$$);     -- bucket 7: node2
SELECT pg_temp.outcome($$SELECT im.create_conversation('direct', ARRAY[1, 2])$$);  -- bucket 3

-- message ids carry their conversation's bucket
SELECT message_id % 64 = :g % 64 AS message_bucket, msg_seq
FROM im.send_message(2, :g, 'p-1', '{"text": "one"}');
SELECT message_id AS m FROM im.event WHERE client_msg_id = 'p-1' \gset

-- keys placed elsewhere: IS421, nothing written
SELECT pg_temp.outcome($$SELECT * FROM im.send_message(2, 65, 'p-x', '{"text": "x"}')$$);
SELECT pg_temp.outcome($$SELECT * FROM im.join_conversation(65, 2)$$);
SELECT pg_temp.outcome($$SELECT * FROM im.register_device(3, 'phone')$$);
SELECT pg_temp.outcome($$SELECT * FROM im.sync_changes(3, 'phone', 10, 0)$$);
SELECT pg_temp.outcome($$SELECT * FROM im.conversation_heads(ARRAY[65]::bigint[])$$);
SELECT pg_temp.outcome($$SELECT * FROM im.conversation_current(ARRAY[65]::bigint[])$$);
SELECT pg_temp.outcome($$SELECT * FROM im.shard_received_positions(ARRAY[3]::bigint[])$$);
SELECT count(*) AS events_still FROM im.event WHERE client_msg_id = 'p-x';

-- fanout: local users get their log here, remote ones one transfer per
-- (position, node); no head is ever made for a remote user
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT user_id, array_agg(msg_seq ORDER BY sync_seq) AS positions
FROM im.inbox WHERE conversation_id = :g GROUP BY user_id ORDER BY user_id;
SELECT user_id FROM im.user_head ORDER BY user_id;
-- a period's row travels with the item that opens (or closes) it; the
-- others name their recipients' periods by id
SELECT source_node, dest_node, msg_seq,
       jsonb_path_query_array(payload, '$.periods[*].user_id') AS period_users,
       jsonb_array_length(payload->'period_ids') AS named_periods,
       jsonb_array_length(payload->'events') AS events
FROM im.transfer_out WHERE conversation_id = :g ORDER BY msg_seq;
SELECT * FROM im.shard_pending();
SELECT conversation_id = :g AS own, head_msg_seq FROM im.conversation_heads(ARRAY[:g]::bigint[]);
-- 1.6: the head and the mode in force, for the router's conversation_list
SELECT c.conversation_id = :g AS own, c.head_msg_seq, c.mode = (SELECT mode FROM im.conversation WHERE conversation_id = :g) AS mode_now
FROM im.conversation_current(ARRAY[:g]::bigint[]) c;
SELECT user_id, msg_seq, accepted FROM im.message_audience(:m);
SELECT pg_temp.outcome($$SELECT * FROM im.message_audience(9999984)$$);   -- bucket 48: ours, unknown

-- arrival: a transfer from node2 for node1 (conversation 65, a copy) is
-- recorded under its exact key and the replicated row itself is dropped;
-- the same key again only counts a duplicate
CREATE TEMP TABLE t AS SELECT jsonb_build_object(
  'conversation', jsonb_build_object('conversation_id', 65, 'kind', 'group', 'mode', 'fanout',
                                     'head_msg_seq', 2, 'created_at', now()),
  'events', jsonb_build_array(
     jsonb_build_object('message_id', 129, 'conversation_id', 65, 'msg_seq', 1, 'kind', 'create',
                        'body', '[4]'::jsonb, 'recalled', false, 'created_at', now()),
     jsonb_build_object('message_id', 193, 'conversation_id', 65, 'msg_seq', 2, 'kind', 'message',
                        'sender_id', 4, 'client_msg_id', 'r-1', 'body', '{"text": "from node2"}'::jsonb,
                        'content_type', 'text/plain', 'mode', 'fanout', 'recalled', false, 'created_at', now())),
  'periods', jsonb_build_array(jsonb_build_object('membership_period_id', 65, 'conversation_id', 65,
                        'user_id', 4, 'join_seq', 1, 'join_event_id', 129))) AS payload;
SET session_replication_role = replica;   -- playing the apply worker (transfer_trust.c)
INSERT INTO im.transfer_out (transfer_id, source_node, dest_node, outbox_id, conversation_id, msg_seq, source_event_id, payload)
SELECT 9, 'node2', 'node1', 1, 65, 1, 129, payload FROM t;
INSERT INTO im.transfer_out (transfer_id, source_node, dest_node, outbox_id, conversation_id, msg_seq, source_event_id, payload)
SELECT 11, 'node2', 'node1', 2, 65, 2, 193, payload FROM t;
INSERT INTO im.transfer_out (transfer_id, source_node, dest_node, outbox_id, conversation_id, msg_seq, source_event_id, payload)
SELECT 9, 'node2', 'node1', 1, 65, 1, 129, payload FROM t;
RESET session_replication_role;
SELECT count(*) AS stored_rows_from_node2 FROM im.transfer_out WHERE source_node = 'node2';
SELECT source_node, transfer_id, state, duplicates FROM im.transfer_in ORDER BY transfer_id;
-- a lower id arriving later is not "below the highest seen": it is new
SET session_replication_role = replica;   -- playing the apply worker (transfer_trust.c)
INSERT INTO im.transfer_out (transfer_id, source_node, dest_node, outbox_id, conversation_id, msg_seq, source_event_id, payload)
SELECT 3, 'node2', 'node1', 3, 65, 3, 257, jsonb_set(payload, '{periods,0,user_id}', '5') FROM t;
RESET session_replication_role;
SELECT transfer_id, state FROM im.transfer_in ORDER BY transfer_id;

-- apply: copies and outbox items, delivered by the local fanout as for a
-- local conversation; the poison one (a period of user 5, placed on node2)
-- is quarantined with its error and acknowledged; the rest flows
SELECT im.shard_apply_transfers();
SELECT transfer_id, state, last_error FROM im.transfer_in ORDER BY transfer_id;
-- The failover window: the applied records are not written by the
-- applying transaction (logical decoding could send them before the
-- synchronous standby has the apply) but by the next pass, which sees the
-- apply committed (so on the standby)
SELECT count(*) AS acks_in_the_applying_transaction FROM im.transfer_ack;
SELECT im.shard_apply_transfers() AS applied_again;
SELECT source_node, transfer_id, applied_by FROM im.transfer_ack ORDER BY transfer_id;
SELECT count(*) AS settled_without_record FROM im.transfer_in WHERE state <> 'pending' AND applied_at IS NULL;
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT user_id, conversation_id = 65 AS copy, msg_seq, kind FROM im.inbox WHERE conversation_id = 65 ORDER BY sync_seq;
-- a copy is never written to as if it were authoritative
SELECT pg_temp.outcome($$SELECT * FROM im.send_message(4, 65, 'p-y', '{"text": "y"}')$$);
-- applying again changes nothing
SELECT im.shard_apply_transfers() AS applied_again;
SELECT count(*) AS copy_events FROM im.inbox WHERE conversation_id = 65;

-- reconcile: the quarantined transfer, the unacked transfers only once old
SELECT check_name, severity, detail->>'transfer_id' AS transfer_id FROM im.reconcile() ORDER BY 1;
SET im_sync.reconcile_outbox_age = 0;
SELECT check_name, count(*) FROM im.reconcile() GROUP BY 1 ORDER BY 1;
RESET im_sync.reconcile_outbox_age;
-- the back channel on the source: node2's applied record deletes exactly that row
SET session_replication_role = replica;   -- playing the apply worker (transfer_trust.c)
INSERT INTO im.transfer_ack (source_node, transfer_id, applied_by)
SELECT 'node1', min(transfer_id), 'node2' FROM im.transfer_out WHERE dest_node = 'node2';
RESET session_replication_role;
SELECT count(*) AS acks_stored_from_node2 FROM im.transfer_ack WHERE applied_by = 'node2';
SELECT transfers_unacked FROM im.shard_pending();
-- after repair, a quarantined transfer can be retried (here it fails again)
SELECT im.shard_retry_quarantined('node2', 3);
SELECT im.shard_apply_transfers();
SELECT transfer_id, state FROM im.transfer_in WHERE transfer_id = 3;

-- trust between nodes (transfer_trust.c): a row a session inserts is no
-- other node's transfer or ack (42501); one playing the apply worker (a
-- superuser in the replica role: the sender it claims is believed) still
-- passes every other arrival check or is refused
SELECT pg_temp.outcome($$INSERT INTO im.transfer_out (transfer_id, source_node, dest_node, outbox_id, conversation_id, msg_seq, source_event_id, payload)
  VALUES (21, 'node2', 'node1', 0, 65, 9, 0, '{}')$$);
SELECT pg_temp.outcome($$INSERT INTO im.transfer_ack (source_node, transfer_id, applied_by) VALUES ('node1', 1, 'node2')$$);
SET session_replication_role = replica;
-- claims this node, addressed to another, a conversation this node owns (64: bucket 0)
SELECT pg_temp.outcome($$INSERT INTO im.transfer_out (transfer_id, source_node, dest_node, outbox_id, conversation_id, msg_seq, source_event_id, payload)
  VALUES (22, 'node1', 'node1', 0, 65, 9, 0, '{}')$$);
SELECT pg_temp.outcome($$INSERT INTO im.transfer_out (transfer_id, source_node, dest_node, outbox_id, conversation_id, msg_seq, source_event_id, payload)
  VALUES (23, 'node2', 'node3', 0, 65, 9, 0, '{}')$$);
SELECT pg_temp.outcome($$INSERT INTO im.transfer_out (transfer_id, source_node, dest_node, outbox_id, conversation_id, msg_seq, source_event_id, payload)
  VALUES (24, 'node2', 'node1', 0, 64, 9, 0, '{}')$$);
-- an ack naming this node as its acker, an ack of another node's transfer
SELECT pg_temp.outcome($$INSERT INTO im.transfer_ack (source_node, transfer_id, applied_by) VALUES ('node1', 1, 'node1')$$);
SELECT pg_temp.outcome($$INSERT INTO im.transfer_ack (source_node, transfer_id, applied_by) VALUES ('node2', 1, 'node3')$$);
-- a payload carrying a row of another conversation (a body of 65 in a transfer of 129): quarantined
INSERT INTO im.transfer_out (transfer_id, source_node, dest_node, outbox_id, conversation_id, msg_seq, source_event_id, payload)
SELECT 25, 'node2', 'node1', 4, 129, 1, 449, jsonb_build_object(
  'conversation', jsonb_build_object('conversation_id', 129, 'kind', 'group', 'mode', 'fanout',
                                     'head_msg_seq', 1, 'created_at', now()),
  'events', jsonb_build_array(
     jsonb_build_object('message_id', 449, 'conversation_id', 129, 'msg_seq', 1, 'kind', 'create',
                        'body', '[4]'::jsonb, 'recalled', false, 'created_at', now()),
     jsonb_build_object('message_id', 193, 'conversation_id', 65, 'msg_seq', 2, 'kind', 'message',
                        'sender_id', 4, 'client_msg_id', 'r-1', 'body', '{"text": "forged"}'::jsonb,
                        'content_type', 'text/plain', 'mode', 'fanout', 'recalled', false, 'created_at', now())),
  'periods', '[]'::jsonb, 'period_ids', '[]'::jsonb);
RESET session_replication_role;
SET client_min_messages = error;
SELECT im.shard_apply_transfers() AS applied;
RESET client_min_messages;
SELECT transfer_id, state, last_error FROM im.transfer_in WHERE transfer_id > 20;
SELECT body->>'text' AS body_of_193, (SELECT count(*) FROM im.conversation WHERE conversation_id = 129) AS copies_of_129
FROM im.event WHERE message_id = 193;
-- a session's refusal is its error: nothing recorded
SELECT count(*) AS refused_rows FROM im.transfer_refused;

\c im_regress
DROP DATABASE im_shard_regress;
