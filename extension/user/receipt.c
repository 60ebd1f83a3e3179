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
 *      sender, which fanout writes into the sender's log like any other;
 *      on a sharded node, a row whose sender is placed on another node is
 *      carried there instead (carry_receipt: a transfer row) and applied
 *      by that node (im_receipt_apply_carried), which emits it in its own
 *      step 3 (sharding.md "Receipts").
 *
 * Invariants protected:
 *   - receipts follow the four facts (contract §7): group counts are
 *     message_facts' rows counted (im_message_fact_counts), read only for
 *     readers with read receipts on; a user with them off makes no read
 *     state known (direct: read_through_seq is null);
 *   - across nodes a node counts only the users it places: each node's
 *     part is its own members' facts, the sender's node sums the parts
 *     (one per node, replaced, never added twice) with its own members;
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
			   /*
			    * the other member from the conversation's pair, not from the
			    * periods: a reader's node holds only its own users' periods
			    */
			   "   FROM direct x JOIN im.conversation c ON c.conversation_id" EQ "x.conversation_id"
			   "    AND c.kind" EQ "'direct' AND x.reader IN (c.direct_user_lo, c.direct_user_hi)"
			   "    AND c.direct_user_lo" NE "c.direct_user_hi"
			   "   CROSS JOIN LATERAL (SELECT c.direct_user_lo" PLUS "c.direct_user_hi" MINUS "x.reader AS user_id) p"
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

/*
 * A carried receipt: one transfer from this (the readers') node to the
 * sender's node (sharding.md "Receipts"), published like every transfer
 * (im_to_<dest>, row filter on dest_node) and applied there by
 * im_receipt_apply_carried.  No outbox item stands behind it (outbox_id and
 * source_event_id 0); msg_seq, the newest position it reports, orders it
 * among the conversation's transfers there.
 */
static void
carry_receipt(int64 sender, int64 conversation_id, int64 msg_seq, Datum receipt)
{
	static SPIPlanPtr plan;
	Datum		args[5];

	im_prepare(&plan,
			   "INSERT INTO im.transfer_out (transfer_id, source_node, dest_node, outbox_id, conversation_id,"
			   "                             msg_seq, source_event_id, payload)"
			   " SELECT $1 OPERATOR(pg_catalog.|) pg_catalog.nextval('im.transfer_id_seq'::pg_catalog.regclass),"
			   "  c.self_name, c.bucket_nodes[($2" OP_MOD CppAsString2(IM_SHARD_BUCKETS) ")" PLUS "1], 0, $3, $4, 0,"
			   "  pg_catalog.jsonb_build_object('receipt', $5)"
			   " FROM im.shard_config c",
			   5, INT8OID, INT8OID, INT8OID, INT8OID, JSONBOID);
	args[0] = Int64GetDatum(im_shard_transfer_id_base());
	args[1] = Int64GetDatum(sender);
	args[2] = Int64GetDatum(conversation_id);
	args[3] = Int64GetDatum(Max(msg_seq, 0));
	args[4] = receipt;
	if (im_exec(plan, args, NULL, 0) != 1)
		elog(ERROR, "im_sync: carried receipt was not recorded");
}

/* the parts other nodes carried for message_id, summed (their own members) */
static void
add_carried_parts(int64 message_id, int64 *delivered, int64 *read, int64 *members)
{
	static SPIPlanPtr plan;
	Datum		args[1];

	im_prepare(&plan,
			   "SELECT COALESCE(pg_catalog.sum(delivered_count), 0)::pg_catalog.int8,"
			   "  COALESCE(pg_catalog.sum(read_count), 0)::pg_catalog.int8,"
			   "  COALESCE(pg_catalog.sum(member_count), 0)::pg_catalog.int8"
			   " FROM im.receipt_part WHERE message_id" EQ "$1 AND node_name" NE "im.shard_self()",
			   1, INT8OID);
	args[0] = Int64GetDatum(message_id);
	im_exec(plan, args, NULL, 1);
	*delivered += im_get_int64(0, 1, NULL);
	*read += im_get_int64(0, 2, NULL);
	*members += im_get_int64(0, 3, NULL);
}

/*
 * A group receipt per message of sender in [from, to], newest first.  The
 * sender placed here: receipt private events, the counts of this node's
 * members plus the parts other nodes carried (on a sharded node).  The
 * sender placed elsewhere (carry): this node's part, the counts of its own
 * members only, carried to the sender's node in one transfer (none when no
 * member of the audience is placed here).
 */
