-- sync_changes (contract §5): the nine start-of-batch rules, continuation
-- pages, the fixed batch watermark, cursor checks, event shapes.
-- Users 5001..5099 belong to this file.  Workers are paused: run_fanout
-- delivers.
\i sql/include/fails.sql
\i sql/include/sync_helpers.sql

-- 5002 writes to 5001; user 5001's log: create, m1..m5
SELECT im.create_conversation('group', ARRAY[5001, 5002, 5003]::bigint[], 5002) AS c \gset
SELECT count(*) FROM generate_series(1, 5) i,
       LATERAL im.send_message(5002, :c, 's50-m' || i, jsonb_build_object('t', 'm' || i));
SELECT im.run_fanout() > 0 AS delivered;
SELECT high_watermark FROM im.user_head WHERE user_id = 5001;
SELECT * FROM im.register_device(5001, 'a');
SELECT * FROM im.register_device(5001, 'b');
SELECT * FROM im.register_device(5003, 'a');

-- rule 2: NEW → RESET_REQUIRED, nothing changes, the empty shape
SELECT * FROM pg_temp.sync('r2', 5001, 'a', 1, 0);
SELECT * FROM pg_temp.dev(5001, 'a');
-- snapshot makes it ACTIVE at S = 6 (generation 2)
SELECT * FROM pg_temp.activate(5001, 'a');
SELECT * FROM pg_temp.dev(5001, 'a');

-- rule 7: ACTIVE, same generation, la >= ACK → OK from the ACK
SELECT * FROM pg_temp.sync('r7', 5001, 'a', 2, 6);
SELECT count(*) FROM generate_series(6, 10) i,
       LATERAL im.send_message(5002, :c, 's50-m' || i, jsonb_build_object('t', 'm' || i));
SELECT im.run_fanout() > 0 AS delivered;
-- a batch in pages of 2: the watermark (11) is fixed at its start
SELECT * FROM pg_temp.sync('p1', 5001, 'a', 2, 6, 2);
-- a new event arrives while the batch is read
SELECT message_id AS m11 FROM im.send_message(5002, :c, 's50-m11', jsonb_build_object('t', 'm11')) \gset
SELECT im.run_fanout() > 0 AS delivered;
SELECT * FROM pg_temp.page('p2', 5001, 'a', 'p1', 2);
SELECT * FROM pg_temp.page('p3', 5001, 'a', 'p2', 2);
-- every page repeats the batch token (same batch)
SELECT (SELECT tb FROM tok WHERE k = 'p1') = (SELECT tb FROM tok WHERE k = 'p3') AS same_batch_token;
SELECT * FROM pg_temp.ack(5001, 'a', 'p1', 11);
-- la between ACK and issued is fine; the next batch starts from the ACK
SELECT * FROM pg_temp.sync('n1', 5001, 'a', 2, 11);
-- im_sync.max_batch_events caps the range
SET im_sync.max_batch_events = 1;
SELECT count(*) FROM generate_series(12, 13) i,
       LATERAL im.send_message(5002, :c, 's50-m' || i, jsonb_build_object('t', 'm' || i));
SELECT im.run_fanout() > 0 AS delivered;
SELECT * FROM pg_temp.sync('cap', 5001, 'a', 2, 11);
RESET im_sync.max_batch_events;
SELECT * FROM pg_temp.dev(5001, 'a');

-- event shapes (contract §11): exactly these keys
SELECT (SELECT array_agg(k ORDER BY k) FROM jsonb_object_keys(e) k) AS message_keys
  FROM im.sync_changes(5001, 'a', 2, 11) s, jsonb_array_elements(s.events) e
 WHERE e->>'kind' = 'message' LIMIT 1;

-- rule 5: la beyond anything ever issued → corrupt cursor: bump, RESETTING
SELECT * FROM pg_temp.sync('r5', 5001, 'a', 2, 99);
SELECT * FROM pg_temp.dev(5001, 'a');
-- rule 2 again: RESETTING waits for the snapshot (no further bump)
SELECT * FROM pg_temp.sync('r2b', 5001, 'a', 3, 12);
SELECT * FROM pg_temp.activate(5001, 'a');
SELECT * FROM pg_temp.dev(5001, 'a');

