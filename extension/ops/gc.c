/*
 * gc.c — gc_inbox and its retention fence (contract §8, design §5.4, §14.3).
 *
 * Invariant protected: nothing a device may still need is collected.  Per
 * user the fence is the lowest of
 *   - the ACK of every ACTIVE or RECOVERING device seen within
 *     im_sync.device_inactive_after (NEW/RESETTING devices will snapshot),
 *   - the resume_from of every ACTIVE, unexpired recovery session (lease),
 *   - the base of every unexpired READY/BUILDING snapshot,
 *   - the retention window: no event younger than im_sync.inbox_retention;
 * rows <= fence are deleted and user_head.gc_floor moves to the fence.  A
 * device left behind finds ACK < gc_floor and gets RESET_REQUIRED (sync.c
 * rule 6), never a gap.
 *
 * Concurrency: the fence is computed after taking the user's head FOR
 * UPDATE, in a statement with a fresh snapshot.  sync_changes holds the same
 * row FOR SHARE while it tests gc_floor and creates a recovery lease, so a
 * lease is either seen here or the recovery sees the new gc_floor.
 *
 * Chunks (contract §8): a head lock is held until the transaction ends, so
 * gc_inbox(max_users) collects at most max_users users per call, resuming
 * after the last user the previous chunk reached (im.maintenance_state
 * 'gc_cursor', wrapping around to the start), and a caller (or the worker,
 * one committed transaction per chunk) loops.  A chunk locks only its own
 * users: fanout to anyone else never waits for it.  The cursor row is
 * locked first, so two chunked callers take turns instead of collecting the
 * same users.
 */
#include "core/im_sync.h"
#include "core/common.h"
#include "core/shmem.h"
#include "core/im_sql.h"
#include "ops/ops.h"

#include "catalog/pg_type.h"
#include "miscadmin.h"
#include "utils/builtins.h"

/*
 * Candidates of one chunk, in user_id order (the head lock order): users
 * whose log holds anything, after the cursor; wraps to the start when none
 * is left after it.  max_users <= 0: every user, cursor untouched.  Returns
 * the count; *ids is palloc'd in the caller's SPI context.  *round_done:
 * this chunk ended a round (fewer than max_users left) or had to wrap.
 */
static uint64
chunk_users(int max_users, int64 **ids, bool *round_done)
{
	static SPIPlanPtr all_users;
	static SPIPlanPtr cursor_plan;
	static SPIPlanPtr after_plan;
	static SPIPlanPtr move_plan;
	Datum		args[2];
	uint64		n;
	int64		cursor = 0;

	if (max_users <= 0)
	{
		im_prepare(&all_users,
				   "SELECT user_id FROM im.user_head "
				   "WHERE high_watermark" GT "gc_floor ORDER BY user_id", 0);
		n = im_exec(all_users, NULL, NULL, 0);
	}
	else
	{
		/* insert-or-lock: the row is created on first use */
		im_prepare(&cursor_plan,
				   "INSERT INTO im.maintenance_state AS m (name, value) VALUES ('gc_cursor', 0) "
				   "ON CONFLICT (name) DO UPDATE SET value = m.value RETURNING m.value", 0);
		im_exec(cursor_plan, NULL, NULL, 1);
		cursor = im_get_int64(0, 1, NULL);

		im_prepare(&after_plan,
				   "SELECT user_id FROM im.user_head "
				   "WHERE high_watermark" GT "gc_floor "
				   "AND user_id" GT "$1 ORDER BY user_id LIMIT $2",
				   2, INT8OID, INT4OID);
		args[0] = Int64GetDatum(cursor);
		args[1] = Int32GetDatum(max_users);
		n = im_exec(after_plan, args, NULL, 0);
		if (n == 0 && cursor != 0)
		{
			/* end of a round: start the next one from the lowest user */
			args[0] = Int64GetDatum(PG_INT64_MIN);
			n = im_exec(after_plan, args, NULL, 0);
			*round_done = true;
		}
	}
	*ids = palloc(sizeof(int64) * (n + 1));
	for (uint64 i = 0; i < n; i++)
		(*ids)[i] = im_get_int64(i, 1, NULL);

	if (max_users > 0)
	{
		/* a round ends with the cursor at 0, so the next chunk starts over */
		im_prepare(&move_plan,
				   "UPDATE im.maintenance_state SET value = $1, at = pg_catalog.now() "
				   "WHERE name" EQ "'gc_cursor'", 1, INT8OID);
		args[0] = Int64GetDatum(n < (uint64) max_users ? 0 : (*ids)[n - 1]);
		im_exec(move_plan, args, NULL, 0);
	}
	if (max_users <= 0 || n < (uint64) max_users)
		*round_done = true;
	return n;
}

/*
 * Collect one chunk (see the file comment) in the caller's transaction.
 * Emits a (user_id, retained_from, deleted) row per collected user when
 * fcinfo is not NULL.  Returns true when the chunk ended a round of all
 * users (or wrapped around to start the next one).
 */
