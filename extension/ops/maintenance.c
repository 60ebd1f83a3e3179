/*
 * maintenance.c — what maintenance does besides inbox GC (contract §8):
 * the token key ring (token.c) and the retention of rows that would
 * otherwise be kept for ever.  im.gc_inbox() runs it after its chunk; the
 * first fanout worker runs it after each round of committed GC chunks
 * (worker.c).
 *
 * Retention (each step deletes at most IM_RETENTION_BATCH rows per call,
 * oldest first, so one call stays short and repeated calls catch up):
 *   - done outbox items processed more than im_sync.inbox_retention ago,
 *     unless quarantined (reconcile reports those).  Readers already treat
 *     a missing item as processed; reconcile's message_without_outbox skips
 *     events older than the recorded cutoff;
 *   - private events older than inbox_retention once their outbox item is
 *     gone and no user log holds them;
 *   - snapshots: READY/BUILDING ones past expires_at become ABANDONED (their
 *     token has expired; they no longer hold the fence); any snapshot whose
 *     expiry is one more snapshot_ttl past is deleted with its pages;
 *   - recovery sessions: ACTIVE ones whose lease ran out more than
 *     token_ttl ago (no batch token of theirs is live) become EXPIRED, as
 *     sync_changes would make them; ended ones are deleted once the largest
 *     of token_ttl and recovery_ttl has passed since they ended;
 *   - audit rows older than im_sync.audit_retention;
 *   - moderation evidence: the kept body of a taken-down message once it
 *     was taken down more than im_sync.evidence_retention ago, unless a
 *     legal hold covers it (IM_LEGAL_HOLD_COVERS_SQL); the row stays (the
 *     takedown's idempotency key) with body NULL and erased_at set;
 *   - a sharded node's transfer records.  Its own
 *     applied records (im.transfer_ack) once every logical slot of this
 *     database has confirmed them: a mark (the WAL insert position, taken
 *     after every transaction older than the mark's time has ended) that
 *     every slot's confirmed_flush_lsn passed proves each subscriber durably
 *     applied the acks older than it, so their sources deleted the
 *     transfers they acknowledge (a lost slot never passes it: its acks stay
 *     for the resubscribe repair's initial copy).  Then applied inbound
 *     transfers (im.transfer_in) whose ack is gone and which were applied
 *     more than im_sync.transfer_retention ago: no source still holds them,
 *     so only a replay of old WAL (a subscription re-created over an old
 *     slot, a rewound origin) could bring them again.  Each source's
 *     pruning horizon (the newest sent_at pruned) stays in
 *     im.maintenance_state; transfer_in.c judges an unknown arrival sent
 *     before it by this node's outbox item of its event (a duplicate:
 *     dropped) and quarantines it otherwise — never applied twice, never
 *     dropped unseen.  Quarantined and pending transfers are never pruned.
 * Invariant protected: nothing a fence, a live snapshot or recovery
 * session, a live token, a dead letter or reconcile still needs is deleted:
 * pending and dead items, quarantined items, unexpired snapshots, ACTIVE
 * sessions and private events a log still holds are never touched.
 */
#include "core/im_sync.h"
#include "core/common.h"
#include "core/version_check.h"
#include "core/im_sql.h"
#include "core/xact_horizon.h"
#include "core/standing.h"
#include "user/user.h"
#include "ops/ops.h"

#include "catalog/pg_type.h"
#include "miscadmin.h"

/* Upper bound of rows one retention step deletes per call. */
#define IM_RETENTION_BATCH 10000
/* Snapshots hold many pages each: fewer per call. */
#define IM_RETENTION_SNAPSHOT_BATCH 200

typedef struct RetentionStep
{
	const char *name;			/* for the debug line */
	const char *sql;			/* $1 limit; $2 inbox_retention, $3 token_ttl,
								 * $4 recovery_ttl, $5 snapshot_ttl,
								 * $6 audit_retention, $7 transfer_retention
								 * (seconds); $8 the oldest start of another
								 * running transaction, NULL when none;
								 * $9 evidence_retention (seconds) */
	int			limit;
	int			since_minor;	/* the 1.x catalog whose tables it needs */
} RetentionStep;

/* This node's name; no row (not sharded): the transfer steps find nothing. */
#define SHARD_SELF_SQL "(SELECT cfg.self_name FROM im.shard_config cfg)"

