/*
 * db_hello_batch.c — several queued hellos authenticated in one transaction
 * on one pool connection (for the reconnect storm).
 *
 * Why: im.authenticate NOTIFYs im_sync_device, and PostgreSQL holds the
 * notify queue's lock from before the commit record until after its flush,
 * so NOTIFYing transactions never share a flush: one hello a commit is one
 * fdatasync a hello.  A batch of n hellos is one commit and one NOTIFY
 * commit for all n.
 *
 * What stays true for each hello as if it ran alone (auth.c's rules):
 *   - each runs under a savepoint of its own, so a failed one (bad token:
 *     28000, counted and logged by the extension) is rolled back to its
 *     savepoint alone and answered alone; the hellos after it run again in
 *     the next pipeline segment (after an error a pipeline skips the rest);
 *     a failed BEGIN, ROLLBACK TO or SAVEPOINT fails the whole batch
 *     (UNAVAILABLE, the connection is reset): a savepoint that was never
 *     made cannot be rolled back to without undoing the hello before it;
 *   - every succeeded hello goes to the lws thread with the transaction
 *     open, which checks its limits and decides COMMIT or ROLLBACK per
 *     hello; nothing commits before every one of them is decided;
 *   - a hello refused there must leave no trace (no epoch bump, no
 *     SUPERSEDED): a savepoint cannot undo one hello in the middle without
 *     the later ones, so the whole batch is rolled back and the hellos that
 *     were to be committed run again (im_job.admitted: their limits are not
 *     checked twice), in a batch of admitted hellos only, where none can be
 *     refused again;
 *   - nothing is welcomed before the COMMIT answered (the job comes back
 *     once more, as in the single path); a lost connection answers every
 *     hello of the batch UNAVAILABLE, none is welcomed.
 * A batch of one is never made: a lone hello takes the single path.
 *
 * One pipeline segment: [BEGIN | ROLLBACK TO SAVEPOINT] then, per hello
 * still to run, SAVEPOINT and the hello statement, then a Sync.  Every
 * command gives exactly one result (COMMAND_OK, TUPLES_OK, an error, or
 * PIPELINE_ABORTED after an error); NULLs separate them.
 */
#include "server/db/db_internal.h"
#include "common/log.h"

#include <stdlib.h>
#include <string.h>

#define SAVEPOINT_NAME "im_hello"

#ifdef IM_GW_FAULTS
/*
 * Test build only (im_gateway_faults, gateway/Makefile):
 * IM_GW_FAULT_BATCH_SAVEPOINT=k makes the savepoint before hello k (from 0)
 * of a batch's first segment fail on the server (3B001), as a failing
 * SAVEPOINT would.
 */
static const char *
savepoint_sql(int first, int i)
{
	const char *k = getenv("IM_GW_FAULT_BATCH_SAVEPOINT");

	if (first == 0 && k && *k && atoi(k) == i)
		return "ROLLBACK TO SAVEPOINT im_hello_no_such_savepoint";
	return "SAVEPOINT " SAVEPOINT_NAME;
}
#else
#define savepoint_sql(first, i) ("SAVEPOINT " SAVEPOINT_NAME)
#endif

/* Sends the segment that runs hellos first..n-1, after lead. */
static void
send_segment(dbconn *c, const char *lead, int first)
{
	hello_batch *b = &c->batch;
	int			i,
				ok;

	b->seg_first = first;
	b->seg_cmd = 0;
	b->failed = -1;
	ok = PQenterPipelineMode(c->pg) &&
		PQsendQueryParams(c->pg, lead, 0, NULL, NULL, NULL, NULL, 0);
	for (i = first; ok && i < b->n; i++)
		ok = PQsendQueryParams(c->pg, savepoint_sql(first, i), 0, NULL, NULL, NULL, NULL, 0) &&
			im_conn_send_job(c, b->job[i]);
	ok = ok && PQpipelineSync(c->pg);
	c->st = C_BUSY;
	c->t_sent = im_now();
	im_conn_sent(c, ok);		/* takes c down (and answers the batch) when it failed */
}

void
im_batch_start(dbconn *c, im_job **jobs, int n)
{
	hello_batch *b = &c->batch;
	int			i;

	memset(b, 0, sizeof(*b));
	b->n = n;
	for (i = 0; i < n; i++)
	{
		b->job[i] = jobs[i];
		b->st[i] = HB_RUNNING;
	}
	im_db_stats_g.hello_batches++;
	im_db_stats_g.hellos_batched += n;
	c->preparing = 0;
	c->unreplicated = 0;
	c->txn = TXN_BATCH;
	send_segment(c, "BEGIN", 0);
}

