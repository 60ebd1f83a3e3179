/*
 * metrics.c — im.metrics(): Prometheus-style gauges, counters and per-stage
 * latency histograms (contract §8, design doc §18.1, §6.3).
 *
 * Rows are (name, value, help, type, labels) (contract §21): name is the
 * bare series name, type `counter`, `gauge` or `histogram`, labels a jsonb
 * object of strings (NULL for none).  A histogram is the usual family of
 * rows name_bucket (cumulative, label le, the last one "+Inf" equal to
 * _count), name_sum and name_count, all three of type `histogram`.  The
 * gateway's GET /metrics prints them as Prometheus text.  On a catalog
 * before 1.10 the function has the three columns (name, value, help) of its
 * release: a label is then spelled inside the name (name{k="v"}) and the
 * series added since are left out, so the answer stays that release's.
 *
 * Cost: a scrape never scans event-sized tables in full.  Outbox gauges use
 * the partial indexes on pending and dead items; per-user and per-device
 * gauges read one row per user (im.user_head) or device (im.device); the
 * latency histograms sample the newest IM_METRICS_SAMPLE outbox items by
 * primary key and at most IM_METRICS_SAMPLE inbox rows / devices.
 *
 * Every latency names its stage (§18.1: never one mixed "message latency"):
 *   im_stage_accept_to_fanout_seconds  outbox.processed_at − outbox.created_at:
 *       send committed its outbox item → the fanout transaction that
 *       processed it (queueing + retries);
 *   im_stage_accept_to_log_seconds     inbox.created_at − outbox.created_at,
 *       one sample per recipient event: accepted → in that user's log
 *       (both stamps are transaction start times, so the stage that follows
 *       fanout, "processed → inbox written", is the same transaction and
 *       would always read 0; this stage is what a user actually waits);
 *   im_stage_log_to_ack_seconds        device.acked_at − inbox.created_at of
 *       the event the device's ACK points at: in the log → applied and
 *       acknowledged by the device (latest ACK per device).
 */
#include "core/im_sync.h"
#include "core/common.h"
#include "core/shmem.h"
#include "core/version_check.h"
#include "core/im_sql.h"
#include "push/push.h"
#include "shard/shard.h"
#include "ops/ops.h"

#include "access/xlog.h"
#include "catalog/pg_type.h"
#include "utils/builtins.h"
#include "utils/json.h"

/* A device more than this many events behind its user's log is "behind". */
#define IM_DEVICES_BEHIND_THRESHOLD 1000
/* Upper bound of rows a histogram looks at. */
#define IM_METRICS_SAMPLE 10000

static const double buckets[] = {
	0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800
};

#define NUM_BUCKETS lengthof(buckets)

#define STR(x) #x
#define XSTR(x) STR(x)

/*
 * Gauges from tables: (name, value, help); metric_rows_from_spi adds their
 * type and (no) labels.
 */
