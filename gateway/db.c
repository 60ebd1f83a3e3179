/*
 * db.c — the database thread of im_gateway.
 *
 * One thread polls a pool of non-blocking libpq connections
 * (PQconnectStartParams/PQconnectPoll, PQsendQueryParams, PQflush,
 * PQconsumeInput/PQisBusy/PQgetResult) and one LISTEN connection
 * (im_sync_hint, im_sync_device).  Jobs come from the lws thread through a
 * mutex-protected queue and a wake pipe; finished jobs go back through a
 * second queue and the lws thread is woken with lws_cancel_service.
 *
 * Why a thread and not fd adoption into lws: libpq may change its socket
 * while connecting and after a server restart, and a separate thread keeps
 * the JSON encoding of large result sets off the websocket loop.
 *
 * Failure rules (contract §10): a lost connection answers every job on it
 * UNAVAILABLE (the outcome of a send is then unknown; send is idempotent by
 * client_msg_id, so the client retries); 40001/40P01 are retried here up
 * to three times; connections come back by themselves with backoff.
 */
#include "db.h"
#include "json_splice.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_CONNS 64
#define MAX_ATTEMPTS 3
#define MAX_QUEUE 20000
#define MAX_PREPARED 64			/* distinct statements per connection */
#define IM_MAX_RAW 16			/* json/jsonb columns in one result row */

const double im_db_hist_bounds[11] = {0.001, 0.002, 0.005, 0.01, 0.02, 0.05,
0.1, 0.2, 0.5, 1.0, 2.0};
im_db_stats im_db_stats_g;

typedef enum
{
	C_DOWN, C_CONNECTING, C_SETUP, C_IDLE, C_BUSY,
	C_HELD						/* transaction open, waiting for im_db_end_txn */
} cstate;

/* Where a txn job (im_job.txn) is on its connection. */
typedef enum
{
	TXN_NONE, TXN_BEGIN, TXN_STMT, TXN_ABORT, TXN_END
} txn_stage;

typedef struct dbconn
{
	PGconn	   *pg;
	cstate		st;
	int			listen;			/* the LISTEN connection */
	int			want_write;		/* connecting or flushing wants POLLOUT */
	double		retry_at;
	double		backoff;
	im_job	   *job;
	double		t_sent;
	PGresult   *res;			/* first result of the running job */
	/*
	 * Statements prepared on this connection, by the address of their static
	 * text (every statement is a static string): "s<index>".  A job whose
	 * statement is new first sends PQsendPrepare (preparing = 1), then runs
	 * prepared, so no call is parsed and planned again per request.
	 */
	const char *prepared[MAX_PREPARED];
	int			nprepared;
	int			preparing;
	txn_stage	txn;
	uint64_t	hold_id;		/* bumped per hold: a stale im_db_end_txn never matches */
	PGresult   *txn_saved;		/* failed statement's result while ROLLBACK runs */
} dbconn;

static char *g_conninfo;
static int	g_npool;
static int	g_statement_timeout_ms = IM_DB_DEFAULT_STATEMENT_TIMEOUT_MS;
static dbconn g_conns[MAX_CONNS + 1];	/* [0..npool) pool, [npool] listen */
static pthread_t g_thread;
static int	g_wake_pipe[2] = {-1, -1};
static volatile int g_stop;
static void (*g_wake) (void *);
static void *g_wake_arg;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static im_job *g_in_head, *g_in_tail;	/* lws -> db */
static im_job *g_done_head, *g_done_tail;	/* db -> lws */

/* db-thread private FIFO of jobs waiting for a connection */
static im_job *q_head, *q_tail;
static int	q_len;

double
im_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

im_job *
im_job_new(im_job_kind kind, uint64_t sid)
{
	im_job	   *j = calloc(1, sizeof(im_job));

	if (!j)
		abort();
	j->kind = kind;
	j->sid = sid;
	return j;
}

char *
im_param_int64(int64_t v)
{
	char		b[32];

	snprintf(b, sizeof(b), "%" PRId64, v);
	return strdup(b);
}

