/*
 * worker.c — fanout background workers: their registration and their loop
 * (fanout batches, the first worker's maintenance rounds, batch failures).
 *
 * A worker publishes its latch in shared memory (shmem.c) so a committing
 * sender wakes it; it also polls, so a lost wake-up costs one naptime.
 *
 * Each worker loop iteration is one transaction around im_fanout_batch()
 * (fanout.c, the only writer of sync_seq) and im_send_hints(), so inbox
 * events, heads, states and hints commit together (§13.1).  A failing item
 * is handled inside the batch; a batch failing outside any one item is
 * caught here and logged, and in a new transaction its items back off
 * (transient failure) or are charged an attempt (any other), contract §4:
 * so a broken batch is neither retried for ever at no cost nor retried
 * with the same healthy conversations, and the worker stays up and never
 * takes the cluster down with it (only an exit by signal restarts every
 * backend).  On a hot standby the workers start too and wait, read-only,
 * until promotion (fanout.h).
 *
 * Every transaction that touches the extension's tables runs as their
 * owner, from its start until after its commit (deferred triggers fire in
 * the commit), never as the bootstrap superuser the worker connects as;
 * while that role is unfit the worker does nothing (core/worker_owner.h).
 */
#include "core/im_sync.h"
#include "core/shmem.h"
#include "core/version_check.h"
#include "core/worker_owner.h"
#include "fanout/fanout.h"
#include "shard/shard.h"
#include "ops/ops.h"
#include "user/user.h"

#include "access/xact.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/latch.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/timeout.h"

/*
 * Outbox items per worker transaction.  A batch's events and hints become
 * visible only at its commit, so it must not be huge; but every batch also
 * updates the heads and states of its users once, and rows updated in
 * every small batch bloat their version chains.  Measured on 2 cores, a
 * 200-member group (test/bench/send_fanout.sh): 10-item batches drained
 * 1,000 queued messages at 45k events/s, 50-item batches at 103k (0.73x the
 * one-statement floor); 200 messages: 0.58-0.61x vs 0.76x.  Large groups
 * get batches of their own (fanout.c), so small conversations do not wait.
 */
#define IM_WORKER_BATCH 50
/* Poll interval when idle, and wait after a failed batch that could not be recorded (ms). */
#define IM_WORKER_NAPTIME_MS 1000
#define IM_WORKER_ERROR_NAPTIME_MS 5000
/*
 * After an empty batch, a latch wake-up waits this long before the next
 * batch, so a burst of committing senders costs one batch, not one per
 * commit (every commit wakes every worker, and a worker that finds its
 * conversations held by another would otherwise spin on each wake-up).
 */
#define IM_WORKER_COALESCE_MS 10
/* pg_stat_activity.query of a worker that refused to run this round */
#define IM_WORKER_REFUSING_ACTIVITY "im_sync fanout worker: refusing to run, the extension's owner is unfit"
/* Seconds before the postmaster restarts a worker that exited. */
#define IM_WORKER_RESTART_S 5
/*
 * Maintenance (first worker only, contract §8): a round is inbox GC in
 * committed chunks of IM_WORKER_GC_CHUNK_USERS users (a chunk holds its
 * users' head locks until it commits, so it stays small), at most
 * IM_WORKER_GC_CHUNKS_PER_TURN per loop iteration so fanout batches run in
 * between, then one transaction of im_maintain (key ring, retention).  The
 * next round starts im_sync.maintenance_interval after one ends.
 */
#define IM_WORKER_GC_CHUNK_USERS 100
#define IM_WORKER_GC_CHUNKS_PER_TURN 10

/* What the current batch claimed, in the loop context: survives its abort. */
static ImFanoutClaim batch_claim;

/* The owner identity of the current transaction; restored after an error too. */
static ImOwnerScope owner_scope;

/*
 * Maintenance round state of the first worker (see above).  The next round
 * is due im_sync.maintenance_interval after the last one ended, read at
 * each turn, so a reloaded interval applies at once.
 */
static bool maintenance_round_open = false;
static TimestampTz maintenance_round_ended = 0;	/* 0: none yet */

PGDLLEXPORT void im_fanout_worker_main(Datum main_arg);

/*
 * Register im_sync.fanout_workers workers (called from _PG_init while the
 * library is being preloaded).  They restart a few seconds after any exit.
 */