/*
 * Hellos of one device twice in the batch: the earlier ones are superseded
 * at the batch's commit (columns 0 and 1 of the hello result: user and
 * device).  hello_order.h keeps a device's second hello out of a batch its
 * first is in when its token was accepted before; this stays for tokens
 * not accepted yet or whose claims the gateway could not read.  n is at
 * most 32, so pairs are cheap.
 */
static void
mark_superseded(hello_batch *b)
{
	int			i,
				k;

	for (i = 0; i < b->n; i++)
	{
		if (b->st[i] != HB_RUNNING || PQntuples(b->res[i]) != 1)
			continue;
		for (k = i + 1; k < b->n; k++)
			if (b->st[k] == HB_RUNNING && PQntuples(b->res[k]) == 1 &&
				strcmp(PQgetvalue(b->res[i], 0, 0), PQgetvalue(b->res[k], 0, 0)) == 0 &&
				strcmp(PQgetvalue(b->res[i], 0, 1), PQgetvalue(b->res[k], 0, 1)) == 0)
			{
				b->job[i]->superseded_in_batch = 1;
				break;
			}
	}
}

/* Every hello has its statement's answer: hand the succeeded ones over. */
static void
hold_batch(dbconn *c)
{
	hello_batch *b = &c->batch;
	uint64_t	hold = ++c->hold_id;
	double		dt = im_now() - c->t_sent;
	int			i;

	im_conn_observe(dt);
	b->undecided = 0;
	for (i = 0; i < b->n; i++)
	{
		if (b->st[i] == HB_RUNNING && !b->res[i])
		{
			/* no answer of its own (cannot happen): not held, not welcomed */
			b->st[i] = HB_GONE;
			im_db_finish_job(b->job[i], IM_JOB_UNAVAILABLE, NULL);
		}
		else if (b->st[i] == HB_RUNNING)
			b->undecided++;
	}
	if (b->undecided == 0)
	{
		/* every hello failed: nothing to keep */
		b->ending = 1;
		c->st = C_BUSY;
		c->t_sent = im_now();
		im_conn_sent(c, PQsendQuery(c->pg, "ROLLBACK"));
		return;
	}
	c->st = C_HELD;
	mark_superseded(b);
	for (i = 0; i < b->n; i++)
	{
		im_job	   *j = b->job[i];
		PGresult   *r = b->res[i];

		if (b->st[i] != HB_RUNNING)
			continue;
		b->res[i] = NULL;
		b->st[i] = HB_HELD;
		j->db_seconds = dt;
		j->txn_held = 1;
		j->txn_conn = (int) (c - im_db_conns);
		j->txn_hold = hold;
		im_db_finish_job(j, IM_JOB_OK, r);	/* the lws thread's from here */
	}
}

/* The segment's Sync arrived: the failed hello is answered, the rest run on. */
static void
segment_done(dbconn *c)
{
	hello_batch *b = &c->batch;
	int			f = b->failed;
	PGresult   *fr = b->fail_res;

	if (!PQexitPipelineMode(c->pg))
	{
		im_conn_down(c, PQerrorMessage(c->pg));
		return;
	}
	b->fail_res = NULL;
	if (f == -2)
	{
		/*
		 * BEGIN, ROLLBACK TO or a SAVEPOINT failed: the transaction cannot
		 * go on, and no hello of the batch is welcomed (all UNAVAILABLE)
		 */
		if (fr)
			PQclear(fr);
		im_conn_down(c, "hello batch transaction failed");
		return;
	}
	if (f < 0)
	{
		hold_batch(c);
		return;
	}
	/* only this hello's savepoint is undone; the hellos after it run again */
	b->st[f] = HB_GONE;
	if (im_conn_answer(c, b->job[f], fr) < 0)
		return;					/* c went down (the batch with it) */
	send_segment(c, "ROLLBACK TO SAVEPOINT " SAVEPOINT_NAME, f + 1);
}

