/*
 * db_conn.c — the state machine of one libpq connection of the database
 * thread: connect (PQconnectStartParams/PQconnectPoll), session setup,
 * prepared statements, a job's results, explicit transactions held for the
 * lws thread (hellos), and going down with backoff.
 *
 * Failure rules (contract §10): a lost connection answers every job on it
 * UNAVAILABLE (the outcome of a send is then unknown; send is idempotent by
 * client_msg_id, so the client retries); 40001/40P01 are retried up to
 * MAX_ATTEMPTS times; 08*, 57P* and 57014 answer UNAVAILABLE; so do 25006
 * (a read-only server: the connection goes, the next one looks for the
 * primary) and a commit whose synchronous-replication wait was cancelled.
 * Deadlines (im_conn_check_deadlines): connecting longer than
 * connect_timeout, or a reply later than the statement timeout + grace,
 * takes the connection down, so a silent server never holds a call
 * (following a primary: between its death and the promotion clients get
 * UNAVAILABLE, never a hang).
 */
#include "server/db/db_internal.h"
#include "common/log.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ATTEMPTS 3
/*
 * A running job whose reply has not come statement_timeout + this long
 * after it was sent: the server (or the network to it) is gone without a
 * word, e.g. a primary frozen or cut off mid-call; answer UNAVAILABLE
 * instead of waiting for TCP to notice.
 */
#define IM_DB_REPLY_GRACE_S 5.0
/* Reconnect backoff: 0.25 s doubling up to this, so a promoted standby is
 * found within about a second of accepting writes. */
#define IM_DB_MAX_BACKOFF_S 1.0

void
im_conn_down(dbconn *c, const char *why)
{
	if (c->pg)
	{
		if (c->node >= 0)
			im_log("warn", "event=db_conn_lost conn=listen node=%s reason=\"%s\"",
				   im_node_name(c->node), why);
		else
			im_log("warn", "event=db_conn_lost conn=%s reason=\"%s\"",
				   c->listen ? "listen" : "pool", why);
		PQfinish(c->pg);
	}
	c->pg = NULL;
	c->st = C_DOWN;
	c->want_write = 0;
	if (c->res)
		PQclear(c->res);
	c->res = NULL;
	if (c->txn_saved)
		PQclear(c->txn_saved);
	c->txn_saved = NULL;
	if (c->txn == TXN_BATCH)
		im_batch_lost(c);
	c->txn = TXN_NONE;			/* the server rolls back an open transaction */
	c->lq = LQ_NONE;
	if (c->job)
	{
		if (c->job->txn_ended && !c->job->txn_commit)
			im_db_free_ended(c->job);	/* a ROLLBACK never comes back */
		else
			im_db_finish_job(c->job, IM_JOB_UNAVAILABLE, NULL);
		c->job = NULL;
	}
	c->backoff = c->backoff <= 0 ? 0.25 :
		(c->backoff * 2 > IM_DB_MAX_BACKOFF_S ? IM_DB_MAX_BACKOFF_S : c->backoff * 2);
	c->retry_at = im_now() + c->backoff;
	if (c->listen)
		im_listen_update_ready();
	else
		im_db_pool_changed();
}

/*
 * libpq prints notices (and a FATAL sent outside a query) to stderr by
 * default; route them into the structured log instead.  One notice changes
 * the answer: a commit whose wait for the synchronous standby was
 * cancelled (statement_timeout, a cancel) is committed on the primary only,
 * and the server still reports success; the job is answered UNAVAILABLE
 * instead, so the gateway never confirms what the synchronous standby was
 * not shown to hold (the client's retry finds it by client_msg_id).
 */
static void
notice_receiver(void *arg, const PGresult *res)
{
	dbconn	   *c = arg;
	const char *msg = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);

	im_log("warn", "event=db_notice msg=\"%s\"", PQresultErrorMessage(res));
	if (msg && strstr(msg, "wait for synchronous replication"))
		c->unreplicated = 1;
}