static int64
emit_group(int64 sender, int64 conversation_id, int64 from, int64 to, bool carry)
{
	static SPIPlanPtr plan;
	static SPIPlanPtr payload_plan;
	static SPIPlanPtr parts_plan;
	Datum		args[5];
	int64	   *ids;
	int64	   *seqs;
	int64	   *pids,
			   *pd,
			   *pr,
			   *pm;
	int			nparts = 0;
	int			n;
	bool		sharded = im_shard_configured() && im_catalog_at_least(1, 12);

	im_prepare(&plan,
			   "SELECT message_id, msg_seq FROM im.event WHERE conversation_id" EQ "$1"
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
	seqs = palloc(sizeof(int64) * Max(n, 1));
	pids = palloc(sizeof(int64) * Max(n, 1));
	pd = palloc(sizeof(int64) * Max(n, 1));
	pr = palloc(sizeof(int64) * Max(n, 1));
	pm = palloc(sizeof(int64) * Max(n, 1));
	for (int i = 0; i < n; i++)
	{
		ids[i] = im_get_int64(i, 1, NULL);
		seqs[i] = im_get_int64(i, 2, NULL);
	}
	/* oldest first into the log */
	for (int i = n - 1; i >= 0; i--)
	{
		int64		delivered,
					read,
					members;
		Datum		payload;
		bool		isnull;

		im_message_fact_counts(ids[i], sender, sharded, &delivered, &read, &members);
		if (carry)
		{
			if (members == 0)
				continue;		/* nobody of the audience here: no part */
			pids[nparts] = ids[i];
			pd[nparts] = delivered;
			pr[nparts] = read;
			pm[nparts] = members;
			nparts++;
			continue;
		}
		if (sharded)
			add_carried_parts(ids[i], &delivered, &read, &members);
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
	if (carry && nparts > 0)
	{
		Datum		receipt;
		bool		isnull;

		im_prepare(&parts_plan,
				   "SELECT pg_catalog.jsonb_build_object('kind', 'group', 'sender_id', $1, 'parts',"
				   "  pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object('message_id', x.m,"
				   "    'delivered_count', x.d, 'read_count', x.r, 'member_count', x.c) ORDER BY x.m))"
				   " FROM ROWS FROM (pg_catalog.unnest($2::pg_catalog.int8[]), pg_catalog.unnest($3::pg_catalog.int8[]),"
				   "   pg_catalog.unnest($4::pg_catalog.int8[]), pg_catalog.unnest($5::pg_catalog.int8[])) x(m, d, r, c)",
				   5, INT8OID, INT8ARRAYOID, INT8ARRAYOID, INT8ARRAYOID, INT8ARRAYOID);
		args[0] = Int64GetDatum(sender);
		args[1] = im_int8_array(pids, nparts);
		args[2] = im_int8_array(pd, nparts);
		args[3] = im_int8_array(pr, nparts);
		args[4] = im_int8_array(pm, nparts);
		im_exec(parts_plan, args, NULL, 1);
		receipt = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
		receipt = PointerGetDatum(PG_DETOAST_DATUM_COPY(receipt));
		carry_receipt(sender, conversation_id, seqs[0], receipt);
	}
	/* the receipts written here (a carried one is written on the sender's node) */
	return carry ? 0 : n;
}

/* a carried "reads hidden" (the reader turned read receipts off on its node) */
#define IM_READ_HIDDEN_SQL "rp.read_hidden OR"

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
	int64		other;			/* direct: the other member (the reader) */
	int64		through;		/* direct: the newest position reported */
} DueRow;

#define EMIT_DUE_SQL(hidden) \
	"SELECT rp.user_id, rp.conversation_id, c.kind" EQ "'direct', c.mode" EQ "'fanout'," \
	"  rp.dirty_from_msg_seq, rp.dirty_to_msg_seq," \
	"  pg_catalog.jsonb_build_object('delivered_through_seq', rp.delivered_through_seq," \
	"    'read_through_seq', CASE WHEN " hidden " EXISTS (SELECT 1 FROM im.membership_period p" \
	"        JOIN im.receipt_setting rs ON rs.user_id" EQ "p.user_id AND NOT rs.read_receipts" \
	"        WHERE p.conversation_id" EQ "rp.conversation_id AND p.user_id" NE "rp.user_id)" \
	"      THEN NULL ELSE rp.read_through_seq END)," \
	"  c.direct_user_lo" PLUS "c.direct_user_hi" MINUS "rp.user_id," \
	"  GREATEST(rp.delivered_through_seq, rp.read_through_seq) " \
	"FROM im.receipt_pending rp JOIN im.conversation c ON c.conversation_id" EQ "rp.conversation_id " \
	"WHERE rp.dirty AND (c.kind" EQ "'direct' OR rp.emitted_at IS NULL" \
	"  OR rp.emitted_at" PLUS "$2 * interval '1 millisecond'" LE "pg_catalog.now()) " \
	"ORDER BY rp.user_id, rp.conversation_id LIMIT $1 " \
	"FOR UPDATE OF rp SKIP LOCKED"

/*
 * Step 3: the due pending rows, locked with SKIP LOCKED (a row another
 * producer holds goes next round), emitted and marked clean.
 */
static int64
emit_due(int max_rows)
{
	static SPIPlanPtr plans[2];
	SPIPlanPtr	plan;
	static SPIPlanPtr clean_plan;
	Datum		args[3];
	int			n;
	DueRow	   *rows;
	int64		written = 0;

	/* read_hidden exists only on a catalog that carries receipts */
	if (im_catalog_at_least(1, 12))
		im_prepare(&plans[1], EMIT_DUE_SQL(IM_READ_HIDDEN_SQL), 2, INT4OID, INT4OID);
	else
		im_prepare(&plans[0], EMIT_DUE_SQL(""), 2, INT4OID, INT4OID);
	plan = plans[im_catalog_at_least(1, 12) ? 1 : 0];
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
		rows[i].other = im_get_int64(i, 8, &isnull);
		rows[i].through = im_get_int64(i, 9, NULL);
	}
	for (int i = 0; i < n; i++)
	{
		DueRow	   *r = &rows[i];

		/*
		 * A sender placed on another node is told on its node (contract
		 * §15): what this node knows is carried there (sharding.md
		 * "Receipts"); an older catalog has nothing to carry it with.
		 */
		bool		remote = im_shard_configured() && !im_shard_owns_bucket(im_shard_bucket(r->user_id));

		if (remote && !im_catalog_at_least(1, 12))
			;
		else if (remote && r->direct)
		{
			static SPIPlanPtr direct_plan;
			Datum		receipt;
			bool		isnull;

			im_prepare(&direct_plan,
					   "SELECT $1" OP_CONCAT "pg_catalog.jsonb_build_object('kind', 'direct',"
					   " 'sender_id', $2, 'reader_id', $3)",
					   3, JSONBOID, INT8OID, INT8OID);
			args[0] = r->payload;
			args[1] = Int64GetDatum(r->user_id);
			args[2] = Int64GetDatum(r->other);
			im_exec(direct_plan, args, NULL, 1);
			receipt = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
			receipt = PointerGetDatum(PG_DETOAST_DATUM_COPY(receipt));
			carry_receipt(r->user_id, r->conversation_id, r->through, receipt);
		}
		else if (r->direct)
		{
			write_receipt(r->user_id, r->conversation_id, r->payload);
			written++;
		}
		else if (r->has_range && r->fanout)
			written += emit_group(r->user_id, r->conversation_id, r->from, r->to, remote);

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

/*
 * A receipt carried from node `source` (a transfer's payload 'receipt'),
 * applied on the sender's node in the transfer's subtransaction: any ERROR
 * quarantines the transfer and changes nothing.  Believed only as far as
 * the map allows: the sender is placed here (else IS421), a direct
 * receipt's reader is placed on the source and the conversation is their
 * pair, a group part is the source's own (keyed by the source node, so a
 * node can only replace its own part), of messages of that conversation by
 * that sender, with counts no larger than its members.
 *   direct: (delivered_through_seq, read_through_seq) with GREATEST, so
 *           order and duplicates do not matter; a NULL read_through_seq is
 *           a reader who turned read receipts off (read_hidden, set by a
 *           receipt not behind the state held, cleared by one that moved
 *           it forward: an older receipt arriving late changes nothing);
 *   group:  each part replaces the source's part of its message
 *           (im.receipt_part); the sender's messages it names are marked
 *           due, and emit_group sums the parts.
 */
void
im_receipt_apply_carried(const char *source, Datum payload, int64 conversation_id)
{
	static SPIPlanPtr head_plan;
	static SPIPlanPtr direct_plan;
	static SPIPlanPtr parts_plan;
	Datum		args[6];
	char		nulls[6] = {' ', ' ', ' ', ' ', ' ', ' '};
	char	   *kind;
	int64		sender;
	bool		isnull;
	const char *owner;

	im_prepare(&head_plan,
			   "SELECT r->>'kind', (r->>'sender_id')::pg_catalog.int8, (r->>'reader_id')::pg_catalog.int8,"
			   "  (r->>'delivered_through_seq')::pg_catalog.int8, (r->>'read_through_seq')::pg_catalog.int8,"
			   "  (SELECT c.kind::pg_catalog.text FROM im.conversation c WHERE c.conversation_id" EQ "$2)"
			   " FROM (SELECT $1->'receipt' AS r) x",
			   2, JSONBOID, INT8OID);
	args[0] = payload;
	args[1] = Int64GetDatum(conversation_id);
	im_exec(head_plan, args, NULL, 1);
	kind = im_get_text(0, 1);
	sender = im_get_int64(0, 2, &isnull);
	if (kind == NULL || isnull || sender <= 0 ||
		(strcmp(kind, "direct") != 0 && strcmp(kind, "group") != 0))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("receipt carried for conversation " INT64_FORMAT " has no valid kind and sender",
						conversation_id),
				 errhint("A carried receipt is {\"kind\": \"direct\" or \"group\", \"sender_id\": …}; nothing of it was applied.")));
	im_shard_require_user(sender);
	if (strcmp(kind, "direct") == 0)
	{
		int64		reader = im_get_int64(0, 3, &isnull);
		int64		delivered;
		int64		read;
		bool		read_null;
		bool		no_delivered;
		char	   *ckind = im_get_text(0, 6);

		if (isnull)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("direct receipt carried for conversation " INT64_FORMAT " names no reader",
							conversation_id)));
		delivered = im_get_int64(0, 4, &no_delivered);
		read = im_get_int64(0, 5, &read_null);
		if (no_delivered || delivered < 0 || (!read_null && read < 0))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("direct receipt carried for conversation " INT64_FORMAT
							" has no valid delivered_through_seq / read_through_seq", conversation_id)));
		owner = im_shard_node_of_bucket(im_shard_bucket(reader));
		if (owner == NULL || strcmp(owner, source) != 0)
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("receipt from node \"%s\" reports reader " INT64_FORMAT
							", whom this node's map places on node \"%s\"",
							source, reader, owner ? owner : "?")));
		if (ckind == NULL || strcmp(ckind, "direct") != 0)
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("receipt from node \"%s\" names conversation " INT64_FORMAT
							", which this node holds as no direct conversation", source, conversation_id),
					 errhint("Its transfer is retried; the conversation's row arrives with the sender's messages.")));
		im_prepare(&direct_plan,
				   "INSERT INTO im.receipt_pending AS rp (user_id, conversation_id, delivered_through_seq,"
				   "  read_through_seq, read_hidden, dirty)"
				   " SELECT $1, $2, $3, COALESCE($4, 0), $4 IS NULL, true FROM im.conversation c"
				   " WHERE c.conversation_id" EQ "$2 AND c.kind" EQ "'direct'"
				   "  AND LEAST($1, $5)" EQ "c.direct_user_lo AND GREATEST($1, $5)" EQ "c.direct_user_hi"
				   "  AND $1" NE "$5 "
				   "ON CONFLICT (user_id, conversation_id) DO UPDATE SET"
				   "  delivered_through_seq = GREATEST(rp.delivered_through_seq, EXCLUDED.delivered_through_seq),"
				   "  read_through_seq = GREATEST(rp.read_through_seq, EXCLUDED.read_through_seq),"
				   /*
					* hidden as the newest receipt says: an older one (delivered
					* behind) keeps it, one that moved forward sets it
					*/
				   "  read_hidden = CASE WHEN EXCLUDED.delivered_through_seq" LT "rp.delivered_through_seq"
				   "    THEN rp.read_hidden WHEN EXCLUDED.read_hidden THEN true"
				   "    WHEN EXCLUDED.delivered_through_seq" GT "rp.delivered_through_seq"
				   "      OR EXCLUDED.read_through_seq" GT "rp.read_through_seq THEN false"
				   "    ELSE rp.read_hidden END,"
				   "  dirty = rp.dirty OR EXCLUDED.delivered_through_seq" GT "rp.delivered_through_seq"
				   "    OR EXCLUDED.read_through_seq" GT "rp.read_through_seq"
				   "    OR (EXCLUDED.read_hidden AND NOT rp.read_hidden"
				   "        AND EXCLUDED.delivered_through_seq" GE "rp.delivered_through_seq)",
				   5, INT8OID, INT8OID, INT8OID, INT8OID, INT8OID);
		args[0] = Int64GetDatum(sender);
		args[1] = Int64GetDatum(conversation_id);
		args[2] = Int64GetDatum(delivered);
		args[3] = Int64GetDatum(read);
		nulls[3] = read_null ? 'n' : ' ';
		args[4] = Int64GetDatum(reader);
		if (im_exec(direct_plan, args, nulls, 0) != 1)
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("receipt from node \"%s\": conversation " INT64_FORMAT " is not the direct pair of "
							INT64_FORMAT " and " INT64_FORMAT, source, conversation_id, sender, reader)));
	}
	else
	{
		char	   *ckind = im_get_text(0, 6);
		uint64		n;

		if (ckind != NULL && strcmp(ckind, "group") != 0)
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("group receipt from node \"%s\" names conversation " INT64_FORMAT ", a %s conversation",
							source, conversation_id, ckind)));
		/*
		 * One statement: the parts checked, the source's parts replaced
		 * (those that changed) and the sender's pending row marked due for
		 * the messages of those this node holds.  A part that fails a check
		 * makes the whole receipt fail.
		 */
		im_prepare(&parts_plan,
				   "WITH x AS ("
				   "  SELECT p.* FROM pg_catalog.jsonb_to_recordset($1->'receipt'->'parts')"
				   "   AS p(message_id pg_catalog.int8, delivered_count pg_catalog.int8,"
				   "        read_count pg_catalog.int8, member_count pg_catalog.int8)),"
				   " bad AS (SELECT pg_catalog.count(*) AS n FROM x"
				   "  WHERE x.message_id IS NULL OR x.delivered_count IS NULL OR x.read_count IS NULL"
				   "   OR x.member_count IS NULL OR x.delivered_count" LT "0 OR x.read_count" LT "0"
				   "   OR x.delivered_count" GT "x.member_count OR x.read_count" GT "x.member_count"
				   "   OR (x.message_id" OP_MOD CppAsString2(IM_SHARD_BUCKETS) ")" NE
				   "      ($2" OP_MOD CppAsString2(IM_SHARD_BUCKETS) ")"
				   "   OR EXISTS (SELECT 1 FROM im.event e WHERE e.message_id" EQ "x.message_id"
				   "     AND (e.conversation_id" NE "$2 OR e.sender_id IS DISTINCT FROM $3"
				   "          OR e.kind" NE "'message'))"
				   /* a part this node holds for another sender or conversation */
				   "   OR EXISTS (SELECT 1 FROM im.receipt_part p WHERE p.message_id" EQ "x.message_id"
				   "     AND p.node_name" EQ "$4 AND (p.sender_id" NE "$3 OR p.conversation_id" NE "$2))),"
				   " total AS (SELECT pg_catalog.count(*) AS n FROM x),"
				   " up AS (INSERT INTO im.receipt_part AS rp (message_id, node_name, sender_id, conversation_id,"
				   "    delivered_count, read_count, member_count)"
				   "  SELECT x.message_id, $4, $3, $2, x.delivered_count, x.read_count, x.member_count FROM x"
				   "  WHERE (SELECT n FROM bad)" EQ "0 AND (SELECT n FROM total)" GT "0"
				   "  ORDER BY x.message_id"
				   "  ON CONFLICT (message_id, node_name) DO UPDATE SET"
				   "   delivered_count = EXCLUDED.delivered_count, read_count = EXCLUDED.read_count,"
				   "   member_count = EXCLUDED.member_count, updated_at = pg_catalog.now()"
				   /* the same part again changes nothing (and marks nothing due) */
				   "  WHERE (rp.delivered_count, rp.read_count, rp.member_count)"
				   "    IS DISTINCT FROM (EXCLUDED.delivered_count, EXCLUDED.read_count, EXCLUDED.member_count)"
				   "  RETURNING rp.message_id),"
				   " due AS (INSERT INTO im.receipt_pending AS rp (user_id, conversation_id, dirty_from_msg_seq,"
				   "    dirty_to_msg_seq, dirty)"
				   "  SELECT $3, $2, pg_catalog.min(e.msg_seq), pg_catalog.max(e.msg_seq), true"
				   "  FROM up JOIN im.event e ON e.message_id" EQ "up.message_id"
				   "  HAVING pg_catalog.count(*)" GT "0 "
				   "  ON CONFLICT (user_id, conversation_id) DO UPDATE SET"
				   "   dirty_from_msg_seq = LEAST(rp.dirty_from_msg_seq, EXCLUDED.dirty_from_msg_seq),"
				   "   dirty_to_msg_seq = GREATEST(rp.dirty_to_msg_seq, EXCLUDED.dirty_to_msg_seq),"
				   "   dirty = true RETURNING 1) "
				   "SELECT (SELECT n FROM bad), (SELECT n FROM total), (SELECT pg_catalog.count(*) FROM up),"
				   "  (SELECT pg_catalog.count(*) FROM due)",
				   4, JSONBOID, INT8OID, INT8OID, TEXTOID);
		args[0] = payload;
		args[1] = Int64GetDatum(conversation_id);
		args[2] = Int64GetDatum(sender);
		args[3] = CStringGetTextDatum(source);
		im_exec(parts_plan, args, NULL, 1);
		n = (uint64) im_get_int64(0, 1, NULL);
		if (n > 0 || im_get_int64(0, 2, NULL) == 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("group receipt from node \"%s\" for conversation " INT64_FORMAT
							" has %s", source, conversation_id,
							n > 0 ? psprintf(UINT64_FORMAT " invalid parts", n) : "no parts"),
					 errhint("Each part is {message_id of the conversation's message by the sender, delivered_count,"
							 " read_count, member_count}, counts 0 to member_count, of a message no other sender's"
							 " or conversation's part names; nothing of it was applied.")));
	}
	im_wake_fanout_at_commit();
}