/* The batch's COMMIT or ROLLBACK answered: deliver, free or run again. */
static void
batch_ended(dbconn *c)
{
	hello_batch *b = &c->batch;
	PGresult   *r = b->fail_res;
	int			committed = r && PQresultStatus(r) == PGRES_COMMAND_OK &&
		strcmp(PQcmdStatus(r), "COMMIT") == 0 && !c->unreplicated;
	int			i;

	if (r)
		PQclear(r);
	b->fail_res = NULL;
	for (i = b->n - 1; i >= 0; i--)		/* requeued in their order */
	{
		im_job	   *j = b->job[i];

		if (b->st[i] == HB_ROLLBACK)
			im_db_free_ended(j);
		else if (b->st[i] == HB_COMMIT && b->rerun)
		{
			/* decided COMMIT, rolled back with a refused one: again */
			if (j->res)
				PQclear(j->res);
			j->res = NULL;
			j->status = IM_JOB_OK;
			j->txn_held = j->txn_ended = j->txn_commit = 0;
			j->superseded_in_batch = 0;
			j->admitted = 1;
			im_db_requeue_front(j);
		}
		else if (b->st[i] == HB_COMMIT)
		{
			/* res of the job stays its statement's result */
			j->status = committed ? IM_JOB_OK : IM_JOB_UNAVAILABLE;
			im_db_post_done(j);
		}
	}
	memset(b, 0, sizeof(*b));
	c->txn = TXN_NONE;
	c->st = C_IDLE;
	c->unreplicated = 0;
}

void
im_batch_result(dbconn *c, PGresult *r)
{
	hello_batch *b = &c->batch;
	int			ci,
				i;

	if (b->ending)
	{
		/* COMMIT/ROLLBACK: its one result, then NULL */
		if (r == NULL)
			batch_ended(c);
		else if (b->fail_res)
			PQclear(r);
		else
			b->fail_res = r;
		return;
	}
	if (r == NULL)
		return;
	if (PQresultStatus(r) == PGRES_PIPELINE_SYNC)
	{
		PQclear(r);
		segment_done(c);
		return;
	}
	/*
	 * Command 0 is the lead, then each hello's SAVEPOINT and statement.  Only
	 * a failed statement is the hello's own (i); a failed lead or SAVEPOINT
	 * is the transaction's (-2): after a failed SAVEPOINT, ROLLBACK TO would
	 * reach the savepoint before it and undo the previous hello, whose
	 * result is kept and would still be welcomed.
	 */
	ci = b->seg_cmd++;
	i = ci > 0 && (ci - 1) % 2 == 1 ? b->seg_first + (ci - 1) / 2 : -2;
	if (PQresultStatus(r) == PGRES_FATAL_ERROR && b->failed == -1)
	{
		b->failed = i;
		b->fail_res = r;
		return;
	}
	if (i >= 0 && PQresultStatus(r) == PGRES_TUPLES_OK && b->failed == -1)
	{
		b->res[i] = r;			/* the hello statement's answer */
		return;
	}
	PQclear(r);					/* BEGIN, SAVEPOINT, or aborted after the error */
}

void
im_batch_decided(dbconn *c, im_job *j)
{
	hello_batch *b = &c->batch;
	int			i,
				refused = 0;

	for (i = 0; i < b->n; i++)
		if (b->job[i] == j && b->st[i] == HB_HELD)
			break;
	if (i == b->n)
	{
		im_log("error", "event=hello_batch_unknown_job");
		return;
	}
	b->st[i] = j->txn_commit ? HB_COMMIT : HB_ROLLBACK;
	if (--b->undecided > 0)
		return;
	for (i = 0; i < b->n; i++)
		refused += b->st[i] == HB_ROLLBACK;
	b->rerun = refused > 0;
	if (b->rerun)
		im_db_stats_g.hello_batch_reruns++;
	b->ending = 1;
	c->st = C_BUSY;
	c->unreplicated = 0;
	c->t_sent = im_now();
	im_conn_sent(c, PQsendQuery(c->pg, refused ? "ROLLBACK" : "COMMIT"));
}

void
im_batch_lost(dbconn *c)
{
	hello_batch *b = &c->batch;
	int			i;

	for (i = 0; i < b->n; i++)
	{
		if (b->res[i])
			PQclear(b->res[i]);
		if (b->st[i] == HB_RUNNING || b->st[i] == HB_COMMIT)
			im_db_finish_job(b->job[i], IM_JOB_UNAVAILABLE, NULL);	/* as a lone hello's */
		else if (b->st[i] == HB_ROLLBACK)
			im_db_free_ended(b->job[i]);	/* a ROLLBACK never comes back */
		/* HB_HELD: the lws thread's; its decision finds the hold gone */
	}
	if (b->fail_res)
		PQclear(b->fail_res);
	memset(b, 0, sizeof(*b));
}
