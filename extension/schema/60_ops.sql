-- ---- operations: maintenance rounds, reconcile and repair, metrics
-- (ops/: gc.c, maintenance.c, reconcile.c, metrics.c)

-- Resumable maintenance positions (maintenance.c):
--   gc_cursor                value: last user_id a gc_inbox chunk collected;
--   outbox_collected_before  at: done outbox items processed before this were
--                            collected (reconcile does not miss them).
CREATE TABLE im.maintenance_state (
    name   text PRIMARY KEY,
    value  bigint NOT NULL DEFAULT 0,
    at     timestamptz
);
SELECT pg_catalog.pg_extension_config_dump('im.maintenance_state', '');
COMMENT ON TABLE im.maintenance_state IS 'Resumable positions of the maintenance rounds: GC cursor, outbox retention horizon (contract §8)';

-- Per-stage latency evidence for metrics: one row per processed outbox item
-- is already in im.outbox (created_at, processed_at); device ACK latency is
-- derived from im.device.acked_at.

-- §8 operations
CREATE FUNCTION im.gc_inbox(max_users int DEFAULT NULL)
RETURNS TABLE(user_id bigint, retained_from bigint, deleted bigint)
AS 'MODULE_PATHNAME', 'im_gc_inbox' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.reconcile()
RETURNS TABLE(check_name text, severity text, conversation_id bigint, user_id bigint, detail jsonb)
AS 'MODULE_PATHNAME', 'im_reconcile' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
-- Re-runs missing fanout through the idempotent path; reports what it cannot decide.
CREATE FUNCTION im.repair_fanout(retry_dead boolean DEFAULT false, dry_run boolean DEFAULT false)
RETURNS TABLE(action text, outbox_id bigint, conversation_id bigint, user_id bigint, detail jsonb)
AS 'MODULE_PATHNAME', 'im_repair_fanout' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
-- type: counter, gauge or histogram; labels: a jsonb object, NULL for none
-- (contract §21; the list: extension/doc/operations.md "Metrics")
CREATE FUNCTION im.metrics()
RETURNS TABLE(name text, value double precision, help text, type text, labels jsonb)
AS 'MODULE_PATHNAME', 'im_metrics' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;

COMMENT ON FUNCTION im.gc_inbox(integer) IS 'Collects log entries every device has ACKed, behind the retention fence (contract §8)';
COMMENT ON FUNCTION im.reconcile() IS 'Checks positions, periods, fanout and logs against each other and reports findings (contract §8)';
COMMENT ON FUNCTION im.repair_fanout(boolean, boolean) IS 'Requeues missing fanout, reports quarantine, optionally retries dead letters (contract §8)';
COMMENT ON FUNCTION im.metrics() IS 'Counters, gauges and latency histograms for monitoring, with their type and labels (contract §8, §21)';

-- Operators: one message's path, stage by stage (contract §21; the stages
-- and what is recorded for each: extension/doc/operations.md "Following
-- one message").  shard_trace_message is the per-recipient part, for the
-- users placed on this node (the router asks each user's node for its
-- users); trace_message adds the conversation's part (accepted, a
-- collected outbox item) and asks shard_trace_message for the audience
-- placed here.  Rows of a stage whose record maintenance collected say so
-- with detail.gone = true and a reason.  Nothing records when a hint (the
-- NOTIFY fanout commits with the inbox row) went out: no `hinted` row.
CREATE FUNCTION im.shard_trace_message(message_id bigint, user_ids bigint[])
RETURNS TABLE(stage text, at timestamptz, user_id bigint, detail jsonb)
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp AS $fn$
#variable_conflict use_column
DECLARE
    m bigint := shard_trace_message.message_id;