bool
im_gc_inbox_chunk(int max_users, FunctionCallInfo fcinfo)
{
	static SPIPlanPtr lock;
	static SPIPlanPtr fence_plan;
	static SPIPlanPtr collect;
	int64	   *ids;
	uint64		nusers;
	int64		total = 0;
	bool		round_done = false;

	im_spi_connect();
	nusers = chunk_users(max_users, &ids, &round_done);

	im_prepare(&lock,
			   "SELECT gc_floor, high_watermark FROM im.user_head "
			   "WHERE user_id" EQ "$1 FOR UPDATE",
			   1, INT8OID);
	im_prepare(&fence_plan,
			   "SELECT LEAST($2::pg_catalog.int8, "
			   " (SELECT pg_catalog.min(d.acked_sync_seq) FROM im.device d "
			   "   WHERE d.user_id" EQ "$1 "
			   "   AND d.state" EQ "ANY ('{ACTIVE,RECOVERING}'::pg_catalog.text[]) "
			   "   AND d.last_seen_at" GT "(pg_catalog.now()" MINUS
			   "       pg_catalog.make_interval(secs => $3))), "
			   " (SELECT pg_catalog.min(s.resume_from) FROM im.recovery_session s "
			   "   WHERE s.user_id" EQ "$1 AND s.state" EQ "'ACTIVE' "
			   "   AND s.expires_at" GT "pg_catalog.now()), "
			   " (SELECT pg_catalog.min(p.base_sync_seq) FROM im.snapshot p "
			   "   WHERE p.user_id" EQ "$1 "
			   "   AND p.state" EQ "ANY ('{READY,BUILDING}'::pg_catalog.text[]) "
			   "   AND p.expires_at" GT "pg_catalog.now()), "
			   " (SELECT pg_catalog.min(i.sync_seq)" MINUS "1 FROM im.inbox i "
			   "   WHERE i.user_id" EQ "$1 "
			   "   AND i.created_at" GE "(pg_catalog.now()" MINUS
			   "       pg_catalog.make_interval(secs => $4))))",
			   4, INT8OID, INT8OID, FLOAT8OID, FLOAT8OID);
	im_prepare(&collect,
			   "WITH d AS (DELETE FROM im.inbox WHERE user_id" EQ "$1 "
			   "           AND sync_seq" LE "$2 RETURNING 1), "
			   "u AS (UPDATE im.user_head SET gc_floor = $2 WHERE user_id" EQ "$1 "
			   "      AND gc_floor" LT "$2 RETURNING 1) "
			   "SELECT pg_catalog.count(*) FROM d",
			   2, INT8OID, INT8OID);

	for (uint64 i = 0; i < nusers; i++)
	{
		Datum		args[4];
		int64		floor;
		int64		hw;
		int64		fence;
		int64		deleted;
		Datum		v[3];
		bool		n[3] = {false, false, false};

		CHECK_FOR_INTERRUPTS();
		args[0] = Int64GetDatum(ids[i]);
		if (im_exec(lock, args, NULL, 1) != 1)
			continue;
		floor = im_get_int64(0, 1, NULL);
		hw = im_get_int64(0, 2, NULL);

		/* after the lock: a fresh snapshot sees every committed lease */
		args[1] = Int64GetDatum(hw);
		args[2] = Float8GetDatum((double) im_device_inactive_after_s);
		args[3] = Float8GetDatum((double) im_inbox_retention_s);
		im_exec(fence_plan, args, NULL, 1);
		fence = im_get_int64(0, 1, NULL);
		if (fence <= floor)
			continue;

		args[1] = Int64GetDatum(fence);
		im_exec(collect, args, NULL, 1);
		deleted = im_get_int64(0, 1, NULL);
		total += deleted;

		if (fcinfo != NULL)
		{
			v[0] = Int64GetDatum(ids[i]);
			v[1] = Int64GetDatum(fence + 1);
			v[2] = Int64GetDatum(deleted);
			im_srf_row(fcinfo, v, n);
		}
	}
	SPI_finish();
	if (total > 0)
		im_counter_add_at_commit(IM_COUNTER_GC_DELETED, total);
	return round_done;
}

PG_FUNCTION_INFO_V1(im_gc_inbox);
/*
 * gc_inbox(max_users): one chunk of inbox GC (NULL: every user), then the
 * rest of maintenance (maintenance.c: key ring, retention), all in the
 * caller's transaction.  max_users must be positive (22023).
 */
Datum
im_gc_inbox(PG_FUNCTION_ARGS)
{
	int			max_users = 0;

	if (!PG_ARGISNULL(0))
	{
		max_users = PG_GETARG_INT32(0);
		if (max_users < 1)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("max_users must be positive"),
					 errdetail("max_users is %d; pass NULL to collect every user in one call.",
							   max_users)));
	}
	im_srf_begin(fcinfo);
	(void) im_gc_inbox_chunk(max_users, fcinfo);
	im_maintain();
	return (Datum) 0;
}
