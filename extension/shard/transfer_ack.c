/*
 * transfer_ack.c — the back channel of transfers.  PostgreSQL 15
 * has no `origin = none`, so "applied" records travel in a table of their
 * own: the destination inserts one im.transfer_ack row per transfer it
 * applied (or quarantined, which it then holds), publication
 * im_to_<source> carries it (row filter on source_node), and on the source
 * the ENABLE ALWAYS BEFORE INSERT trigger deletes exactly that
 * im.transfer_out row (transfer id and destination: never a range, never
 * "below the highest seen") and drops the ack row (returns NULL), so the
 * apply worker never meets a unique key here either.
 */
#include "core/im_sync.h"
#include "core/common.h"
#include "core/shard_map.h"
#include "core/im_sql.h"
#include "core/xact_horizon.h"
#include "shard/shard.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

/*
 * What to do with a row inserted into im.transfer_ack (trust between nodes,
 * transfer_trust.c): store it — this node's own applied record for another
 * node, written by this node's code, never a replicated row —, settle it —
 * it acknowledges a transfer of this node and came through the
 * subscription of the node it names as acker —, or drop it (refused:
 * logged and listed by reconcile; an error for a session's insert).
 */
typedef enum
{
	ACK_STORE,
	ACK_SETTLE,
	ACK_DROP
} AckAction;

static AckAction
ack_action(TriggerData *td, const char *self, const char *source, const char *applied_by)
{
	ImArrival	via;
	const char *from;
	const char *reason;
	bool		isnull;
	int64		transfer_id = DatumGetInt64(SPI_getbinval(td->tg_trigtuple, td->tg_relation->rd_att,
														  SPI_fnumber(td->tg_relation->rd_att, "transfer_id"),
														  &isnull));

	switch (im_transfer_row_fate(self, applied_by, source, &via, &from, &reason))
	{
		case IM_ROW_OWN:
			return ACK_STORE;
		case IM_ROW_FOREIGN_LOCAL:
			return ACK_DROP;	/* for another node, written here by hand: never stored */
		case IM_ROW_CHECK:
			reason = im_ack_refusal(self, from, source, applied_by);
			if (reason == NULL)
				return ACK_SETTLE;
			break;
		case IM_ROW_REFUSED:
			break;
	}
	im_transfer_refuse(via, "ack", from, source, NULL, applied_by, transfer_id, false, 0, reason, NULL);
	return ACK_DROP;
}

PG_FUNCTION_INFO_V1(im_transfer_ack_arrive);
Datum
im_transfer_ack_arrive(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr plan;
	TriggerData *td = (TriggerData *) fcinfo->context;
	TupleDesc	desc;
	const char *self;
	char	   *source;
	char	   *applied_by;
	Datum		args[2];
	bool		isnull;

	if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_BEFORE(td->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(td->tg_event) || !TRIGGER_FIRED_BY_INSERT(td->tg_event))
		elog(ERROR, "im_sync: im.transfer_ack_arrive is a BEFORE INSERT row trigger");
	desc = td->tg_relation->rd_att;
	self = im_shard_self_name();
	source = SPI_getvalue(td->tg_trigtuple, desc, SPI_fnumber(desc, "source_node"));
	applied_by = SPI_getvalue(td->tg_trigtuple, desc, SPI_fnumber(desc, "applied_by"));
	switch (ack_action(td, self, source, applied_by))
	{
		case ACK_STORE:
			return PointerGetDatum(td->tg_trigtuple);
		case ACK_DROP:
			return PointerGetDatum(NULL);
		case ACK_SETTLE:
			break;
	}
	im_spi_connect();
	im_prepare(&plan,
			   "DELETE FROM im.transfer_out WHERE transfer_id" EQ "$1 AND dest_node" EQ "$2",
			   2, INT8OID, TEXTOID);
	args[0] = SPI_getbinval(td->tg_trigtuple, desc, SPI_fnumber(desc, "transfer_id"), &isnull);
	args[1] = CStringGetTextDatum(applied_by);
	if (im_exec(plan, args, NULL, 0) == 0)
	{
		/*
		 * Not visible (yet): logical decoding sends a transaction once its
		 * commit record is flushed, before the committing backend leaves the
		 * proc array, so the ack's round trip can beat the transfer's own
		 * visibility here.  Dropping the ack then lost it for good (the
		 * transfer stayed unacked forever).  Keep it instead, once per key
		 * (never a unique-key conflict in the apply worker);
		 * im_transfer_ack_settle_stored matches it later.
		 */
		static SPIPlanPtr held;

		im_prepare(&held,
				   "SELECT 1 FROM im.transfer_ack WHERE source_node" EQ "$3 AND transfer_id" EQ "$1"
				   " AND applied_by" EQ "$2",
				   3, INT8OID, TEXTOID, TEXTOID);
		{
			Datum		hargs[3] = {args[0], args[1], CStringGetTextDatum(source)};

			if (im_exec(held, hargs, NULL, 1) == 0)
			{
				/*
				 * Held with THIS node's arrival time in applied_at (the
				 * destination's clock never decides here): the transfer's
				 * transaction began before it, so the settling pass can
				 * tell whether that transaction may still be invisible.
				 */
				int			col = SPI_fnumber(desc, "applied_at");
				Datum		arrival = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
				bool		notnull = false;
				HeapTuple	kept = heap_modify_tuple_by_cols(td->tg_trigtuple, desc, 1, &col,
															 &arrival, &notnull);

				SPI_finish();
				return PointerGetDatum(kept);
			}
		}
	}
	SPI_finish();
	return PointerGetDatum(NULL);
}