void
im_job_free(im_job *job)
{
	int			i;

	if (!job)
		return;
	for (i = 0; i < job->nparams; i++)
		free(job->params[i]);
	if (job->id)
		json_decref(job->id);
	free(job->errmsg);
	if (job->res)
		PQclear(job->res);
	free(job->reply);
	free(job->channel);
	free(job->payload);
	free(job);
}

void
im_db_submit(im_job *job)
{
	char		c = 1;

	int			was_empty;

	job->next = NULL;
	job->t_submit = im_now();
	pthread_mutex_lock(&g_lock);
	was_empty = g_in_head == NULL;
	if (g_in_tail)
		g_in_tail->next = job;
	else
		g_in_head = job;
	g_in_tail = job;
	pthread_mutex_unlock(&g_lock);
	/* a non-empty queue already has a wake-up on its way */
	if (was_empty && write(g_wake_pipe[1], &c, 1) < 0 && errno != EAGAIN)
		im_log("error", "event=wake_pipe_failed errno=%d", errno);
}

im_job *
im_db_take_done(void)
{
	im_job	   *l;

	pthread_mutex_lock(&g_lock);
	l = g_done_head;
	g_done_head = g_done_tail = NULL;
	pthread_mutex_unlock(&g_lock);
	return l;
}

static void
post_done(im_job *job)
{
	int			was_empty;

	job->next = NULL;
	pthread_mutex_lock(&g_lock);
	was_empty = g_done_head == NULL;
	if (g_done_tail)
		g_done_tail->next = job;
	else
		g_done_head = job;
	g_done_tail = job;
	pthread_mutex_unlock(&g_lock);
	/* one lws_cancel_service per batch: the loop takes the whole list */
	if (was_empty)
		g_wake(g_wake_arg);
}

/* ---- reply building (API jobs) ---- */

static int
is_json_type(Oid t)
{
	return t == 114 || t == 3802;	/* json, jsonb */
}

/* A scalar column as a jansson value (json/jsonb columns are spliced). */
static json_t *
cell_json(const PGresult *res, int row, int col)
{
	const char *v;
	json_t	   *j;

	if (PQgetisnull(res, row, col))
		return json_null();
	v = PQgetvalue(res, row, col);
	switch (PQftype(res, col))
	{
		case 16:				/* bool */
			return json_boolean(v[0] == 't');
		case 20:				/* int8 */
		case 21:				/* int2 */
		case 23:				/* int4 */
		case 26:				/* oid */
			return json_integer(strtoll(v, NULL, 10));
		case 700:				/* float4 */
		case 701:				/* float8 */
			j = json_real(strtod(v, NULL));
			return j ? j : json_null();	/* NaN and infinities are not JSON */
		default:
			return json_string(v);
	}
}

/*
 * One row as an object text: scalars through jansson, json/jsonb columns
 * spliced in as PostgreSQL printed them (issue 8 item 1: never re-parsed,
 * never turned into a string).  base, when given, holds keys that come
 * first (type, id) and is consumed.
 */
static char *
row_text(json_t *base, const PGresult *res, int row, const im_raw_member *extra, int nextra)
{
	json_t	   *o = base ? base : json_object();
	im_raw_member raw[IM_MAX_RAW];
	int			nraw = 0;
	int			c;
	char	   *text;

	for (c = 0; c < nextra && nraw < IM_MAX_RAW; c++)
		raw[nraw++] = extra[c];
	for (c = 0; res && c < PQnfields(res); c++)
	{
		if (is_json_type(PQftype(res, c)) && !PQgetisnull(res, row, c) && nraw < IM_MAX_RAW)
		{
			raw[nraw].name = PQfname(res, c);
			raw[nraw].text = PQgetvalue(res, row, c);
			raw[nraw].len = (size_t) PQgetlength(res, row, c);
			nraw++;
		}
		else
			json_object_set_new(o, PQfname(res, c), cell_json(res, row, c));
	}
	text = im_json_splice(o, raw, nraw);
	json_decref(o);
	if (!text)
		abort();
	return text;
}

