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
CREATE FUNCTION im.metrics()
RETURNS TABLE(name text, value double precision, help text)
AS 'MODULE_PATHNAME', 'im_metrics' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;

COMMENT ON FUNCTION im.gc_inbox(integer) IS 'Collects log entries every device has ACKed, behind the retention fence (contract §8)';
COMMENT ON FUNCTION im.reconcile() IS 'Checks positions, periods, fanout and logs against each other and reports findings (contract §8)';
COMMENT ON FUNCTION im.repair_fanout(boolean, boolean) IS 'Requeues missing fanout, reports quarantine, optionally retries dead letters (contract §8)';
COMMENT ON FUNCTION im.metrics() IS 'Counters, gauges and latency histograms for monitoring (contract §8)';
