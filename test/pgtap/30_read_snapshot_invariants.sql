-- Invariants of read state, history and snapshots (contract §1, §6, §7;
-- design §2.3, §7.5, §13), checked over a small generated history rather
-- than single examples.  Users 3001.. so other files' data cannot interfere.
BEGIN;
SELECT plan(17);

CREATE TEMP TABLE conv AS
  SELECT im.create_conversation('group', ARRAY[3001, 3002, 3003, 3004]::bigint[], 3001) AS id;
-- a history with leaves, re-joins, recalls and edits from several senders
DO $$
DECLARE c bigint := (SELECT id FROM conv); m bigint;
BEGIN
  FOR i IN 1..30 LOOP
    SELECT message_id INTO m FROM im.send_message(3001 + i % 3, c, 'tap-' || i, jsonb_build_object('i', i));
    IF i % 7 = 0 THEN PERFORM im.recall_message(3001 + i % 3, c, 'tap-r' || i, m); END IF;
    IF i % 5 = 0 THEN PERFORM im.edit_message(3001 + i % 3, c, 'tap-e' || i, m, jsonb_build_object('i', -i)); END IF;
    IF i = 8 THEN PERFORM im.leave_conversation(c, 3004); END IF;
    IF i = 17 THEN PERFORM im.join_conversation(c, 3004); END IF;
    IF i = 12 THEN PERFORM im.join_conversation(c, 3005); END IF;
  END LOOP;
END $$;
SELECT im.register_device(u, d) FROM (VALUES (3004, 'a'), (3004, 'b')) v(u, d);
SELECT im.run_fanout();

-- §1: fetch_messages returns only positions covered by one of the user's
-- periods (recall/edit: their target; leave: also the leaver)
SELECT is_empty($$
  SELECT u, m->>'msg_seq'
  FROM generate_series(3001, 3005) u,
       im.fetch_messages(u, (SELECT id FROM conv), 0, 1000) f, jsonb_array_elements(f.messages) m
  LEFT JOIN im.event t ON t.message_id = (m->>'target_message_id')::bigint
  WHERE NOT EXISTS (SELECT 1 FROM im.membership_period p
                    WHERE p.conversation_id = (SELECT id FROM conv) AND p.user_id = u
                      AND COALESCE(t.msg_seq, (m->>'msg_seq')::bigint) BETWEEN p.join_seq AND COALESCE(p.leave_seq, 9e18::bigint))
    AND NOT (m->>'kind' = 'leave' AND m->'body'->>'user_id' = u::text) $$,
  'fetch_messages never returns a position outside the user''s periods');
-- ... and every covered position (nothing deleted yet)
SELECT is((SELECT count(*) FROM im.fetch_messages(3004, (SELECT id FROM conv), 0, 1000) f,
                                jsonb_array_elements(f.messages) m)::int,
          (SELECT count(*) FROM im.event e LEFT JOIN im.event t ON t.message_id = e.target_message_id
           WHERE e.conversation_id = (SELECT id FROM conv)
             AND (EXISTS (SELECT 1 FROM im.membership_period p WHERE p.conversation_id = e.conversation_id
                          AND p.user_id = 3004 AND COALESCE(t.msg_seq, e.msg_seq) BETWEEN p.join_seq AND COALESCE(p.leave_seq, 9e18::bigint))
                  OR (e.kind = 'leave' AND e.subject_user_id = 3004)))::int,
          'fetch_messages returns every visible position of a user with two periods');
SELECT is_empty($$
  SELECT 1 FROM generate_series(3001, 3005) u,
       im.fetch_messages(u, (SELECT id FROM conv), 0, 1000) f, jsonb_array_elements(f.messages) m
  WHERE (m->>'recalled')::boolean AND m->'body' <> 'null'::jsonb $$,
  'no recalled position carries a body');
-- paging through small pages returns exactly the one-page result
SELECT is((WITH RECURSIVE pg(after, msgs, more) AS (
             SELECT f.next_after_seq, f.messages, f.has_more FROM im.fetch_messages(3004, (SELECT id FROM conv), 0, 3) f
             UNION ALL
             SELECT f.next_after_seq, f.messages, f.has_more FROM pg, im.fetch_messages(3004, (SELECT id FROM conv), pg.after, 3) f
             WHERE pg.more)
           SELECT jsonb_agg(m ORDER BY (m->>'msg_seq')::int) FROM pg, jsonb_array_elements(pg.msgs) m),
          (SELECT messages FROM im.fetch_messages(3004, (SELECT id FROM conv), 0, 1000)),
          'pages of 3 concatenate to the full history');

-- §7: the read cursor only moves forward and never past last_msg_seq;
-- unread_count always equals the recount; device ACKs never move
CREATE TEMP TABLE acks AS SELECT device_id, acked_sync_seq FROM im.device WHERE user_id = 3004;
CREATE TEMP TABLE reads AS
  SELECT n, r.read_msg_seq, r.unread_count
  FROM (VALUES (1, 10), (2, 4), (3, 25), (4, 12), (5, 1000), (6, 0)) v(n, to_seq),
       LATERAL im.report_read(3004, (SELECT id FROM conv), v.to_seq) r;
SELECT is_empty($$ SELECT 1 FROM reads a JOIN reads b ON b.n = a.n + 1 WHERE b.read_msg_seq < a.read_msg_seq $$,
  'read_msg_seq never moves backwards');
SELECT is((SELECT max(read_msg_seq) FROM reads),
          (SELECT last_msg_seq FROM im.user_conversation WHERE user_id = 3004 AND conversation_id = (SELECT id FROM conv)),
          'a cursor beyond the last visible position is clamped to it');
