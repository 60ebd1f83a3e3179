-- §2.3 invariants of the core write path (conversation.c, send.c, fanout.c):
-- gap-free msg_seq and sync_seq, one message per (sender, client_msg_id),
-- non-overlapping periods, recipients by period, unread = recount, and
-- inbox / head / state consistency, including after redelivery.
\set ON_ERROR_STOP 1
\pset format unaligned
\pset tuples_only true
\pset pager off
BEGIN;
SELECT plan(24);

-- A copy of IM_UNREAD_RECOUNT_SQL (im_sync.h).
CREATE FUNCTION pg_temp.recount(uid bigint, cid bigint, rd bigint) RETURNS bigint LANGUAGE sql AS $$
SELECT count(*) FROM im.event e
WHERE e.conversation_id = cid AND e.kind = 'message' AND e.msg_seq > rd AND e.sender_id <> uid
  AND EXISTS (SELECT 1 FROM im.outbox o WHERE o.source_event_id = e.message_id AND o.state = 'done')
  AND EXISTS (SELECT 1 FROM im.membership_period p WHERE p.conversation_id = e.conversation_id
              AND p.user_id = uid AND p.join_seq <= e.msg_seq AND (p.leave_seq IS NULL OR p.leave_seq >= e.msg_seq))
  AND NOT EXISTS (SELECT 1 FROM im.event r JOIN im.outbox ro ON ro.source_event_id = r.message_id
              WHERE r.target_message_id = e.message_id AND r.kind = 'recall' AND ro.state = 'done')
  AND NOT EXISTS (SELECT 1 FROM im.deleted_for_me d WHERE d.user_id = uid AND d.message_id = e.message_id)
$$;

-- a workload: two groups and a direct conversation, sends, a leave racing
-- unprocessed sends, a re-join, a recall and an edit
SELECT im.create_conversation('group', ARRAY[101, 102, 103]::bigint[]) AS g1 \gset
SELECT im.create_conversation('group', ARRAY[102, 104]::bigint[], 101) AS g2 \gset
SELECT im.direct_conversation(101, 104) AS d1 \gset
SELECT message_id AS m1 FROM im.send_message(101, :g1, 'tap-1', '{"t": 1}') \gset
SELECT message_id AS m2 FROM im.send_message(102, :g1, 'tap-2', '{"t": 2}') \gset
SELECT im.run_fanout(3) > 0 AS partial \gset
SELECT message_id AS m3 FROM im.send_message(101, :g1, 'tap-3', '{"t": 3}') \gset
SELECT leave_seq AS leave_seq FROM im.leave_conversation(:g1, 103) \gset
SELECT message_id AS m4 FROM im.send_message(101, :g1, 'tap-4', '{"t": 4}') \gset
SELECT membership_period_id AS rejoin FROM im.join_conversation(:g1, 103) \gset
SELECT message_id AS m5 FROM im.send_message(103, :g1, 'tap-5', '{"t": 5}') \gset
SELECT message_id AS r3 FROM im.recall_message(101, :g1, 'tap-r3', :m3) \gset
SELECT message_id AS e4 FROM im.edit_message(101, :g1, 'tap-e4', :m4, '{"t": "4!"}') \gset
SELECT message_id AS dm FROM im.send_message(104, :d1, 'tap-d', '{"t": "d"}') \gset
SELECT message_id AS gm FROM im.send_message(104, :g2, 'tap-g', '{"t": "g"}') \gset
SELECT im.run_fanout() AS processed \gset

-- msg_seq: unique, gap-free from 1, head = last position
SELECT is((SELECT count(*) FROM (SELECT conversation_id FROM im.event GROUP BY 1
           HAVING count(*) <> max(msg_seq) OR count(DISTINCT msg_seq) <> count(*) OR min(msg_seq) <> 1) x),
          0::bigint, 'msg_seq is unique and gap-free from 1 in every conversation');