void
im_conn_start(dbconn *c)
{
	const char *kw[65];
	const char *val[65];
	char		buf[4096];

	im_conninfo_params(c->ci, c->first_host, c->listen ? "im_gateway_listen" : "im_gateway",
					   kw, val, buf, sizeof(buf));
	c->nprepared = 0;
	c->preparing = 0;
	c->unreplicated = 0;
	c->connect_deadline = c->ci->connect_timeout > 0 ? im_now() + c->ci->connect_timeout : 0;
	c->pg = PQconnectStartParams(kw, val, 0);
	if (!c->pg || PQstatus(c->pg) == CONNECTION_BAD)
	{
		im_conn_down(c, c->pg ? PQerrorMessage(c->pg) : "out of memory");
		return;
	}
	PQsetNoticeReceiver(c->pg, notice_receiver, c);
	c->st = C_CONNECTING;
	c->want_write = 1;
	im_db_stats_g.reconnects++;
}

int
im_conn_sent(dbconn *c, int ok)
{
	if (!ok)
	{
		im_conn_down(c, PQerrorMessage(c->pg));
		return 0;
	}
	c->want_write = PQflush(c->pg) == 1;
	return 1;
}

/*
 * No call may hold a pool connection (and the locks it took) unboundedly
 * (contract §12): every pool connection gets the statement timeout before
 * its first job; 57014 answers UNAVAILABLE.  Replies are JSON text, so
 * results come as UTF-8.
 */
static int
pool_setup_send(dbconn *c)
{
	char		setup[128];

	snprintf(setup, sizeof(setup),
			 "SET statement_timeout = %d; SET client_encoding = 'UTF8'",
			 im_db_statement_timeout_ms);
	return PQsendQuery(c->pg, setup);
}

/* Connected: the setup (LISTEN, or the pool's settings) comes first. */
static void
conn_ready(dbconn *c)
{
	PQsetnonblocking(c->pg, 1);
	c->backoff = 0;
	if (im_conn_sent(c, c->listen ? im_listen_send(c) : pool_setup_send(c)))
		c->st = C_SETUP;
}

/* The pool setup's results are in (a LISTEN connection's: db_listen.c).
 * Returns 0 when c went down. */
static int
setup_done(dbconn *c)
{
	int			ok = !c->res || PQresultStatus(c->res) == PGRES_COMMAND_OK;

	if (c->res)
		PQclear(c->res);
	c->res = NULL;
	if (!ok)
	{
		im_conn_down(c, "session setup failed");
		return 0;
	}
	c->st = C_IDLE;
	im_db_pool_changed();
	im_log("info", "event=db_conn_ready conn=pool");
	return 1;
}


/* The index of sql among c's prepared statements, -1 when not prepared. */
static int
prepared_index(const dbconn *c, const char *sql)
{
	int			i;

	for (i = 0; i < c->nprepared; i++)
		if (c->prepared[i] == sql)
			return i;
	return -1;
}

int
im_conn_is_prepared(const dbconn *c, const char *sql)
{
	return prepared_index(c, sql) >= 0;
}

int
im_conn_send_job(dbconn *c, im_job *j)
{
	const char *vals[8];
	char		name[16];
	int			i = prepared_index(c, j->sql);

	if (i >= 0)
	{
		int			k;

		snprintf(name, sizeof(name), "s%d", i);
		for (k = 0; k < j->nparams; k++)
			vals[k] = j->params[k];
		return PQsendQueryPrepared(c->pg, name, j->nparams, vals, NULL, NULL, 0);
	}
	if (c->nprepared < MAX_PREPARED)
	{
		/* parameter types come from the casts in the statement text */
		snprintf(name, sizeof(name), "s%d", c->nprepared);
		c->preparing = 1;
		return PQsendPrepare(c->pg, name, j->sql, j->nparams, NULL);
	}
	for (i = 0; i < j->nparams; i++)
		vals[i] = j->params[i];
	return PQsendQueryParams(c->pg, j->sql, j->nparams, NULL, vals, NULL, NULL, 0);
}

