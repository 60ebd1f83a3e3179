-- §2.3 invariants of the device sync protocol (sync.c, gc.c, token.c):
-- pages of a batch are exactly the log range (resume_from, watermark] in
-- order, for any page size, without deleted-for-me positions; the watermark
-- is fixed and capped; "issued" covers every watermark handed out; the ACK
-- never moves backwards; every bump kills older tokens and cursors; a
-- recovery completes at its watermark; a device left behind by GC resets.
\set ON_ERROR_STOP 1
\pset format unaligned
\pset tuples_only true
\pset pager off
BEGIN;
SELECT plan(22);

SELECT im.create_conversation('group', ARRAY[20001, 20002]::bigint[], 20002) AS c \gset
SELECT im.run_fanout() > 0;
SELECT * FROM im.register_device(20001, 'a');
SELECT * FROM im.register_device(20001, 'b');
SELECT a.* FROM im.begin_snapshot(20001, 'a') b,
       LATERAL im.ack_snapshot(20001, 'a', b.snapshot_token, b.manifest_digest) a;
SELECT a.* FROM im.begin_snapshot(20001, 'b') b,
       LATERAL im.ack_snapshot(20001, 'b', b.snapshot_token, b.manifest_digest) a;
SELECT count(*) FROM generate_series(1, 30) i,
       LATERAL im.send_message(20002, :c, 'tap20-' || i, jsonb_build_object('t', i));
SELECT message_id AS gone FROM im.event WHERE client_msg_id = 'tap20-7' AND sender_id = 20002 \gset
SELECT im.delete_for_me(20001, :c, :gone);
SELECT im.run_fanout() > 0;

-- Every watermark any call returned, for the "issued" check.
CREATE TEMP TABLE seen_wm (wm bigint);

-- read_all: one batch read page by page; returns the sync_seqs of every
-- page, and fails if a page leaves (resume_from, watermark], repeats a
-- position, changes the batch or its token, or a cursor is missing.
CREATE FUNCTION pg_temp.read_all(u bigint, d text, cg int, la bigint, lim int,
                                 OUT seqs bigint[], OUT st text, OUT rf bigint, OUT wm bigint,
                                 OUT token text)
LANGUAGE plpgsql AS $f$
DECLARE r record; cur text; last bigint; s bigint; first boolean := true;
BEGIN
    seqs := '{}';
    LOOP
        IF first THEN
            SELECT * INTO r FROM im.sync_changes(u, d, cg, la, lim);
            st := r.status; rf := r.resume_from; wm := r.batch_high_watermark; token := r.batch_token;
            last := rf;
            INSERT INTO seen_wm VALUES (wm);
            first := false;
        ELSE
            SELECT * INTO r FROM im.sync_changes(u, d, NULL, NULL, lim, cur);
            IF r.status IS DISTINCT FROM st OR r.resume_from IS DISTINCT FROM rf
               OR r.batch_high_watermark IS DISTINCT FROM wm OR r.batch_token IS DISTINCT FROM token THEN
                RAISE EXCEPTION 'page changed the batch: % % % %', r.status, r.resume_from, r.batch_high_watermark, st;
            END IF;
        END IF;
        IF r.status NOT IN ('OK', 'RECOVERY') THEN
            RETURN;
        END IF;
        IF jsonb_array_length(r.events) > lim THEN
            RAISE EXCEPTION 'page longer than page_limit';
        END IF;
        FOR s IN SELECT (e->>'sync_seq')::bigint FROM jsonb_array_elements(r.events) e LOOP
            IF s <= last OR s > wm THEN
                RAISE EXCEPTION 'position % outside (%, %] or out of order', s, last, wm;
            END IF;
            last := s;
            seqs := seqs || s;
        END LOOP;
        EXIT WHEN NOT r.has_more;
        IF r.next_cursor IS NULL THEN
            RAISE EXCEPTION 'has_more without a cursor';
        END IF;
        cur := r.next_cursor;
    END LOOP;
END
$f$;

-- the log range a batch must return exactly (minus deleted-for-me)
CREATE FUNCTION pg_temp.log_range(u bigint, lo bigint, hi bigint) RETURNS bigint[]
LANGUAGE sql AS $f$
SELECT COALESCE(array_agg(i.sync_seq ORDER BY i.sync_seq), '{}') FROM im.inbox i
 WHERE i.user_id = u AND i.sync_seq > lo AND i.sync_seq <= hi
   AND NOT EXISTS (SELECT 1 FROM im.deleted_for_me d JOIN im.event e
                           ON d.message_id IN (e.message_id, e.target_message_id)
                    WHERE d.user_id = u AND e.message_id = i.source_event_id)
$f$;

SELECT high_watermark AS hw FROM im.user_head WHERE user_id = 20001 \gset

-- 1-5: any page size gives exactly the log range, in order, once
SELECT is((SELECT r.seqs FROM pg_temp.read_all(20001, 'a', 2, 1, lim) r),
          pg_temp.log_range(20001, 1, :hw), 'pages of ' || lim || ' = the log range (1, hw]')
  FROM unnest(ARRAY[1, 2, 3, 7, 1000]) lim;
