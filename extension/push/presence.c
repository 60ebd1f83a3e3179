/*
 * presence.c — which devices are connected (contract §13): written by the
 * gateway, read by fanout (no push for an online device) and by claim (a
 * job whose device came online is suppressed).
 *
 * A device is online while an unexpired im.presence row of its CURRENT
 * connection epoch exists: a superseded connection's late calls change
 * nothing (set_presence returns false), and a gateway that dies leaves
 * rows that expire after their ttl.
 *
 * set_presence takes the user's head row FOR SHARE: fanout holds the heads
 * of every recipient for its whole batch, so a presence change and a fanout
 * to that user are ordered — the fanout sees the device either online (it
 * got the hint over its connection) or offline (a job is queued), never a
 * state from the middle of the other (test/isolation/specs/push_presence).
 */
#include "core/im_sync.h"
#include "core/common.h"
#include "core/im_sql.h"
#include "push/push.h"

#include "catalog/pg_type.h"
#include "catalog/pg_type_d.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/timestamp.h"

/* ttl: more than 0, at most a day (a presence must expire if nobody renews it) */
static Interval *
arg_ttl(FunctionCallInfo fcinfo, int argno)
{
	Interval   *ttl;
	Interval	day;
	Interval	zero;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ttl must not be NULL")));
	ttl = PG_GETARG_INTERVAL_P(argno);
	memset(&day, 0, sizeof(day));
	memset(&zero, 0, sizeof(zero));
	day.day = 1;
	if (DatumGetInt32(DirectFunctionCall2(interval_cmp, IntervalPGetDatum(ttl), IntervalPGetDatum(&day))) > 0 ||
		DatumGetInt32(DirectFunctionCall2(interval_cmp, IntervalPGetDatum(ttl), IntervalPGetDatum(&zero))) <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ttl must be more than 0 and at most 1 day")));
	return ttl;
}

PG_FUNCTION_INFO_V1(im_set_presence);
Datum
im_set_presence(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr current_plan;
	static SPIPlanPtr online_plan;
	static SPIPlanPtr offline_plan;
	int64		user_id = im_arg_user_id(fcinfo, 0, "user_id");
	char	   *device_id = im_arg_device_id(fcinfo, 1);
	int64		epoch;
	bool		online;
	Interval   *ttl;
	Datum		args[4];
	bool		current;

	if (PG_ARGISNULL(2) || PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be NULL", PG_ARGISNULL(2) ? "connection_epoch" : "online")));
	epoch = PG_GETARG_INT64(2);
	online = PG_GETARG_BOOL(3);
	ttl = arg_ttl(fcinfo, 4);
	im_push_require_catalog();

	im_spi_connect();
	args[0] = Int64GetDatum(user_id);
	args[1] = CStringGetTextDatum(device_id);
	args[2] = Int64GetDatum(epoch);
	args[3] = IntervalPGetDatum(ttl);
	/* ordered with fanout by the user's head (see the file comment) */
	im_prepare(&current_plan,
			   "SELECT d.connection_epoch" EQ "$3,"
			   "  (SELECT 1 FROM im.user_head h WHERE h.user_id" EQ "$1 FOR SHARE)"
			   " FROM im.device d WHERE d.user_id" EQ "$1 AND d.device_id" EQ "$2 AND d.state" NE "'REVOKED'",
			   3, INT8OID, TEXTOID, INT8OID);
	current = im_exec(current_plan, args, NULL, 0) == 1 && im_get_bool(0, 1, NULL);
	if (current && online)
	{
		im_prepare(&online_plan,
				   "INSERT INTO im.presence (user_id, device_id, connection_epoch, expires_at)"
				   " VALUES ($1, $2, $3, pg_catalog.statement_timestamp()" PLUS "$4)"
				   " ON CONFLICT (user_id, device_id) DO UPDATE SET"
				   "  connection_epoch = EXCLUDED.connection_epoch, expires_at = EXCLUDED.expires_at",
				   4, INT8OID, TEXTOID, INT8OID, INTERVALOID);
		im_exec(online_plan, args, NULL, 0);
	}
	else if (current)
	{
		im_prepare(&offline_plan,
				   "DELETE FROM im.presence WHERE user_id" EQ "$1 AND device_id" EQ "$2"
				   " AND connection_epoch" EQ "$3",
				   3, INT8OID, TEXTOID, INT8OID);
		im_exec(offline_plan, args, NULL, 0);
	}
	SPI_finish();
	PG_RETURN_BOOL(current);
}

/*
 * refresh_presence: renew the leases of many sessions in one statement.
 * Only rows that exist with that epoch are renewed: a refresh racing a
 * close never brings a presence back.
 */
PG_FUNCTION_INFO_V1(im_refresh_presence);
Datum
im_refresh_presence(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr plan;
	Interval   *ttl;
	Datum		args[4];
	int			n[3];
	uint64		rows;

	for (int a = 0; a < 3; a++)
	{
		ArrayType  *arr;

		if (PG_ARGISNULL(a))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("user_ids, device_ids and connection_epochs must not be NULL")));
		arr = PG_GETARG_ARRAYTYPE_P(a);
		if (ARR_NDIM(arr) > 1)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("user_ids, device_ids and connection_epochs must be one-dimensional")));
		if (array_contains_nulls(arr))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("user_ids, device_ids and connection_epochs must not hold NULLs")));
		n[a] = ArrayGetNItems(ARR_NDIM(arr), ARR_DIMS(arr));
		args[a] = PointerGetDatum(arr);
	}
	if (n[0] != n[1] || n[1] != n[2])
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("user_ids, device_ids and connection_epochs must have the same length, got %d, %d and %d",
						n[0], n[1], n[2])));
	{
		Datum	   *ids;
		bool	   *idnulls;
		int			nids;

		deconstruct_array(DatumGetArrayTypeP(args[0]), INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE,
						  &ids, &idnulls, &nids);
		for (int i = 0; i < nids; i++)
			im_check_user_id(DatumGetInt64(ids[i]), "every element of user_ids");
	}
	ttl = arg_ttl(fcinfo, 3);
	args[3] = IntervalPGetDatum(ttl);
	im_push_require_catalog();
	if (n[0] == 0)
		PG_RETURN_INT32(0);

	im_spi_connect();
	im_prepare(&plan,
			   "WITH r AS (SELECT DISTINCT * FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.int8[]),"
			   "  pg_catalog.unnest($2::pg_catalog.text[]), pg_catalog.unnest($3::pg_catalog.int8[]))"
			   "  AS r(user_id, device_id, epoch))"
			   "UPDATE im.presence p SET expires_at = pg_catalog.statement_timestamp()" PLUS "$4"
			   " FROM r WHERE p.user_id" EQ "r.user_id AND p.device_id" EQ "r.device_id"
			   "  AND p.connection_epoch" EQ "r.epoch",
			   4, INT8ARRAYOID, TEXTARRAYOID, INT8ARRAYOID, INTERVALOID);
	rows = im_exec(plan, args, NULL, 0);
	SPI_finish();
	PG_RETURN_INT32((int32) rows);
}