void
im_conn_dispatch(dbconn *c, im_job *j)
{
	int			sent;

	c->preparing = 0;
	c->unreplicated = 0;
	if (j->txn && prepared_index(c, j->sql) >= 0)
	{
		/*
		 * BEGIN and the prepared statement in one round trip: the Sync
		 * after them does not end the transaction BEGIN opened, so it stays
		 * open for the lws thread's decision as in the two-trip path.
		 */
		c->txn = TXN_PIPE;
		c->pipe_nulls = 0;
		sent = PQenterPipelineMode(c->pg) &&
			PQsendQueryParams(c->pg, "BEGIN", 0, NULL, NULL, NULL, NULL, 0) &&
			im_conn_send_job(c, j) && PQpipelineSync(c->pg);
	}
	else if (j->txn)
	{
		c->txn = TXN_BEGIN;
		sent = PQsendQuery(c->pg, "BEGIN");
	}
	else
		sent = im_conn_send_job(c, j);
	if (!sent)
	{
		/* the query never left: try it on another connection */
		im_db_requeue_front(j);
		im_conn_down(c, PQerrorMessage(c->pg));
		return;
	}
	c->job = j;
	c->st = C_BUSY;
	c->t_sent = im_now();
	c->want_write = PQflush(c->pg) == 1;
}

void
im_conn_observe(double s)
{
	int			i;

	for (i = 0; i < 11 && s > im_db_hist_bounds[i]; i++)
		;
	im_db_stats_g.hist[i]++;
	im_db_stats_g.hist_sum += s;
	im_db_stats_g.hist_count++;
}

/* The running job leaves c (answered or held): its round trip is counted. */
static im_job *
take_running_job(dbconn *c)
{
	im_job	   *j = c->job;
	double		dt = im_now() - c->t_sent;

	im_conn_observe(dt);
	j->db_seconds = dt;
	c->job = NULL;
	c->preparing = 0;
	return j;
}

static void
job_result_done(dbconn *c)
{
	im_job	   *j = take_running_job(c);
	PGresult   *res = c->res;

	c->res = NULL;
	c->st = C_IDLE;
	im_conn_answer(c, j, res);
}

int
im_conn_answer(dbconn *c, im_job *j, PGresult *res)
{
	if (c->unreplicated)
	{
		c->unreplicated = 0;
		if (res)
			PQclear(res);
		snprintf(j->sqlstate, sizeof(j->sqlstate), "57014");
		im_db_finish_job(j, IM_JOB_UNAVAILABLE, NULL);
		return 0;
	}
	if (res && PQresultStatus(res) == PGRES_FATAL_ERROR)
	{
		const char *ss = PQresultErrorField(res, PG_DIAG_SQLSTATE);

		/*
		 * 25006: this server is read-only (a standby, e.g. the conninfo
		 * has no target_session_attrs and reached one).  Unavailable, and
		 * the connection goes: the next one looks for the primary again.
		 */
		if (ss && strcmp(ss, "25006") == 0)
		{
			PQclear(res);
			im_db_finish_job(j, IM_JOB_UNAVAILABLE, NULL);
			im_conn_down(c, "server is read-only");
			return -1;
		}

		if (ss && (strcmp(ss, "40001") == 0 || strcmp(ss, "40P01") == 0) &&
			++j->attempts < MAX_ATTEMPTS)
		{
			PQclear(res);
			im_db_requeue_front(j);
			return 0;
		}
		if (ss && (strcmp(ss, "40001") == 0 || strcmp(ss, "40P01") == 0))
		{
			PQclear(res);
			im_db_finish_job(j, IM_JOB_UNAVAILABLE, NULL);
			return 0;
		}
		/* admin shutdown, crash recovery, connection failure, statement
		 * timeout or cancel (57014): unavailable, the client retries */
		if (ss && (strncmp(ss, "08", 2) == 0 || strncmp(ss, "57P", 3) == 0 ||
				   strcmp(ss, "57014") == 0))
		{
			/* kept so the reply can say why */
			snprintf(j->sqlstate, sizeof(j->sqlstate), "%s", ss);
			PQclear(res);
			im_db_finish_job(j, IM_JOB_UNAVAILABLE, NULL);
			return 0;
		}
	}
	if (!res)
	{
		im_db_finish_job(j, IM_JOB_UNAVAILABLE, NULL);
		return 0;
	}
	im_db_finish_job(j, IM_JOB_OK, res);
	return 0;
}

/*
 * The next step of a txn job once the current step's results are in.
 * Returns 1 when another query was sent on c (results to wait for).
 */
