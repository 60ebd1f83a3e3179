/*
 * shmem.c — shared memory of im_sync: one latch slot per fanout worker, the
 * commit-time wake-up, the rollback-proof counters of im.metrics() and the
 * clock of the failed-authentication summary.
 *
 * A sender never NOTIFYs (contract §4: NOTIFY takes a cluster-wide lock
 * through commit and would serialize every send); it asks for a wake-up,
 * and an XactCallback sets the workers' latches only once the commit is
 * visible.  A lost wake-up costs at most one naptime: workers also poll.
 * The same callback adds the counters a transaction counted "at commit", so
 * work a rollback undoes is never counted.
 */
#include "core/im_sync.h"
#include "core/shmem.h"

#include "access/xact.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "utils/memutils.h"

typedef struct ImShared
{
	/* pgprocno + 1 of the worker running in each slot; 0 when none. */
	pg_atomic_uint32 worker_procno[IM_MAX_FANOUT_WORKERS];
	pg_atomic_uint64 counters[IM_COUNTER__COUNT];
	/* Last failed-authentication summary: its time (0: none yet) and count. */
	pg_atomic_uint64 auth_summary_at;
	pg_atomic_uint64 auth_summary_failures;
	/*
	 * Account standing (standing.c), one slot per database that uses it
	 * (shared memory is the cluster's, suspensions are a database's): its
	 * oid (0: free), the generation and flag, the writers in flight.
	 */
	struct
	{
		pg_atomic_uint32 dboid;
		pg_atomic_uint64 state;
		pg_atomic_uint32 writers;
	}			standing[IM_STANDING_SLOTS];
} ImShared;

/* NULL when the library was not preloaded: counters read 0, no wake-ups. */
static ImShared *im_shared = NULL;

/*
 * Backend-local state of the current transaction, applied by the commit
 * callback and dropped on abort: it wrote outbox items (wake the workers),
 * and the counter deltas it counted at commit, each with the subtransaction
 * that counted it (a rolled-back savepoint drops its own; a released one
 * hands them to its parent).  The list lives in TopTransactionContext.
 */
typedef struct ImPendingCount
{
	SubTransactionId subid;
	ImCounter	which;
	int64		delta;
} ImPendingCount;

static bool wake_at_commit = false;
static List *pending_counts = NIL;
static bool xact_callback_registered = false;

/* This worker's slot, for the exit callback. */
static int	my_slot = -1;

Size
im_shmem_size(void)
{
	return MAXALIGN(sizeof(ImShared));
}

void
im_shmem_init(void)
{
	bool		found;

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	im_shared = ShmemInitStruct("im_sync", im_shmem_size(), &found);
	if (!found)
	{
		for (int i = 0; i < IM_MAX_FANOUT_WORKERS; i++)
			pg_atomic_init_u32(&im_shared->worker_procno[i], 0);
		for (int i = 0; i < IM_COUNTER__COUNT; i++)
			pg_atomic_init_u64(&im_shared->counters[i], 0);
		pg_atomic_init_u64(&im_shared->auth_summary_at, 0);
		pg_atomic_init_u64(&im_shared->auth_summary_failures, 0);
		for (int i = 0; i < IM_STANDING_SLOTS; i++)
		{
			pg_atomic_init_u32(&im_shared->standing[i].dboid, 0);
			pg_atomic_init_u64(&im_shared->standing[i].state, 0);
			pg_atomic_init_u32(&im_shared->standing[i].writers, 0);
		}
	}
	LWLockRelease(AddinShmemInitLock);
}

/* Clears this worker's slot so senders stop waking a dead process. */
static void
worker_slot_on_exit(int code, Datum arg)
{
	if (im_shared != NULL && my_slot >= 0)
		pg_atomic_write_u32(&im_shared->worker_procno[my_slot], 0);
}