void
im_worker_register(void)
{
	for (int i = 0; i < im_fanout_workers; i++)
	{
		BackgroundWorker worker;

		memset(&worker, 0, sizeof(worker));
		worker.bgw_flags = BGWORKER_SHMEM_ACCESS |
			BGWORKER_BACKEND_DATABASE_CONNECTION;
		/* also on a hot standby, where they wait (fanout.h) */
		worker.bgw_start_time = BgWorkerStart_ConsistentState;
		worker.bgw_restart_time = IM_WORKER_RESTART_S;
		snprintf(worker.bgw_library_name, BGW_MAXLEN, "im_sync");
		snprintf(worker.bgw_function_name, BGW_MAXLEN, "im_fanout_worker_main");
		snprintf(worker.bgw_name, BGW_MAXLEN, "im_sync fanout worker %d", i);
		snprintf(worker.bgw_type, BGW_MAXLEN, "im_sync fanout worker");
		worker.bgw_main_arg = Int32GetDatum(i);
		worker.bgw_notify_pid = 0;
		RegisterBackgroundWorker(&worker);
	}
}

/* Sleeps until the latch is set or the timeout; true if the latch woke us. */
static bool
worker_wait(long timeout_ms)
{
	int			rc;

	rc = WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
				   timeout_ms, PG_WAIT_EXTENSION);
	ResetLatch(MyLatch);
	CHECK_FOR_INTERRUPTS();
	return (rc & WL_LATCH_SET) != 0;
}

static void
worker_reload_if_needed(void)
{
	if (ConfigReloadPending)
	{
		ConfigReloadPending = false;
		ProcessConfigFile(PGC_SIGHUP);
	}
}

/*
 * The receipt producer (user/receipt.c) before the batch, in a
 * subtransaction: a producer that fails logs a WARNING and leaves its
 * queued rows for the next batch, and fanout goes on (receipts are never
 * allowed to stop delivery).  Cancels and shutdowns propagate.
 */
static void
worker_produce_receipts(void)
{
	MemoryContext oldcontext = CurrentMemoryContext;
	ResourceOwner oldowner = CurrentResourceOwner;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(oldcontext);
	PG_TRY();
	{
		(void) im_receipts_produce(IM_WORKER_BATCH);
		ReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(oldcontext);
		CurrentResourceOwner = oldowner;
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(oldcontext);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(oldcontext);
		CurrentResourceOwner = oldowner;
		if (edata->sqlerrcode == ERRCODE_QUERY_CANCELED ||
			edata->sqlerrcode == ERRCODE_ADMIN_SHUTDOWN)
			ReThrowError(edata);
		ereport(WARNING,
				(errmsg("im_sync: the receipt producer failed: %s; stage=receipts",
						edata->message ? edata->message : "(no message)"),
				 errdetail("Fanout goes on; the queued ACKs and reads stay queued for the next batch.")));
		FreeErrorData(edata);
	}
	PG_END_TRY();
}

/*
 * Runs one fanout batch in its own transaction, as the extension's owner.
 * Returns the number of items processed, -1 when the extension is not (or
 * no longer) installed in this database or its owner is unfit.  Errors
 * propagate to the caller's recovery block.
 */
static int64
worker_run_batch(MemoryContext loop_cxt)
{
	int64		n = 0;
	StringInfo	hints;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, "im_sync fanout batch");

	if (OidIsValid(get_extension_oid("im_sync", true)) && im_worker_become_owner(&owner_scope))
	{
		/* In the loop context: survives SPI_finish, reset next iteration. */
		MemoryContext old = MemoryContextSwitchTo(loop_cxt);

		hints = makeStringInfo();
		MemoryContextSwitchTo(old);

		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "im_sync: SPI_connect failed");
		/* inbound transfers become local outbox items first */
		im_transfer_apply(IM_WORKER_BATCH);
		/* queued ACKs and reads into receipts, delivered by this batch or the next */
		worker_produce_receipts();
		n = im_fanout_batch(IM_WORKER_BATCH, hints, &batch_claim);
		/* NOTIFY is queued now and delivered at this transaction's commit. */
		im_send_hints(hints);
		SPI_finish();
	}
	else
		n = -1;

	PopActiveSnapshot();
	CommitTransactionCommand();
	im_worker_restore_user(&owner_scope);
	MemoryContextSwitchTo(loop_cxt);
	pgstat_report_stat(false);
	pgstat_report_activity(STATE_IDLE, NULL);
	return n;
}

/*
 * One maintenance transaction, as the extension's owner: a GC chunk
 * (returns true when it ended the round) or, with gc false, im_maintain
 * (returns true).  Does nothing when the extension is not installed here or
 * its owner is unfit (returns true: the round is over).
 */
