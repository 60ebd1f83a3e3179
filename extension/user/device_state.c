/*
 * device_state.c — the one owner of a device's sync state: its generation,
 * the leases it holds on the log (recovery sessions and snapshots) and its
 * last-seen time.  User side.
 *
 * Invariants protected here:
 *   - a generation only grows, and every bump kills the device's older
 *     batch tokens, cursors and snapshot tokens (STALE_GENERATION);
 *   - a lease that can never be used again (older generation, revoked
 *     device) is ended at once, so it stops holding the GC fence (gc.c).
 * Every function needs the caller to hold the device row (im_lock_device,
 * core/locks.c).
 */
#include "core/im_sync.h"
#include "core/common.h"
#include "core/locks.h"
#include "core/shard_map.h"
#include "core/im_sql.h"
#include "user/user.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"

static void
device_args(Datum *args, int64 user_id, const char *device_id)
{
	args[0] = Int64GetDatum(user_id);
	args[1] = CStringGetTextDatum(device_id);
}

void
im_device_bump_generation(ImDevice *dev, const char *new_state)
{
	static SPIPlanPtr plan;
	Datum		args[3];

	im_prepare(&plan,
			   "UPDATE im.device SET sync_generation = sync_generation" PLUS "1, "
			   "  state = $3, last_seen_at = pg_catalog.now() "
			   "WHERE user_id" EQ "$1 AND device_id" EQ "$2 "
			   "RETURNING sync_generation",
			   3, INT8OID, TEXTOID, TEXTOID);
	device_args(args, dev->user_id, dev->device_id);
	args[2] = CStringGetTextDatum(new_state);
	if (im_exec(plan, args, NULL, 0) != 1)
		elog(ERROR, "im_sync: device row vanished while locked");
	dev->sync_generation = im_get_int32(0, 1, NULL);
	strlcpy(dev->state, new_state, sizeof(dev->state));
}

void
im_device_note_issued(ImDevice *dev, int64 watermark)
{
	static SPIPlanPtr plan;
	Datum		args[3];

	if (watermark <= dev->issued_sync_seq)
		return;
	im_prepare(&plan,
			   "UPDATE im.device SET issued_sync_seq = GREATEST(issued_sync_seq, $3) "
			   "WHERE user_id" EQ "$1 AND device_id" EQ "$2",
			   3, INT8OID, TEXTOID, INT8OID);
	device_args(args, dev->user_id, dev->device_id);
	args[2] = Int64GetDatum(watermark);
	im_exec(plan, args, NULL, 0);
	dev->issued_sync_seq = watermark;
}

void
im_device_end_recovery_sessions(int64 user_id, const char *device_id, const char *how)
{
	static SPIPlanPtr plan;
	Datum		args[3];

	im_prepare(&plan,
			   "UPDATE im.recovery_session SET state = $3, ended_at = pg_catalog.now() "
			   "WHERE user_id" EQ "$1 AND device_id" EQ "$2 "
			   "AND state" EQ "'ACTIVE'",
			   3, INT8OID, TEXTOID, TEXTOID);
	device_args(args, user_id, device_id);
	args[2] = CStringGetTextDatum(how);
	im_exec(plan, args, NULL, 0);
}

void
im_device_end_leases(int64 user_id, const char *device_id)
{
	static SPIPlanPtr plan;
	Datum		args[2];

	im_device_end_recovery_sessions(user_id, device_id, "ENDED");
	im_prepare(&plan,
			   "UPDATE im.snapshot SET state = 'ABANDONED' "
			   "WHERE user_id" EQ "$1 AND device_id" EQ "$2 "
			   "AND state" EQ "ANY ('{READY,BUILDING}'::pg_catalog.text[])",
			   2, INT8OID, TEXTOID);
	device_args(args, user_id, device_id);
	im_exec(plan, args, NULL, 0);
}

void
im_device_touch(int64 user_id, const char *device_id)
{
	static SPIPlanPtr plan;
	Datum		args[2];

	im_prepare(&plan,
			   "UPDATE im.device SET last_seen_at = pg_catalog.now() "
			   "WHERE user_id" EQ "$1 AND device_id" EQ "$2",
			   2, INT8OID, TEXTOID);
	device_args(args, user_id, device_id);
	im_exec(plan, args, NULL, 0);
}

void
im_device_touch_coarse(int64 user_id, const char *device_id)
{
	static SPIPlanPtr plan;
	Datum		args[2];

	im_prepare(&plan,
			   "UPDATE im.device SET last_seen_at = pg_catalog.now() "
			   "WHERE user_id" EQ "$1 AND device_id" EQ "$2 "
			   "AND last_seen_at" LT "(pg_catalog.now()" MINUS "'1 second'::pg_catalog.interval)",
			   2, INT8OID, TEXTOID);
	device_args(args, user_id, device_id);
	im_exec(plan, args, NULL, 0);
}