static const char *gauges_sql =
"SELECT 'im_outbox_pending', (SELECT pg_catalog.count(*) FROM im.outbox o "
"   WHERE o.state" EQ "'pending')::float8, "
"  'Outbox items accepted and not yet fanned out.' "
"UNION ALL SELECT 'im_outbox_oldest_pending_age_seconds', "
"  COALESCE((SELECT EXTRACT(epoch FROM pg_catalog.now()" MINUS "pg_catalog.min(o.created_at)) "
"     FROM im.outbox o WHERE o.state" EQ "'pending'), 0)::float8, "
"  'Age of the oldest pending outbox item (0 when none).' "
"UNION ALL SELECT 'im_fanout_lag_seconds', "
"  COALESCE((SELECT EXTRACT(epoch FROM pg_catalog.now()" MINUS "pg_catalog.min(o.created_at)) "
"     FROM im.outbox o WHERE o.state" EQ "'pending' "
"       AND o.next_attempt_at" LE "pg_catalog.now()), 0)::float8, "
"  'How far fanout is behind: now minus the acceptance time of the oldest pending item that is ready to run (items waiting for a retry backoff excluded; 0 when none).' "
"UNION ALL SELECT 'im_outbox_backing_off', (SELECT pg_catalog.count(*) FROM im.outbox o "
"   WHERE o.state" EQ "'pending' AND o.next_attempt_at" GT "pg_catalog.now())::float8, "
"  'Pending outbox items waiting out a retry backoff after a failure (they and the later items of their conversation wait).' "
"UNION ALL SELECT 'im_outbox_transient_retrying', (SELECT pg_catalog.count(*) FROM im.outbox o "
"   WHERE o.state" EQ "'pending' AND o.transient_failures" GT "0)::float8, "
"  'Pending outbox items that failed transiently (lock timeout, disk full, ...) at least once: retried without limit, never dead letters for it.' "
"UNION ALL SELECT 'im_fanout_quarantined_items', "
"  (SELECT pg_catalog.count(*) FROM im.fanout_quarantine)::float8, "
"  'Item-user pairs covered by two membership periods: kept, not delivered, need review.' "
"UNION ALL SELECT 'im_fanout_dead_letters', (SELECT pg_catalog.count(*) FROM im.outbox o "
"   WHERE o.state" EQ "'dead')::float8, "
"  'Outbox items that failed im_sync.fanout_max_attempts times (see im.reconcile).' "
"UNION ALL SELECT 'im_inbox_events', (SELECT COALESCE(pg_catalog.sum(h.high_watermark" MINUS "h.gc_floor), 0) "
"   FROM im.user_head h)::float8, "
"  'Events retained in all user logs (sum of high_watermark - gc_floor).' "
"UNION ALL SELECT 'im_user_watermark_spread', (SELECT COALESCE(pg_catalog.percentile_disc(0.99) "
"   WITHIN GROUP (ORDER BY h.high_watermark" MINUS "h.gc_floor), 0) FROM im.user_head h)::float8, "
"  'p99 over users of the retained log length (high_watermark - gc_floor).' "
"UNION ALL SELECT 'im_devices_behind', (SELECT pg_catalog.count(*) FROM im.device d "
"   JOIN im.user_head h ON h.user_id" EQ "d.user_id "
"   WHERE d.state" EQ "ANY ('{ACTIVE,RECOVERING}'::text[]) "
"     AND (h.high_watermark" MINUS "d.acked_sync_seq)" GT
XSTR(IM_DEVICES_BEHIND_THRESHOLD) ")::float8, "
"  'ACTIVE or RECOVERING devices whose ACK is more than " XSTR(IM_DEVICES_BEHIND_THRESHOLD)
" events behind their user''s high watermark.' "
"UNION ALL SELECT 'im_recovery_sessions_active', (SELECT pg_catalog.count(*) FROM im.recovery_session r "
"   WHERE r.state" EQ "'ACTIVE' AND r.expires_at" GT "pg_catalog.now())::float8, "
"  'Unexpired recovery sessions (each holds a retention lease).' "
"UNION ALL SELECT 'im_recovery_session_oldest_age_seconds', "
"  COALESCE((SELECT EXTRACT(epoch FROM pg_catalog.now()" MINUS "pg_catalog.min(r.created_at)) "
"     FROM im.recovery_session r WHERE r.state" EQ "'ACTIVE'), 0)::float8, "
"  'Age of the oldest ACTIVE recovery session (0 when none).' "
"UNION ALL SELECT 'im_snapshots_building', (SELECT pg_catalog.count(*) FROM im.snapshot s "
"   WHERE s.state" EQ "'BUILDING')::float8, "
"  'Snapshots being built.' "
"UNION ALL SELECT 'im_snapshots_ready', (SELECT pg_catalog.count(*) FROM im.snapshot s "
"   WHERE s.state" EQ "'READY' AND s.expires_at" GT "pg_catalog.now())::float8, "
"  'Unexpired snapshots built and not yet installed (each holds the retention fence).'";

/* Histogram samples: one float8 column `secs` each. */
typedef struct Stage
{
	const char *name;
	const char *help;
	const char *sample_sql;
} Stage;