#include "frame.h"

static void
build_reply(im_job *job)
{
	json_t	   *o = json_object();
	const PGresult *res = job->res;

	json_object_set_new(o, "type", json_string(im_ops[job->op].reply_type));
	if (job->id)
		json_object_set(o, "id", job->id);
	if (im_ops[job->op].shape == IM_REPLY_ROWS)
	{
		int			n = PQntuples(res);
		char	  **rows = calloc((size_t) n + 1, sizeof(char *));
		im_raw_member arr;
		int			r;

		if (!rows)
			abort();
		for (r = 0; r < n; r++)
			rows[r] = row_text(NULL, res, r, NULL, 0);
		arr.name = "rows";
		arr.text = im_json_array_of_texts(rows, n);
		if (!arr.text)
			abort();
		arr.len = strlen(arr.text);
		job->reply = row_text(o, NULL, 0, &arr, 1);
		for (r = 0; r < n; r++)
			free(rows[r]);
		free(rows);
		free((char *) arr.text);
	}
	else
		job->reply = row_text(o, PQntuples(res) > 0 ? res : NULL, 0, NULL, 0);
	PQclear(job->res);
	job->res = NULL;
}

/* ---- job completion ---- */

static void
finish_job(im_job *job, im_job_status st, PGresult *res)
{
	job->status = st;
	if (res)
	{
		if (PQresultStatus(res) == PGRES_TUPLES_OK || PQresultStatus(res) == PGRES_COMMAND_OK)
		{
			job->status = IM_JOB_OK;
			job->res = res;
		}
		else
		{
			const char *ss = PQresultErrorField(res, PG_DIAG_SQLSTATE);
			const char *msg = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);

			job->status = IM_JOB_SQL_ERROR;
			strncpy(job->sqlstate, ss ? ss : "XX000", 5);
			job->sqlstate[5] = '\0';
			job->errmsg = strdup(msg ? msg : "error");
			PQclear(res);
		}
	}
	if (job->kind == IM_JOB_API && job->status == IM_JOB_OK)
		build_reply(job);
	post_done(job);
}

static void
fail_queue(void)
{
	while (q_head)
	{
		im_job	   *j = q_head;

		q_head = j->next;
		finish_job(j, IM_JOB_UNAVAILABLE, NULL);
	}
	q_tail = NULL;
	q_len = 0;
}

static void
enqueue_front(im_job *j)
{
	j->next = q_head;
	q_head = j;
	if (!q_tail)
		q_tail = j;
	q_len++;
}

static void
enqueue(im_job *j)
{
	j->next = NULL;
	if (q_tail)
		q_tail->next = j;
	else
		q_head = j;
	q_tail = j;
	q_len++;
}

static void
update_ready(void)
{
	int			i,
				n = 0;

	for (i = 0; i < g_npool; i++)
		if (g_conns[i].st == C_IDLE || g_conns[i].st == C_BUSY || g_conns[i].st == C_HELD)
			n++;
	im_db_stats_g.pool_ready = n;
}

/* ---- connections ---- */

