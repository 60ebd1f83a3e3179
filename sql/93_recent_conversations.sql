-- recent_conversations and pin_conversation (contract §20): order (pinned
-- first, then last activity, ties by id), what moves a conversation, left
-- conversations, shared_log, the keyset cursor with messages arriving
-- between pages, malformed cursors, pins (idempotent, per user, synced as
-- conversation_pin events, limited), and the plan of a page for a user in
-- 10,000 conversations.  In a database of its own: later tests read
-- metrics from what this database holds.
CREATE DATABASE im_recent;
\c im_recent
SET client_min_messages = warning;
CREATE EXTENSION im_sync CASCADE;
RESET client_min_messages;
SELECT setval('im.conversation_id_seq', 2000000) IS NOT NULL AS pinned,
       setval('im.event_id_seq', 20000000) IS NOT NULL AS pinned_events,
       setval('im.membership_period_id_seq', 2000000) IS NOT NULL AS pinned_periods;

\i sql/include/err.sql
-- the user's list, compact: id, pinned, left, role, whether activity is known
CREATE FUNCTION pg_temp.recent(u bigint, lim int DEFAULT 50, cur text DEFAULT NULL)
RETURNS TABLE(conversation_id bigint, kind text, pinned boolean, left_conv boolean,
              my_role text, has_activity boolean, muted_until timestamptz, more boolean)
LANGUAGE sql AS $$
  SELECT r.conversation_id, r.kind, r.conversation_pinned, r.left_conversation, r.my_role,
         r.last_activity_at IS NOT NULL, r.muted_until, r.next_cursor IS NOT NULL
  FROM im.recent_conversations(u, lim, cur) r $$;
-- last_activity_at is the created_at of the last message the user saw
CREATE FUNCTION pg_temp.activity_is_last_message(u bigint, c bigint) RETURNS boolean
LANGUAGE sql AS $$
  SELECT r.last_activity_at IS NOT DISTINCT FROM
         (SELECT max(e.created_at) FROM im.event e JOIN im.membership_period p
             ON p.conversation_id = e.conversation_id AND p.user_id = u
            AND e.msg_seq >= p.join_seq AND (p.leave_seq IS NULL OR e.msg_seq <= p.leave_seq)
          WHERE e.conversation_id = c AND e.kind = 'message')
  FROM im.recent_conversations(u, 1000) r WHERE r.conversation_id = c $$;

-- 9301 alice, 9302 bob, 9303 carol, 9304 never a member of anything
SELECT im.create_conversation('group', ARRAY[9301, 9302]::bigint[], 9301) AS g1 \gset
SELECT im.direct_conversation(9301, 9303) AS d \gset
SELECT im.create_conversation('group', ARRAY[9301, 9302, 9303]::bigint[], 9302) AS g2 \gset
SELECT im.create_conversation('group', ARRAY[9301, 9303]::bigint[], 9303) AS quiet \gset
SELECT im.create_conversation('group', ARRAY[9301, 9302]::bigint[], 9302) AS gone \gset
SELECT :g1, :d, :g2, :quiet, :gone;

-- no message yet anywhere: ties by conversation_id ascending, no activity
SELECT im.run_fanout() IS NOT NULL AS fanned_out;
SELECT * FROM pg_temp.recent(9301);

-- newest message first; several messages in one fanout run (lean path)
SELECT msg_seq FROM im.send_message(9302, :g1, 'rc-1', '{"text": "g1 one"}');
SELECT msg_seq FROM im.send_message(9302, :g1, 'rc-2', '{"text": "g1 two"}');
SELECT im.run_fanout() IS NOT NULL AS fanned_out;
SELECT msg_seq FROM im.send_message(9303, :d, 'rc-3', '{"text": "d"}');
SELECT im.run_fanout() IS NOT NULL AS fanned_out;
SELECT msg_seq FROM im.send_message(9301, :g2, 'rc-4', '{"text": "g2 own"}');
SELECT msg_seq FROM im.send_message(9301, :gone, 'rc-5', '{"text": "gone"}');
SELECT im.run_fanout() IS NOT NULL AS fanned_out;
SELECT conversation_id, has_activity FROM pg_temp.recent(9301);
SELECT c, pg_temp.activity_is_last_message(9301, c) FROM unnest(ARRAY[:g1, :d, :g2, :gone]::bigint[]) c;

