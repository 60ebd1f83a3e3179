-- Helpers (session-local).  Tokens are random: stored in tok, never printed.
-- ev(events): compact, deterministic rendering (no ids, no timestamps).
CREATE TEMP TABLE tok (k text PRIMARY KEY, tb text, tc text);
CREATE FUNCTION pg_temp.ev(j jsonb) RETURNS text LANGUAGE sql AS $f$
SELECT COALESCE(string_agg(
         (e->>'sync_seq') || ':' || (e->>'kind')
         || CASE WHEN e ? 'msg_seq' THEN '#' || (e->>'msg_seq') ELSE '' END
         || CASE WHEN e->>'kind' = 'message' THEN '=' || COALESCE(e->'body'->>'t', 'null') ELSE '' END
         || CASE WHEN e ? 'read_msg_seq' THEN '(read ' || (e->>'read_msg_seq') || ')' ELSE '' END,
         ' ' ORDER BY (e->>'sync_seq')::bigint), '')
  FROM jsonb_array_elements(j) e
$f$;
-- sync(k, …): calls im.sync_changes, keeps its batch token and cursor as k.
CREATE FUNCTION pg_temp.sync(k_ text, u bigint, d text, cg int, la bigint,
                             lim int DEFAULT 200, cur text DEFAULT NULL)
RETURNS TABLE(status text, gen int, token boolean, resume_from bigint, wm bigint,
              ack bigint, events text, more_cursor boolean, has_more boolean,
              recovery boolean, user_hw bigint)
LANGUAGE plpgsql AS $f$
DECLARE r record;
BEGIN
    SELECT * INTO r FROM im.sync_changes(u, d, cg, la, lim, cur);
    INSERT INTO tok AS t VALUES (k_, r.batch_token, r.next_cursor)
        ON CONFLICT (k) DO UPDATE SET tb = excluded.tb, tc = excluded.tc;
    RETURN QUERY SELECT r.status, r.sync_generation, r.batch_token IS NOT NULL,
        r.resume_from, r.batch_high_watermark, r.server_acked_sync_seq,
        pg_temp.ev(r.events), r.next_cursor IS NOT NULL, r.has_more,
        r.recovery_session_id IS NOT NULL, r.user_high_watermark;
END
$f$;
-- page(k_new, u, d, k_cursor, lim): the next page of the batch behind cursor k
CREATE FUNCTION pg_temp.page(k_ text, u bigint, d text, kc text, lim int DEFAULT 200)
RETURNS TABLE(status text, gen int, token boolean, resume_from bigint, wm bigint,
              ack bigint, events text, more_cursor boolean, has_more boolean,
              recovery boolean, user_hw bigint)
LANGUAGE sql AS $f$
SELECT * FROM pg_temp.sync(k_, u, d, NULL, NULL, lim, (SELECT tc FROM tok WHERE k = kc))
$f$;
-- ack(u, d, k, seq): im.ack_sync with the batch token kept as k
CREATE FUNCTION pg_temp.ack(u bigint, d text, k_ text, seq bigint)
RETURNS TABLE(status text, acked_sync_seq bigint) LANGUAGE sql AS $f$
SELECT * FROM im.ack_sync(u, d, (SELECT tb FROM tok WHERE k = k_), seq)
$f$;
-- activate(u, d): snapshot + ack, the way a NEW or RESETTING device gets ACTIVE
CREATE FUNCTION pg_temp.activate(u bigint, d text)
RETURNS TABLE(status text, acked_sync_seq bigint) LANGUAGE sql AS $f$
SELECT a.* FROM im.begin_snapshot(u, d) b,
       LATERAL im.ack_snapshot(u, d, b.snapshot_token, b.manifest_digest) a
$f$;
-- dev(u, d): the device row's protocol state
CREATE FUNCTION pg_temp.dev(u bigint, d text)
RETURNS TABLE(state text, gen int, acked bigint, issued bigint) LANGUAGE sql AS $f$
SELECT state, sync_generation, acked_sync_seq, issued_sync_seq FROM im.device
 WHERE user_id = u AND device_id = d
$f$;