static int
txn_step(dbconn *c)
{
	im_job	   *j = c->job;
	PGresult   *res = c->res;

	c->res = NULL;
	switch (c->txn)
	{
		case TXN_BEGIN:
			if (!res || PQresultStatus(res) != PGRES_COMMAND_OK)
			{
				c->txn = TXN_NONE;	/* nothing opened */
				c->res = res;
				job_result_done(c);
				return 0;
			}
			PQclear(res);
			c->txn = TXN_STMT;
			return im_conn_sent(c, im_conn_send_job(c, j));
		case TXN_STMT:
			if (res && PQresultStatus(res) == PGRES_TUPLES_OK)
			{
				/* hold the transaction open for the lws thread's decision */
				take_running_job(c);
				c->txn = TXN_NONE;
				c->st = C_HELD;
				j->txn_held = 1;
				j->txn_conn = (int) (c - im_db_conns);
				j->txn_hold = ++c->hold_id;
				im_db_finish_job(j, IM_JOB_OK, res);
				return 0;
			}
			/* failed: roll back first, then answer (or retry) as usual */
			c->txn_saved = res;
			c->txn = TXN_ABORT;
			return im_conn_sent(c, PQsendQuery(c->pg, "ROLLBACK"));
		case TXN_ABORT:
			if (res)
				PQclear(res);
			c->res = c->txn_saved;
			c->txn_saved = NULL;
			c->txn = TXN_NONE;
			job_result_done(c);
			return 0;
		case TXN_END:
			c->job = NULL;
			c->st = C_IDLE;
			c->txn = TXN_NONE;
			if (j->txn_commit)
			{
				/* res of the job stays the statement's result */
				j->status = res && PQresultStatus(res) == PGRES_COMMAND_OK && !c->unreplicated ?
					IM_JOB_OK : IM_JOB_UNAVAILABLE;
				im_db_post_done(j);
			}
			else
				im_db_free_ended(j);
			if (res)
				PQclear(res);
			return 0;
		case TXN_NONE:
		case TXN_PIPE:			/* pipe_result turns it into TXN_STMT first */
		case TXN_BATCH:			/* db_hello_batch.c's */
			break;
	}
	c->res = res;
	job_result_done(c);
	return 0;
}

/* im_db_end_txn's job arrived: COMMIT or ROLLBACK on the connection it holds. */
void
im_conn_end_txn(im_job *j)
{
	dbconn	   *c = &im_db_conns[j->txn_conn];

	if (c->st != C_HELD || c->hold_id != j->txn_hold)
	{
		/* connection lost meanwhile: the server rolled the transaction back */
		if (j->txn_commit)
			im_db_finish_job(j, IM_JOB_UNAVAILABLE, NULL);
		else
			im_db_free_ended(j);
		return;
	}
	if (c->txn == TXN_BATCH)
	{
		im_batch_decided(c, j);
		return;
	}
	c->job = j;
	c->st = C_BUSY;
	c->txn = TXN_END;
	c->unreplicated = 0;
	c->t_sent = im_now();
	im_conn_sent(c, PQsendQuery(c->pg, j->txn_commit ? "COMMIT" : "ROLLBACK"));
}


void
im_conn_keep_result(dbconn *c, PGresult *r)
{
	if (!c->res || (PQresultStatus(r) == PGRES_FATAL_ERROR &&
					PQresultStatus(c->res) != PGRES_FATAL_ERROR))
	{
		if (c->res)
			PQclear(c->res);
		c->res = r;
	}
	else
		PQclear(r);
}

/*
 * One PQgetResult of a TXN_PIPE hello (r may be NULL).  Keeps BEGIN's
 * result only when it failed (the statement then comes back aborted) and
 * the statement's result; at the Sync leaves pipeline mode and returns 1:
 * the statement's outcome is in c->res and the hello goes on as TXN_STMT.
 */
static int
pipe_result(dbconn *c, PGresult *r)
{
	if (r == NULL)
	{
		c->pipe_nulls++;
		return 0;
	}
	if (PQresultStatus(r) != PGRES_PIPELINE_SYNC)
	{
		if (c->pipe_nulls == 0 && PQresultStatus(r) != PGRES_FATAL_ERROR)
			PQclear(r);			/* BEGIN went through */
		else
			im_conn_keep_result(c, r);
		return 0;
	}
	PQclear(r);
	if (!PQexitPipelineMode(c->pg))
	{
		im_conn_down(c, PQerrorMessage(c->pg));
		return 0;
	}
	c->txn = TXN_STMT;
	return 1;
}