-- reactions, message pins and edits do not move a conversation; neither
-- do control events (a join)
SELECT message_id AS g1_msg FROM im.event WHERE conversation_id = :g1 AND kind = 'message' ORDER BY msg_seq LIMIT 1 \gset
SELECT message_id AS g2_msg FROM im.event WHERE conversation_id = :g2 AND kind = 'message' ORDER BY msg_seq LIMIT 1 \gset
SELECT created FROM im.react(9301, :g1, :g1_msg, 'like', true, 'rc-6');
SELECT created FROM im.pin_message(9302, :g1, :g1_msg, true, 'rc-7');
SELECT created FROM im.edit_message(9301, :g2, 'rc-8', :g2_msg, '{"text": "g2 edited"}');
SELECT im.join_conversation(:g1, 9303) IS NOT NULL AS joined;
SELECT im.run_fanout() IS NOT NULL AS fanned_out;
SELECT conversation_id FROM pg_temp.recent(9301);
SELECT pg_temp.activity_is_last_message(9301, :g1) AS g1_unmoved;

-- a conversation the user left stays listed, flagged; later messages (not
-- visible to the leaver) do not move it for the leaver
SELECT leave_seq FROM im.leave_conversation(:gone, 9301);
SELECT msg_seq FROM im.send_message(9302, :gone, 'rc-9', '{"text": "after alice left"}');
SELECT im.run_fanout() IS NOT NULL AS fanned_out;
SELECT conversation_id, left_conv, my_role FROM pg_temp.recent(9301) WHERE conversation_id IN (:gone, :d);
SELECT pg_temp.activity_is_last_message(9301, :gone) AS leaver_unmoved,
       pg_temp.activity_is_last_message(9302, :gone) AS member_moved;
SELECT (SELECT last_activity_at FROM im.recent_conversations(9301) WHERE conversation_id = :gone)
     < (SELECT last_activity_at FROM im.recent_conversations(9302) WHERE conversation_id = :gone) AS bob_saw_later;

-- pins: per user, most recently pinned first, idempotent
SELECT * FROM im.pin_conversation(9301, :quiet, true);
SELECT * FROM im.pin_conversation(9301, :g1, true, 'trace-pin-1');
SELECT count(*) AS pin_events FROM im.private_event WHERE user_id = 9301 AND kind = 'conversation_pin';
SELECT * FROM im.pin_conversation(9301, :g1, true);     -- changes nothing
SELECT * FROM im.pin_conversation(9301, :g2, false);    -- not pinned: nothing
SELECT count(*) AS pin_events FROM im.private_event WHERE user_id = 9301 AND kind = 'conversation_pin';
SELECT conversation_id, pinned FROM pg_temp.recent(9301);
-- bob's order is his own
SELECT conversation_id, pinned FROM pg_temp.recent(9302);
-- a pinned conversation's new message does not reorder the pins
SELECT msg_seq FROM im.send_message(9303, :quiet, 'rc-10', '{"text": "quiet speaks"}');
SELECT im.run_fanout() IS NOT NULL AS fanned_out;
SELECT conversation_id, pinned FROM pg_temp.recent(9301) LIMIT 2;
-- a left conversation can be pinned (it is listed)
SELECT * FROM im.pin_conversation(9301, :gone, true);
SELECT * FROM im.pin_conversation(9301, :gone, false);
SELECT * FROM im.pin_conversation(9301, :g1, false);
SELECT conversation_id, pinned FROM pg_temp.recent(9301);
-- the user's devices get the pins as private events, with the trace id
SELECT im.run_fanout() IS NOT NULL AS fanned_out;
SELECT i.conversation_id, i.kind, i.payload, o.trace_id
  FROM im.inbox i JOIN im.outbox o ON o.outbox_id = i.outbox_id
 WHERE i.user_id = 9301 AND i.kind = 'conversation_pin' ORDER BY i.sync_seq;