static const Stage stages[] = {
	{"im_stage_accept_to_fanout_seconds",
	 "Stage accepted -> fanned out: outbox processed_at - created_at over the newest "
	 XSTR(IM_METRICS_SAMPLE) " processed items.",
	 "SELECT EXTRACT(epoch FROM o.processed_at" MINUS "o.created_at)::float8 AS secs "
	 "FROM im.outbox o WHERE o.state" EQ "'done' AND o.processed_at IS NOT NULL "
	 "ORDER BY o.outbox_id DESC LIMIT " XSTR(IM_METRICS_SAMPLE)},
	{"im_stage_accept_to_log_seconds",
	 "Stage accepted -> in the user's log: inbox created_at - outbox created_at, per recipient event, "
	 "for the newest 1000 processed items (at most " XSTR(IM_METRICS_SAMPLE) " events).",
	 "SELECT EXTRACT(epoch FROM b.created_at" MINUS "o.created_at)::float8 AS secs "
	 "FROM (SELECT o.source_event_id, o.created_at FROM im.outbox o "
	 "      WHERE o.state" EQ "'done' ORDER BY o.outbox_id DESC LIMIT 1000) o "
	 "JOIN im.inbox b ON b.source_event_id" EQ "o.source_event_id "
	 "LIMIT " XSTR(IM_METRICS_SAMPLE)},
	{"im_stage_log_to_ack_seconds",
	 "Stage in the user's log -> acknowledged by a device: device acked_at - inbox created_at "
	 "of the acknowledged event (latest ACK of at most " XSTR(IM_METRICS_SAMPLE) " devices).",
	 "SELECT EXTRACT(epoch FROM d.acked_at" MINUS "b.created_at)::float8 AS secs "
	 "FROM im.device d JOIN im.inbox b ON b.user_id" EQ "d.user_id "
	 "  AND b.sync_seq" EQ "d.acked_sync_seq "
	 "WHERE d.acked_at IS NOT NULL AND d.acked_sync_seq" GT "0 "
	 "LIMIT " XSTR(IM_METRICS_SAMPLE)},
};

#define NUM_STAGES lengthof(stages)

/* The result has the 1.10 columns type and labels (a 1.10 catalog). */
static bool
metrics_typed(FunctionCallInfo fcinfo)
{
	return ((ReturnSetInfo *) fcinfo->resultinfo)->setDesc->natts >= 5;
}

/*
 * One row.  label_key/label_value: at most one label (NULL: none); on the
 * three-column result of an older catalog it is spelled into the name as
 * that release did (name{key="value"}).
 */
void
im_metric_row(FunctionCallInfo fcinfo, const char *name, double value, const char *help,
			  const char *type, const char *label_key, const char *label_value)
{
	Datum		values[5];
	bool		nulls[5] = {false, false, false, false, false};

	if (!metrics_typed(fcinfo))
	{
		if (label_key != NULL)
			name = psprintf("%s{%s=\"%s\"}", name, label_key, label_value);
		values[0] = CStringGetTextDatum(name);
		values[1] = Float8GetDatum(value);
		values[2] = CStringGetTextDatum(help);
		im_srf_row(fcinfo, values, nulls);
		return;
	}
	values[0] = CStringGetTextDatum(name);
	values[1] = Float8GetDatum(value);
	values[2] = CStringGetTextDatum(help);
	values[3] = CStringGetTextDatum(type);
	if (label_key == NULL)
		nulls[4] = true;
	else
	{
		StringInfoData j;

		/* escape_json quotes and escapes: a slot name is the DBA's text */
		initStringInfo(&j);
		appendStringInfoChar(&j, '{');
		escape_json(&j, label_key);
		appendStringInfoChar(&j, ':');
		escape_json(&j, label_value);
		appendStringInfoChar(&j, '}');
		values[4] = DirectFunctionCall1(jsonb_in, CStringGetDatum(j.data));
	}
	im_srf_row(fcinfo, values, nulls);
}

/*
 * The rows of the last SPI result: columns name, value, help, then
 * optionally type (default_type when absent), label_key, label_value.
 */
void
im_metric_rows_from_spi(FunctionCallInfo fcinfo, const char *default_type)
{
	SPITupleTable *tt = SPI_tuptable;
	uint64		n = SPI_processed;
	int			ncols = tt->tupdesc->natts;

	for (uint64 r = 0; r < n; r++)
	{
		bool		isnull;
		char	   *name = SPI_getvalue(tt->vals[r], tt->tupdesc, 1);
		double		value = DatumGetFloat8(SPI_getbinval(tt->vals[r], tt->tupdesc, 2, &isnull));
		char	   *help = SPI_getvalue(tt->vals[r], tt->tupdesc, 3);
		const char *type = ncols >= 4 ? SPI_getvalue(tt->vals[r], tt->tupdesc, 4) : default_type;
		char	   *key = ncols >= 6 ? SPI_getvalue(tt->vals[r], tt->tupdesc, 5) : NULL;
		char	   *val = ncols >= 6 ? SPI_getvalue(tt->vals[r], tt->tupdesc, 6) : NULL;

		if (isnull)
			value = 0;
		im_metric_row(fcinfo, name, value, help, type ? type : default_type,
					  key && val ? key : NULL, val);
	}
}

