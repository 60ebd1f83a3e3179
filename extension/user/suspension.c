/*
 * suspension.c — suspend_user and reinstate_user (contract §17): an
 * account's standing, its sessions and its pushes.
 *
 * Invariants protected here:
 *   - a suspension is one row of im.user_suspension per user; the checks
 *     of every API call read it through core/standing.c, never a copy;
 *   - once suspend_user commits, no authenticate of the user succeeds: it
 *     locks the user's device rows (in device_id order) as authenticate
 *     locks its device row, so an authenticate either committed first
 *     (its new epoch is told SUSPENDED below) or checks after this commit;
 *   - every non-revoked device of the user that ever connected is told
 *     SUSPENDED on im_sync_device; the gateway believes only
 *     device_session's account_state (any role can NOTIFY);
 *   - the user's queued and claimed push jobs are suppressed in the same
 *     transaction (later ones are never queued or claimed: push_queue.c);
 *   - one audit row per call that changed something, with the moderator
 *     and the reason.
 */
#include "core/im_sync.h"
#include "core/common.h"
#include "core/im_sql.h"
#include "core/standing.h"
#include "push/push.h"
#include "user/user.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#define IM_MAX_MODERATOR 200
#define IM_MAX_REASON 1000

/* The audit row of a suspension action: detail keys moderator, reason and its own. */
static void
audit_standing(const char *action, int64 user_id, const char *moderator, const char *reason,
			   Datum until, bool until_null, int sessions)
{
	static SPIPlanPtr plan;
	Datum		args[6];
	char		nulls[6] = {' ', ' ', ' ', ' ', ' ', ' '};

	im_prepare(&plan,
			   "INSERT INTO im.audit (action, user_id, detail) "
			   "SELECT $1, $2, pg_catalog.jsonb_strip_nulls(pg_catalog.jsonb_build_object("
			   "  'moderator', $3, 'reason', $4, 'suspended_until', $5, 'sessions_closed', $6))"
			   "  OPERATOR(pg_catalog.||) CASE WHEN $1" EQ "'suspend' AND $5 IS NULL"
			   "    THEN '{\"suspended_until\": null}'::pg_catalog.jsonb ELSE '{}'::pg_catalog.jsonb END",
			   6, TEXTOID, INT8OID, TEXTOID, TEXTOID, TIMESTAMPTZOID, INT4OID);
	args[0] = CStringGetTextDatum(action);
	args[1] = Int64GetDatum(user_id);
	args[2] = CStringGetTextDatum(moderator);
	if (reason != NULL)
		args[3] = CStringGetTextDatum(reason);
	else
		nulls[3] = 'n';
	args[4] = until;
	if (until_null)
		nulls[4] = 'n';
	args[5] = Int32GetDatum(sessions);
	if (sessions < 0)
		nulls[5] = 'n';
	im_exec(plan, args, nulls, 0);
}

PG_FUNCTION_INFO_V1(im_suspend_user);
/*
 * suspend_user(moderator, user_id, suspended_until, reason) →
 * (suspended, sessions_closed).  suspended: true when the account was not
 * suspended before this call (false: an active suspension got the new end
 * and reason).  sessions_closed: the devices told SUSPENDED on this node,
 * the user's non-revoked devices that ever authenticated (each has at most
 * one live session; a gateway closes the ones it holds).
 */
