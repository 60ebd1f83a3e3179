/*
 * receipt.c — delivered and read receipts to a sender's devices as
 * `receipt` private events (contract §20, §8.1: delivery and read apart);
 * user side.
 *
 * Three steps, so the paths that learn the facts stay as fast as they were:
 *   1. ack_sync and report_read, when they move, each insert ONE row into
 *      im.receipt_source (im_receipt_note): no lookup, no lock on an
 *      existing row, never a row per recipient per message;
 *   2. the producer (im_receipts_produce: every fanout worker batch and
 *      im.run_receipts) takes the queued rows with one DELETE and turns
 *      them into per-(sender, conversation) rows of im.receipt_pending:
 *      direct conversations keep the cumulative delivered_through_seq (the
 *      newest position of the conversation an ACK of the other member
 *      covers) and read_through_seq (the other member's cursor); fanout
 *      groups keep the msg_seq range of the sender's messages whose counts
 *      may have changed; shared_log groups get nothing;
 *   3. the producer emits the due rows (direct: at once; groups: at most
 *      once per im_sync.receipt_interval) as private events of the
 *      sender, which fanout writes into the sender's log like any other.
 *
 * Invariants protected:
 *   - receipts follow the four facts (contract §7): group counts are
 *     message_facts' rows counted (im_message_fact_counts), read only for
 *     readers with read receipts on; a user with them off makes no read
 *     state known (direct: read_through_seq is null);
 *   - nothing is lost: a fact committed after the producer read the facts
 *     left its own source row, which marks the pending row dirty again;
 *   - lock order: the producer takes source rows (its DELETE skips none
 *     but only waits for another producer's DELETE of the same rows), then
 *     pending rows in (user_id, conversation_id) order (its upsert), or
 *     due pending rows with SKIP LOCKED (never waits); it never locks a
 *     device, a user head or a user's state.  ACK and read report take no
 *     pending row.  So no cycle exists with the existing order (the
 *     conversation row, devices, user heads, user states): the producer's
 *     private event insert takes a key-share lock on the conversation row
 *     and may wait for a sender, and no sender waits for a receipt row.
 */
#include "core/im_sync.h"
#include "core/common.h"
#include "core/shard_map.h"
#include "core/shmem.h"
#include "core/im_sql.h"
#include "core/version_check.h"
#include "core/standing.h"
#include "user/user.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"

/* at most this many of a sender's messages per group receipt round */
#define IM_RECEIPT_GROUP_MESSAGES 100

void
im_receipt_note(int64 user_id, int64 conversation_id, int64 from_seq, int64 to_seq)
{
	static SPIPlanPtr plan;
	Datum		args[4];
	char		nulls[4] = {' ', ' ', ' ', ' '};

	if (to_seq <= from_seq || !im_catalog_at_least(1, 11))
		return;
	im_prepare(&plan,
			   "INSERT INTO im.receipt_source (user_id, conversation_id, from_seq, to_seq) "
			   "VALUES ($1, $2, $3, $4)",
			   4, INT8OID, INT8OID, INT8OID, INT8OID);
	args[0] = Int64GetDatum(user_id);
	args[1] = Int64GetDatum(conversation_id);
	if (conversation_id == 0)
		nulls[1] = 'n';
	args[2] = Int64GetDatum(from_seq);
	args[3] = Int64GetDatum(to_seq);
	im_exec(plan, args, nulls, 0);
	im_wake_fanout_at_commit();
}

/*
 * Step 2: queued sources into pending rows.  One statement: the DELETE and
 * the upsert commit together, so a source is either still queued or
 * reflected in its pending rows.
 */
