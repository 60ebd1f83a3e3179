/*
 * standing.c — account standing (contract §17): is this user suspended now?
 *
 * Every API call made for a user asks im_user_check_standing (one check,
 * one message).  A suspension is a row of im.user_suspension; it is active
 * while suspended_until is NULL or later than now(), so a timed suspension
 * ends by itself (nothing has to fire).
 *
 * The common case, no active suspension on this node, must cost nothing on
 * the hot paths (send, sync): shared memory keeps one word, a generation
 * and a flag (UNKNOWN, NONE, SOME), and a count of writers in flight.
 *   - a writer of im.user_suspension (the statement trigger below, so any
 *     INSERT or UPDATE, COPY included, counts) first adds itself to the
 *     writers, then moves the word to the next generation with SOME, before
 *     its commit; at its transaction's end it moves the generation again
 *     and leaves the writers (a PREPARE stays counted: the prepared rows
 *     commit later, without this backend);
 *   - a recount (the maintenance round, or the first check after a start)
 *     reads the word, counts the active rows with a fresh snapshot, and
 *     only then, with no writer in flight, swaps the word it read for NONE:
 *     any writer that began or ended in between moved the generation, so
 *     the swap fails and the word stays SOME;
 *   - NONE is never set during recovery or under a transaction snapshot
 *     (the count could miss committed rows), so a standby and a promoted
 *     standby look every suspension up until a recount on the primary;
 *   - shared memory starts UNKNOWN (after a crash too); without it (library
 *     not preloaded) every check looks the row up;
 *   - the words are per database (shared memory is the cluster's, the
 *     table a database's): a recount in one database never clears another's;
 *     beyond IM_STANDING_SLOTS databases every check looks the row up.
 * Invariant: while an active suspension row is visible to a check, the
 * word is not NONE.
 */
#include "core/im_sync.h"
#include "core/common.h"
#include "core/im_sql.h"
#include "core/shmem.h"
#include "core/standing.h"
#include "core/version_check.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "utils/builtins.h"
#include "utils/snapmgr.h"

#define ST_UNKNOWN 0
#define ST_NONE 1
#define ST_SOME 2
#define ST_FLAG(s) ((s) & UINT64CONST(3))
#define ST_WITH(s, flag) (((s) & ~UINT64CONST(3)) | (flag))
#define ST_NEXT(s, flag) (((((s) >> 2) + 1) << 2) | (flag))

/* An active suspension, in the statements' words. */
#define IM_SUSPENSION_ACTIVE_SQL \
	"(s.suspended_until IS NULL OR s.suspended_until" GT "pg_catalog.now())"

/* This backend's transaction counts in the writers. */
static bool writing = false;
static bool callback_registered = false;

/* Moves the word to the next generation, flagged SOME. */
static void
bump_some(pg_atomic_uint64 *state)
{
	uint64		old = pg_atomic_read_u64(state);

	while (!pg_atomic_compare_exchange_u64(state, &old, ST_NEXT(old, ST_SOME)))
		;
}

static void
standing_xact_callback(XactEvent event, void *arg)
{
	pg_atomic_uint64 *state;
	pg_atomic_uint32 *writers;

	if (!writing || !im_shmem_standing(&state, &writers))
		return;
	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			bump_some(state);	/* the row is visible (or gone) by now */
			pg_atomic_fetch_sub_u32(writers, 1);
			writing = false;
			break;
		case XACT_EVENT_PREPARE:
			writing = false;	/* stays counted: SOME until a restart */
			break;
		default:
			break;
	}
}

/* A writer of im.user_suspension: counted until its transaction ends. */
static void
mark_writer(void)
{
	pg_atomic_uint64 *state;
	pg_atomic_uint32 *writers;

	if (writing || !im_shmem_standing(&state, &writers))
		return;
	if (!callback_registered)
	{
		RegisterXactCallback(standing_xact_callback, NULL);
		callback_registered = true;
	}
	pg_atomic_fetch_add_u32(writers, 1);
	writing = true;
	bump_some(state);
}

PG_FUNCTION_INFO_V1(im_user_suspension_written);
/* BEFORE INSERT OR UPDATE statement trigger of im.user_suspension. */
Datum
im_user_suspension_written(PG_FUNCTION_ARGS)
{
	if (!CALLED_AS_TRIGGER(fcinfo))
		elog(ERROR, "im_sync: im_user_suspension_written must be called as a trigger");
	mark_writer();
	return PointerGetDatum(NULL);
}

void
im_standing_recount(void)
{
	static SPIPlanPtr plan;
	pg_atomic_uint64 *state;
	pg_atomic_uint32 *writers;
	uint64		seen;
	int64		active;

	if (!im_shmem_standing(&state, &writers) || RecoveryInProgress() ||
		IsolationUsesXactSnapshot() || !im_catalog_at_least(1, 12))
		return;
	seen = pg_atomic_read_u64(state);
	if (ST_FLAG(seen) == ST_NONE || pg_atomic_read_u32(writers) != 0)
		return;
	pg_memory_barrier();
	im_spi_connect();
	im_prepare(&plan,
			   "SELECT pg_catalog.count(*) FROM im.user_suspension s WHERE " IM_SUSPENSION_ACTIVE_SQL,
			   0);
	im_exec(plan, NULL, NULL, 1);
	active = im_get_int64(0, 1, NULL);
	SPI_finish();
	pg_memory_barrier();
	if (pg_atomic_read_u32(writers) != 0)
		return;
	/* fails when a writer moved the generation since `seen` */
	pg_atomic_compare_exchange_u64(state, &seen, ST_WITH(seen, active == 0 ? ST_NONE : ST_SOME));
}

bool
im_standing_any(void)
{
	pg_atomic_uint64 *state;
	pg_atomic_uint32 *writers;
	uint64		s;

	if (!im_shmem_standing(&state, &writers))
		return im_catalog_at_least(1, 12);
	s = pg_atomic_read_u64(state);
	if (ST_FLAG(s) == ST_NONE)
		return false;
	if (!im_catalog_at_least(1, 12))
		return false;			/* no suspensions before the catalog has them */
	if (ST_FLAG(s) == ST_UNKNOWN)
	{
		im_standing_recount();
		return ST_FLAG(pg_atomic_read_u64(state)) != ST_NONE;
	}
	return true;
}

bool
im_user_suspended(int64 user_id)
{
	static SPIPlanPtr plan;
	Datum		args[1];
	bool		suspended;

	if (!im_standing_any())
		return false;
	im_spi_connect();
	im_prepare(&plan,
			   "SELECT 1 FROM im.user_suspension s WHERE s.user_id" EQ "$1 AND " IM_SUSPENSION_ACTIVE_SQL,
			   1, INT8OID);
	args[0] = Int64GetDatum(user_id);
	suspended = im_exec(plan, args, NULL, 1) == 1;
	SPI_finish();
	return suspended;
}

void
im_user_check_standing(int64 user_id)
{
	if (im_user_suspended(user_id))
		ereport(ERROR,
				(errcode(ERRCODE_IM_FORBIDDEN),
				 errmsg("account suspended"),
				 errdetail("User " INT64_FORMAT " is suspended.", user_id)));
}