#define AGO(param) \
	"(pg_catalog.now()" MINUS "pg_catalog.make_interval(secs => " param "))"

static const RetentionStep steps[] = {
	{"outbox",
	 "WITH c AS (SELECT o.outbox_id FROM im.outbox o "
	 "  WHERE o.state" EQ "'done' AND o.processed_at" LT AGO("$2")
	 "    AND NOT EXISTS (SELECT 1 FROM im.fanout_quarantine q WHERE q.outbox_id" EQ "o.outbox_id) "
	 "  ORDER BY o.processed_at LIMIT $1), "
	 "d AS (DELETE FROM im.outbox o USING c WHERE o.outbox_id" EQ "c.outbox_id RETURNING 1), "
	 /* the cutoff reconcile trusts: only moves forward, only when used */
	 "m AS (INSERT INTO im.maintenance_state AS m (name, at) "
	 "  SELECT 'outbox_collected_before', " AGO("$2") " WHERE EXISTS (SELECT 1 FROM d) "
	 "  ON CONFLICT (name) DO UPDATE SET at = GREATEST(m.at, EXCLUDED.at) RETURNING 1) "
	 /* (a data-modifying CTE runs whether or not the query reads it) */
	 "SELECT pg_catalog.count(*) FROM d",
	 IM_RETENTION_BATCH},
	{"private_event",
	 "WITH c AS (SELECT pe.private_event_id FROM im.private_event pe "
	 "  WHERE pe.created_at" LT AGO("$2")
	 "    AND NOT EXISTS (SELECT 1 FROM im.outbox o "
	 "                    WHERE o.source_event_id" EQ "pe.private_event_id) "
	 "    AND NOT EXISTS (SELECT 1 FROM im.inbox i WHERE i.user_id" EQ "pe.user_id "
	 "                    AND i.source_event_id" EQ "pe.private_event_id) "
	 "  ORDER BY pe.created_at LIMIT $1), "
	 "d AS (DELETE FROM im.private_event pe USING c "
	 "  WHERE pe.private_event_id" EQ "c.private_event_id RETURNING 1) "
	 "SELECT pg_catalog.count(*) FROM d",
	 IM_RETENTION_BATCH},
	{"snapshot_abandon",
	 "WITH d AS (UPDATE im.snapshot SET state = 'ABANDONED' "
	 "  WHERE state" EQ "ANY ('{READY,BUILDING}'::pg_catalog.text[]) "
	 "    AND expires_at" LT "pg_catalog.now() RETURNING 1) "
	 "SELECT pg_catalog.count(*) FROM d",
	 0},
	{"snapshot",
	 "WITH c AS (SELECT s.snapshot_id FROM im.snapshot s "
	 "  WHERE s.state" EQ "ANY ('{INSTALLED,ABANDONED}'::pg_catalog.text[]) "
	 "    AND s.expires_at" LT AGO("$5")
	 "  ORDER BY s.expires_at LIMIT $1), "
	 "d AS (DELETE FROM im.snapshot s USING c "
	 "  WHERE s.snapshot_id" EQ "c.snapshot_id RETURNING 1) "
	 "SELECT pg_catalog.count(*) FROM d",
	 IM_RETENTION_SNAPSHOT_BATCH},
	{"recovery_session_expire",
	 "WITH d AS (UPDATE im.recovery_session SET state = 'EXPIRED', ended_at = pg_catalog.now() "
	 "  WHERE state" EQ "'ACTIVE' AND expires_at" LT AGO("$3")
	 "  RETURNING 1) "
	 "SELECT pg_catalog.count(*) FROM d",
	 0},
	{"recovery_session",
	 "WITH c AS (SELECT r.recovery_session_id FROM im.recovery_session r "
	 "  WHERE r.state" NE "'ACTIVE' "
	 "    AND COALESCE(r.ended_at, r.expires_at)" LT AGO("GREATEST($3, $4)")
	 "  ORDER BY r.recovery_session_id LIMIT $1), "
	 "d AS (DELETE FROM im.recovery_session r USING c "
	 "  WHERE r.recovery_session_id" EQ "c.recovery_session_id RETURNING 1) "
	 "SELECT pg_catalog.count(*) FROM d",
	 IM_RETENTION_BATCH},
	{"audit",
	 "WITH c AS (SELECT a.audit_id FROM im.audit a WHERE a.at" LT AGO("$6")
	 "  ORDER BY a.at LIMIT $1), "
	 "d AS (DELETE FROM im.audit a USING c WHERE a.audit_id" EQ "c.audit_id RETURNING 1) "
	 "SELECT pg_catalog.count(*) FROM d",
	 IM_RETENTION_BATCH},
	{"takedown_evidence",
	 "WITH c AS (SELECT v.target_message_id FROM im.takedown_evidence v "
	 "  WHERE v.erased_at IS NULL AND v.taken_down_at" LT AGO("$9")
	 "    AND NOT " IM_LEGAL_HOLD_COVERS_SQL("v.conversation_id", "v.sender_id") " "
	 "  ORDER BY v.taken_down_at LIMIT $1), "
	 "d AS (UPDATE im.takedown_evidence v SET body = NULL, erased_at = pg_catalog.now() FROM c "
	 "  WHERE v.target_message_id" EQ "c.target_message_id RETURNING 1) "
	 "SELECT pg_catalog.count(*) FROM d",
	 IM_RETENTION_BATCH, 12},
	/*
	 * Carried receipt parts (contract §20) a sync window after their last
	 * change: the group's receipts in the logs are collected by then, and a
	 * device back after longer starts from a snapshot, which carries none
	 */
	{"receipt_part",
	 "WITH c AS (SELECT r.message_id, r.node_name FROM im.receipt_part r "
	 "  WHERE r.updated_at" LT AGO("$2")
	 "  ORDER BY r.updated_at LIMIT $1), "
	 "d AS (DELETE FROM im.receipt_part r USING c WHERE r.message_id" EQ "c.message_id "
	 "  AND r.node_name" EQ "c.node_name RETURNING 1) "
	 "SELECT pg_catalog.count(*) FROM d",
	 IM_RETENTION_BATCH, 12},
	/*
	 * The ack mark: when every logical slot of this database has confirmed
	 * the previous mark's position, acks older than its time are confirmed;
	 * then a new mark.  Its time is the start of the oldest transaction
	 * still running (or now), read from the backend status array before
	 * this statement takes the WAL position (xact_horizon.h: whoever runs
	 * it, the owner role included): every ack older than the time committed
	 * below the position.
	 */
	{"transfer_ack_mark",
	 "WITH mk AS (SELECT m.value, m.at FROM im.maintenance_state m"
	 "            WHERE m.name" EQ "'transfer_ack_mark'),"
	 " ok AS (SELECT mk.at FROM mk WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_replication_slots s"
	 "   WHERE s.slot_type" EQ "'logical' AND s.database" EQ "pg_catalog.current_database()"
	 "     AND (s.confirmed_flush_lsn IS NULL OR s.confirmed_flush_lsn" LT
	 "          ('0/0'::pg_catalog.pg_lsn" PLUS "mk.value::pg_catalog.numeric)))),"
	 " c AS (INSERT INTO im.maintenance_state AS m (name, at)"
	 "   SELECT 'transfer_acks_confirmed_before', ok.at FROM ok"
	 "   ON CONFLICT (name) DO UPDATE SET at = GREATEST(m.at, EXCLUDED.at) RETURNING 1),"
	 " n AS (INSERT INTO im.maintenance_state AS m (name, value, at)"
	 "   SELECT 'transfer_ack_mark', x.lsn, x.at FROM ("
	 "     SELECT LEAST(pg_catalog.now(), $8) AS at,"
	 "            (pg_catalog.pg_current_wal_insert_lsn()" MINUS "'0/0'::pg_catalog.pg_lsn)::pg_catalog.int8 AS lsn) x"
	 "   WHERE " SHARD_SELF_SQL " IS NOT NULL"
	 "     AND (EXISTS (SELECT 1 FROM ok) OR NOT EXISTS (SELECT 1 FROM mk))"
	 "   ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value, at = EXCLUDED.at RETURNING 1) "
	 "SELECT pg_catalog.count(*) FROM c",
	 0, 5},
	/* this node's own applied records that every subscriber confirmed */
	{"transfer_ack",
	 "WITH c AS (SELECT a.source_node, a.transfer_id, a.applied_by FROM im.transfer_ack a"
	 "  WHERE a.applied_by" EQ SHARD_SELF_SQL " AND a.source_node" NE "a.applied_by"
	 "    AND a.applied_at" LT "(SELECT m.at FROM im.maintenance_state m"
	 "                         WHERE m.name" EQ "'transfer_acks_confirmed_before')"
	 "  ORDER BY a.applied_at LIMIT $1), "
	 "d AS (DELETE FROM im.transfer_ack a USING c WHERE a.source_node" EQ "c.source_node"
	 "  AND a.transfer_id" EQ "c.transfer_id AND a.applied_by" EQ "c.applied_by RETURNING 1) "
	 "SELECT pg_catalog.count(*) FROM d",
	 IM_RETENTION_BATCH, 5},
	/* applied transfers whose ack is confirmed, past transfer_retention */
	{"transfer_in",
	 "WITH c AS (SELECT t.source_node, t.transfer_id FROM im.transfer_in t"
	 "  WHERE t.state" EQ "'applied' AND t.applied_at" LT AGO("$7")
	 "    AND NOT EXISTS (SELECT 1 FROM im.transfer_ack a WHERE a.source_node" EQ "t.source_node"
	 "                    AND a.transfer_id" EQ "t.transfer_id)"
	 "  ORDER BY t.applied_at LIMIT $1), "
	 "d AS (DELETE FROM im.transfer_in t USING c WHERE t.source_node" EQ "c.source_node"
	 "  AND t.transfer_id" EQ "c.transfer_id RETURNING t.source_node, t.sent_at), "
	 /* each source's horizon: only moves forward, committed with the deletes */
	 "m AS (INSERT INTO im.maintenance_state AS m (name, at)"
	 "  SELECT 'transfer_in_pruned_before:'" OP_CONCAT "d.source_node, pg_catalog.max(d.sent_at)"
	 "  FROM d GROUP BY d.source_node"
	 "  ON CONFLICT (name) DO UPDATE SET at = GREATEST(m.at, EXCLUDED.at) RETURNING 1) "
	 "SELECT pg_catalog.count(*) FROM d",
	 IM_RETENTION_BATCH, 5},
};