BEGIN
    -- the users' checks of the router's per-node functions: 22023, IS421
    PERFORM pg_catalog.count(*) FROM im.shard_message_facts(m, user_ids);
    RETURN QUERY
    WITH e AS (SELECT e.* FROM im.event e WHERE e.message_id OPERATOR(pg_catalog.=) m),
    o AS (SELECT o.* FROM im.outbox o WHERE o.source_event_id OPERATOR(pg_catalog.=) m),
    ev AS (
      SELECT (SELECT e.conversation_id FROM e) AS conversation_id,
             (SELECT e.msg_seq FROM e)::bigint AS msg_seq,
             (SELECT e.created_at FROM e) AS created_at,
             EXISTS (SELECT 1 FROM e) AS here,
             COALESCE((SELECT e.kind IN ('message', 'reaction', 'pin')
                              AND e.mode OPERATOR(pg_catalog.=) 'shared_log' FROM e), false) AS shared,
             COALESCE((SELECT e.trace_id FROM e), (SELECT o.trace_id FROM o)) AS trace_id),
    u AS (SELECT DISTINCT w.u AS user_id FROM pg_catalog.unnest(user_ids) w(u)),
    i AS (
      SELECT b.user_id, b.sync_seq, b.delivery_scope, b.outbox_id, b.created_at, b.kind
        FROM im.inbox b JOIN u ON u.user_id OPERATOR(pg_catalog.=) b.user_id
       WHERE b.source_event_id OPERATOR(pg_catalog.=) m),
    -- per user without an inbox row: why (first match wins)
    w AS (
      SELECT u.user_id,
             CASE WHEN NOT ev.here THEN 'not_here'
                  WHEN q.user_id IS NOT NULL THEN 'quarantined'
                  WHEN (SELECT o.state FROM o) OPERATOR(pg_catalog.<>) 'done' THEN 'waiting'
                  WHEN ev.shared THEN 'shared_log'
                  WHEN COALESCE(h.gc_floor, 0) OPERATOR(pg_catalog.>) 0
                       AND NOT COALESCE((SELECT pg_catalog.min(b.created_at) FROM im.inbox b
                                          WHERE b.user_id OPERATOR(pg_catalog.=) u.user_id)
                                        OPERATOR(pg_catalog.<) ev.created_at, false) THEN 'gone'
                  ELSE 'missing' END AS why,
             q.periods, h.gc_floor
        FROM u CROSS JOIN ev
        LEFT JOIN im.fanout_quarantine q ON q.user_id OPERATOR(pg_catalog.=) u.user_id
              AND q.outbox_id OPERATOR(pg_catalog.=) (SELECT o.outbox_id FROM o)
        LEFT JOIN im.user_head h ON h.user_id OPERATOR(pg_catalog.=) u.user_id
       WHERE NOT EXISTS (SELECT 1 FROM i WHERE i.user_id OPERATOR(pg_catalog.=) u.user_id)),
    -- the user's first inbox row of the event, the devices whose ACK covers it
    f AS (SELECT i.user_id, pg_catalog.min(i.sync_seq) AS sync_seq FROM i GROUP BY i.user_id),
    dv AS (
      SELECT f.user_id, f.sync_seq, d.device_id, d.acked_sync_seq, d.acked_at,
             pg_catalog.count(*) OVER (PARTITION BY f.user_id) AS devices_acked,
             pg_catalog.row_number() OVER (PARTITION BY f.user_id
                 ORDER BY (d.acked_sync_seq OPERATOR(pg_catalog.=) f.sync_seq AND d.acked_at IS NOT NULL) DESC,
                          d.acked_sync_seq, d.acked_at, d.device_id) AS rn
        FROM f JOIN im.device d ON d.user_id OPERATOR(pg_catalog.=) f.user_id
       WHERE d.state OPERATOR(pg_catalog.<>) 'REVOKED'
         AND d.acked_sync_seq OPERATOR(pg_catalog.>=) f.sync_seq
         AND NOT (SELECT ev.shared FROM ev)),
    rows AS (
      -- fanout: one row per inbox row of the event (in shared_log mode the
      -- one a marker going dirty writes)
      SELECT 'fanout'::text AS stage, i.created_at AS at, i.user_id,
             pg_catalog.jsonb_build_object('sync_seq', i.sync_seq, 'membership_period_id', i.delivery_scope,
                                           'outbox_id', i.outbox_id, 'trace_id', ev.trace_id)
             OPERATOR(pg_catalog.||)
             CASE WHEN ev.shared THEN pg_catalog.jsonb_build_object('shared_log', true, 'inbox_kind', i.kind,
                 'reason', 'shared_log conversation: no per-user event for a message; this row is the dirty marker that sends the devices to fetch_messages, so no synced row')
                  ELSE '{}'::jsonb END AS detail
        FROM i CROSS JOIN ev
      UNION ALL
      -- fanout of a user without a row: why
      SELECT 'fanout', CASE WHEN w.why OPERATOR(pg_catalog.=) 'shared_log' THEN (SELECT o.processed_at FROM o) END,
             w.user_id,
             pg_catalog.jsonb_build_object('trace_id', ev.trace_id) OPERATOR(pg_catalog.||)
             CASE w.why
               WHEN 'not_here' THEN pg_catalog.jsonb_build_object('waiting', true,
                   'reason', 'the event has not reached this user''s node yet (its transfer is in flight: im.shard_pending())')
               WHEN 'quarantined' THEN pg_catalog.jsonb_build_object('quarantined', true,
                   'periods', pg_catalog.to_jsonb(w.periods),
                   'reason', 'two membership periods cover it: kept, not delivered, reported by im.repair_fanout for review')
               WHEN 'waiting' THEN pg_catalog.jsonb_build_object('waiting', true,
                   'outbox_state', (SELECT o.state FROM o)::text, 'attempts', (SELECT o.attempts FROM o),
                   'last_error', (SELECT o.last_error FROM o),
                   'reason', CASE WHEN (SELECT o.state FROM o)::text OPERATOR(pg_catalog.=) 'dead'
                                  THEN 'dead letter: fanout gave up (im.repair_fanout(retry_dead => true) after the cause is fixed)'
                                  ELSE 'not fanned out yet' END)
               WHEN 'shared_log' THEN pg_catalog.jsonb_build_object('shared_log', true,
                   'reason', 'shared_log conversation: the position is read from the conversation''s log (fetch_messages); the user''s marker was already dirty, so the log has no row for it and there is no synced row')
               WHEN 'gone' THEN pg_catalog.jsonb_build_object('gone', true, 'gc_floor', w.gc_floor,
                   'reason', 'the user''s log was collected past it (gc_inbox): its sync_seq and delivery time are gone')
               ELSE pg_catalog.jsonb_build_object('missing', true,
                   'reason', 'processed, but not in the user''s log, which still holds older entries: a gap (im.reconcile, im.repair_fanout)')
             END
        FROM w CROSS JOIN ev
      UNION ALL
      -- synced: the first device whose ACK covers the user's row; its
      -- time is known only when that ACK is the device's latest and ends
      -- exactly there (a device records the time of its latest ACK only)
      SELECT 'synced', CASE WHEN dv.acked_sync_seq OPERATOR(pg_catalog.=) dv.sync_seq THEN dv.acked_at END,
             dv.user_id,
             pg_catalog.jsonb_build_object('device_id', dv.device_id, 'sync_seq', dv.sync_seq,
                                           'acked_sync_seq', dv.acked_sync_seq, 'devices_acked', dv.devices_acked,
                                           'trace_id', ev.trace_id)
             OPERATOR(pg_catalog.||)
             CASE WHEN dv.acked_sync_seq OPERATOR(pg_catalog.=) dv.sync_seq AND dv.acked_at IS NOT NULL
                  THEN '{}'::jsonb
                  ELSE pg_catalog.jsonb_build_object('latest_ack_at', dv.acked_at,
                      'reason', 'the device''s ACK went past it: only the time of its latest ACK is recorded') END
        FROM dv CROSS JOIN ev WHERE dv.rn OPERATOR(pg_catalog.=) 1
      UNION ALL
      -- synced of a collected row: gc_inbox collects only what devices ACKed
      SELECT 'synced', NULL::timestamptz, w.user_id,
             pg_catalog.jsonb_build_object('gone', true, 'gc_floor', w.gc_floor,
                 'devices_acked', (SELECT pg_catalog.count(*) FROM im.device d
                                    WHERE d.user_id OPERATOR(pg_catalog.=) w.user_id
                                      AND d.state OPERATOR(pg_catalog.<>) 'REVOKED'
                                      AND d.acked_sync_seq OPERATOR(pg_catalog.>=) w.gc_floor),
                 'reason', 'the log entry was collected by gc_inbox, which collects only entries the devices holding the log have ACKed: which device and when are gone',
                 'trace_id', ev.trace_id)
        FROM w CROSS JOIN ev WHERE w.why OPERATOR(pg_catalog.=) 'gone'
      UNION ALL
      -- read: the user's read cursor covers the position; the time is that
      -- of the first read_cursor private event reaching it, while kept
      SELECT 'read', r.read_at, uc.user_id,
             pg_catalog.jsonb_build_object('read_msg_seq', uc.read_msg_seq, 'trace_id', ev.trace_id)
             OPERATOR(pg_catalog.||)
             CASE WHEN r.read_at IS NULL THEN pg_catalog.jsonb_build_object('gone', true,
                 'reason', 'the time of the read report is gone (read_cursor private events are collected after im_sync.inbox_retention)')
                  ELSE '{}'::jsonb END
        FROM im.user_conversation uc JOIN u ON u.user_id OPERATOR(pg_catalog.=) uc.user_id
        CROSS JOIN ev
        CROSS JOIN LATERAL (
          SELECT pg_catalog.min(pe.created_at) AS read_at FROM im.private_event pe
           WHERE pe.user_id OPERATOR(pg_catalog.=) uc.user_id
             AND pe.conversation_id OPERATOR(pg_catalog.=) uc.conversation_id
             AND pe.kind OPERATOR(pg_catalog.=) 'read_cursor'
             AND pe.read_msg_seq OPERATOR(pg_catalog.>=) ev.msg_seq) r
       WHERE uc.conversation_id OPERATOR(pg_catalog.=) ev.conversation_id
         AND uc.read_msg_seq OPERATOR(pg_catalog.>=) ev.msg_seq
      UNION ALL
      -- pushed: each push job of the message for the user, its state's time
      SELECT 'pushed', COALESCE(j.finished_at, j.claimed_at, j.queued_at), j.user_id,
             pg_catalog.jsonb_build_object('job_id', j.job_id, 'state', j.state, 'device_id', j.device_id,
                                           'attempts', j.attempts, 'last_result', j.last_result,
                                           'http_status', j.http_status, 'coalesced', j.coalesced,
                                           'queued_at', j.queued_at, 'trace_id', ev.trace_id)
        FROM im.push_job j JOIN u ON u.user_id OPERATOR(pg_catalog.=) j.user_id
        CROSS JOIN ev
       WHERE j.message_id OPERATOR(pg_catalog.=) m)
    SELECT r.stage, r.at, r.user_id, r.detail FROM rows r
     ORDER BY r.at NULLS LAST,
              pg_catalog.array_position(ARRAY['accepted', 'fanout', 'hinted', 'synced', 'read', 'pushed'], r.stage),
              r.user_id, (r.detail OPERATOR(pg_catalog.->>) 'sync_seq')::bigint, r.detail::text;