static void
conn_down(dbconn *c, const char *why)
{
	if (c->pg)
	{
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
	c->txn = TXN_NONE;			/* the server rolls back an open transaction */
	if (c->job)
	{
		if (c->job->txn_ended && !c->job->txn_commit)
			im_job_free(c->job);	/* a ROLLBACK never comes back */
		else
			finish_job(c->job, IM_JOB_UNAVAILABLE, NULL);
		c->job = NULL;
	}
	c->backoff = c->backoff <= 0 ? 0.25 : (c->backoff * 2 > 4 ? 4 : c->backoff * 2);
	c->retry_at = im_now() + c->backoff;
	if (c->listen)
		im_db_stats_g.listen_ready = 0;
	update_ready();
	if (!c->listen && im_db_stats_g.pool_ready == 0)
		fail_queue();
}

/* libpq prints notices (and a FATAL sent outside a query) to stderr by
 * default; route them into the structured log instead. */
static void
notice_to_log(void *arg, const char *message)
{
	(void) arg;
	im_log("warn", "event=db_notice msg=\"%s\"", message);
}

static void
conn_start(dbconn *c)
{
	const char *const kw[] = {"dbname", "application_name", NULL};
	const char *const val[] = {g_conninfo, c->listen ? "im_gateway_listen" : "im_gateway", NULL};

	c->nprepared = 0;
	c->preparing = 0;
	c->pg = PQconnectStartParams(kw, val, 1);
	if (!c->pg || PQstatus(c->pg) == CONNECTION_BAD)
	{
		conn_down(c, c->pg ? PQerrorMessage(c->pg) : "out of memory");
		return;
	}
	PQsetNoticeProcessor(c->pg, notice_to_log, NULL);
	c->st = C_CONNECTING;
	c->want_write = 1;
	im_db_stats_g.reconnects++;
}

static void
conn_ready(dbconn *c)
{
	PQsetnonblocking(c->pg, 1);
	c->backoff = 0;
	if (c->listen)
	{
		if (!PQsendQuery(c->pg, "LISTEN im_sync_hint; LISTEN im_sync_device"))
		{
			conn_down(c, PQerrorMessage(c->pg));
			return;
		}
		c->st = C_SETUP;
		c->want_write = PQflush(c->pg) == 1;
	}
	else
	{
		/*
		 * No call may hold a pool connection (and the locks it took)
		 * unboundedly (contract §12): every pool connection gets the
		 * statement timeout before its first job; 57014 answers UNAVAILABLE.
		 * Replies are JSON text, so results come as UTF-8.
		 */
		char		setup[128];

		snprintf(setup, sizeof(setup),
				 "SET statement_timeout = %d; SET client_encoding = 'UTF8'",
				 g_statement_timeout_ms);
		if (!PQsendQuery(c->pg, setup))
		{
			conn_down(c, PQerrorMessage(c->pg));
			return;
		}
		c->st = C_SETUP;
		c->want_write = PQflush(c->pg) == 1;
	}
}

void
im_db_set_statement_timeout(int ms)
{
	g_statement_timeout_ms = ms < 0 ? 0 : ms;
}

static int
send_job(dbconn *c, im_job *j)
{
	const char *vals[8];
	char		name[16];
	int			i;

	for (i = 0; i < c->nprepared; i++)
		if (c->prepared[i] == j->sql)
			break;
	if (i < c->nprepared)
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

static void
dispatch(dbconn *c, im_job *j)
{
	int			sent;

	c->preparing = 0;
	if (j->txn)
	{
		c->txn = TXN_BEGIN;
		sent = PQsendQuery(c->pg, "BEGIN");
	}
	else
		sent = send_job(c, j);
	if (!sent)
	{
		/* the query never left: try it on another connection */
		enqueue_front(j);
		conn_down(c, PQerrorMessage(c->pg));
		return;
	}
	c->job = j;
	c->st = C_BUSY;
	c->t_sent = im_now();
	c->want_write = PQflush(c->pg) == 1;
}

static void
hist_observe(double s)
{
	int			i;

	for (i = 0; i < 11 && s > im_db_hist_bounds[i]; i++)
		;
	im_db_stats_g.hist[i]++;
	im_db_stats_g.hist_sum += s;
	im_db_stats_g.hist_count++;
}

static void
job_result_done(dbconn *c)
{
	im_job	   *j = c->job;
	PGresult   *res = c->res;
	double		dt = im_now() - c->t_sent;

	c->job = NULL;
	c->res = NULL;
	c->st = C_IDLE;
	c->preparing = 0;
	hist_observe(dt);
	j->db_seconds = dt;
	if (res && PQresultStatus(res) == PGRES_FATAL_ERROR)
	{
		const char *ss = PQresultErrorField(res, PG_DIAG_SQLSTATE);

		if (ss && (strcmp(ss, "40001") == 0 || strcmp(ss, "40P01") == 0) &&
			++j->attempts < MAX_ATTEMPTS)
		{
			PQclear(res);
			enqueue_front(j);
			return;
		}
		if (ss && (strcmp(ss, "40001") == 0 || strcmp(ss, "40P01") == 0))
		{
			PQclear(res);
			finish_job(j, IM_JOB_UNAVAILABLE, NULL);
			return;
		}
		/* admin shutdown, crash recovery, connection failure, statement
		 * timeout or cancel (57014): unavailable, the client retries */
		if (ss && (strncmp(ss, "08", 2) == 0 || strncmp(ss, "57P", 3) == 0 ||
				   strcmp(ss, "57014") == 0))
		{
			/* kept so the reply can say why */
			snprintf(j->sqlstate, sizeof(j->sqlstate), "%s", ss);
			PQclear(res);
			finish_job(j, IM_JOB_UNAVAILABLE, NULL);
			return;
		}
	}
	if (!res)
	{
		finish_job(j, IM_JOB_UNAVAILABLE, NULL);
		return;
	}
	finish_job(j, IM_JOB_OK, res);
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
			if (!send_job(c, j))
			{
				conn_down(c, PQerrorMessage(c->pg));
				return 0;
			}
			c->want_write = PQflush(c->pg) == 1;
			return 1;
		case TXN_STMT:
			if (res && PQresultStatus(res) == PGRES_TUPLES_OK)
			{
				/* hold the transaction open for the lws thread's decision */
				double		dt = im_now() - c->t_sent;

				hist_observe(dt);
				j->db_seconds = dt;
				c->txn = TXN_NONE;
				c->job = NULL;
				c->st = C_HELD;
				c->preparing = 0;
				j->txn_held = 1;
				j->txn_conn = (int) (c - g_conns);
				j->txn_hold = ++c->hold_id;
				finish_job(j, IM_JOB_OK, res);
				return 0;
			}
			/* failed: roll back first, then answer (or retry) as usual */
			c->txn_saved = res;
			c->txn = TXN_ABORT;
			if (!PQsendQuery(c->pg, "ROLLBACK"))
			{
				conn_down(c, PQerrorMessage(c->pg));
				return 0;
			}
			c->want_write = PQflush(c->pg) == 1;
			return 1;
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
				j->status = res && PQresultStatus(res) == PGRES_COMMAND_OK ?
					IM_JOB_OK : IM_JOB_UNAVAILABLE;
				post_done(j);
			}
			else
				im_job_free(j);
			if (res)
				PQclear(res);
			return 0;
		case TXN_NONE:
			break;
	}
	c->res = res;
	job_result_done(c);
	return 0;
}