void
im_shmem_publish_worker(int slot)
{
	if (im_shared == NULL || slot < 0 || slot >= IM_MAX_FANOUT_WORKERS)
		return;
	my_slot = slot;
	before_shmem_exit(worker_slot_on_exit, (Datum) 0);
	pg_atomic_write_u32(&im_shared->worker_procno[slot],
						(uint32) MyProc->pgprocno + 1);
}

/*
 * Wakes every registered worker.  Must not fail: it runs in the commit
 * callback, after the transaction is already durable and visible.  A slot
 * naming a process that has exited at worst sets a stranger's latch, which
 * every latch user tolerates as a spurious wake-up.
 */
static void
wake_workers(void)
{
	/*
	 * Paused workers fan out nothing and poll for the setting (their reload
	 * wakes them): a wake-up per commit would only cost a signal each.
	 */
	if (im_shared == NULL || im_fanout_paused)
		return;
	for (int i = 0; i < IM_MAX_FANOUT_WORKERS; i++)
	{
		uint32		procno = pg_atomic_read_u32(&im_shared->worker_procno[i]);

		if (procno != 0 && procno <= ProcGlobal->allProcCount)
			SetLatch(&ProcGlobal->allProcs[procno - 1].procLatch);
	}
}

/* The list's memory goes with TopTransactionContext. */
static void
forget_pending(void)
{
	wake_at_commit = false;
	pending_counts = NIL;
}

/*
 * XACT_EVENT_COMMIT runs after ProcArrayEndTransaction, so a worker that
 * wakes up sees the new outbox rows, and a counted deletion is durable.  An
 * abort or PREPARE forgets both (a prepared transaction's items are found
 * by polling; its counts are not known to commit, so they are dropped).
 */
static void
im_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
			{
				ListCell   *lc;

				foreach(lc, pending_counts)
				{
					ImPendingCount *c = (ImPendingCount *) lfirst(lc);

					im_counter_add(c->which, c->delta);
				}
			}
			if (wake_at_commit)
				wake_workers();
			forget_pending();
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_PREPARE:
			forget_pending();
			break;
		default:
			break;
	}
}

/*
 * A savepoint ends: its counts go to the parent (released) or are dropped
 * (rolled back; its children were already handed to it or dropped).
 */
static void
im_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
					SubTransactionId parentSubid, void *arg)
{
	ListCell   *lc;

	switch (event)
	{
		case SUBXACT_EVENT_COMMIT_SUB:
			foreach(lc, pending_counts)
			{
				ImPendingCount *c = (ImPendingCount *) lfirst(lc);

				if (c->subid == mySubid)
					c->subid = parentSubid;
			}
			break;
		case SUBXACT_EVENT_ABORT_SUB:
			foreach(lc, pending_counts)
			{
				ImPendingCount *c = (ImPendingCount *) lfirst(lc);

				if (c->subid == mySubid)
					pending_counts = foreach_delete_current(pending_counts, lc);
			}
			break;
		default:
			break;
	}
}

/* The callbacks are registered on first use in each backend. */
static void
register_xact_callback(void)
{
	if (!xact_callback_registered)
	{
		RegisterXactCallback(im_xact_callback, NULL);
		RegisterSubXactCallback(im_subxact_callback, NULL);
		xact_callback_registered = true;
	}
}

/*
 * Ask the fanout workers to wake up once the current transaction commits.
 * Works whether or not the library was preloaded (without shared memory it
 * is a no-op and im.run_fanout does the work).
 */
void
im_wake_fanout_at_commit(void)
{
	if (im_shared == NULL)
		return;
	register_xact_callback();
	wake_at_commit = true;
}

/* Counters live in shared memory so a rollback does not undo them. */
void
im_counter_add(ImCounter which, int64 delta)
{
	if (im_shared == NULL || which < 0 || which >= IM_COUNTER__COUNT)
		return;
	pg_atomic_fetch_add_u64(&im_shared->counters[which], (uint64) delta);
}