SELECT is((SELECT count(*) FROM im.conversation c
           WHERE c.head_msg_seq <> (SELECT max(msg_seq) FROM im.event e WHERE e.conversation_id = c.conversation_id)),
          0::bigint, 'conversation head equals the last position');
SELECT is((SELECT count(*) FROM im.event e WHERE NOT EXISTS
             (SELECT 1 FROM im.outbox o WHERE o.source_event_id = e.message_id AND o.msg_seq = e.msg_seq)),
          0::bigint, 'every position has its outbox item');

-- sync_seq: gap-free per user and equal to the head
SELECT is((SELECT count(*) FROM im.user_head h
           WHERE h.high_watermark <> (SELECT count(*) FROM im.inbox i WHERE i.user_id = h.user_id)
              OR h.high_watermark <> coalesce((SELECT max(sync_seq) FROM im.inbox i WHERE i.user_id = h.user_id), 0)),
          0::bigint, 'sync_seq is gap-free per user and the head is its last value');
SELECT is((SELECT count(*) FROM im.outbox WHERE state <> 'done'), 0::bigint, 'every item was processed');

-- one message per (sender, client_msg_id)
SELECT is((SELECT message_id FROM im.send_message(101, :g1, 'tap-1', '{"t": 1}')), :m1::bigint,
          'a replay returns the original message');
SELECT is((SELECT created FROM im.send_message(101, :g1, 'tap-1', '{"t": 1}')), false, 'a replay is not created');
SELECT is((SELECT count(*) FROM im.event WHERE sender_id = 101 AND client_msg_id = 'tap-1'), 1::bigint,
          'one event per (sender, client_msg_id)');
SELECT throws_ok($$SELECT * FROM im.send_message(101, $$ || :g1 || $$, 'tap-1', '{"t": "other"}')$$,
                 'IS409', NULL, 'same key, different body: IS409');
SELECT throws_ok($$SELECT * FROM im.send_message(101, $$ || :g2 || $$, 'tap-1', '{"t": 1}')$$,
                 'IS409', NULL, 'same key, other conversation: IS409');

-- membership periods
SELECT throws_ok($$INSERT INTO im.membership_period (conversation_id, user_id, join_seq, leave_seq, join_event_id, leave_event_id)
                   VALUES ($$ || :g1 || $$, 103, 2, $$ || :leave_seq || $$ + 1, $$ || :m1 || $$, $$ || :m1 || $$)$$,
                 '23P01', NULL, 'an overlapping period is rejected by the exclusion constraint');
SELECT is((SELECT count(*) FROM (SELECT 1 FROM im.membership_period WHERE leave_seq IS NULL
                                 GROUP BY conversation_id, user_id HAVING count(*) > 1) x),
          0::bigint, 'at most one open period per (conversation, user)');
SELECT is((SELECT count(*) FROM im.membership_period WHERE conversation_id = :g1 AND user_id = 103), 2::bigint,
          'a re-join makes a second period');
SELECT throws_ok($$SELECT * FROM im.leave_conversation($$ || :g1 || $$, 999)$$, '42501', NULL,
                 'leaving without a period is 42501');