/* im_db_end_txn's job arrived: COMMIT or ROLLBACK on the connection it holds. */
static void
end_txn(im_job *j)
{
	dbconn	   *c = &g_conns[j->txn_conn];

	if (c->st != C_HELD || c->hold_id != j->txn_hold)
	{
		/* connection lost meanwhile: the server rolled the transaction back */
		if (j->txn_commit)
			finish_job(j, IM_JOB_UNAVAILABLE, NULL);
		else
			im_job_free(j);
		return;
	}
	c->job = j;
	c->st = C_BUSY;
	c->txn = TXN_END;
	c->t_sent = im_now();
	if (!PQsendQuery(c->pg, j->txn_commit ? "COMMIT" : "ROLLBACK"))
	{
		conn_down(c, PQerrorMessage(c->pg));
		return;
	}
	c->want_write = PQflush(c->pg) == 1;
}

void
im_db_end_txn(im_job *job, int commit)
{
	job->txn_ended = 1;
	job->txn_commit = commit;
	im_db_submit(job);
}

static void
drain_notifies(dbconn *c)
{
	PGnotify   *n;

	while ((n = PQnotifies(c->pg)) != NULL)
	{
		im_job	   *j = im_job_new(IM_JOB_NOTIFY, 0);

		j->channel = strdup(n->relname);
		j->payload = strdup(n->extra);
		PQfreemem(n);
		post_done(j);
	}
}

