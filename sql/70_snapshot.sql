-- begin/fetch/ack_snapshot (contract §6, design §7.5): every status, the
-- digests recomputed from the returned items, the cut at S, the generation
-- fence.  Sequences are pinned so ids in the output are deterministic.
SELECT setval('im.conversation_id_seq', 7000) IS NOT NULL AS pinned,
       setval('im.event_id_seq', 70000) IS NOT NULL AS pinned_events,
       setval('im.membership_period_id_seq', 7000) IS NOT NULL AS pinned_periods,
       setval('im.snapshot_id_seq', 700) IS NOT NULL AS pinned_snapshots;

\i sql/include/err.sql
-- the contract's digest definitions, recomputed from what fetch_snapshot
-- returns: true when every item, page and the manifest digest match
CREATE FUNCTION pg_temp.digests_ok(u bigint, dev text, tok text, manifest text)
RETURNS TABLE(items_ok boolean, pages_ok boolean, manifest_ok boolean)
LANGUAGE sql AS $$
  WITH pages AS (
    SELECT f.page, f.items, f.page_digest
    FROM generate_series(0, (SELECT page_count - 1 FROM im.fetch_snapshot(u, dev, tok, 0))) p,
         im.fetch_snapshot(u, dev, tok, p) f)
  SELECT bool_and(encode(sha256(convert_to((i - 'digest')::text, 'UTF8')), 'hex') = i->>'digest'),
         (SELECT bool_and(encode(sha256(convert_to(items::text, 'UTF8')), 'hex') = page_digest) FROM pages),
         (SELECT encode(sha256(convert_to(string_agg(page_digest, '' ORDER BY page), 'UTF8')), 'hex') = manifest FROM pages)
  FROM pages, jsonb_array_elements(pages.items) i $$;
-- the items of one page as rows (digest left out: it is checked above)
CREATE FUNCTION pg_temp.items(u bigint, dev text, tok text, p int DEFAULT 0)
RETURNS TABLE(conversation_id bigint, kind text, mode text, version bigint, periods jsonb,
              last_msg_seq bigint, read_msg_seq bigint, unread_count bigint,
              dirty_target_msg_seq bigint, dirty_version bigint, recalled_message_ids jsonb)
LANGUAGE sql AS $$
  SELECT x.conversation_id, x.kind, x.mode, x.version, x.periods, x.last_msg_seq, x.read_msg_seq,
         x.unread_count, x.dirty_target_msg_seq, x.dirty_version, x.recalled_message_ids
  FROM im.fetch_snapshot(u, dev, tok, p) f,
       jsonb_to_recordset(f.items) AS x(conversation_id bigint, kind text, mode text, version bigint,
         periods jsonb, last_msg_seq bigint, read_msg_seq bigint, unread_count bigint,
         dirty_target_msg_seq bigint, dirty_version bigint, recalled_message_ids jsonb, digest text)
  ORDER BY 1 $$;

-- 7001 is the user whose devices snapshot.  c1: a group with a recall;
-- c2: a direct conversation; c3: 7001 joined late and left; c4: 7001 joins
-- but fanout has not run yet when the snapshot starts.
SELECT im.create_conversation('group', ARRAY[7001, 7002, 7003]::bigint[], 7002) AS c1 \gset
SELECT message_id AS c1m2 FROM im.send_message(7002, :c1, 's-1', '{"text": "one"}') \gset
SELECT msg_seq FROM im.send_message(7003, :c1, 's-2', '{"text": "two"}');
SELECT msg_seq FROM im.recall_message(7002, :c1, 's-r1', :c1m2);
SELECT im.direct_conversation(7001, 7002) AS c2 \gset
SELECT msg_seq FROM im.send_message(7002, :c2, 's-3', '{"text": "hi"}');
SELECT im.create_conversation('group', ARRAY[7002, 7003]::bigint[], 7002) AS c3 \gset
SELECT msg_seq FROM im.send_message(7002, :c3, 's-4', '{"text": "before 7001"}');
SELECT join_seq FROM im.join_conversation(:c3, 7001);
SELECT msg_seq FROM im.send_message(7002, :c3, 's-5', '{"text": "with 7001"}');
SELECT leave_seq FROM im.leave_conversation(:c3, 7001);
SELECT msg_seq FROM im.send_message(7002, :c3, 's-6', '{"text": "after 7001"}');
SELECT im.run_fanout() IS NOT NULL AS fanned_out;
SELECT * FROM im.report_read(7001, :c1, 2);
-- not fanned out when the snapshot starts: a message in c1, the join to c4
SELECT im.create_conversation('group', ARRAY[7002, 7003]::bigint[], 7002) AS c4 \gset
SELECT im.run_fanout() IS NOT NULL AS fanned_out;
SELECT msg_seq FROM im.send_message(7002, :c1, 's-7', '{"text": "late"}');
SELECT join_seq FROM im.join_conversation(:c4, 7001);

