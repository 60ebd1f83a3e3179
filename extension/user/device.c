/*
 * device.c — devices, connection epochs, device tokens and their audit trail
 * (contract §5, §8 issue_device_token/authenticate, §12).
 *
 * Invariants protected here:
 *   - a revoked device's tokens never work again, also after it registers
 *     again: every registration bumps im.device.registration and every token
 *     binds it (and re-registration bumps the sync generation, which kills
 *     batch and snapshot tokens);
 *   - one current connection per device: authenticate bumps
 *     connection_epoch and NOTIFYs im_sync_device so older connections close;
 *   - audit rows for registration, token issue and revocation, never a token;
 *   - a failed authentication leaves no row (the error rolls back) but is
 *     counted in shared memory and summarized in the log (at most one line
 *     per minute, without the token).
 *   - at most im_sync.max_devices_per_user devices that are not revoked:
 *     a new device, or a revoked one registering again, is counted under
 *     the user's head lock (two racing registrations count one after the
 *     other);
 *   - a suspended account (contract §17) registers nothing, is issued no
 *     token and authenticates no more (after the token checks, 28000 first);
 *     device_session reports its standing for the gateway's re-check.
 * Lock order: device row, then the user's head (contract §4); a device
 * that does not exist yet takes the head first (architecture.md).
 */
#include "core/im_sync.h"
#include "core/common.h"
#include "core/locks.h"
#include "core/audit.h"
#include "core/shard_map.h"
#include "core/shmem.h"
#include "core/log_privacy.h"
#include "core/im_sql.h"
#include "core/standing.h"
#include "push/push.h"
#include "user/user.h"

#include "catalog/pg_type.h"
#include "commands/async.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#define IM_DEVICE_CHANNEL "im_sync_device"

/* NOTIFY im_sync_device 'user:device:epoch:what', delivered at commit. */
void
im_device_notify(int64 user_id, const char *device_id, int64 epoch, const char *what)
{
	char		payload[160];

	snprintf(payload, sizeof(payload), INT64_FORMAT ":%s:" INT64_FORMAT ":%s",
			 user_id, device_id, epoch, what);
	Async_Notify(IM_DEVICE_CHANNEL, payload);
}

/*
 * The device cap (im_sync.max_devices_per_user): the user's devices that are
 * not revoked, besides device_id, must leave room for it.  The caller holds
 * the user's head, so the count is not raced by another registration.
 */
static void
require_device_room(int64 user_id, const char *device_id)
{
	static SPIPlanPtr count;
	Datum		args[2];
	int64		n;

	im_prepare(&count,
			   "SELECT pg_catalog.count(*) FROM im.device "
			   "WHERE user_id" EQ "$1 AND device_id" NE "$2 AND state" NE "'REVOKED'",
			   2, INT8OID, TEXTOID);
	args[0] = Int64GetDatum(user_id);
	args[1] = CStringGetTextDatum(device_id);
	im_exec(count, args, NULL, 1);
	n = im_get_int64(0, 1, NULL);
	if (n >= im_max_devices_per_user)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("user " INT64_FORMAT " already has %d devices, the most im_sync.max_devices_per_user allows",
						user_id, im_max_devices_per_user),
				 errhint("Revoke one of the user's devices (im.revoke_device) before registering another.")));
}

PG_FUNCTION_INFO_V1(im_register_device);
/*
 * register_device: new device → NEW, generation 1; existing → its current
 * generation and state; REVOKED → NEW again with generation + 1 and
 * registration + 1 (so nothing issued before the revocation works).
 */