static void
drain_sources(int max_rows)
{
	static SPIPlanPtr plan;
	Datum		args[1];

	im_prepare(&plan,
			   "WITH src AS ("
			   "  DELETE FROM im.receipt_source WHERE ctid" EQ "ANY (ARRAY("
			   "    SELECT ctid FROM im.receipt_source LIMIT $1 FOR UPDATE SKIP LOCKED))"
			   "  RETURNING user_id, conversation_id, from_seq, to_seq),"
			   /* the reader reports reads (absent: on) */
			   " rd AS (SELECT s.* FROM src s WHERE s.conversation_id IS NOT NULL"
			   "   AND NOT EXISTS (SELECT 1 FROM im.receipt_setting rs"
			   "                   WHERE rs.user_id" EQ "s.user_id AND NOT rs.read_receipts)),"
			   /* positions an ACK covered, per conversation */
			   " ack AS (SELECT s.user_id AS reader, i.conversation_id, i.msg_seq, i.source_event_id"
			   "   FROM src s JOIN im.inbox i ON i.user_id" EQ "s.user_id"
			   "    AND i.sync_seq" GT "s.from_seq AND i.sync_seq" LE "s.to_seq"
			   "   WHERE s.conversation_id IS NULL AND i.msg_seq IS NOT NULL),"
			   " direct AS ("
			   "   SELECT a.reader, a.conversation_id, pg_catalog.max(a.msg_seq) AS d, 0::pg_catalog.int8 AS r"
			   "   FROM ack a GROUP BY 1, 2"
			   "   UNION ALL SELECT r.user_id, r.conversation_id, 0, r.to_seq FROM rd r),"
			   " facts AS ("
			   "   SELECT p.user_id AS sender, x.conversation_id, x.d, x.r,"
			   "          NULL::pg_catalog.int8 AS f, NULL::pg_catalog.int8 AS t"
			   "   FROM direct x JOIN im.conversation c ON c.conversation_id" EQ "x.conversation_id"
			   "    AND c.kind" EQ "'direct'"
			   "   JOIN im.membership_period p ON p.conversation_id" EQ "x.conversation_id"
			   "    AND p.user_id" NE "x.reader"
			   "   UNION ALL"
			   "   SELECT e.sender_id, a.conversation_id, 0, 0, pg_catalog.min(a.msg_seq), pg_catalog.max(a.msg_seq)"
			   "   FROM ack a JOIN im.event e ON e.message_id" EQ "a.source_event_id"
			   "    AND e.kind" EQ "'message' AND e.sender_id" NE "a.reader"
			   "   JOIN im.conversation c ON c.conversation_id" EQ "a.conversation_id"
			   "    AND c.kind" EQ "'group' AND c.mode" EQ "'fanout'"
			   "   GROUP BY 1, 2"
			   "   UNION ALL"
			   "   SELECT e.sender_id, r.conversation_id, 0, 0, pg_catalog.min(e.msg_seq), pg_catalog.max(e.msg_seq)"
			   "   FROM rd r JOIN im.conversation c ON c.conversation_id" EQ "r.conversation_id"
			   "    AND c.kind" EQ "'group' AND c.mode" EQ "'fanout'"
			   "   JOIN im.event e ON e.conversation_id" EQ "r.conversation_id"
			   "    AND e.msg_seq" GT "r.from_seq AND e.msg_seq" LE "r.to_seq"
			   "    AND e.kind" EQ "'message' AND e.sender_id" NE "r.user_id"
			   "   GROUP BY 1, 2) "
			   "INSERT INTO im.receipt_pending AS rp (user_id, conversation_id, delivered_through_seq,"
			   "  read_through_seq, dirty_from_msg_seq, dirty_to_msg_seq, dirty) "
			   "SELECT sender, conversation_id, pg_catalog.max(d), pg_catalog.max(r),"
			   "       pg_catalog.min(f), pg_catalog.max(t), true "
			   "FROM facts WHERE sender IS NOT NULL GROUP BY 1, 2 ORDER BY 1, 2 "
			   "ON CONFLICT (user_id, conversation_id) DO UPDATE SET "
			   "  delivered_through_seq = GREATEST(rp.delivered_through_seq, EXCLUDED.delivered_through_seq),"
			   "  read_through_seq = GREATEST(rp.read_through_seq, EXCLUDED.read_through_seq),"
			   "  dirty_from_msg_seq = LEAST(rp.dirty_from_msg_seq, EXCLUDED.dirty_from_msg_seq),"
			   "  dirty_to_msg_seq = GREATEST(rp.dirty_to_msg_seq, EXCLUDED.dirty_to_msg_seq),"
			   "  dirty = rp.dirty"
			   "     OR EXCLUDED.delivered_through_seq" GT "rp.delivered_through_seq"
			   "     OR EXCLUDED.read_through_seq" GT "rp.read_through_seq"
			   "     OR EXCLUDED.dirty_from_msg_seq IS NOT NULL",
			   1, INT4OID);
	args[0] = Int32GetDatum(max_rows);
	im_exec(plan, args, NULL, 0);
}