-- 6: the deleted-for-me position is never returned, its private event is
SELECT ok(NOT EXISTS (
    SELECT 1 FROM im.sync_changes(20001, 'a', 2, 1, 1000) s, jsonb_array_elements(s.events) e
     WHERE e->>'kind' = 'message' AND (e->>'message_id')::bigint = :gone)
   AND EXISTS (
    SELECT 1 FROM im.sync_changes(20001, 'a', 2, 1, 1000) s, jsonb_array_elements(s.events) e
     WHERE e->>'kind' = 'delete_for_me' AND (e->>'message_id')::bigint = :gone),
   'deleted-for-me: position omitted, private event delivered');

-- 7-8: the watermark is capped and fixed
SET LOCAL im_sync.max_batch_events = 5;
SELECT is((SELECT r.wm FROM pg_temp.read_all(20001, 'a', 2, 1, 2) r), 6::bigint, 'watermark capped at resume_from + max_batch_events');
SELECT is((SELECT r.seqs FROM pg_temp.read_all(20001, 'a', 2, 1, 2) r), pg_temp.log_range(20001, 1, 6), 'capped batch = (1, 6]');
RESET im_sync.max_batch_events;

-- 9: the ACK never moves backwards (60 ACKs in random order)
SELECT setseed(0.2001);
CREATE TEMP TABLE acks AS
SELECT n, (random() * :hw)::bigint AS seq FROM generate_series(1, 60) n;
CREATE TEMP TABLE ack_results AS
SELECT a.n, a.seq, r.status, r.acked_sync_seq
  FROM acks a, LATERAL (SELECT * FROM im.ack_sync(20001, 'b',
        (SELECT batch_token FROM im.sync_changes(20001, 'b', 2, (SELECT acked_sync_seq FROM im.device WHERE user_id = 20001 AND device_id = 'b'))),
        a.seq)) r
 ORDER BY a.n;
SELECT ok(bool_and(acked_sync_seq = (SELECT max(GREATEST(x.seq, 1)) FROM acks x WHERE x.n <= r.n
                                     AND x.seq <= :hw)),
          'after every ACK the device ACK is the running maximum')
  FROM ack_results r;
-- 10: and every answer was OK (an older ACK is idempotent)
SELECT ok(bool_and(status = 'OK'), 'every in-range ACK answers OK') FROM ack_results;

-- 11-14: a bump kills every older batch token and cursor
SELECT batch_token AS old_tok, next_cursor AS old_cur FROM im.sync_changes(20001, 'a', 2, 1, 3) \gset
SELECT is((SELECT status FROM im.sync_changes(20001, 'a', 2, 0)), 'RECOVERY', 'rollback below the ACK starts a recovery');
SELECT is((SELECT status FROM im.ack_sync(20001, 'a', :'old_tok', 2)), 'STALE_GENERATION', 'old batch token is stale after the bump');
SELECT is((SELECT status FROM im.sync_changes(20001, 'a', NULL, NULL, 3, :'old_cur')), 'STALE_GENERATION', 'old cursor is stale after the bump');
SELECT is((SELECT acked_sync_seq FROM im.device WHERE user_id = 20001 AND device_id = 'a'), 1::bigint, 'a stale ACK moved nothing');

-- 15-17: the recovery replays exactly (0, wm] and completes at its watermark
SELECT sync_generation AS g FROM im.device WHERE user_id = 20001 AND device_id = 'a' \gset
SELECT * FROM pg_temp.read_all(20001, 'a', :g, 0, 4) \gset rc_
SELECT is(:'rc_st'::text, 'RECOVERY', 'same session batch again');
SELECT is(:'rc_seqs'::bigint[], pg_temp.log_range(20001, 0, :rc_wm), 'recovery pages = the log range (0, wm]');
SELECT is((SELECT acked_sync_seq FROM im.ack_sync(20001, 'a', :'rc_token', :rc_wm)), :rc_wm::bigint,
          'ACK of the watermark completes the recovery');

-- 18: issued covers every watermark ever handed out
SELECT ok((SELECT issued_sync_seq FROM im.device WHERE user_id = 20001 AND device_id = 'a')
          >= (SELECT max(wm) FROM seen_wm), 'issued >= every watermark given');
-- 19: la above issued (same generation) is a corrupt cursor: reset
SELECT is((SELECT status FROM im.sync_changes(20001, 'a', :g, 1000)), 'RESET_REQUIRED', 'la beyond issued resets');

-- 20-22: GC never leaves an active device behind silently
UPDATE im.inbox SET created_at = now() - interval '1 day' WHERE user_id = 20001;
SET LOCAL im_sync.inbox_retention = 0;
SELECT is((SELECT retained_from FROM im.gc_inbox() WHERE user_id = 20001),
          (SELECT min(acked_sync_seq) + 1 FROM im.device WHERE user_id = 20001 AND state IN ('ACTIVE', 'RECOVERING')),
          'GC stops at the lowest ACK of an active device');
SET LOCAL im_sync.device_inactive_after = 0;
SELECT ok((SELECT count(*) FROM im.gc_inbox() WHERE user_id = 20001) = 1, 'an inactive device no longer holds the fence');
SELECT is((SELECT status FROM im.sync_changes(20001, 'b', 2,
           (SELECT acked_sync_seq FROM im.device WHERE user_id = 20001 AND device_id = 'b'))),
          'RESET_REQUIRED', 'the device left behind is told to reset, not given a gap');

SELECT * FROM finish();
ROLLBACK;