/* An unlabelled counter (its name ends in _total) or gauge. */
static void
metric_row(FunctionCallInfo fcinfo, const char *name, double value, const char *help)
{
	size_t		len = strlen(name);
	bool		counter = len > 6 && strcmp(name + len - 6, "_total") == 0;

	im_metric_row(fcinfo, name, value, help, counter ? "counter" : "gauge", NULL, NULL);
}

/*
 * One histogram over samples: cumulative bucket counts (label le), +Inf
 * equal to _count, _sum.  Negative samples (clock steps, a redelivered
 * item) count in the lowest bucket rather than vanish.
 */
static void
emit_histogram_samples(FunctionCallInfo fcinfo, const char *name, const char *help,
					   const double *bounds, int nbounds, uint64 n)
{
	uint64	   *counts = palloc0(sizeof(uint64) * nbounds);
	double		sum = 0;

	for (uint64 r = 0; r < n; r++)
	{
		bool		isnull;
		Datum		d = SPI_getbinval(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 1, &isnull);
		double		x;

		if (isnull)
			continue;
		x = DatumGetFloat8(d);
		if (x < 0)
			x = 0;
		sum += x;
		for (int b = 0; b < nbounds; b++)
			if (x <= bounds[b])
				counts[b]++;
	}
	for (int b = 0; b < nbounds; b++)
		im_metric_row(fcinfo, psprintf("%s_bucket", name), (double) counts[b], help,
					  "histogram", "le", psprintf("%g", bounds[b]));
	im_metric_row(fcinfo, psprintf("%s_bucket", name), (double) n, help,
				  "histogram", "le", "+Inf");
	im_metric_row(fcinfo, psprintf("%s_sum", name), sum, help, "histogram", NULL, NULL);
	im_metric_row(fcinfo, psprintf("%s_count", name), (double) n, help, "histogram", NULL, NULL);
}

static void
emit_histogram(FunctionCallInfo fcinfo, const Stage *stage, SPIPlanPtr *plan)
{
	uint64		n;

	im_prepare(plan, stage->sample_sql, 0);
	n = im_exec(*plan, NULL, NULL, 0);
	emit_histogram_samples(fcinfo, stage->name, stage->help, buckets, NUM_BUCKETS, n);
}

/* Offline push (contract §13): the queue's gauges (1.4 catalog) and the relay results. */
/* the transfer and slot gauges of a sharded node (shard/shard_metrics.c) */
static void
emit_shard_metrics(FunctionCallInfo fcinfo)
{
	static SPIPlanPtr plans[IM_SHARD_METRIC_QUERIES];
	const char *queries[IM_SHARD_METRIC_QUERIES];
	int			n = im_shard_metric_queries(queries);

	for (int q = 0; q < n; q++)
	{
		im_prepare(&plans[q], queries[q], 0);
		im_exec(plans[q], NULL, NULL, 0);
		im_metric_rows_from_spi(fcinfo, "gauge");
	}
}

static void
emit_push_metrics(FunctionCallInfo fcinfo)
{
	static SPIPlanPtr queue_plan;
	bool		isnull;

	/* a 1.3 catalog under this library answers as 1.3 did */
	if (!im_push_catalog())
		return;
	{
		im_prepare(&queue_plan,
				   "SELECT pg_catalog.count(*)::pg_catalog.float8,"
				   "  COALESCE(pg_catalog.date_part('epoch', pg_catalog.now()" MINUS "pg_catalog.min(queued_at)), 0)::pg_catalog.float8"
				   " FROM im.push_job WHERE state" EQ "ANY ('{pending,retry}'::pg_catalog.text[])",
				   0);
		im_exec(queue_plan, NULL, NULL, 0);
		metric_row(fcinfo, "im_push_pending", DatumGetFloat8(im_get_datum_copy(0, 1, &isnull)),
				   "Push jobs waiting to be claimed (pending or retrying).");
		metric_row(fcinfo, "im_push_oldest_pending_seconds", DatumGetFloat8(im_get_datum_copy(0, 2, &isnull)),
				   "Age of the oldest push job waiting to be claimed.");
	}
	for (int r = 0; r < IM_PUSH_RESULTS; r++)
		im_metric_row(fcinfo, "im_push_results_total",
					  (double) im_counter_get(IM_COUNTER_PUSH_DELIVERED + r),
					  "Push relay results reported through complete_push_job, since server start.",
					  "counter", "result", im_push_result_name(r));
	metric_row(fcinfo, "im_push_suppressed_total", (double) im_counter_get(IM_COUNTER_PUSH_SUPPRESSED),
			   "Push jobs completed as suppressed at claim (device online or caught up, message recalled, muted), since server start.");
	metric_row(fcinfo, "im_push_targets_disabled_total", (double) im_counter_get(IM_COUNTER_PUSH_TARGETS_DISABLED),
			   "Push targets disabled after 3 consecutive rejections, since server start.");

}