static void
conn_io(dbconn *c, short revents)
{
	if (c->st == C_CONNECTING)
	{
		PostgresPollingStatusType r = PQconnectPoll(c->pg);

		if (r == PGRES_POLLING_FAILED)
			conn_down(c, PQerrorMessage(c->pg));
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
			conn_down(c, PQerrorMessage(c->pg));
			return;
		}
		c->want_write = (f == 1);
	}
	if (revents & (POLLIN | POLLERR | POLLHUP))
	{
		if (!PQconsumeInput(c->pg))
		{
			conn_down(c, PQerrorMessage(c->pg));
			return;
		}
		if (c->listen)
			drain_notifies(c);
		while ((c->st == C_BUSY || c->st == C_SETUP) && !PQisBusy(c->pg))
		{
			PGresult   *r = PQgetResult(c->pg);

			if (r == NULL)
			{
				if (c->st == C_SETUP)
				{
					int			ok = !c->res || PQresultStatus(c->res) == PGRES_COMMAND_OK;

					if (c->res)
						PQclear(c->res);
					c->res = NULL;
					if (!ok)
					{
						conn_down(c, c->listen ? "LISTEN failed" : "session setup failed");
						return;
					}
					c->st = C_IDLE;
					if (!c->listen)
					{
						update_ready();
						im_log("info", "event=db_conn_ready conn=pool");
						break;
					}
					im_db_stats_g.listen_ready = 1;
					im_log("info", "event=listen_ready");
					post_done(im_job_new(IM_JOB_LISTEN_UP, 0));
				}
				else if (c->preparing && c->res &&
						 PQresultStatus(c->res) == PGRES_COMMAND_OK)
				{
					/* statement prepared: now run the job with it */
					PQclear(c->res);
					c->res = NULL;
					c->prepared[c->nprepared++] = c->job->sql;
					c->preparing = 0;
					if (!send_job(c, c->job))
					{
						conn_down(c, PQerrorMessage(c->pg));
						return;
					}
					c->want_write = PQflush(c->pg) == 1;
					continue;
				}
				else if (c->txn != TXN_NONE)
				{
					if (txn_step(c))
						continue;
				}
				else
					job_result_done(c);	/* a failed prepare answers the job */
				break;
			}
			/* keep the first result (an error wins over later ones) */
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
		if (c->pg && PQstatus(c->pg) == CONNECTION_BAD)
			conn_down(c, "connection bad");
	}
}

static void
take_incoming(void)
{
	im_job	   *l;
	char		buf[256];
	int			i,
				idle = 0;

	while (read(g_wake_pipe[0], buf, sizeof(buf)) > 0)
		;
	pthread_mutex_lock(&g_lock);
	l = g_in_head;
	g_in_head = g_in_tail = NULL;
	pthread_mutex_unlock(&g_lock);
	for (i = 0; i < g_npool; i++)
		if (g_conns[i].st == C_IDLE)
			idle++;
	while (l)
	{
		im_job	   *n = l->next;

		if (l->txn_ended)
			end_txn(l);			/* goes to the connection it holds, not the queue */
		else if (im_db_stats_g.pool_ready == 0 || q_len >= MAX_QUEUE)
			finish_job(l, IM_JOB_UNAVAILABLE, NULL);
		else
		{
			/* a job that finds no idle connection waits for one */
			if (q_len >= idle)
				im_db_stats_g.pool_waits++;
			enqueue(l);
		}
		l = n;
	}
}

/*
 * The oldest queued job that may run now.  Hellos (IM_JOB_AUTH) use at most
 * npool - 1 connections: one stays for the requests of authenticated
 * sessions, so hellos stalled in the database (a reconnect storm, a locked
 * device row) never stop sessions that are already in.
 */