/*
 * Fanout delivered a run of positions of conversation_id here (event_ids):
 * on a sharded node, a fanout group's message whose sender is placed on
 * another node gets its (sender, conversation) pending row marked due, so
 * this node's part (with its member count) reaches the sender's node even
 * before anyone here ACKs (the sender's node counts only the members the
 * parts report); a message of a sender placed here that parts arrived for
 * before the message did is marked due too.
 */
void
im_receipt_note_delivered(int64 conversation_id, const int64 *event_ids, int n)
{
	static SPIPlanPtr plan;
	Datum		args[2];

	if (n == 0 || !im_shard_configured() || !im_catalog_at_least(1, 12))
		return;
	im_prepare(&plan,
			   "INSERT INTO im.receipt_pending AS rp (user_id, conversation_id, dirty_from_msg_seq,"
			   "  dirty_to_msg_seq, dirty)"
			   " SELECT e.sender_id, e.conversation_id, pg_catalog.min(e.msg_seq), pg_catalog.max(e.msg_seq), true"
			   " FROM im.event e JOIN im.conversation c ON c.conversation_id" EQ "e.conversation_id"
			   "  AND c.kind" EQ "'group' AND c.mode" EQ "'fanout'"
			   " CROSS JOIN im.shard_config sc"
			   " WHERE e.message_id" EQ "ANY ($1) AND e.conversation_id" EQ "$2 AND e.kind" EQ "'message'"
			   "  AND e.sender_id IS NOT NULL"
			   "  AND (sc.bucket_nodes[(e.sender_id" OP_MOD CppAsString2(IM_SHARD_BUCKETS) ")" PLUS "1]" NE "sc.self_name"
			   "       OR EXISTS (SELECT 1 FROM im.receipt_part p WHERE p.message_id" EQ "e.message_id))"
			   " GROUP BY 1, 2 ORDER BY 1, 2 "
			   "ON CONFLICT (user_id, conversation_id) DO UPDATE SET"
			   "  dirty_from_msg_seq = LEAST(rp.dirty_from_msg_seq, EXCLUDED.dirty_from_msg_seq),"
			   "  dirty_to_msg_seq = GREATEST(rp.dirty_to_msg_seq, EXCLUDED.dirty_to_msg_seq),"
			   "  dirty = true",
			   2, INT8ARRAYOID, INT8OID);
	args[0] = im_int8_array(event_ids, n);
	args[1] = Int64GetDatum(conversation_id);
	im_exec(plan, args, NULL, 0);
}