SELECT pg_temp.err('SELECT im.begin_snapshot(7001, ''phone'')') AS unknown_device;
SELECT pg_temp.err('SELECT im.begin_snapshot(7001, ''bad id!'')') AS bad_device_id;
SELECT sync_generation, state FROM im.register_device(7001, 'phone');
SELECT status, snapshot_id, sync_generation, base_sync_seq, page_count,
       length(manifest_digest) AS digest_len
FROM im.begin_snapshot(7001, 'phone');
-- the snapshot above was replaced right away: a second begin bumps again
SELECT status, snapshot_id, sync_generation, base_sync_seq AS s, snapshot_token AS tok,
       manifest_digest AS md, page_count
FROM im.begin_snapshot(7001, 'phone') \gset
SELECT :'status' AS status, :snapshot_id AS snapshot_id, :sync_generation AS generation,
       :s AS base_sync_seq, :page_count AS page_count;
SELECT state, sync_generation, issued_sync_seq = :s AS issued_is_base FROM im.device
WHERE user_id = 7001 AND device_id = 'phone';
SELECT high_watermark = :s AS base_is_high_watermark FROM im.user_head WHERE user_id = 7001;

-- the manifest at S: c1 without the late message (last_msg_seq 4) but with
-- the committed read cursor; c2; c3 with the closed period and its leave
-- (last_msg_seq = the leave event); no c4 (the join is not in the log yet)
SELECT * FROM pg_temp.items(7001, 'phone', :'tok');
SELECT * FROM pg_temp.digests_ok(7001, 'phone', :'tok', :'md');

-- fetch_snapshot statuses
SELECT status, page, page_count, jsonb_array_length(items) AS items, length(page_digest) AS digest_len
FROM im.fetch_snapshot(7001, 'phone', :'tok', 0);
SELECT pg_temp.err(format('SELECT im.fetch_snapshot(7001, ''phone'', %L, 1)', :'tok')) AS page_past_end;
SELECT pg_temp.err(format('SELECT im.fetch_snapshot(7001, ''phone'', %L, -1)', :'tok')) AS page_negative;
SELECT pg_temp.err('SELECT im.fetch_snapshot(7001, ''phone'', NULL, 0)') AS token_null;
-- tampered: one character changed, or garbage
SELECT overlay(:'tok' placing (CASE WHEN substr(:'tok', 20, 1) = 'A' THEN 'B' ELSE 'A' END) from 20 for 1) AS bad \gset
SELECT * FROM im.fetch_snapshot(7001, 'phone', :'bad', 0);
SELECT * FROM im.fetch_snapshot(7001, 'phone', 'not a token', 0);
SELECT * FROM im.ack_snapshot(7001, 'phone', :'bad', :'md');
-- another device's token, another user's device
SELECT sync_generation, state FROM im.register_device(7001, 'tablet');
SELECT snapshot_token AS ttok, manifest_digest AS tmd FROM im.begin_snapshot(7001, 'tablet') \gset
SELECT * FROM im.fetch_snapshot(7001, 'phone', :'ttok', 0);
SELECT * FROM im.ack_snapshot(7001, 'phone', :'ttok', :'tmd');
SELECT sync_generation, state FROM im.register_device(7002, 'phone');
SELECT * FROM im.fetch_snapshot(7002, 'phone', :'tok', 0);
-- stale generation: a newer begin_snapshot of the same device
SELECT snapshot_token AS tok3, manifest_digest AS md3, sync_generation AS g3, base_sync_seq AS s3
FROM im.begin_snapshot(7001, 'phone') \gset
SELECT :s3 = :s AS same_cut, :'md3' = :'md' AS same_manifest;
SELECT * FROM im.fetch_snapshot(7001, 'phone', :'tok', 0);
SELECT * FROM im.ack_snapshot(7001, 'phone', :'tok', :'md');
SELECT state, sync_generation FROM im.device WHERE user_id = 7001 AND device_id = 'phone';