static im_job *
take_job(void)
{
	int			i,
				auth_running = 0;
	im_job	   *j,
			   *prev = NULL;

	for (i = 0; i < g_npool; i++)
		if (g_conns[i].st == C_HELD ||
			(g_conns[i].job && g_conns[i].job->kind == IM_JOB_AUTH))
			auth_running++;
	for (j = q_head; j; prev = j, j = j->next)
		if (j->kind != IM_JOB_AUTH || g_npool == 1 || auth_running < g_npool - 1)
			break;
	if (!j)
		return NULL;
	if (prev)
		prev->next = j->next;
	else
		q_head = j->next;
	if (q_tail == j)
		q_tail = prev;
	q_len--;
	return j;
}

static void *
db_main(void *arg)
{
	struct pollfd pfd[MAX_CONNS + 2];
	int			map[MAX_CONNS + 2];
	int			nconns = g_npool + 1;

	(void) arg;
	while (!g_stop)
	{
		int			i,
					n = 0;
		double		now = im_now();
		int			timeout = 1000;

		for (i = 0; i < nconns; i++)
		{
			dbconn	   *c = &g_conns[i];

			if (c->st == C_DOWN && now >= c->retry_at)
				conn_start(c);
		}
		take_incoming();
		/* hand queued jobs to idle pool connections */
		for (i = 0; i < g_npool && q_head; i++)
		{
			if (g_conns[i].st == C_IDLE)
			{
				im_job	   *j = take_job();

				if (!j)
					break;		/* only hellos queued, and they have their share */
				dispatch(&g_conns[i], j);
			}
		}

		pfd[n].fd = g_wake_pipe[0];
		pfd[n].events = POLLIN;
		map[n++] = -1;
		for (i = 0; i < nconns; i++)
		{
			dbconn	   *c = &g_conns[i];

			if (c->st == C_DOWN)
			{
				int			ms = (int) ((c->retry_at - now) * 1000) + 1;

				if (ms < timeout)
					timeout = ms < 0 ? 0 : ms;
				continue;
			}
			pfd[n].fd = PQsocket(c->pg);
			if (pfd[n].fd < 0)
			{
				conn_down(c, "no socket");
				continue;
			}
			pfd[n].events = POLLIN | (c->want_write ? POLLOUT : 0);
			map[n++] = i;
		}
		if (poll(pfd, (nfds_t) n, timeout) < 0 && errno != EINTR)
			im_log("error", "event=poll_failed errno=%d", errno);
		for (i = 1; i < n; i++)
		{
			dbconn	   *c = &g_conns[map[i]];

			if (pfd[i].revents && c->pg)
				conn_io(c, pfd[i].revents);
		}
	}
	for (int i = 0; i < nconns; i++)
		if (g_conns[i].pg)
			PQfinish(g_conns[i].pg);
	return NULL;
}

int
im_db_start(const char *conninfo, int pool, void (*wake) (void *), void *wake_arg)
{
	int			i;

	if (pool < 1)
		pool = 1;
	if (pool > MAX_CONNS)
		pool = MAX_CONNS;
	g_conninfo = strdup(conninfo ? conninfo : "");
	g_npool = pool;
	g_wake = wake;
	g_wake_arg = wake_arg;
	for (i = 0; i <= pool; i++)
	{
		memset(&g_conns[i], 0, sizeof(dbconn));
		g_conns[i].st = C_DOWN;
		g_conns[i].listen = (i == pool);
	}
	if (pipe(g_wake_pipe) != 0)
		return -1;
	fcntl(g_wake_pipe[0], F_SETFL, O_NONBLOCK);
	fcntl(g_wake_pipe[1], F_SETFL, O_NONBLOCK);
	return pthread_create(&g_thread, NULL, db_main, NULL);
}

void
im_db_stop(void)
{
	char		c = 0;

	g_stop = 1;
	if (write(g_wake_pipe[1], &c, 1) < 0)
		im_log("warn", "event=wake_pipe_failed errno=%d", errno);
	pthread_join(g_thread, NULL);
}