Datum
im_suspend_user(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr upsert;
	static SPIPlanPtr devices;
	static SPIPlanPtr pushes;
	char	   *moderator = im_arg_text(fcinfo, 0, "moderator", IM_MAX_MODERATOR);
	int64		user_id = im_arg_user_id(fcinfo, 1, "user_id");
	bool		until_null = PG_ARGISNULL(2);
	Datum		until = until_null ? (Datum) 0 : PG_GETARG_DATUM(2);
	char	   *reason = PG_ARGISNULL(3) ? NULL : im_arg_text(fcinfo, 3, "reason", IM_MAX_REASON);
	Datum		args[4];
	char		nulls[4] = {' ', ' ', ' ', ' '};
	bool		was_suspended;
	int			told = 0;
	uint64		n;
	Datum		values[2];
	bool		rnulls[2] = {false, false};

	if (!until_null && DatumGetTimestampTz(until) <= GetCurrentTransactionStartTimestamp())
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("suspended_until must be in the future"),
				 errhint("Use NULL to suspend until reinstate_user, or reinstate_user to lift a suspension.")));

	im_srf_begin(fcinfo);
	im_spi_connect();
	args[0] = Int64GetDatum(user_id);
	/* first the device rows, as authenticate takes them (lock order) */
	im_prepare(&devices,
			   "SELECT device_id, connection_epoch, state" NE "'REVOKED' FROM im.device "
			   "WHERE user_id" EQ "$1 ORDER BY device_id FOR UPDATE",
			   1, INT8OID);
	n = im_exec(devices, args, NULL, 0);
	was_suspended = im_user_suspended(user_id);
	for (uint64 i = 0; i < n; i++)
	{
		/* the device rows' states after the lock: a revoked one has no session */
		char	   *device_id = im_get_text(i, 1);
		int64		epoch = im_get_int64(i, 2, NULL);

		if (epoch > 0 && im_get_bool(i, 3, NULL))
		{
			im_device_notify(user_id, device_id, epoch, "SUSPENDED");
			told++;
		}
	}

	im_prepare(&upsert,
			   "INSERT INTO im.user_suspension AS s (user_id, suspended_until, moderator, reason) "
			   "VALUES ($1, $2, $3, $4) "
			   "ON CONFLICT (user_id) DO UPDATE SET suspended_at = pg_catalog.now(), "
			   "  suspended_until = EXCLUDED.suspended_until, moderator = EXCLUDED.moderator, "
			   "  reason = EXCLUDED.reason",
			   4, INT8OID, TIMESTAMPTZOID, TEXTOID, TEXTOID);
	args[1] = until;
	if (until_null)
		nulls[1] = 'n';
	args[2] = CStringGetTextDatum(moderator);
	if (reason != NULL)
		args[3] = CStringGetTextDatum(reason);
	else
		nulls[3] = 'n';
	im_exec(upsert, args, nulls, 0);

	/* pushes queued or handed to a relay stop here (a relay's late answer is stale) */
	if (im_push_catalog())
	{
		im_prepare(&pushes,
				   "UPDATE im.push_job SET state = 'suppressed', lease_until = NULL, "
				   "  finished_at = pg_catalog.now() "
				   "WHERE user_id" EQ "$1 AND state" EQ "ANY ('{pending,retry,claimed}'::pg_catalog.text[])",
				   1, INT8OID);
		im_exec(pushes, args, NULL, 0);
	}
	audit_standing("suspend", user_id, moderator, reason, until, until_null, told);
	SPI_finish();

	values[0] = BoolGetDatum(!was_suspended);
	values[1] = Int32GetDatum(told);
	im_srf_row(fcinfo, values, rnulls);
	return (Datum) 0;
}

PG_FUNCTION_INFO_V1(im_reinstate_user);
/*
 * reinstate_user(moderator, user_id) → reinstated: true when an active
 * suspension was lifted now; false when there was none (an expired one's
 * row goes too).  The user authenticates again as before; nothing is told
 * (the sessions were closed at the suspension).
 */
Datum
im_reinstate_user(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr del;
	char	   *moderator = im_arg_text(fcinfo, 0, "moderator", IM_MAX_MODERATOR);
	int64		user_id = im_arg_user_id(fcinfo, 1, "user_id");
	Datum		args[1];
	bool		reinstated = false;
	Datum		values[1];
	bool		nulls[1] = {false};

	im_srf_begin(fcinfo);
	im_spi_connect();
	im_prepare(&del,
			   "DELETE FROM im.user_suspension s WHERE s.user_id" EQ "$1 "
			   "RETURNING (s.suspended_until IS NULL OR s.suspended_until" GT "pg_catalog.now())",
			   1, INT8OID);
	args[0] = Int64GetDatum(user_id);
	if (im_exec(del, args, NULL, 1) == 1)
		reinstated = im_get_bool(0, 1, NULL);
	if (reinstated)
		audit_standing("reinstate", user_id, moderator, NULL, (Datum) 0, true, -1);
	SPI_finish();

	values[0] = BoolGetDatum(reinstated);
	im_srf_row(fcinfo, values, nulls);
	return (Datum) 0;
}