/* One receipt private event of user_id with its outbox item. */
static void
write_receipt(int64 user_id, int64 conversation_id, Datum payload)
{
	static SPIPlanPtr plan;
	Datum		args[4];

	im_prepare(&plan,
			   "WITH pe AS ("
			   "  INSERT INTO im.private_event (private_event_id, user_id, conversation_id, kind, payload)"
			   "  VALUES ($1, $2, $3, 'receipt', $4) RETURNING private_event_id, user_id, conversation_id) "
			   "INSERT INTO im.outbox (conversation_id, msg_seq, source_event_id, private_user_id) "
			   "SELECT pe.conversation_id, NULL, pe.private_event_id, pe.user_id FROM pe",
			   4, INT8OID, INT8OID, INT8OID, JSONBOID);
	args[0] = Int64GetDatum(im_shard_next_placed_id("event_id_seq", user_id));
	args[1] = Int64GetDatum(user_id);
	args[2] = Int64GetDatum(conversation_id);
	args[3] = payload;
	if (im_exec(plan, args, NULL, 0) != 1)
		elog(ERROR, "im_sync: receipt was not recorded");
}

/* A group receipt per message of sender in [from, to], newest first. */
static int64
emit_group(int64 sender, int64 conversation_id, int64 from, int64 to)
{
	static SPIPlanPtr plan;
	static SPIPlanPtr payload_plan;
	Datum		args[4];
	int64	   *ids;
	int			n;

	im_prepare(&plan,
			   "SELECT message_id FROM im.event WHERE conversation_id" EQ "$1"
			   " AND msg_seq" GE "$2 AND msg_seq" LE "$3 AND sender_id" EQ "$4"
			   " AND kind" EQ "'message' ORDER BY msg_seq DESC LIMIT "
			   CppAsString2(IM_RECEIPT_GROUP_MESSAGES),
			   4, INT8OID, INT8OID, INT8OID, INT8OID);
	args[0] = Int64GetDatum(conversation_id);
	args[1] = Int64GetDatum(from);
	args[2] = Int64GetDatum(to);
	args[3] = Int64GetDatum(sender);
	n = (int) im_exec(plan, args, NULL, 0);
	ids = palloc(sizeof(int64) * Max(n, 1));
	for (int i = 0; i < n; i++)
		ids[i] = im_get_int64(i, 1, NULL);
	/* oldest first into the log */
	for (int i = n - 1; i >= 0; i--)
	{
		int64		delivered,
					read,
					members;
		Datum		payload;
		bool		isnull;

		im_message_fact_counts(ids[i], sender, &delivered, &read, &members);
		im_prepare(&payload_plan,
				   "SELECT pg_catalog.jsonb_build_object('message_id', $1, 'delivered_count', $2,"
				   " 'read_count', $3, 'member_count', $4)",
				   4, INT8OID, INT8OID, INT8OID, INT8OID);
		args[0] = Int64GetDatum(ids[i]);
		args[1] = Int64GetDatum(delivered);
		args[2] = Int64GetDatum(read);
		args[3] = Int64GetDatum(members);
		im_exec(payload_plan, args, NULL, 1);
		payload = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
		payload = PointerGetDatum(PG_DETOAST_DATUM_COPY(payload));
		write_receipt(sender, conversation_id, payload);
	}
	return n;
}

typedef struct DueRow
{
	int64		user_id;
	int64		conversation_id;
	bool		direct;
	bool		fanout;			/* mode now: a group switched to shared_log gets none */
	bool		has_range;
	int64		from;
	int64		to;
	Datum		payload;		/* direct: the event's keys */
} DueRow;

/*
 * Step 3: the due pending rows, locked with SKIP LOCKED (a row another
 * producer holds goes next round), emitted and marked clean.
 */