-- recipients: every inbox event lies in the period it was made for (or is the leaver's leave)
SELECT is((SELECT count(*) FROM im.inbox i JOIN im.membership_period p ON p.membership_period_id = i.delivery_scope
           JOIN im.event e ON e.message_id = i.source_event_id
           LEFT JOIN im.event t ON t.message_id = e.target_message_id
           WHERE i.user_id <> p.user_id
              OR (NOT (p.join_seq <= coalesce(t.msg_seq, e.msg_seq)
                       AND (p.leave_seq IS NULL OR p.leave_seq >= coalesce(t.msg_seq, e.msg_seq)))
                  AND p.leave_event_id IS DISTINCT FROM e.message_id)),
          0::bigint, 'every inbox event is covered by its period');
SELECT is((SELECT count(*) FROM im.event e JOIN im.membership_period p ON p.conversation_id = e.conversation_id
           AND p.join_seq <= e.msg_seq AND (p.leave_seq IS NULL OR p.leave_seq >= e.msg_seq)
           WHERE e.kind IN ('message', 'create', 'join', 'leave') AND NOT EXISTS
             (SELECT 1 FROM im.inbox i WHERE i.user_id = p.user_id AND i.source_event_id = e.message_id)),
          0::bigint, 'every covering period got its event');
SELECT bag_eq($$SELECT msg_seq FROM im.inbox WHERE user_id = 103 AND conversation_id = $$ || :g1,
              $$SELECT msg_seq FROM im.event WHERE conversation_id = $$ || :g1 ||
              $$ AND (msg_seq <= $$ || :leave_seq || $$ + 1 OR msg_seq >= (SELECT join_seq FROM im.membership_period
                                                                       WHERE membership_period_id = $$ || :rejoin || $$))
                 AND kind NOT IN ('edit', 'recall')
               UNION ALL SELECT msg_seq FROM im.event WHERE message_id = $$ || :r3,
              'the leaver sees its period, its leave, the recall of a message it saw, not the gap nor the edit of a gap message');
SELECT is((SELECT count(*) FROM im.inbox WHERE source_event_id = :e4 AND user_id = 103), 0::bigint,
          'an edit follows its target''s periods');
SELECT is((SELECT count(*) FROM (SELECT user_id, conversation_id FROM im.inbox WHERE msg_seq IS NOT NULL
           GROUP BY 1, 2 HAVING array_agg(msg_seq ORDER BY sync_seq) <> array_agg(msg_seq ORDER BY msg_seq)) x),
          0::bigint, 'a user gets one conversation''s events in msg_seq order');

-- unread and state
SELECT is((SELECT count(*) FROM im.user_conversation u
           WHERE u.unread_count <> pg_temp.recount(u.user_id, u.conversation_id, u.read_msg_seq)),
          0::bigint, 'unread_count equals the recount for every user state');
SELECT is((SELECT count(*) FROM im.user_conversation u
           WHERE u.last_msg_seq <> coalesce((SELECT max(msg_seq) FROM im.inbox i
                                            WHERE i.user_id = u.user_id AND i.conversation_id = u.conversation_id), 0)),
          0::bigint, 'last_msg_seq is the highest position in the user''s log');

-- redelivery of everything changes nothing
CREATE TEMP TABLE snap AS
  SELECT (SELECT md5(string_agg(i::text, ';' ORDER BY user_id, sync_seq)) FROM
            (SELECT user_id, sync_seq, source_event_id, delivery_scope, msg_seq FROM im.inbox) i) AS inbox,
         (SELECT md5(string_agg(u::text, ';' ORDER BY user_id, conversation_id)) FROM im.user_conversation u) AS st,
         (SELECT md5(string_agg(h::text, ';' ORDER BY user_id)) FROM im.user_head h) AS heads;
UPDATE im.outbox SET state = 'pending';
SELECT is(im.run_fanout(), (SELECT count(*) FROM im.outbox), 'redelivery processes every item again');
SELECT is((SELECT (SELECT md5(string_agg(i::text, ';' ORDER BY user_id, sync_seq)) FROM
            (SELECT user_id, sync_seq, source_event_id, delivery_scope, msg_seq FROM im.inbox) i)
          || (SELECT md5(string_agg(u::text, ';' ORDER BY user_id, conversation_id)) FROM im.user_conversation u)
          || (SELECT md5(string_agg(h::text, ';' ORDER BY user_id)) FROM im.user_head h)),
          (SELECT inbox || st || heads FROM snap), 'redelivery changes no log, state or head');
SELECT throws_ok($$SELECT * FROM im.send_message(103, $$ || :d1 || $$, 'tap-x', '{}')$$, '42501', NULL,
                 'a non-member cannot send');

SELECT * FROM finish();
ROLLBACK;