-- and a snapshot item carries the pin state
SELECT im.register_device(9301, 'rc-phone') IS NOT NULL AS registered;
SELECT snapshot_token AS tok FROM im.begin_snapshot(9301, 'rc-phone') \gset
SELECT (it->>'conversation_id')::bigint AS conversation_id, it->'conversation_pinned' AS conversation_pinned
  FROM im.fetch_snapshot(9301, 'rc-phone', :'tok', 0) f, jsonb_array_elements(f.items) it
 ORDER BY 1;

-- refusals
SELECT pg_temp.err(format('SELECT * FROM im.pin_conversation(9304, %s, true)', :g1));
SELECT pg_temp.err('SELECT * FROM im.pin_conversation(9301, 999999, true)');
SELECT pg_temp.err(format('SELECT * FROM im.pin_conversation(9301, %s, NULL)', :g1));
SELECT pg_temp.err(format('SELECT * FROM im.pin_conversation(9301, %s, true, %L)', :g1, 'bad trace'));
SELECT pg_temp.err('SELECT * FROM im.recent_conversations(9301, 0)');
SELECT pg_temp.err('SELECT * FROM im.recent_conversations(0)');
-- malformed cursors: not base64, empty, wrong length, a key no page gives
SELECT pg_temp.err('SELECT * FROM im.recent_conversations(9301, 2, ''not a cursor!'')');
SELECT pg_temp.err('SELECT * FROM im.recent_conversations(9301, 2, '''')');
SELECT pg_temp.err(format('SELECT * FROM im.recent_conversations(9301, 2, %L)',
                          encode('\x0001020304'::bytea, 'base64')));
SELECT pg_temp.err(format('SELECT * FROM im.recent_conversations(9301, 2, %L)',
                          encode(decode(repeat('00', 24), 'hex'), 'base64')));   -- conversation 0

-- shared_log: the last message under the dirty marker's target
SELECT im.create_conversation('group', ARRAY[9301, 9302, 9303]::bigint[], 9301) AS big \gset
SELECT im.set_conversation_mode(:big, 'shared_log') IS NOT NULL AS switched;
SELECT im.run_fanout() IS NOT NULL AS fanned_out;
SELECT msg_seq FROM im.send_message(9302, :big, 'rc-11', '{"text": "big one"}');
SELECT msg_seq FROM im.send_message(9302, :big, 'rc-12', '{"text": "big two"}');
SELECT message_id AS big_msg FROM im.event WHERE conversation_id = :big AND kind = 'message' ORDER BY msg_seq LIMIT 1 \gset
SELECT im.run_fanout() IS NOT NULL AS fanned_out;
SELECT created FROM im.react(9303, :big, :big_msg, 'like', true, 'rc-13');  -- a marker position, no message
SELECT im.run_fanout() IS NOT NULL AS fanned_out;
SELECT dirty_target_msg_seq, pg_temp.activity_is_last_message(9301, :big) AS last_message
  FROM im.recent_conversations(9301) WHERE conversation_id = :big;
SELECT (SELECT conversation_id FROM pg_temp.recent(9301) WHERE NOT pinned LIMIT 1) = :big AS big_is_newest;

-- the cursor: pages of 2 while messages arrive between pages.  A
-- conversation whose activity does not change meanwhile is listed exactly
-- once; one that moved may be missed or repeated (the client de-duplicates).
SELECT * FROM im.pin_conversation(9301, :d, true);
CREATE TEMP TABLE seen (page int, conversation_id bigint);
CREATE TEMP TABLE moved (conversation_id bigint);
DO $$
DECLARE cur text; page int := 0; n int; c bigint;
BEGIN
  LOOP
    page := page + 1;
    INSERT INTO seen SELECT page, r.conversation_id FROM im.recent_conversations(9301, 2, cur) r;
    GET DIAGNOSTICS n = ROW_COUNT;
    SELECT r.next_cursor INTO cur FROM im.recent_conversations(9301, 2, cur) r OFFSET 1 LIMIT 1;
    EXIT WHEN cur IS NULL OR n < 2 OR page > 20;
    -- one conversation already listed and one not listed yet get a message
    SELECT s.conversation_id INTO c FROM seen s JOIN im.conversation k USING (conversation_id)
     WHERE k.conversation_id NOT IN (SELECT conversation_id FROM moved)
       AND EXISTS (SELECT 1 FROM im.membership_period p WHERE p.conversation_id = k.conversation_id
                   AND p.user_id = 9301 AND p.leave_seq IS NULL)
     ORDER BY s.page DESC, s.conversation_id LIMIT 1;
    IF c IS NOT NULL THEN
      PERFORM im.send_message(9303, c, 'rc-page-a' || page, '{"text": "between pages"}')
        WHERE EXISTS (SELECT 1 FROM im.membership_period p WHERE p.conversation_id = c
                      AND p.user_id = 9303 AND p.leave_seq IS NULL);
      PERFORM im.send_message(9301, c, 'rc-page-b' || page, '{"text": "between pages"}');
      INSERT INTO moved VALUES (c);
    END IF;
    PERFORM im.run_fanout();
  END LOOP;
END $$;
SELECT count(*) > 2 AS several_pages FROM (SELECT DISTINCT page FROM seen) p;
-- every conversation not moved: exactly once
SELECT uc.conversation_id, count(s.conversation_id) AS times
  FROM im.user_conversation uc LEFT JOIN seen s USING (conversation_id)
 WHERE uc.user_id = 9301 AND uc.conversation_id NOT IN (SELECT conversation_id FROM moved)
 GROUP BY uc.conversation_id HAVING count(s.conversation_id) <> 1;
SELECT count(*) AS unmoved_listed_once FROM (
  SELECT s.conversation_id FROM seen s WHERE s.conversation_id NOT IN (SELECT conversation_id FROM moved)
  GROUP BY 1 HAVING count(*) = 1) x;
-- the final order is still the rule's
SELECT array_agg(conversation_id) = (SELECT array_agg(uc.conversation_id ORDER BY
          uc.conversation_pinned_at DESC, uc.last_activity_at DESC, uc.conversation_id)
        FROM im.user_conversation uc WHERE uc.user_id = 9301) AS ordered
  FROM pg_temp.recent(9301);

-- at most 100 pinned conversations per user (rolled back: the later
-- tests of this database scan every conversation)
BEGIN;
SELECT count(im.create_conversation('group', ARRAY[9305, 9306]::bigint[], 9305)) FROM generate_series(1, 101);
SELECT count(*) FILTER (WHERE p.conversation_pinned) AS pinned
  FROM im.user_conversation uc, LATERAL im.pin_conversation(9305, uc.conversation_id, true) p
 WHERE uc.user_id = 9305 AND uc.conversation_id < (SELECT max(conversation_id) FROM im.user_conversation WHERE user_id = 9305);
SELECT pg_temp.err(format('SELECT * FROM im.pin_conversation(9305, %s, true)',
                          (SELECT max(conversation_id) FROM im.user_conversation WHERE user_id = 9305)));
SELECT count(*) AS still_pinned FROM im.recent_conversations(9305, 1000) WHERE conversation_pinned;
ROLLBACK;

-- a page for a user in 10,000 conversations reads page_limit + 1 rows from
-- the recency index backwards: no Sort, no scan of all the user's rows.  The
-- statement is recent_conversations' own (recent.c), planned generic as
-- the function's kept plan is.  Rolled back at the end.
BEGIN;
SELECT count(im.create_conversation('group', ARRAY[9390, 9391]::bigint[], 9391)) FROM generate_series(1, 10000);
UPDATE im.user_conversation SET last_activity_at = now() - (conversation_id % 997) * interval '1 second'
 WHERE user_id = 9390 AND conversation_id % 3 = 0;
ANALYZE im.user_conversation;
ANALYZE im.membership_period;
SET plan_cache_mode = force_generic_plan;
PREPARE page(bigint, timestamptz, timestamptz, bigint, bigint) AS
SELECT c.conversation_id, c.kind, c.mode, uc.last_msg_seq, uc.read_msg_seq,
       uc.unread_count, uc.dirty_target_msg_seq, uc.dirty_version, c.head_msg_seq,
       NULLIF(uc.last_activity_at, '-infinity'::pg_catalog.timestamptz),
       uc.conversation_pinned_at OPERATOR(pg_catalog.>) '-infinity'::pg_catalog.timestamptz,
       m.gone,
       CASE WHEN c.kind OPERATOR(pg_catalog.=) 'direct' THEN NULL ELSE 'member' END,
       NULL::pg_catalog.timestamptz, NULL::pg_catalog.text,
       uc.conversation_pinned_at, uc.last_activity_at, uc.conversation_id
FROM im.user_conversation uc
JOIN im.conversation c ON c.conversation_id OPERATOR(pg_catalog.=) uc.conversation_id
CROSS JOIN LATERAL (SELECT pg_catalog.bool_and(p.leave_seq IS NOT NULL) AS gone
                    FROM im.membership_period p
                    WHERE p.user_id OPERATOR(pg_catalog.=) $1 AND p.conversation_id OPERATOR(pg_catalog.=) uc.conversation_id) m
WHERE uc.user_id OPERATOR(pg_catalog.=) $1
  AND (uc.conversation_pinned_at, uc.last_activity_at, ( OPERATOR(pg_catalog.-) uc.conversation_id)) OPERATOR(pg_catalog.<) ($2, $3, $4)
  AND m.gone IS NOT NULL
ORDER BY uc.conversation_pinned_at DESC, uc.last_activity_at DESC,
         ( OPERATOR(pg_catalog.-) uc.conversation_id) DESC
LIMIT $5;
-- the plan's facts, independent of join details the statistics decide:
-- Sort nodes, how the user's rows are read, the most rows any node made
CREATE FUNCTION pg_temp.plan_facts(q text)
RETURNS TABLE(sort_nodes bigint, user_rows_from text, user_rows_read bigint, most_rows_any_node bigint)
LANGUAGE plpgsql AS $$
DECLARE plan jsonb;
BEGIN
  EXECUTE 'EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF, FORMAT JSON) ' || q INTO plan;
  RETURN QUERY
  WITH RECURSIVE n(node) AS (
    SELECT plan->0->'Plan'
    UNION ALL
    SELECT c FROM n, jsonb_array_elements(n.node->'Plans') c)
  SELECT count(*) FILTER (WHERE node->>'Node Type' LIKE '%Sort%'),
         string_agg(DISTINCT (node->>'Node Type') || ' ' || (node->>'Scan Direction') || ' on ' || (node->>'Index Name'), ', ')
           FILTER (WHERE node->>'Relation Name' = 'user_conversation'),
         sum((node->>'Actual Rows')::bigint * (node->>'Actual Loops')::bigint)
           FILTER (WHERE node->>'Relation Name' = 'user_conversation')::bigint,
         max((node->>'Actual Rows')::bigint * (node->>'Actual Loops')::bigint)
  FROM n;
END $$;
SELECT * FROM pg_temp.plan_facts($q$EXECUTE page(9390, 'infinity', 'infinity', 9223372036854775807, 51)$q$);
-- a later page: the same
SELECT * FROM pg_temp.plan_facts($q$EXECUTE page(9390, '-infinity', now(), -5000, 51)$q$);
RESET plan_cache_mode;
-- and the function itself reads pages through that index
SELECT coalesce(sum(idx_scan), 0) AS scans_before FROM pg_stat_user_indexes
 WHERE indexrelname = 'user_conversation_recent_idx' \gset
SELECT count(*), count(next_cursor) FROM im.recent_conversations(9390);
SELECT next_cursor AS cur FROM im.recent_conversations(9390) OFFSET 49 \gset
SELECT count(*), count(DISTINCT conversation_id) FROM im.recent_conversations(9390, 50, :'cur');
ROLLBACK;
SELECT pg_stat_force_next_flush();
SELECT pg_stat_clear_snapshot();
SELECT sum(idx_scan) - :scans_before >= 2 AS index_used FROM pg_stat_user_indexes
 WHERE indexrelname = 'user_conversation_recent_idx';

\c im_regress
DROP DATABASE im_recent;