static bool
worker_maintenance_xact(bool gc, MemoryContext loop_cxt)
{
	bool		round_done = true;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, gc ? "im_sync maintenance: inbox gc chunk"
						   : "im_sync maintenance: key ring and retention");
	if (OidIsValid(get_extension_oid("im_sync", true)) && im_worker_become_owner(&owner_scope))
	{
		if (gc)
			round_done = im_gc_inbox_chunk(IM_WORKER_GC_CHUNK_USERS, NULL);
		else
			im_maintain();
	}
	PopActiveSnapshot();
	CommitTransactionCommand();
	im_worker_restore_user(&owner_scope);
	MemoryContextSwitchTo(loop_cxt);
	pgstat_report_stat(false);
	pgstat_report_activity(STATE_IDLE, NULL);
	return round_done;
}

/*
 * One maintenance turn of the first worker; true while its round is still
 * open (the loop then goes on without sleeping).  Errors propagate.
 */
static bool
worker_maintenance_turn(MemoryContext loop_cxt)
{
	TimestampTz now = GetCurrentTimestamp();

	if (!maintenance_round_open)
	{
		if (maintenance_round_ended != 0 &&
			now < maintenance_round_ended + (TimestampTz) im_maintenance_interval_s * USECS_PER_SEC)
			return false;
		maintenance_round_open = true;
	}
	for (int i = 0; i < IM_WORKER_GC_CHUNKS_PER_TURN; i++)
	{
		if (worker_maintenance_xact(true, loop_cxt))
		{
			(void) worker_maintenance_xact(false, loop_cxt);
			maintenance_round_open = false;
			maintenance_round_ended = GetCurrentTimestamp();
			return false;
		}
	}
	return true;
}

/*
 * Error recovery for a failed transaction, modelled on PostgresMain's:
 * report, abort the transaction (which also unwinds SPI and the snapshot
 * stack), and go on.  Returns a copy of the error in loop_cxt.  FATAL (e.g.
 * SIGTERM via die()) never gets here.
 */
static ErrorData *
worker_recover(MemoryContext loop_cxt)
{
	ErrorData  *edata;

	error_context_stack = NULL;
	HOLD_INTERRUPTS();
	disable_all_timeouts(false);
	QueryCancelPending = false;
	MemoryContextSwitchTo(loop_cxt);
	edata = CopyErrorData();
	EmitErrorReport();
	AbortCurrentTransaction();
	/* the abort restored the identity of the transaction's start; say so */
	im_worker_restore_user(&owner_scope);
	MemoryContextSwitchTo(loop_cxt);
	FlushErrorState();
	pgstat_report_activity(STATE_IDLE, NULL);
	RESUME_INTERRUPTS();
	return edata;
}

/*
 * After a batch failed outside any one item: in a new transaction, back off
 * or charge every item it claimed (im_fanout_batch_failed).  Returns false
 * when nothing was recorded (nothing was claimed, or this transaction
 * failed too); the caller then pauses before the next batch.
 */
static bool
worker_record_batch_failure(MemoryContext loop_cxt, ErrorData *edata)
{
	volatile bool recorded = false;
	bool		fit;

	if (batch_claim.n == 0)
	{
		im_fanout_batch_failed(&batch_claim, edata);	/* only counts it */
		return false;
	}
	PG_TRY();
	{
		SetCurrentStatementStartTimestamp();
		StartTransactionCommand();
		PushActiveSnapshot(GetTransactionSnapshot());
		pgstat_report_activity(STATE_RUNNING, "im_sync fanout: recording a failed batch");
		/* an unfit owner: nothing recorded, the caller pauses */
		fit = im_worker_become_owner(&owner_scope);
		if (fit)
		{
			if (SPI_connect() != SPI_OK_CONNECT)
				elog(ERROR, "im_sync: SPI_connect failed");
			im_fanout_batch_failed(&batch_claim, edata);
			SPI_finish();
		}
		PopActiveSnapshot();
		CommitTransactionCommand();
		im_worker_restore_user(&owner_scope);
		MemoryContextSwitchTo(loop_cxt);
		pgstat_report_activity(STATE_IDLE, NULL);
		recorded = fit;
	}
	PG_CATCH();
	{
		(void) worker_recover(loop_cxt);
	}
	PG_END_TRY();
	return recorded;
}

/*
 * Whether the extension's owner is fit (worker_owner.h), in a transaction
 * of its own; logs when that changes.  An error counts as "wait".
 */