#define NUM_STEPS lengthof(steps)

/* Every retention step once, in the caller's transaction. */
static void
retention_collect(void)
{
	static SPIPlanPtr plans[NUM_STEPS];
	Datum		args[9];
	char		nulls[9] = "        ";
	TimestampTz oldest;

	args[1] = Float8GetDatum((double) im_inbox_retention_s);
	args[2] = Float8GetDatum((double) im_token_ttl_s);
	args[3] = Float8GetDatum((double) im_recovery_ttl_s);
	args[4] = Float8GetDatum((double) im_snapshot_ttl_s);
	args[5] = Float8GetDatum((double) im_audit_retention_s);
	args[6] = Float8GetDatum((double) im_transfer_retention_s);
	oldest = im_oldest_other_xact_start();
	args[7] = TimestampTzGetDatum(oldest);
	nulls[7] = oldest != 0 ? ' ' : 'n';
	args[8] = Float8GetDatum((double) im_evidence_retention_s);

	im_spi_connect();
	for (int i = 0; i < (int) NUM_STEPS; i++)
	{
		int64		n;

		CHECK_FOR_INTERRUPTS();
		if (steps[i].since_minor > 0 && !im_catalog_at_least(1, steps[i].since_minor))
			continue;
		/* a step without a limit changes few rows (expired leases, a mark) */
		args[0] = Int64GetDatum(steps[i].limit > 0 ? steps[i].limit : PG_INT64_MAX);
		im_prepare(&plans[i], steps[i].sql, 9,
				   INT8OID, FLOAT8OID, FLOAT8OID, FLOAT8OID, FLOAT8OID, FLOAT8OID, FLOAT8OID,
				   TIMESTAMPTZOID, FLOAT8OID);
		im_exec(plans[i], args, nulls, 1);
		n = im_get_int64(0, 1, NULL);
		if (n > 0)
			elog(DEBUG1, "im_sync: retention step %s: " INT64_FORMAT " rows", steps[i].name, n);
	}
	SPI_finish();
}

void
im_maintain(void)
{
	bool		rotated;
	int			retired;

	retired = im_token_keys_maintain(&rotated);
	if (rotated || retired > 0)
		ereport(LOG,
				(errmsg("im_sync: token key maintenance: %s, %d superseded key(s) retired",
						rotated ? "rotated to a new signing key" : "no rotation", retired)));
	retention_collect();
	/* reinstated or expired suspensions: the checks may skip the lookup again */
	im_standing_recount();
}