Datum
im_register_device(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr known;
	static SPIPlanPtr ins;
	static SPIPlanPtr again;
	int64		user_id = im_arg_user_id(fcinfo, 0, "user_id");
	char	   *device_id = im_arg_device_id(fcinfo, 1);
	Datum		args[2];
	ImDevice	dev;
	Datum		values[2];
	bool		nulls[2] = {false, false};
	char		detail[96];

	im_shard_require_user(user_id);	/* devices live on the user's node */

	im_srf_begin(fcinfo);
	im_spi_connect();
	im_user_check_standing(user_id);

	args[0] = Int64GetDatum(user_id);
	args[1] = CStringGetTextDatum(device_id);
	im_prepare(&known,
			   "SELECT 1 FROM im.device WHERE user_id" EQ "$1 AND device_id" EQ "$2",
			   2, INT8OID, TEXTOID);
	/*
	 * A device not known yet counts against the cap: under the user's head
	 * lock, so two registrations racing at the cap are counted one after
	 * the other.  Taking the head before the new device's row is safe: no
	 * other transaction can hold that row (its inserter would hold the
	 * head first).
	 */
	if (im_exec(known, args, NULL, 1) == 0)
	{
		im_lock_user_heads(&user_id, 1);
		require_device_room(user_id, device_id);
	}
	im_prepare(&ins,
			   "INSERT INTO im.device (user_id, device_id, state) VALUES ($1, $2, 'NEW') "
			   "ON CONFLICT (user_id, device_id) DO NOTHING",
			   2, INT8OID, TEXTOID);
	if (im_exec(ins, args, NULL, 0) == 1)
	{
		strlcpy(dev.state, "NEW", sizeof(dev.state));
		dev.sync_generation = 1;
		im_audit_device("register_device", user_id, device_id, "{\"registration\": 1}");
		/* the row is ours (inserted), so holding it first keeps lock order */
		im_lock_device(user_id, device_id, &dev);
	}
	else
	{
		im_lock_device(user_id, device_id, &dev);
		if (strcmp(dev.state, "REVOKED") == 0)
		{
			/* counted again: the cap as for a new device (device, then head) */
			im_lock_user_heads(&user_id, 1);
			require_device_room(user_id, device_id);
			/* a new registration: a new generation and nothing acknowledged */
			im_device_bump_generation(&dev, "NEW");
			im_prepare(&again,
					   "UPDATE im.device SET "
					   "  registration = registration" PLUS "1, "
					   "  acked_sync_seq = 0, acked_at = NULL, revoked_at = NULL, "
					   "  registered_at = pg_catalog.now() "
					   "WHERE user_id" EQ "$1 AND device_id" EQ "$2",
					   2, INT8OID, TEXTOID);
			im_exec(again, args, NULL, 0);
			dev.registration++;
			snprintf(detail, sizeof(detail), "{\"registration\": %d, \"sync_generation\": %d}",
					 dev.registration, dev.sync_generation);
			im_audit_device("register_device", user_id, device_id, detail);
		}
	}
	/* The user's head must exist so sync and fanout can lock it. */
	im_lock_user_heads(&user_id, 1);

	SPI_finish();
	values[0] = Int32GetDatum(dev.sync_generation);
	values[1] = CStringGetTextDatum(dev.state);
	im_srf_row(fcinfo, values, nulls);
	return (Datum) 0;
}

PG_FUNCTION_INFO_V1(im_revoke_device);
/*
 * revoke_device: true when revoked now, false when already revoked.  Ends an
 * active recovery session and abandons unfinished snapshots, so the device
 * no longer holds the GC fence.
 */
Datum
im_revoke_device(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr upd;
	int64		user_id = im_arg_user_id(fcinfo, 0, "user_id");
	char	   *device_id = im_arg_device_id(fcinfo, 1);
	Datum		args[2];
	ImDevice	dev;
	bool		revoked = false;
	char		detail[64];

	im_spi_connect();
	im_lock_device(user_id, device_id, &dev);
	if (strcmp(dev.state, "REVOKED") != 0)
	{
		args[0] = Int64GetDatum(user_id);
		args[1] = CStringGetTextDatum(device_id);
		im_prepare(&upd,
				   "UPDATE im.device SET state = 'REVOKED', revoked_at = pg_catalog.now() "
				   "WHERE user_id" EQ "$1 AND device_id" EQ "$2",
				   2, INT8OID, TEXTOID);
		im_exec(upd, args, NULL, 0);
		im_device_end_leases(user_id, device_id);
		im_push_remove_device_target(user_id, device_id);	/* its push target goes with it (contract §13) */
		snprintf(detail, sizeof(detail), "{\"registration\": %d}", dev.registration);
		im_audit_device("revoke_device", user_id, device_id, detail);
		im_device_notify(user_id, device_id, dev.connection_epoch, "REVOKED");
		revoked = true;
	}
	SPI_finish();
	PG_RETURN_BOOL(revoked);
}

/* Result columns of device_session's statement. */
enum
{
	Anum_session_state = 1,
	Anum_session_sync_generation,
	Anum_session_acked_sync_seq,
	Anum_session_user_high_watermark,
	Anum_session_current_epoch
};