/*
 * Repairs and refusals (1.10 catalog).  im_gaps_repaired_total counts, at
 * commit, what im.repair_fanout put back into fanout: kind
 * "missing_delivery" one per (item, user, period) whose missing event it
 * requeued, kind "dead_letter" one per dead item it requeued (retry_dead).
 * A dry run or a requeue that found the item changed counts nothing.
 */
static void
emit_repair_metrics(FunctionCallInfo fcinfo)
{
	static SPIPlanPtr refused_plan;
	bool		isnull;

	im_metric_row(fcinfo, "im_gaps_repaired_total",
				  (double) im_counter_get(IM_COUNTER_GAPS_REPAIRED_MISSING),
				  "Deliveries im.repair_fanout put back into fanout, committed, since server start: "
				  "kind missing_delivery one per (outbox item, user, period) whose missing inbox event it requeued, "
				  "kind dead_letter one per dead outbox item it requeued (retry_dead).",
				  "counter", "kind", "missing_delivery");
	im_metric_row(fcinfo, "im_gaps_repaired_total",
				  (double) im_counter_get(IM_COUNTER_GAPS_REPAIRED_DEAD),
				  "Deliveries im.repair_fanout put back into fanout, committed, since server start: "
				  "kind missing_delivery one per (outbox item, user, period) whose missing inbox event it requeued, "
				  "kind dead_letter one per dead outbox item it requeued (retry_dead).",
				  "counter", "kind", "dead_letter");
	im_prepare(&refused_plan,
			   "SELECT pg_catalog.count(*)::pg_catalog.float8 FROM im.transfer_refused", 0);
	im_exec(refused_plan, NULL, NULL, 0);
	metric_row(fcinfo, "im_transfers_refused", DatumGetFloat8(im_get_datum_copy(0, 1, &isnull)),
			   "Replicated transfers and acks refused at arrival and kept in im.transfer_refused until an operator "
			   "deletes them (extension/doc/trust_between_nodes.md; 0 on an unsharded node).");
}

/*
 * WAL every replication slot of the server holds back, one row per slot
 * (label slot): the alert on a slot that stopped consuming.  A standby
 * has no current WAL insert position (pg_current_wal_lsn fails in
 * recovery): no rows there.
 */
static void
emit_slot_metrics(FunctionCallInfo fcinfo)
{
	static SPIPlanPtr plan;

	if (RecoveryInProgress())
		return;
	im_prepare(&plan,
			   "SELECT 'im_replication_slot_retained_bytes', "
			   "  COALESCE(pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(), s.restart_lsn), 0)::pg_catalog.float8, "
			   "  'WAL this replication slot holds back: current WAL insert position minus its restart_lsn "
			   "(0 for a slot that holds none).', "
			   "  'gauge', 'slot', s.slot_name::pg_catalog.text "
			   "FROM pg_catalog.pg_replication_slots s ORDER BY s.slot_name", 0);
	im_exec(plan, NULL, NULL, 0);
	im_metric_rows_from_spi(fcinfo, "gauge");
}

/*
 * Fanout amplification: inbox rows written per event, over the newest
 * IM_AMPLIFICATION_SAMPLE processed items of conversation events.  Taken
 * from the tables like the stage histograms rather than counted by fanout
 * itself: it costs the send and fanout paths nothing and survives a
 * restart.  An item with no row left is not a sample (shared_log
 * positions, and items whose every row gc_inbox collected: a 0 would mix
 * "nobody" with "collected").
 */
#define IM_AMPLIFICATION_SAMPLE 1000

static const double amplification_buckets[] = {
	1, 2, 5, 10, 20, 50, 100, 200, 500, 1000
};

static void
emit_amplification(FunctionCallInfo fcinfo)
{
	static SPIPlanPtr plan;
	uint64		n;

	im_prepare(&plan,
			   "SELECT x.n::pg_catalog.float8 FROM ("
			   "  SELECT (SELECT pg_catalog.count(*) FROM im.inbox b "
			   "           WHERE b.source_event_id" EQ "o.source_event_id) AS n "
			   "  FROM im.outbox o WHERE o.state" EQ "'done' AND o.private_user_id IS NULL "
			   "  ORDER BY o.outbox_id DESC LIMIT " XSTR(IM_AMPLIFICATION_SAMPLE) ") x "
			   "WHERE x.n" GT "0", 0);
	n = im_exec(plan, NULL, NULL, 0);
	emit_histogram_samples(fcinfo, "im_fanout_amplification_rows",
						   "Inbox rows (recipient events) one conversation event fanned out to, over the newest "
						   XSTR(IM_AMPLIFICATION_SAMPLE) " processed items that still have rows in the logs.",
						   amplification_buckets, lengthof(amplification_buckets), n);
}

