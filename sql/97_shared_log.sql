-- Large groups (contract §2 set_conversation_mode, §4 shared_log, §7
-- clear_dirty; design §10.3): dirty markers instead of per-member message
-- events, coalesced per fanout batch; one conversation_dirty event per
-- clean -> dirty; clear_dirty by version CAS; a switch in either direction
-- loses and doubles nothing; unread equals the recount after the switch back.
SET client_min_messages = warning;
DROP DATABASE IF EXISTS im_shared_log;
RESET client_min_messages;
CREATE DATABASE im_shared_log;
\c im_shared_log
SET client_min_messages = warning;
CREATE EXTENSION btree_gist;
CREATE EXTENSION im_sync;
RESET client_min_messages;
CREATE FUNCTION try_sql(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE st text; msg text; det text;
BEGIN
  EXECUTE q;
  RETURN 'ok';
EXCEPTION WHEN others THEN
  GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, det = PG_EXCEPTION_DETAIL;
  RETURN st || ': ' || msg || coalesce(' | ' || nullif(det, ''), '');
END $$;
-- what each user's log holds, per kind
CREATE VIEW logs AS
  SELECT user_id, string_agg(kind || coalesce('@' || msg_seq, '') ||
                             coalesce(' ' || payload::text, ''), ', ' ORDER BY sync_seq) AS log
  FROM im.inbox GROUP BY user_id ORDER BY user_id;
CREATE VIEW markers AS
  SELECT user_id, last_msg_seq, read_msg_seq, unread_count, dirty_target_msg_seq,
         dirty_version, dirty
  FROM im.user_conversation ORDER BY user_id, conversation_id;

SELECT im.create_conversation('group', ARRAY[1, 2, 3]::bigint[]) AS c \gset
SELECT message_id, msg_seq FROM im.send_message(1, :c, 'a1', '{"t": "fanout era"}');   -- 2

-- errors change nothing
SELECT try_sql($$SELECT im.set_conversation_mode(1, 'broadcast')$$);
SELECT try_sql($$SELECT im.set_conversation_mode(1, NULL)$$);
SELECT try_sql($$SELECT im.set_conversation_mode(99, 'shared_log')$$);
SELECT try_sql($$SELECT im.set_conversation_mode(im.direct_conversation(7, 8), 'shared_log')$$);
SELECT count(*) AS events_after_errors FROM im.event WHERE conversation_id = 1;

-- switch: a `mode` control event at msg_seq 3; same mode again is a no-op
SELECT im.set_conversation_mode(:c, 'shared_log');
SELECT im.set_conversation_mode(:c, 'shared_log');
SELECT msg_seq, kind, body, mode FROM im.event WHERE conversation_id = :c ORDER BY msg_seq;

-- shared_log traffic: two messages, a leave, a message, a recall (control)
SELECT msg_seq FROM im.send_message(1, :c, 'a2', '{"t": "s1"}');   -- 4
SELECT msg_seq FROM im.send_message(2, :c, 'b1', '{"t": "s2"}');   -- 5
SELECT leave_seq FROM im.leave_conversation(:c, 3);                -- leave event 6
SELECT msg_seq FROM im.send_message(1, :c, 'a3', '{"t": "s3"}');   -- 7
SELECT msg_seq FROM im.recall_message(1, :c, 'r1',
  (SELECT message_id FROM im.event WHERE conversation_id = :c AND msg_seq = 4));   -- 8

-- hints: c<conversation>:<position> per coalesced run, user:watermark for moved heads
-- (psql prints notifications to its \o target, a file in pg_regress's results
-- directory that psql reads back, so the server needs no access to it; the
-- PID is normalized)
\getenv abs_builddir PG_ABS_BUILDDIR
LISTEN im_sync_hint;
\o :abs_builddir/results/sl_hints_1.out
SELECT im.run_fanout();
\o
\set psql_output `cat :'abs_builddir'/results/sl_hints_1.out`
SELECT regexp_replace(:'psql_output', 'PID \d+', 'PID N', 'g') AS psql_output;
-- no `message` events for 4, 5, 7; one conversation_dirty per user (clean->dirty);
-- control events (mode, leave, recall) always as inbox events; the leaver's
-- marker stops at its last visible position (5); it still gets the recall of 4
SELECT * FROM logs;
SELECT * FROM markers;

-- clear_dirty: stale version fails, a saved position short of the target fails,
-- the right version and position clears; errors
SELECT * FROM im.clear_dirty(1, :c, 1, 7);
SELECT * FROM im.clear_dirty(1, :c, 2, 6);
SELECT * FROM im.clear_dirty(1, :c, 2, 7);
SELECT * FROM im.clear_dirty(1, :c, 2, 7);   -- repeat: clean already, still cleared
SELECT try_sql($$SELECT im.clear_dirty(1, 1, NULL, 7)$$);
SELECT try_sql($$SELECT im.clear_dirty(1, 1, 1, -1)$$);
SELECT try_sql($$SELECT im.clear_dirty(9, 1, 1, 7)$$);
SELECT try_sql($$SELECT im.clear_dirty(1, 99, 1, 7)$$);

-- a new message after the clear makes user 1 dirty again (new event); user 2
-- never cleared: version bumps, no second event
SELECT msg_seq FROM im.send_message(2, :c, 'b2', '{"t": "s4"}');   -- 9
\o :abs_builddir/results/sl_hints_2.out
SELECT im.run_fanout();
\o
\set psql_output `cat :'abs_builddir'/results/sl_hints_2.out`
SELECT regexp_replace(:'psql_output', 'PID \d+', 'PID N', 'g') AS psql_output;
SELECT * FROM logs;
SELECT * FROM markers;

-- reading in shared_log mode: clamped to the marker, unread is the upper bound
SELECT * FROM im.report_read(1, :c, 100);

-- switch back to fanout: unread becomes the exact recount again
SELECT im.set_conversation_mode(:c, 'fanout');                      -- 10
SELECT msg_seq FROM im.send_message(1, :c, 'a4', '{"t": "f2"}');   -- 11
\o :abs_builddir/results/sl_hints_3.out
SELECT im.run_fanout();
\o
\set psql_output `cat :'abs_builddir'/results/sl_hints_3.out`
SELECT regexp_replace(:'psql_output', 'PID \d+', 'PID N', 'g') AS psql_output;
SELECT * FROM markers;
SELECT count(*) AS reconcile_rows FROM im.reconcile();

-- every member can obtain every visible position exactly once: fanout-mode
-- positions through inbox events, shared_log positions through fetch_messages
-- under a marker whose target covers them
SELECT u AS user_id,
       (SELECT array_agg(x ORDER BY x) FROM (
          SELECT i.msg_seq AS x FROM im.inbox i
          WHERE i.user_id = u AND i.msg_seq IS NOT NULL
          UNION ALL
          SELECT (m->>'msg_seq')::bigint
          FROM im.fetch_messages(u, :c, 0, 1000) f, jsonb_array_elements(f.messages) m
          JOIN im.event e ON e.message_id = (m->>'message_id')::bigint
          WHERE e.kind = 'message' AND e.mode = 'shared_log'
            AND e.msg_seq <= (SELECT dirty_target_msg_seq FROM im.user_conversation
                              WHERE user_id = u AND conversation_id = :c)) s) AS obtained,
       (SELECT array_agg((m->>'msg_seq')::bigint ORDER BY (m->>'msg_seq')::bigint)
        FROM im.fetch_messages(u, :c, 0, 1000) f, jsonb_array_elements(f.messages) m) AS visible
FROM unnest(ARRAY[1, 2, 3]::bigint[]) u;

-- message_status: device_synced is NULL for a shared_log message position
UNLISTEN im_sync_hint;
SELECT * FROM im.register_device(2, 'phone');
SELECT user_id, device_id, accepted, in_sync_scope, device_synced, user_read
FROM im.message_status((SELECT message_id FROM im.event WHERE conversation_id = :c AND msg_seq = 7))
ORDER BY 1, 2;

-- the active members, for the gateway's CONVERSATION_ADVANCED hints
SELECT * FROM im.conversation_members(:c);
SELECT try_sql($$SELECT * FROM im.conversation_members(99)$$);

-- conversation_list gives the authoritative head
SELECT conversation_id, mode, last_msg_seq, dirty_target_msg_seq, head_msg_seq
FROM im.conversation_list(2);

-- im_sync.shared_log_min_members switches a group on the join that reaches it
SET im_sync.shared_log_min_members = 3;
SELECT im.create_conversation('group', ARRAY[1, 2]::bigint[]) AS g \gset
SELECT im.set_conversation_mode(:g, 'fanout') AS still_fanout;
SELECT created FROM im.join_conversation(:g, 3);
SELECT mode, head_msg_seq FROM im.conversation WHERE conversation_id = :g;
SELECT msg_seq, kind, body FROM im.event WHERE conversation_id = :g ORDER BY msg_seq;
RESET im_sync.shared_log_min_members;