static int64
emit_due(int max_rows)
{
	static SPIPlanPtr plan;
	static SPIPlanPtr clean_plan;
	Datum		args[2];
	int			n;
	DueRow	   *rows;
	int64		written = 0;

	im_prepare(&plan,
			   "SELECT rp.user_id, rp.conversation_id, c.kind" EQ "'direct', c.mode" EQ "'fanout',"
			   "  rp.dirty_from_msg_seq, rp.dirty_to_msg_seq,"
			   "  pg_catalog.jsonb_build_object('delivered_through_seq', rp.delivered_through_seq,"
			   "    'read_through_seq', CASE WHEN EXISTS (SELECT 1 FROM im.membership_period p"
			   "        JOIN im.receipt_setting rs ON rs.user_id" EQ "p.user_id AND NOT rs.read_receipts"
			   "        WHERE p.conversation_id" EQ "rp.conversation_id AND p.user_id" NE "rp.user_id)"
			   "      THEN NULL ELSE rp.read_through_seq END) "
			   "FROM im.receipt_pending rp JOIN im.conversation c ON c.conversation_id" EQ "rp.conversation_id "
			   "WHERE rp.dirty AND (c.kind" EQ "'direct' OR rp.emitted_at IS NULL"
			   "  OR rp.emitted_at" PLUS "$2 * interval '1 millisecond'" LE "pg_catalog.now()) "
			   "ORDER BY rp.user_id, rp.conversation_id LIMIT $1 "
			   "FOR UPDATE OF rp SKIP LOCKED",
			   2, INT4OID, INT4OID);
	args[0] = Int32GetDatum(max_rows);
	args[1] = Int32GetDatum(im_receipt_interval_ms);
	n = (int) im_exec(plan, args, NULL, 0);
	rows = palloc(sizeof(DueRow) * Max(n, 1));
	for (int i = 0; i < n; i++)
	{
		bool		isnull;
		Datum		d;

		rows[i].user_id = im_get_int64(i, 1, NULL);
		rows[i].conversation_id = im_get_int64(i, 2, NULL);
		rows[i].direct = im_get_bool(i, 3, NULL);
		rows[i].fanout = im_get_bool(i, 4, NULL);
		rows[i].from = im_get_int64(i, 5, &isnull);
		rows[i].has_range = !isnull;
		rows[i].to = im_get_int64(i, 6, NULL);
		d = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 7, &isnull);
		rows[i].payload = PointerGetDatum(PG_DETOAST_DATUM_COPY(d));
	}
	for (int i = 0; i < n; i++)
	{
		DueRow	   *r = &rows[i];

		/*
		 * A sender placed on another node is told on its node (contract
		 * §15); this node does not write it a log entry (see
		 * sharding.md "Receipts").
		 */
		if (im_shard_configured() && !im_shard_owns_bucket(im_shard_bucket(r->user_id)))
			;
		else if (r->direct)
		{
			write_receipt(r->user_id, r->conversation_id, r->payload);
			written++;
		}
		else if (r->has_range && r->fanout)
			written += emit_group(r->user_id, r->conversation_id, r->from, r->to);

		im_prepare(&clean_plan,
				   "UPDATE im.receipt_pending SET dirty = false, dirty_from_msg_seq = NULL,"
				   " dirty_to_msg_seq = NULL, emitted_at = pg_catalog.now() "
				   "WHERE user_id" EQ "$1 AND conversation_id" EQ "$2",
				   2, INT8OID, INT8OID);
		args[0] = Int64GetDatum(r->user_id);
		args[1] = Int64GetDatum(r->conversation_id);
		im_exec(clean_plan, args, NULL, 0);
	}
	if (written > 0)
		im_wake_fanout_at_commit();
	return written;
}

int64
im_receipts_produce(int max_rows)
{
	if (!im_catalog_at_least(1, 11))
		return 0;
	drain_sources(max_rows);
	return emit_due(max_rows);
}

PG_FUNCTION_INFO_V1(im_run_receipts);
/* run_receipts(max_rows): one producer pass now; the receipts written */
Datum
im_run_receipts(PG_FUNCTION_ARGS)
{
	int32		max_rows = PG_ARGISNULL(0) ? 10000 : PG_GETARG_INT32(0);
	int64		n;

	if (max_rows < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_rows must be positive")));
	im_spi_connect();
	n = im_receipts_produce(max_rows);
	SPI_finish();
	PG_RETURN_INT64(n);
}

PG_FUNCTION_INFO_V1(im_set_read_receipts);
/*
 * set_read_receipts(user_id, enabled): off, the user's reads are no longer
 * reported to others (delivery still is); returns the setting now.
 */
Datum
im_set_read_receipts(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr plan;
	int64		user_id = im_arg_user_id(fcinfo, 0, "user_id");
	bool		enabled;
	Datum		args[2];
	Datum		values[1];
	bool		nulls[1] = {false};

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("enabled must not be NULL")));
	enabled = PG_GETARG_BOOL(1);
	(void) im_arg_trace_id(fcinfo, 2);	/* checked like every write's */

	im_srf_begin(fcinfo);
	im_spi_connect();
	im_user_check_standing(user_id);	/* IS403 for a suspended account (contract §17) */
	im_shard_require_user(user_id);
	im_prepare(&plan,
			   "INSERT INTO im.receipt_setting (user_id, read_receipts) VALUES ($1, $2) "
			   "ON CONFLICT (user_id) DO UPDATE SET read_receipts = EXCLUDED.read_receipts",
			   2, INT8OID, BOOLOID);
	args[0] = Int64GetDatum(user_id);
	args[1] = BoolGetDatum(enabled);
	im_exec(plan, args, NULL, 0);
	SPI_finish();
	values[0] = BoolGetDatum(enabled);
	im_srf_row(fcinfo, values, nulls);
	PG_RETURN_NULL();
}