/*
 * Acks this node received before their transfer was visible (above): delete
 * the transfers they acknowledge and the acks.  An ack still unmatched once
 * every transaction that was running at its arrival has ended acknowledges
 * a transfer deleted already (a duplicate after a replay): it goes too.
 * Called by every apply pass (workers, im.run_fanout).
 *
 * The horizon — the oldest start of another running transaction, or this
 * statement's start when none runs — is read from the backend status
 * array (xact_horizon.h: every backend, whoever the caller is), fresh,
 * BEFORE the snapshot that looks for the transfers: a transaction not
 * running at that read has left the proc array, so its transfer is
 * visible to the later snapshot; one that began after it began after
 * every ack older than the horizon arrived.  (Read
 * inside the settling statement, the horizon could be taken after its
 * snapshot, and an ack whose transfer committed in between was dropped;
 * with no other transaction running, the old min() was NULL and an
 * unmatched ack was kept for ever.)
 */
void
im_transfer_ack_settle_stored(void)
{
	static SPIPlanPtr plan;
	Datum		args[1];
	TimestampTz horizon = im_oldest_other_xact_start();

	args[0] = TimestampTzGetDatum(horizon != 0 ? horizon : GetCurrentStatementStartTimestamp());
	im_prepare(&plan,
			   "WITH a AS (SELECT a.source_node, a.transfer_id, a.applied_by, a.applied_at"
			   "           FROM im.transfer_ack a WHERE a.source_node" EQ "im.shard_self()),"
			   " t AS (DELETE FROM im.transfer_out t USING a"
			   "       WHERE t.transfer_id" EQ "a.transfer_id AND t.dest_node" EQ "a.applied_by"
			   "       RETURNING t.transfer_id, t.dest_node) "
			   "DELETE FROM im.transfer_ack x USING a"
			   " WHERE x.source_node" EQ "a.source_node AND x.transfer_id" EQ "a.transfer_id"
			   "   AND x.applied_by" EQ "a.applied_by"
			   "   AND ((a.transfer_id, a.applied_by) IN (SELECT t.transfer_id, t.dest_node FROM t)"
			   "        OR a.applied_at" LT "$1)",
			   1, TIMESTAMPTZOID);
	im_exec(plan, args, NULL, 0);
}

/*
 * The failover window (1.7): write the applied records of transfers that
 * earlier transactions settled (im.transfer_in rows applied or quarantined
 * with applied_at still NULL), and stamp applied_at.  Returns how many.
 *
 * Why a later transaction: PostgreSQL 15's logical senders decode a
 * transaction once it is flushed on this primary, while its commit still
 * waits for the synchronous standby.  An applied record written in the
 * applying transaction could thus reach the source, which deletes the
 * transfer for good, before the standby had the apply; a failover then
 * lost it (drill test/shards/ack_window_check.py).  A committing
 * transaction stays in the proc array until that wait is over, and the
 * apply commits with synchronous_commit at least remote_write
 * (transfer_in.c), so a settlement visible to this statement's snapshot is
 * on every synchronous standby: its record can no longer overtake it.
 * (A wait cancelled by hand commits locally with a WARNING;
 * extension/doc/operations.md, "Running with a standby", covers that case
 * for every commit.)
 * Called by every apply pass, under the applier's lock.  A row another
 * transaction holds (an operator's retry, a duplicate's arrival) is
 * skipped, never waited for: a pass must not stall behind an open
 * transaction; the next pass takes it if it is still due.
 */
uint64
im_transfer_ack_release(void)
{
	static SPIPlanPtr plan;

	im_prepare(&plan,
			   "WITH c AS (SELECT t.source_node, t.transfer_id FROM im.transfer_in t"
			   "           WHERE t.state" NE "'pending' AND t.applied_at IS NULL"
			   "           FOR UPDATE SKIP LOCKED),"
			   " d AS (UPDATE im.transfer_in t SET applied_at = pg_catalog.now() FROM c"
			   "       WHERE t.source_node" EQ "c.source_node AND t.transfer_id" EQ "c.transfer_id"
			   "       RETURNING t.source_node, t.transfer_id) "
			   "INSERT INTO im.transfer_ack (source_node, transfer_id, applied_by)"
			   " SELECT d.source_node, d.transfer_id, im.shard_self() FROM d "
			   "ON CONFLICT DO NOTHING",
			   0);
	return im_exec(plan, NULL, NULL, 0);
}