/*
 * The running statement's results are all in (PQgetResult gave NULL): the
 * next step.  Returns 1 when another query was sent on c, 0 when c waits
 * for work, -1 when c went down.
 */
static int
results_complete(dbconn *c)
{
	if (c->st == C_SETUP)
		return setup_done(c) ? 0 : -1;
	if (c->preparing && c->res && PQresultStatus(c->res) == PGRES_COMMAND_OK)
	{
		/* statement prepared: now run the job with it */
		PQclear(c->res);
		c->res = NULL;
		c->prepared[c->nprepared++] = c->job->sql;
		c->preparing = 0;
		return im_conn_sent(c, im_conn_send_job(c, c->job)) ? 1 : -1;
	}
	if (c->txn != TXN_NONE)
		return txn_step(c);
	job_result_done(c);			/* a failed prepare answers the job */
	return 0;
}

/* Poll found c's socket ready (revents): connect, flush, read results. */
void
im_conn_io(dbconn *c, short revents)
{
	if (c->st == C_CONNECTING)
	{
		PostgresPollingStatusType r = PQconnectPoll(c->pg);

		if (r == PGRES_POLLING_FAILED)
			im_conn_down(c, PQerrorMessage(c->pg));
		else if (r == PGRES_POLLING_OK)
			conn_ready(c);
		else
			c->want_write = (r == PGRES_POLLING_WRITING);
		return;
	}
	if (revents & POLLOUT)
	{
		int			f = PQflush(c->pg);

		if (f < 0)
		{
			im_conn_down(c, PQerrorMessage(c->pg));
			return;
		}
		c->want_write = (f == 1);
	}
	if (revents & (POLLIN | POLLERR | POLLHUP))
	{
		if (!PQconsumeInput(c->pg))
		{
			im_conn_down(c, PQerrorMessage(c->pg));
			return;
		}
		if (c->listen)
		{
			im_listen_drain(c);
			im_listen_results(c);
			if (c->pg && PQstatus(c->pg) == CONNECTION_BAD)
				im_conn_down(c, "connection bad");
			return;
		}
		while ((c->st == C_BUSY || c->st == C_SETUP) && !PQisBusy(c->pg))
		{
			PGresult   *r = PQgetResult(c->pg);
			int			next;

			if (c->txn == TXN_BATCH)
			{
				im_batch_result(c, r);
				if (!c->pg)
					return;		/* went down */
				continue;
			}
			if (c->txn == TXN_PIPE)
			{
				if (!pipe_result(c, r))
					continue;
				if (txn_step(c) <= 0)
					break;		/* held, answered or down */
				continue;		/* ROLLBACK of a failed statement sent */
			}
			if (r != NULL)
			{
				im_conn_keep_result(c, r);
				continue;
			}
			next = results_complete(c);
			if (next < 0)
				return;
			if (next == 0)
				break;
		}
		if (c->pg && PQstatus(c->pg) == CONNECTION_BAD)
			im_conn_down(c, "connection bad");
	}
}

void
im_conn_check_deadlines(dbconn *c, double now)
{
	if ((c->st == C_CONNECTING || c->st == C_SETUP) && c->connect_deadline > 0 &&
		now > c->connect_deadline)
	{
		/* the next attempt starts at the next host: this one never answered */
		c->first_host = (c->first_host + 1) % c->ci->nhosts;
		im_conn_down(c, "connect timeout");
	}
	else if (c->st == C_BUSY && im_db_statement_timeout_ms > 0 &&
			 !c->listen && now > c->t_sent + im_db_statement_timeout_ms / 1000.0 + IM_DB_REPLY_GRACE_S)
	{
		if (c->job)
			snprintf(c->job->sqlstate, sizeof(c->job->sqlstate), "57014");
		im_conn_down(c, "no reply within the statement timeout");
	}
	else if (c == IM_DB_ROUTER_LISTEN)
		im_listen_tick(c, now);
}