static bool
worker_owner_fit(MemoryContext loop_cxt)
{
	volatile bool fit = false;

	PG_TRY();
	{
		SetCurrentStatementStartTimestamp();
		StartTransactionCommand();
		fit = im_worker_become_owner(&owner_scope);
		im_worker_restore_user(&owner_scope);
		CommitTransactionCommand();
		/* each refusing round shows (a fresh state_change) in pg_stat_activity */
		if (!fit)
			pgstat_report_activity(STATE_IDLE, IM_WORKER_REFUSING_ACTIVITY);
	}
	PG_CATCH();
	{
		(void) worker_recover(loop_cxt);
	}
	PG_END_TRY();
	MemoryContextSwitchTo(loop_cxt);
	return fit;
}

/* im_worker_catalog_matches; an error (e.g. a cancel) counts as "wait" */
static bool
worker_catalog_matches(MemoryContext loop_cxt)
{
	volatile bool matches = false;

	PG_TRY();
	{
		matches = im_worker_catalog_matches();
	}
	PG_CATCH();
	{
		(void) worker_recover(loop_cxt);
	}
	PG_END_TRY();
	MemoryContextSwitchTo(loop_cxt);
	return matches;
}

void
im_fanout_worker_main(Datum main_arg)
{
	int			slot = DatumGetInt32(main_arg);
	MemoryContext loop_cxt;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	im_shmem_publish_worker(slot);

	BackgroundWorkerInitializeConnection(im_database, NULL, 0);
	pgstat_report_appname("im_sync fanout worker");

	loop_cxt = AllocSetContextCreate(TopMemoryContext, "im_sync worker loop",
									 ALLOCSET_DEFAULT_SIZES);
	MemoryContextSwitchTo(loop_cxt);

	for (;;)
	{
		volatile int64 n = 0;
		ErrorData  *volatile failure = NULL;
		volatile bool maintenance_open = false;

		MemoryContextReset(loop_cxt);
		im_fanout_claim_init(&batch_claim, loop_cxt);
		CHECK_FOR_INTERRUPTS();
		worker_reload_if_needed();

		if (im_fanout_paused)
		{
			(void) worker_wait(IM_WORKER_NAPTIME_MS);
			continue;
		}

		/* A standby: wait read-only until promoted (no error loop). */
		if (im_worker_in_recovery())
		{
			(void) worker_wait(IM_WORKER_NAPTIME_MS);
			continue;
		}

		/* New library, old catalog (before ALTER EXTENSION UPDATE): wait. */
		if (!worker_catalog_matches(loop_cxt))
		{
			(void) worker_wait(5 * IM_WORKER_NAPTIME_MS);
			continue;
		}

		/* An owner role someone else could use: refuse to act as it. */
		if (!worker_owner_fit(loop_cxt))
		{
			(void) worker_wait(5 * IM_WORKER_NAPTIME_MS);
			continue;
		}

		if (slot == 0 && im_maintenance_interval_s > 0)
		{
			PG_TRY();
			{
				maintenance_open = worker_maintenance_turn(loop_cxt);
			}
			PG_CATCH();
			{
				/* logged; the next round starts after the usual pause */
				(void) worker_recover(loop_cxt);
				maintenance_round_open = false;
				maintenance_round_ended = GetCurrentTimestamp();
			}
			PG_END_TRY();
		}

		PG_TRY();
		{
			n = worker_run_batch(loop_cxt);
		}
		PG_CATCH();
		{
			failure = worker_recover(loop_cxt);
		}
		PG_END_TRY();

		if (failure != NULL)
		{
			/* Its items now back off: other conversations can go at once. */
			if (!worker_record_batch_failure(loop_cxt, failure))
				(void) worker_wait(IM_WORKER_ERROR_NAPTIME_MS);
		}
		else if (n < 0)
			/* Extension not installed here yet: wait for CREATE EXTENSION. */
			(void) worker_wait(5 * IM_WORKER_NAPTIME_MS);
		else if (batch_claim.n == 0 && !maintenance_open && worker_wait(IM_WORKER_NAPTIME_MS))
		{
			/* Woken by a commit (or a signal): let the burst gather. */
			(void) WaitLatch(NULL, WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
							 IM_WORKER_COALESCE_MS, PG_WAIT_EXTENSION);
			CHECK_FOR_INTERRUPTS();
		}
		/*
		 * Something was claimed or a maintenance round is open: more may be
		 * due, go again at once (what failed backs off, so this cannot spin
		 * on it).
		 */
	}
}