PG_FUNCTION_INFO_V1(im_device_session);
/*
 * device_session: what the gateway's welcome frame needs; `current` is false
 * once a newer connection (a later authenticate) exists.  Reads only.
 */
Datum
im_device_session(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr plan;
	int64		user_id = im_arg_user_id(fcinfo, 0, "user_id");
	char	   *device_id = im_arg_device_id(fcinfo, 1);
	int64		epoch;
	Datum		args[3];
	Datum		values[6];
	bool		nulls[6] = {false, false, false, false, false, false};
	bool		suspended;

	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("connection_epoch must not be NULL")));
	epoch = PG_GETARG_INT64(2);

	im_srf_begin(fcinfo);
	im_spi_connect();
	im_prepare(&plan,
			   "SELECT d.state, d.sync_generation, d.acked_sync_seq, "
			   "       COALESCE(h.high_watermark, 0), "
			   "       d.connection_epoch" EQ "$3 "
			   "FROM im.device d LEFT JOIN im.user_head h ON h.user_id" EQ "d.user_id "
			   "WHERE d.user_id" EQ "$1 AND d.device_id" EQ "$2",
			   3, INT8OID, TEXTOID, INT8OID);
	args[0] = Int64GetDatum(user_id);
	args[1] = CStringGetTextDatum(device_id);
	args[2] = Int64GetDatum(epoch);
	if (im_exec(plan, args, NULL, 1) != 1)
		ereport(ERROR,
				(errcode(ERRCODE_NO_DATA_FOUND),
				 errmsg("device \"%s\" of user " INT64_FORMAT " is not registered",
						device_id, user_id)));
	{
		/* the statement's columns are the result's, in order */
		char	   *state = im_get_text(0, Anum_session_state);	/* upper context */

		values[1] = Int32GetDatum(im_get_int32(0, Anum_session_sync_generation, NULL));
		values[2] = Int64GetDatum(im_get_int64(0, Anum_session_acked_sync_seq, NULL));
		values[3] = Int64GetDatum(im_get_int64(0, Anum_session_user_high_watermark, NULL));
		values[4] = BoolGetDatum(im_get_bool(0, Anum_session_current_epoch, NULL));
		/* the gateway's re-check of a SUSPENDED notification reads this, never the payload */
		suspended = im_user_suspended(user_id);
		SPI_finish();
		values[0] = CStringGetTextDatum(state);
		/* an older catalog declares five columns: the sixth is not stored */
		values[5] = CStringGetTextDatum(suspended ? "suspended" : "active");
	}
	im_srf_row(fcinfo, values, nulls);
	return (Datum) 0;
}

PG_FUNCTION_INFO_V1(im_issue_device_token);
/*
 * issue_device_token: a signed token bound to user, device, registration and
 * expiry.  ttl must be positive (22023).  A revoked device gets 28000, the
 * same answer authenticate would give its token.  The audit row records the
 * registration and expiry, never the token.
 */
Datum
im_issue_device_token(PG_FUNCTION_ARGS)
{
	int64		user_id = im_arg_user_id(fcinfo, 0, "user_id");
	char	   *device_id = im_arg_device_id(fcinfo, 1);
	Interval   *ttl;
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz expires;
	ImDevice	dev;
	ImTokenClaims c;
	char	   *token;
	char		detail[160];

	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ttl must not be NULL")));
	ttl = PG_GETARG_INTERVAL_P(2);
	expires = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
													  TimestampTzGetDatum(now),
													  IntervalPGetDatum(ttl)));
	if (expires <= now)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ttl must be positive")));

	im_spi_connect();
	/* FOR UPDATE: serializes with revoke_device, so no token outlives it */
	im_lock_device(user_id, device_id, &dev);
	if (strcmp(dev.state, "REVOKED") == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_AUTHORIZATION_SPECIFICATION),
				 errmsg("device \"%s\" of user " INT64_FORMAT " is revoked", device_id, user_id),
				 errhint("Register the device again before issuing a token.")));
	im_user_check_standing(user_id);

	memset(&c, 0, sizeof(c));
	c.purpose = IM_TOKEN_DEVICE;
	c.user_id = user_id;
	strlcpy(c.device_id, device_id, sizeof(c.device_id));
	c.registration = dev.registration;
	c.sync_generation = 0;
	c.issued_at = now;
	c.expires_at = expires;
	snprintf(detail, sizeof(detail), "{\"registration\": %d, \"expires_at\": \"%s\"}",
			 dev.registration, timestamptz_to_str(expires));
	im_audit_device("issue_device_token", user_id, device_id, detail);
	SPI_finish();
	/* after SPI_finish, so the token is allocated in the caller's context */
	token = im_token_sign(&c);
	PG_RETURN_TEXT_P(cstring_to_text(token));
}