-- rule 8: rollback (la < ACK) → bump, recovery session, RECOVERY from la;
-- watermark never below the ACK
SELECT * FROM pg_temp.sync('r8', 5001, 'a', 4, 10);
SELECT * FROM pg_temp.dev(5001, 'a');
SELECT sync_generation, resume_from, batch_high_watermark, state,
       expires_at > now() AS lease_held
  FROM im.recovery_session WHERE user_id = 5001 AND device_id = 'a' ORDER BY recovery_session_id;
-- rule 4: the same session batch again (la >= session resume_from)
SELECT * FROM pg_temp.sync('r4', 5001, 'a', 5, 12);
SELECT count(*) AS sessions FROM im.recovery_session WHERE user_id = 5001 AND device_id = 'a';
-- RECOVERING but la below the session's start: rule 8 again, a new session
SELECT * FROM pg_temp.sync('r8b', 5001, 'a', 5, 8);
SELECT sync_generation, resume_from, batch_high_watermark, state
  FROM im.recovery_session WHERE user_id = 5001 AND device_id = 'a' ORDER BY recovery_session_id;
-- rule 3: the session expired → bump, RESETTING, session EXPIRED
SET im_sync.recovery_ttl = 0;
SELECT * FROM pg_temp.sync('r8c', 5001, 'a', 6, 7);
RESET im_sync.recovery_ttl;
SELECT * FROM pg_temp.sync('r3', 5001, 'a', 7, 9);
SELECT * FROM pg_temp.dev(5001, 'a');
SELECT sync_generation, resume_from, state
  FROM im.recovery_session WHERE user_id = 5001 AND device_id = 'a' ORDER BY recovery_session_id;

-- rule 8 for a reinstall: other generation, nothing applied
SELECT * FROM pg_temp.activate(5001, 'a');
SELECT * FROM pg_temp.sync('re', 5001, 'a', 1, NULL);
-- rule 9: the gap is over im_sync.recovery_max_replay
SELECT * FROM pg_temp.activate(5001, 'a');
SET im_sync.recovery_max_replay = 2;
SELECT * FROM pg_temp.sync('r9a', 5001, 'a', 1, 10);
SELECT * FROM pg_temp.dev(5001, 'a');
SELECT * FROM pg_temp.activate(5001, 'a');
SELECT * FROM pg_temp.sync('r8d', 5001, 'a', 1, 12);
RESET im_sync.recovery_max_replay;
-- rule 9: other generation and la beyond anything issued
SELECT * FROM pg_temp.activate(5001, 'a');
SELECT * FROM pg_temp.sync('r9b', 5001, 'a', 1, 500);
SELECT * FROM pg_temp.dev(5001, 'a');
SELECT state, count(*) FROM im.recovery_session WHERE user_id = 5001 AND device_id = 'a'
 GROUP BY state ORDER BY state;

-- continuation pages: only the cursor counts, checked in the contract's order
SELECT * FROM pg_temp.activate(5001, 'a');
SELECT * FROM pg_temp.activate(5001, 'b');
-- a recovery batch (rule 8) read in pages of 2
SELECT * FROM pg_temp.sync('rb', 5001, 'a', 0, 3, 2);
SELECT * FROM pg_temp.page('rb2', 5001, 'a', 'rb', 2);
-- cursor of another device of the same user, of another user: INVALID_TOKEN
SELECT * FROM pg_temp.page('x', 5001, 'b', 'rb2', 2);
SELECT * FROM pg_temp.page('x', 5003, 'a', 'rb2', 2);
-- tampered, garbage, a batch token or a device token as cursor: INVALID_TOKEN
INSERT INTO tok VALUES ('bad1', NULL, (SELECT overlay(tc PLACING CASE WHEN substr(tc, 20, 1) = 'A' THEN 'B' ELSE 'A' END FROM 20 FOR 1) FROM tok WHERE k = 'rb2')),
                       ('bad2', NULL, 'garbage'),
                       ('bad3', NULL, (SELECT tb FROM tok WHERE k = 'rb2')),
                       ('bad4', NULL, im.issue_device_token(5001, 'a'));
