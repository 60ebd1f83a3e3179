/*
 * shard_node.c — the node functions the router and the shard tests call
 * (extension/doc/sharding.md): im.shard_pending, im.conversation_heads,
 * im.shard_received_positions.  All read this node's own state only.
 */
#include "core/im_sync.h"
#include "core/common.h"
#include "core/shard_map.h"
#include "core/version_check.h"
#include "core/im_sql.h"
#include "shard/shard.h"

#include "catalog/pg_type.h"
#include "utils/array.h"

/*
 * im.shard_pending() -> (outbox_pending, transfers_unacked,
 * inbound_unapplied): all three 0 on every node iff everything is fanned
 * out, carried and applied (a transfer is unacked on its source until the
 * destination's applied record came back).  Dead letters and quarantined
 * transfers are not pending: reconcile reports them.  The inbound count is
 * what an apply pass would take now (shard.h): a
 * transfer held behind a quarantined one of its conversation waits for it,
 * as a failed outbox item's later ones wait on one node, and a quarantined
 * one is counted while it is due again.
 */
PG_FUNCTION_INFO_V1(im_shard_pending);
Datum
im_shard_pending(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr plan;
	static SPIPlanPtr plan16;
	bool		ordered = im_catalog_at_least(1, 7);

	im_srf_begin(fcinfo);
	im_spi_connect();
	if (ordered)
		im_prepare(&plan,
				   "SELECT (SELECT pg_catalog.count(*) FROM im.outbox WHERE state" EQ "'pending'),"
				   "       (SELECT pg_catalog.count(*) FROM im.transfer_out),"
				   "       (SELECT pg_catalog.count(*) FROM (" IM_TRANSFERS_DUE_SQL("1") ") d)",
				   0);
	else
		im_prepare(&plan16,
				   "SELECT (SELECT pg_catalog.count(*) FROM im.outbox WHERE state" EQ "'pending'),"
				   "       (SELECT pg_catalog.count(*) FROM im.transfer_out),"
				   "       (SELECT pg_catalog.count(*) FROM im.transfer_in WHERE state" EQ "'pending')",
				   0);
	im_exec(ordered ? plan : plan16, NULL, NULL, 0);
	im_srf_rows_from_spi(fcinfo, 3);
	SPI_finish();
	return (Datum) 0;
}

/* The ids of a bigint[] argument (22023 for NULL elements). */
static Datum
id_array_arg(FunctionCallInfo fcinfo, int argno, const char *name, int64 **ids, int *n)
{
	ArrayType  *arr;
	Datum	   *elems;
	bool	   *nulls;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be NULL", name)));
	arr = PG_GETARG_ARRAYTYPE_P(argno);
	deconstruct_array(arr, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE, &elems, &nulls, n);
	*ids = palloc(sizeof(int64) * Max(*n, 1));
	for (int i = 0; i < *n; i++)
	{
		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s must not contain NULL", name)));
		(*ids)[i] = DatumGetInt64(elems[i]);
	}
	return PointerGetDatum(arr);
}

/*
 * The authoritative rows of conversations this node owns: conversation_id,
 * head_msg_seq, mode; the first ncols of them.  IS421 for a conversation
 * this node does not own (a copy's head and mode may be stale); an unknown
 * id has no row (P0002 is not raised).
 */
static Datum
authoritative_rows(FunctionCallInfo fcinfo, int ncols)
{
	static SPIPlanPtr plan;
	int64	   *ids;
	int			n;
	Datum		args[1];

	args[0] = id_array_arg(fcinfo, 0, "conversation_ids", &ids, &n);
	im_srf_begin(fcinfo);
	for (int i = 0; i < n; i++)
		im_shard_require_conversation(ids[i]);
	im_spi_connect();
	im_prepare(&plan,
			   "SELECT conversation_id, head_msg_seq::pg_catalog.int8, mode FROM im.conversation "
			   "WHERE conversation_id" EQ "ANY ($1::pg_catalog.int8[]) ORDER BY 1",
			   1, INT8ARRAYOID);
	im_exec(plan, args, NULL, 0);
	im_srf_rows_from_spi(fcinfo, ncols);
	SPI_finish();
	return (Datum) 0;
}

/* im.conversation_heads(conversation_ids) -> (conversation_id, head_msg_seq) */
PG_FUNCTION_INFO_V1(im_conversation_heads);
Datum
im_conversation_heads(PG_FUNCTION_ARGS)
{
	return authoritative_rows(fcinfo, 2);
}

/*
 * im.conversation_current(conversation_ids) -> (conversation_id,
 * head_msg_seq, mode), 1.6: what the router's conversation_list takes from
 * the conversation's node, so every user who has or had a period sees the
 * head and the mode in force now, as on one node — an ex-member's copy of
 * the conversation row is not updated once no member is left on its node
 * (extension/doc/sharding.md, known gap 5).
 */
PG_FUNCTION_INFO_V1(im_conversation_current);
Datum
im_conversation_current(PG_FUNCTION_ARGS)
{
	return authoritative_rows(fcinfo, 3);
}

/*
 * im.shard_received_positions(user_ids) -> the conversation positions in
 * these local users' logs (user_id, conversation_id, msg_seq,
 * source_event_id, delivery_scope), for the router's cross-node check
 * "each user's received events match the conversation node's periods"
 * (§18.3).  IS421 for a user placed elsewhere.
 */
PG_FUNCTION_INFO_V1(im_shard_received_positions);
Datum
im_shard_received_positions(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr plan;
	int64	   *ids;
	int			n;
	Datum		args[1];

	args[0] = id_array_arg(fcinfo, 0, "user_ids", &ids, &n);
	for (int i = 0; i < n; i++)
		im_check_user_id(ids[i], "user_ids");
	im_srf_begin(fcinfo);
	for (int i = 0; i < n; i++)
		im_shard_require_user(ids[i]);
	im_spi_connect();
	im_prepare(&plan,
			   "SELECT user_id, conversation_id, msg_seq, source_event_id, delivery_scope FROM im.inbox "
			   "WHERE user_id" EQ "ANY ($1::pg_catalog.int8[]) AND msg_seq IS NOT NULL "
			   "ORDER BY user_id, sync_seq",
			   1, INT8ARRAYOID);
	im_exec(plan, args, NULL, 0);
	im_srf_rows_from_spi(fcinfo, 5);
	SPI_finish();
	return (Datum) 0;
}