void
im_counter_add_at_commit(ImCounter which, int64 delta)
{
	MemoryContext old;
	ImPendingCount *c;

	if (im_shared == NULL || which < 0 || which >= IM_COUNTER__COUNT || delta == 0)
		return;
	register_xact_callback();
	old = MemoryContextSwitchTo(TopTransactionContext);
	c = palloc(sizeof(ImPendingCount));
	c->subid = GetCurrentSubTransactionId();
	c->which = which;
	c->delta = delta;
	pending_counts = lappend(pending_counts, c);
	MemoryContextSwitchTo(old);
}

int64
im_counter_get(ImCounter which)
{
	if (im_shared == NULL || which < 0 || which >= IM_COUNTER__COUNT)
		return 0;
	return (int64) pg_atomic_read_u64(&im_shared->counters[which]);
}

/*
 * True when a failed-authentication summary is due: the first failure, then
 * at most once per IM_AUTH_LOG_INTERVAL_S cluster-wide (the backend that
 * wins the compare-and-swap logs).  *failures: failures counted since the
 * previous summary; *since_s: its age in seconds, -1 for the first.
 * Without shared memory (not preloaded) the same holds per backend.
 */
bool
im_auth_failure_summary_due(int64 *failures, int64 *since_s)
{
	static uint64 local_at = 0;
	static int64 local_failures = 0;
	uint64		now = (uint64) GetCurrentTimestamp();
	uint64		last;
	uint64		total;

	if (im_shared == NULL)
	{
		/* the shared counter reads 0 without shared memory: count here */
		local_failures++;
		if (local_at != 0 && now - local_at < (uint64) IM_AUTH_LOG_INTERVAL_S * USECS_PER_SEC)
			return false;
		*failures = local_failures;
		*since_s = local_at == 0 ? -1 : (int64) ((now - local_at) / USECS_PER_SEC);
		local_at = now;
		local_failures = 0;
		return true;
	}
	total = (uint64) im_counter_get(IM_COUNTER_AUTH_FAILURES);
	last = pg_atomic_read_u64(&im_shared->auth_summary_at);
	if (last != 0 && now - last < (uint64) IM_AUTH_LOG_INTERVAL_S * USECS_PER_SEC)
		return false;
	if (!pg_atomic_compare_exchange_u64(&im_shared->auth_summary_at, &last, now))
		return false;			/* another backend logs this interval */
	*failures = (int64) (total - pg_atomic_exchange_u64(&im_shared->auth_summary_failures, total));
	*since_s = last == 0 ? -1 : (int64) ((now - last) / USECS_PER_SEC);
	return true;
}

/*
 * The standing words of this backend's database (standing.c): its slot,
 * claimed on first use.  False without shared memory or when every slot is
 * another database's (then every check looks suspensions up).  A slot is
 * never given back: a dropped database keeps its slot.
 */
bool
im_shmem_standing(pg_atomic_uint64 **state, pg_atomic_uint32 **writers)
{
	static int	slot = -1;
	static Oid	slot_db = InvalidOid;

	if (im_shared == NULL || !OidIsValid(MyDatabaseId))
		return false;
	if (slot < 0 || slot_db != MyDatabaseId)
	{
		slot = -1;
		for (int i = 0; i < IM_STANDING_SLOTS && slot < 0; i++)
		{
			uint32		db = pg_atomic_read_u32(&im_shared->standing[i].dboid);

			if (db == 0)
			{
				uint32		expected = 0;

				if (pg_atomic_compare_exchange_u32(&im_shared->standing[i].dboid, &expected,
												   (uint32) MyDatabaseId))
					db = (uint32) MyDatabaseId;
				else
					db = expected;	/* another backend took it first */
			}
			if (db == (uint32) MyDatabaseId)
				slot = i;
		}
		if (slot < 0)
			return false;
		slot_db = MyDatabaseId;
	}
	*state = &im_shared->standing[slot].state;
	*writers = &im_shared->standing[slot].writers;
	return true;
}