PG_FUNCTION_INFO_V1(im_metrics);
Datum
im_metrics(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr gauges_plan;
	static SPIPlanPtr stage_plans[NUM_STAGES];

	im_srf_begin(fcinfo);
	im_spi_connect();

	im_prepare(&gauges_plan, gauges_sql, 0);
	im_exec(gauges_plan, NULL, NULL, 0);
	im_metric_rows_from_spi(fcinfo, "gauge");

	/*
	 * Every row above and below only reads, so im.metrics() also answers on
	 * a hot standby; this row tells a scrape which kind of server it read
	 * (a standby's outbox gauges are the primary's as of its replay, and
	 * its counters are its own, mostly 0: its workers wait, fanout.h).
	 */
	/* a row added in 1.4: on an older catalog the answer stays its release's (test/upgrade/calls.sql) */
	if (im_catalog_at_least(1, 4))
		metric_row(fcinfo, "im_server_in_recovery", RecoveryInProgress() ? 1 : 0,
				   "1 on a standby in recovery (read-only; fanout workers wait for promotion), 0 on a primary.");

	/*
	 * Counters live in shared memory (they must survive the rollback of the
	 * counted failure); they read 0 when the library is not preloaded and
	 * restart from 0 with the server, as Prometheus counters may.
	 */
	metric_row(fcinfo, "im_resets_total", (double) im_counter_get(IM_COUNTER_RESETS),
			   "Devices sent to RESET_REQUIRED since server start.");
	metric_row(fcinfo, "im_gc_deleted_total", (double) im_counter_get(IM_COUNTER_GC_DELETED),
			   "Inbox events deleted by gc_inbox since server start.");
	metric_row(fcinfo, "im_duplicate_deliveries_total",
			   (double) im_counter_get(IM_COUNTER_DUPLICATE_DELIVERIES),
			   "Fanout deliveries skipped because the idempotency key already existed, since server start.");
	metric_row(fcinfo, "im_fanout_transient_failures_total",
			   (double) im_counter_get(IM_COUNTER_FANOUT_TRANSIENT_FAILURES),
			   "Outbox item failures with a transient SQLSTATE (classes 08, 40, 53, 57, 58, 55P03): backed off, "
			   "not counted toward im_sync.fanout_max_attempts, since server start.");
	metric_row(fcinfo, "im_fanout_charged_failures_total",
			   (double) im_counter_get(IM_COUNTER_FANOUT_CHARGED_FAILURES),
			   "Outbox item failures charged as an attempt toward im_sync.fanout_max_attempts, since server start.");
	metric_row(fcinfo, "im_fanout_batch_failures_total",
			   (double) im_counter_get(IM_COUNTER_FANOUT_BATCH_FAILURES),
			   "Fanout batches that failed outside any one item (their items were backed off or charged), since server start.");
	metric_row(fcinfo, "im_stale_generation_acks_total", (double) im_counter_get(IM_COUNTER_STALE_ACKS),
			   "ACKs refused with STALE_GENERATION since server start.");
	metric_row(fcinfo, "im_auth_failures_total", (double) im_counter_get(IM_COUNTER_AUTH_FAILURES),
			   "Failed device authentications since server start.");
	if (im_catalog_at_least(1, 10))	/* an older catalog's answer has no such row */
		metric_row(fcinfo, "im_idempotent_retries_total", (double) im_counter_get(IM_COUNTER_IDEMPOTENT_RETRIES),
				   "Sends, recalls, edits, reactions and pins answered with the original (created false) since server start.");

	if (metrics_typed(fcinfo))
		emit_repair_metrics(fcinfo);

	emit_push_metrics(fcinfo);
	emit_shard_metrics(fcinfo);	/* transfers and slots */

	for (int s = 0; s < (int) NUM_STAGES; s++)
		emit_histogram(fcinfo, &stages[s], &stage_plans[s]);

	if (metrics_typed(fcinfo))
	{
		emit_slot_metrics(fcinfo);
		emit_amplification(fcinfo);
	}

	SPI_finish();
	PG_RETURN_NULL();
}
