/*
 * shmem.h — the extension's shared memory (shmem.c): the fanout workers'
 * latch slots, the commit-time wake-up, the rollback-proof counters of
 * im.metrics() and the failed-authentication summary clock.
 *
 * Everything here works without shared memory too (library not preloaded):
 * counters then read 0 and there are no wake-ups (im.run_fanout does the
 * work).
 */
#ifndef IM_SHMEM_H
#define IM_SHMEM_H

#include "postgres.h"

/* Maximum number of fanout workers (shared memory is sized for this). */
#define IM_MAX_FANOUT_WORKERS 32

extern Size im_shmem_size(void);
extern void im_shmem_init(void);

/*
 * A fanout worker publishes its latch in slot `slot` (0-based, below
 * IM_MAX_FANOUT_WORKERS) so committing senders can wake it; the slot is
 * cleared when the process exits.
 */
extern void im_shmem_publish_worker(int slot);

/* Ask fanout workers to wake up once the current transaction commits. */
extern void im_wake_fanout_at_commit(void);

/* Cluster-wide counters that must survive a rollback (failed auth, …). */
typedef enum ImCounter
{
	IM_COUNTER_AUTH_FAILURES,
	IM_COUNTER_STALE_ACKS,
	IM_COUNTER_DUPLICATE_DELIVERIES,
	IM_COUNTER_RESETS,
	IM_COUNTER_GC_DELETED,
	IM_COUNTER_FANOUT_TRANSIENT_FAILURES,	/* item failures backed off, not charged */
	IM_COUNTER_FANOUT_CHARGED_FAILURES, /* item failures charged as attempts */
	IM_COUNTER_FANOUT_BATCH_FAILURES,	/* batches that failed outside any one item */
	/* relay results, in push_queue.c's push_results order */
	IM_COUNTER_PUSH_DELIVERED,
	IM_COUNTER_PUSH_REJECTED,
	IM_COUNTER_PUSH_RATE_LIMITED,
	IM_COUNTER_PUSH_TRANSIENT,
	IM_COUNTER_PUSH_PERMANENT,
	IM_COUNTER_PUSH_SUPPRESSED,	/* jobs completed as suppressed at claim */
	IM_COUNTER_PUSH_TARGETS_DISABLED,	/* targets disabled after 3 rejections */
	IM_COUNTER_GAPS_REPAIRED_MISSING,	/* missing deliveries repair_fanout requeued */
	IM_COUNTER_GAPS_REPAIRED_DEAD,	/* dead items repair_fanout requeued */
	IM_COUNTER_IDEMPOTENT_RETRIES,	/* writes answered with the original (created false) */
	IM_COUNTER__COUNT
} ImCounter;

/* Add now: the event happened whatever the transaction does next. */
extern void im_counter_add(ImCounter which, int64 delta);
/*
 * Add when the current transaction commits, forget on abort: for counts of
 * work the transaction does (rows it deletes), which a rollback undoes.
 */
extern void im_counter_add_at_commit(ImCounter which, int64 delta);
extern int64 im_counter_get(ImCounter which);

/*
 * Failed authentications: count always; true at most once per
 * IM_AUTH_LOG_INTERVAL_S cluster-wide (per backend without shared memory),
 * with the failures counted since the previous summary and its age.
 */
#define IM_AUTH_LOG_INTERVAL_S 60
extern bool im_auth_failure_summary_due(int64 *failures, int64 *since_s);

/*
 * The account-standing words of standing.c (its protocol is described
 * there) for this backend's database, one slot each of at most
 * IM_STANDING_SLOTS databases; false when the library was not preloaded or
 * no slot is left.
 */
#define IM_STANDING_SLOTS 16
#include "port/atomics.h"
extern bool im_shmem_standing(pg_atomic_uint64 **state, pg_atomic_uint32 **writers);

#endif							/* IM_SHMEM_H */