END
$fn$;

CREATE FUNCTION im.trace_message(message_id bigint)
RETURNS TABLE(stage text, at timestamptz, user_id bigint, detail jsonb)
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp AS $fn$
#variable_conflict use_column
DECLARE
    m bigint := trace_message.message_id;
    users bigint[];
BEGIN
    -- P0002 for an unknown message; IS421 on a sharded node that is not
    -- the conversation's (ask the router)
    users := ARRAY(SELECT a.user_id FROM im.message_audience(m) a
                    WHERE NOT EXISTS (SELECT 1 FROM im.shard_config c)
                       OR (SELECT c.bucket_nodes[a.user_id OPERATOR(pg_catalog.%) 64 OPERATOR(pg_catalog.+) 1]
                                  OPERATOR(pg_catalog.=) c.self_name FROM im.shard_config c));
    RETURN QUERY
    WITH e AS (SELECT e.* FROM im.event e WHERE e.message_id OPERATOR(pg_catalog.=) m),
    o AS (SELECT o.* FROM im.outbox o WHERE o.source_event_id OPERATOR(pg_catalog.=) m),
    rows AS (
      SELECT 'accepted'::text AS stage, e.created_at AS at, NULL::bigint AS user_id,
             pg_catalog.jsonb_build_object('conversation_id', e.conversation_id, 'msg_seq', e.msg_seq,
                 'kind', e.kind, 'sender_id', e.sender_id, 'mode', e.mode,
                 'trace_id', COALESCE(e.trace_id, (SELECT o.trace_id FROM o)),
                 'outbox_id', (SELECT o.outbox_id FROM o), 'outbox_state', (SELECT o.state FROM o),
                 'processed_at', (SELECT o.processed_at FROM o)) AS detail
        FROM e
      UNION ALL
      -- maintenance collected the processed outbox item
      SELECT 'fanout', NULL::timestamptz, NULL::bigint,
             pg_catalog.jsonb_build_object('gone', true, 'trace_id', e.trace_id,
                 'reason', 'the outbox item was collected by maintenance (done items are kept im_sync.inbox_retention): when it was processed and after how many attempts is gone')
        FROM e WHERE NOT EXISTS (SELECT 1 FROM o)
      UNION ALL
      SELECT s.stage, s.at, s.user_id, s.detail FROM im.shard_trace_message(m, users) s)
    SELECT r.stage, r.at, r.user_id, r.detail FROM rows r
     ORDER BY r.at NULLS LAST,
              pg_catalog.array_position(ARRAY['accepted', 'fanout', 'hinted', 'synced', 'read', 'pushed'], r.stage),
              r.user_id NULLS FIRST, (r.detail OPERATOR(pg_catalog.->>) 'sync_seq')::bigint, r.detail::text;
END
$fn$;

COMMENT ON FUNCTION im.shard_trace_message(bigint, bigint[]) IS 'trace_message''s rows of the given users placed on this node: fanout, synced, read, pushed (contract §21; the router''s per-node part)';
COMMENT ON FUNCTION im.trace_message(bigint) IS 'Operators: one message''s stages in time order (accepted, fanout, synced, read, pushed) with their times and trace id, and which were collected (contract §21)';