/*
 * A failed authentication: count in shared memory (survives the rollback
 * the error causes), log a summary line when one is due (without the
 * token), raise 28000.
 */
static void
auth_fail(const ImTokenClaims *c, const char *why)
{
	int64		failures;
	int64		since_s;

	im_counter_add(IM_COUNTER_AUTH_FAILURES, 1);
	/*
	 * The statement and context may carry the token as a literal (a caller
	 * that does not pass it as a parameter): keep them out of the log.
	 */
	if (im_auth_failure_summary_due(&failures, &since_s))
		ereport(LOG,
				(since_s < 0 ?
				 errmsg("im_sync: " INT64_FORMAT " failed device authentications since server start",
						failures) :
				 errmsg("im_sync: " INT64_FORMAT " failed device authentications in the last " INT64_FORMAT " s",
						failures, since_s),
				 c != NULL ?
				 errdetail("The latest: device \"%s\" of user " INT64_FORMAT ": the %s.",
						   c->device_id, c->user_id, why) :
				 errdetail("The latest: the %s.", why),
				 errhidestmt(true), errhidecontext(true)));
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_AUTHORIZATION_SPECIFICATION),
			 errmsg(IM_AUTH_FAILED_MSG),
			 errdetail("The %s.", why),
			 errhidestmt(true), errhidecontext(true)));
}

/*
 * authenticate: verifies a device token; on success bumps the device's
 * connection_epoch (the new connection becomes the current one) and notifies
 * im_sync_device SUPERSEDED so older connections close.
 */
IM_SENSITIVE_FUNCTION(im_authenticate)
{
	static SPIPlanPtr sel;
	static SPIPlanPtr bump;
	ImTokenClaims c;
	char	   *token;
	Datum		args[2];
	char	   *state;
	int32		registration;
	int64		epoch;
	Datum		values[3];
	bool		nulls[3] = {false, false, false};

	if (PG_ARGISNULL(0))
		auth_fail(NULL, "token is missing");
	token = text_to_cstring(PG_GETARG_TEXT_PP(0));

	im_srf_begin(fcinfo);
	if (!im_token_verify(token, IM_TOKEN_DEVICE, &c))
		auth_fail(NULL, "token is malformed or its signature does not match");

	im_spi_connect();
	im_prepare(&sel,
			   "SELECT state, registration FROM im.device "
			   "WHERE user_id" EQ "$1 AND device_id" EQ "$2 "
			   "FOR UPDATE",
			   2, INT8OID, TEXTOID);
	args[0] = Int64GetDatum(c.user_id);
	args[1] = CStringGetTextDatum(c.device_id);
	if (im_exec(sel, args, NULL, 1) != 1)
		auth_fail(&c, "device is not registered");
	state = im_get_text(0, 1);
	registration = im_get_int32(0, 2, NULL);
	if (strcmp(state, "REVOKED") == 0)
		auth_fail(&c, "device is revoked");
	if (registration != c.registration)
		auth_fail(&c, "token was issued before the device was revoked");
	if (GetCurrentTimestamp() >= c.expires_at)
		auth_fail(&c, "token has expired");
	/* after every token check (28000 first), under the device row's lock */
	im_user_check_standing(c.user_id);

	im_prepare(&bump,
			   "UPDATE im.device SET connection_epoch = connection_epoch" PLUS "1, "
			   "  last_seen_at = pg_catalog.now() "
			   "WHERE user_id" EQ "$1 AND device_id" EQ "$2 "
			   "RETURNING connection_epoch",
			   2, INT8OID, TEXTOID);
	im_exec(bump, args, NULL, 0);
	epoch = im_get_int64(0, 1, NULL);
	im_device_notify(c.user_id, c.device_id, epoch, "SUPERSEDED");
	SPI_finish();

	values[0] = Int64GetDatum(c.user_id);
	values[1] = CStringGetTextDatum(c.device_id);
	values[2] = Int64GetDatum(epoch);
	im_srf_row(fcinfo, values, nulls);
	return (Datum) 0;
}