-- ack_snapshot: a digest mismatch installs nothing
SELECT * FROM im.ack_snapshot(7001, 'phone', :'tok3', :'md');
SELECT state, acked_sync_seq FROM im.device WHERE user_id = 7001 AND device_id = 'phone';
-- the right digest: ACTIVE with ACK = S, snapshot INSTALLED
SELECT status, acked_sync_seq = :s3 AS ack_is_base FROM im.ack_snapshot(7001, 'phone', :'tok3', :'md3');
SELECT state, sync_generation = :g3 AS same_generation, acked_sync_seq = :s3 AS ack_is_base
FROM im.device WHERE user_id = 7001 AND device_id = 'phone';
SELECT snapshot_id, state, base_sync_seq = :s3 AS base_is_s3 FROM im.snapshot
WHERE user_id = 7001 AND device_id = 'phone' ORDER BY snapshot_id;
-- repeated: OK with the current ACK, nothing changes
SELECT status, acked_sync_seq = :s3 AS ack_is_base FROM im.ack_snapshot(7001, 'phone', :'tok3', :'md3');
-- a stale snapshot token cannot move the new generation's cursor
SELECT * FROM im.ack_snapshot(7001, 'phone', :'tok', :'md');
-- the events after S are exactly the ones the manifest left out ...
SELECT im.run_fanout() IS NOT NULL AS fanned_out;
SELECT sync_seq - :s3 AS after_s, kind, conversation_id, msg_seq FROM im.inbox
WHERE user_id = 7001 AND sync_seq > :s3 ORDER BY sync_seq;
-- ... and the stored snapshot is immutable: same pages, same digests
SELECT * FROM pg_temp.digests_ok(7001, 'phone', :'tok3', :'md3');
-- then the device catches up from S + 1 with sync_changes, nothing lost,
-- nothing twice
SELECT status, resume_from = :s3 AS resumes_at_base,
       (SELECT string_agg(format('%s:%s', e->>'kind', e->>'msg_seq'), ' ' ORDER BY (e->>'sync_seq')::int)
        FROM jsonb_array_elements(events) e) AS events
FROM im.sync_changes(7001, 'phone', :g3, :s3);

-- expired: the token outlives nothing
SET im_sync.snapshot_ttl = 1;
SELECT snapshot_token AS etok, manifest_digest AS emd FROM im.begin_snapshot(7001, 'tablet') \gset
RESET im_sync.snapshot_ttl;
SELECT pg_sleep(1.2);
SELECT * FROM im.fetch_snapshot(7001, 'tablet', :'etok', 0);
SELECT * FROM im.ack_snapshot(7001, 'tablet', :'etok', :'emd');
SELECT state FROM im.device WHERE user_id = 7001 AND device_id = 'tablet';

-- revoked: begin_snapshot refuses, an earlier token reads DEVICE_REVOKED
SELECT snapshot_token AS rtok, manifest_digest AS rmd FROM im.begin_snapshot(7001, 'tablet') \gset
SELECT im.revoke_device(7001, 'tablet');
SELECT status, snapshot_id, sync_generation, base_sync_seq, snapshot_token, page_count, manifest_digest
FROM im.begin_snapshot(7001, 'tablet');
SELECT * FROM im.fetch_snapshot(7001, 'tablet', :'rtok', 0);
SELECT * FROM im.ack_snapshot(7001, 'tablet', :'rtok', :'rmd');
-- re-registered: the old registration's token is still dead
SELECT sync_generation, state FROM im.register_device(7001, 'tablet');
SELECT * FROM im.ack_snapshot(7001, 'tablet', :'rtok', :'rmd');

-- a user without conversations: one empty page
SELECT sync_generation, state FROM im.register_device(7009, 'new');
SELECT status, base_sync_seq, page_count, snapshot_token AS ntok, manifest_digest AS nmd
FROM im.begin_snapshot(7009, 'new') \gset
SELECT :'status' AS status, :base_sync_seq AS base, :page_count AS pages;
SELECT status, items FROM im.fetch_snapshot(7009, 'new', :'ntok', 0);
SELECT * FROM pg_temp.digests_ok(7009, 'new', :'ntok', :'nmd');   -- no item to check

-- more than one page: 101 conversations, 100 items per page
SELECT count(im.direct_conversation(7100, g)) FROM generate_series(7101, 7201) g;
SELECT im.run_fanout() IS NOT NULL AS fanned_out;
SELECT sync_generation, state FROM im.register_device(7100, 'p');
SELECT status, page_count, snapshot_token AS ptok, manifest_digest AS pmd
FROM im.begin_snapshot(7100, 'p') \gset
SELECT :'status' AS status, :page_count AS pages;
SELECT page, jsonb_array_length(items) AS items FROM im.fetch_snapshot(7100, 'p', :'ptok', 0)
UNION ALL
SELECT page, jsonb_array_length(items) FROM im.fetch_snapshot(7100, 'p', :'ptok', 1);
SELECT * FROM pg_temp.digests_ok(7100, 'p', :'ptok', :'pmd');