SELECT k, (SELECT status FROM pg_temp.page('x', 5001, 'a', k, 2)) FROM tok WHERE k LIKE 'bad%' ORDER BY k;
-- the good cursor still works
SELECT * FROM pg_temp.page('rb3', 5001, 'a', 'rb2', 2);
-- a generation bump (here a new recovery) makes it STALE_GENERATION
SELECT * FROM pg_temp.sync('bump', 5001, 'a', 1, 2, 2);
SELECT * FROM pg_temp.page('x', 5001, 'a', 'rb3', 2);
-- expired cursor (token_ttl 0: tokens expire at once)
SET im_sync.token_ttl = 0;
SELECT * FROM pg_temp.sync('ex', 5001, 'a', 0, 3, 2);
RESET im_sync.token_ttl;
SELECT * FROM pg_temp.page('x', 5001, 'a', 'ex', 2);
-- page_limit applies to every page; bad arguments are 22023
SELECT * FROM pg_temp.fails($$SELECT * FROM im.sync_changes(5001, 'a', 1, 0, 0)$$);
SELECT * FROM pg_temp.fails($$SELECT * FROM im.sync_changes(5001, 'a', 1, 0, 10001)$$);
SELECT * FROM pg_temp.fails($$SELECT * FROM im.sync_changes(5001, 'a', 1, 0, NULL)$$);
SELECT * FROM pg_temp.fails($$SELECT * FROM im.sync_changes(5001, 'a', 1, -1)$$);
SELECT * FROM pg_temp.fails($$SELECT * FROM im.sync_changes(5001, 'a b', 1, 0)$$);
SELECT * FROM pg_temp.fails($$SELECT * FROM im.sync_changes(5001, 'zz', 1, 0)$$);
SELECT * FROM pg_temp.fails($$SELECT * FROM im.sync_changes(-1, 'a', 1, 0)$$);

-- private events and deleted-for-me (contract §1, §11)
SELECT * FROM pg_temp.activate(5001, 'b');
SELECT * FROM im.report_read(5001, :c, 3);
SELECT im.delete_for_me(5001, :c, :m11);
SELECT im.run_fanout() > 0 AS delivered;
SELECT sync_generation AS gb FROM im.device WHERE user_id = 5001 AND device_id = 'b' \gset
SELECT * FROM pg_temp.sync('pv', 5001, 'b', :gb, 14);
SELECT (SELECT array_agg(k ORDER BY k) FROM jsonb_object_keys(e) k) AS private_event_keys,
       e->>'kind' AS kind, (e->>'conversation_id')::bigint = :c AS conv_ok,
       e->>'read_msg_seq' AS read_msg_seq, (e->>'message_id')::bigint = :m11 AS deleted_is_m11
  FROM im.sync_changes(5001, 'b', :gb, 14) s, jsonb_array_elements(s.events) e ORDER BY e->>'sync_seq';
-- a replay from 10 no longer returns m11 (deleted for this user)
SELECT * FROM pg_temp.sync('pv2', 5001, 'b', 1, 10);
-- an edit of it is not returned to this user either (same rule as fetch_messages)
SELECT msg_seq FROM im.edit_message(5002, :c, 's50-e11', :m11, jsonb_build_object('t', 'm11 edited'));
SELECT im.run_fanout() > 0 AS delivered;
SELECT * FROM pg_temp.sync('pv3', 5001, 'b', 1, 10);
-- other users still see it
SELECT * FROM pg_temp.activate(5003, 'a');
SELECT * FROM pg_temp.sync('u3', 5003, 'a', 1, 10);

-- rule 1: revoked → DEVICE_REVOKED with the empty shape; cursors too
SELECT * FROM pg_temp.sync('pre', 5001, 'b', 1, 13, 1);
SELECT im.revoke_device(5001, 'b');
SELECT * FROM pg_temp.sync('r1', 5001, 'b', 1, 0);
SELECT * FROM pg_temp.page('x', 5001, 'b', 'pre', 2);
SELECT * FROM pg_temp.dev(5001, 'b');
-- revocation ended the recovery session (its lease no longer holds the log)
SELECT state, count(*) FROM im.recovery_session WHERE user_id = 5001 AND device_id = 'b'
 GROUP BY state ORDER BY state;
-- last_seen_at moves on every call (GC's device_inactive_after)
UPDATE im.device SET last_seen_at = now() - interval '40 days' WHERE user_id = 5001 AND device_id = 'a';
SELECT status FROM im.sync_changes(5001, 'a', 1, 0);
SELECT last_seen_at > now() - interval '1 day' AS seen_now FROM im.device WHERE user_id = 5001 AND device_id = 'a';