SELECT is((SELECT count(*) FROM im.private_event WHERE user_id = 3004 AND kind = 'read_cursor')::int,
          (SELECT count(DISTINCT read_msg_seq) FROM reads WHERE read_msg_seq > 0)::int,
          'one read_cursor private event per cursor move, none for a lower report');
SELECT is_empty($$ SELECT 1 FROM im.private_event pe LEFT JOIN im.outbox o ON o.source_event_id = pe.private_event_id
                   WHERE pe.user_id = 3004 AND (o.outbox_id IS NULL OR o.msg_seq IS NOT NULL OR o.private_user_id <> 3004) $$,
  'every private event has its outbox item (msg_seq NULL, private_user_id set)');
SELECT is_empty($$ SELECT 1 FROM im.device d JOIN acks a USING (device_id)
                   WHERE d.user_id = 3004 AND d.acked_sync_seq <> a.acked_sync_seq $$,
  'report_read never moves a device ACK');
SELECT im.delete_for_me(3002, (SELECT id FROM conv), e.message_id)
FROM im.event e WHERE e.conversation_id = (SELECT id FROM conv) AND e.kind = 'message'
  AND e.sender_id <> 3002 AND e.msg_seq IN (5, 9, 20);
SELECT im.report_read(3003, (SELECT id FROM conv), 15);
SELECT im.run_fanout();
SELECT is_empty($$ SELECT uc.user_id FROM im.user_conversation uc
                   CROSS JOIN LATERAL (SELECT count(*) AS n FROM im.event e
                     WHERE e.conversation_id = uc.conversation_id AND e.kind = 'message'
                       AND e.msg_seq > uc.read_msg_seq AND e.sender_id <> uc.user_id AND NOT e.recalled
                       AND EXISTS (SELECT 1 FROM im.membership_period p WHERE p.conversation_id = e.conversation_id
                                   AND p.user_id = uc.user_id AND e.msg_seq BETWEEN p.join_seq AND COALESCE(p.leave_seq, 9e18::bigint))
                       AND NOT EXISTS (SELECT 1 FROM im.deleted_for_me d WHERE d.user_id = uc.user_id AND d.message_id = e.message_id)) r
                   WHERE uc.conversation_id = (SELECT id FROM conv) AND uc.unread_count <> r.n $$,
  'unread_count equals the recount for every member after reads, deletions and fanout');
SELECT is_empty($$ SELECT 1 FROM im.fetch_messages(3002, (SELECT id FROM conv), 0, 1000) f, jsonb_array_elements(f.messages) m
                   JOIN im.deleted_for_me d ON d.user_id = 3002 AND d.message_id IN ((m->>'message_id')::bigint, (m->>'target_message_id')::bigint) $$,
  'a message deleted for the user (and its edits/recalls) is not returned to it');

-- §6: the manifest's digests follow the definition; its cut agrees with
-- the state fanout maintained (everything fanned out: S = head)
CREATE TEMP TABLE snap AS SELECT * FROM im.begin_snapshot(3004, 'a');
CREATE TEMP TABLE items AS
  SELECT f.page, f.page_digest, f.items, i
  FROM snap s, generate_series(0, s.page_count - 1) p, im.fetch_snapshot(3004, 'a', s.snapshot_token, p) f,
       jsonb_array_elements(f.items) i;
SELECT is_empty($$ SELECT 1 FROM items WHERE encode(sha256(convert_to((i - 'digest')::text, 'UTF8')), 'hex') <> i->>'digest'
                      OR encode(sha256(convert_to(items::text, 'UTF8')), 'hex') <> page_digest $$,
  'item and page digests are SHA-256 of their jsonb text');
SELECT is((SELECT encode(sha256(convert_to(string_agg(page_digest, '' ORDER BY page), 'UTF8')), 'hex')
           FROM (SELECT DISTINCT page, page_digest FROM items) p),
          (SELECT manifest_digest FROM snap), 'the manifest digest is SHA-256 of the page digests');
SELECT is_empty($$ SELECT 1 FROM items JOIN im.user_conversation uc
                     ON uc.user_id = 3004 AND uc.conversation_id = (i->>'conversation_id')::bigint
                   WHERE (i->>'last_msg_seq')::bigint <> uc.last_msg_seq
                      OR (i->>'read_msg_seq')::bigint <> uc.read_msg_seq
                      OR (i->>'unread_count')::bigint <> uc.unread_count $$,
  'with nothing in flight the manifest equals the state fanout maintained');
SELECT is((SELECT state || ':' || sync_generation FROM im.device WHERE user_id = 3004 AND device_id = 'a'),
          'RESETTING:' || (SELECT sync_generation FROM snap), 'begin_snapshot leaves the device RESETTING in the new generation');
SELECT is((SELECT a.status || ':' || d.state FROM snap, im.ack_snapshot(3004, 'a', snap.snapshot_token, repeat('0', 64)) a,
                  im.device d WHERE d.user_id = 3004 AND d.device_id = 'a'),
          'DIGEST_MISMATCH:RESETTING', 'a wrong manifest digest installs nothing');
CREATE TEMP TABLE snap2 AS SELECT * FROM im.begin_snapshot(3004, 'a');
SELECT is((SELECT a.status || ':' || d.state || ':' || d.acked_sync_seq
           FROM snap, im.ack_snapshot(3004, 'a', snap.snapshot_token, snap.manifest_digest) a,
                im.device d WHERE d.user_id = 3004 AND d.device_id = 'a'),
          'STALE_GENERATION:RESETTING:0', 'a token of an older generation cannot install its snapshot');

SELECT * FROM finish();
ROLLBACK;
