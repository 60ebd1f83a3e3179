/*
 * db.c — the database thread of im_gateway: its queues, its poll loop and
 * which queued job runs next.
 *
 * One thread polls a pool of non-blocking libpq connections (db_conn.c:
 * PQconnectStartParams/PQconnectPoll, PQsendQueryParams, PQflush,
 * PQconsumeInput/PQisBusy/PQgetResult) and one LISTEN connection
 * (db_listen.c: im_sync_hint, im_sync_device), plus one per node when --db
 * is a router (db_nodes.c).  Jobs come from the lws
 * thread through a mutex-protected queue and a wake pipe; finished jobs go
 * back through a second queue and the lws thread is woken with
 * lws_cancel_service.
 *
 * Why a thread and not fd adoption into lws: libpq may change its socket
 * while connecting and after a server restart, and a separate thread keeps
 * the JSON encoding of large result sets off the websocket loop.
 *
 * Failure rules (contract §10): a lost connection answers every job on it
 * UNAVAILABLE (the outcome of a send is then unknown; send is idempotent by
 * client_msg_id, so the client retries); 40001/40P01 are retried up to
 * three times (db_conn.c); connections come back by themselves with
 * backoff; with no pool connection up, queued and new jobs are answered
 * UNAVAILABLE at once.
 */
#include "server/db/db_internal.h"
#include "server/db/hello_order.h"
#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_QUEUE 20000

const double im_db_hist_bounds[11] = {0.001, 0.002, 0.005, 0.01, 0.02, 0.05,
0.1, 0.2, 0.5, 1.0, 2.0};
im_db_stats im_db_stats_g;

char	   *im_db_conninfo;
int			im_db_npool;
int			im_db_statement_timeout_ms = IM_DB_DEFAULT_STATEMENT_TIMEOUT_MS;
dbconn		im_db_conns[MAX_CONNS + 1 + MAX_NODES];
static pthread_t g_thread;
static int	g_wake_pipe[2] = {-1, -1};
static volatile int g_stop;
static void (*g_wake) (void *);
static void *g_wake_arg;

/*
 * Job queues, FIFOs of libwebsockets' lws_dll2 (a job's `list` member): two
 * cross-thread ones under g_lock, and the db thread's own queue of jobs
 * waiting for a connection.
 */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static lws_dll2_owner_t g_in;	/* lws -> db */
static lws_dll2_owner_t g_done;	/* db -> lws */
static lws_dll2_owner_t q;		/* db thread only */
static int	q_other;			/* queued jobs that are not hellos */

#define JOB_OF(d) lws_container_of(d, im_job, list)

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

/*
 * Appends job to one of the two cross-thread queues.  Returns 1 when the
 * queue was empty: only then does the other side need a wake-up, since it
 * takes the whole queue when woken.
 */
static int
append_locked(lws_dll2_owner_t *queue, im_job *job)
{
	int			was_empty;

	pthread_mutex_lock(&g_lock);
	was_empty = queue->count == 0;
	lws_dll2_add_tail(&job->list, queue);
	pthread_mutex_unlock(&g_lock);
	return was_empty;
}

/* Moves every job of `from` to the end of `to`, in order. */
static void
move_all(lws_dll2_owner_t *from, lws_dll2_owner_t *to)
{
	struct lws_dll2 *d;

	while ((d = lws_dll2_get_head(from)))
	{
		lws_dll2_remove(d);
		lws_dll2_add_tail(d, to);
	}
}

void
im_db_submit(im_job *job)
{
	char		c = 1;

	job->t_submit = im_now();
	/* a non-empty queue already has a wake-up on its way */
	if (append_locked(&g_in, job) &&
		write(g_wake_pipe[1], &c, 1) < 0 && errno != EAGAIN)
		im_log("error", "event=wake_pipe_failed errno=%d", errno);
}

void
im_db_take_done(lws_dll2_owner_t *out)
{
	pthread_mutex_lock(&g_lock);
	move_all(&g_done, out);
	pthread_mutex_unlock(&g_lock);
}

void
im_db_post_done(im_job *job)
{
	/* a hello handed over with its transaction open still holds its device */
	if (!job->txn_held || job->txn_ended)
		im_hello_order_release(job);
	/* one lws_cancel_service per batch: the loop takes the whole queue */
	if (append_locked(&g_done, job))
		g_wake(g_wake_arg);
}

/* ---- job completion ---- */

void
im_db_finish_job(im_job *job, im_job_status st, PGresult *res)
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
		im_db_build_reply(job);
	/* its authenticate returned the row: the database accepted the token */
	if (job->kind == IM_JOB_AUTH && job->status == IM_JOB_OK && job->res &&
		PQntuples(job->res) == 1)
		im_hello_order_verified(job);
	im_db_post_done(job);
}

void
im_db_free_ended(im_job *j)
{
	im_hello_order_release(j);
	im_job_free(j);
}

/*
 * A hello that must wait for an earlier hello of its device (hello_order.h);
 * counted the first time.
 */
static int
waits_for_device(im_job *j)
{
	if (!im_hello_order_blocked(j))
		return 0;
	if (!j->device_waited)
		im_db_stats_g.hello_device_waits++;
	j->device_waited = 1;
	return 1;
}

/* Takes j out of the db thread's queue. */
static void
dequeue(im_job *j)
{
	lws_dll2_remove(&j->list);
	q_other -= j->kind != IM_JOB_AUTH;
}

static void
fail_queue(void)
{
	struct lws_dll2 *d;

	while ((d = lws_dll2_get_head(&q)))
	{
		im_job	   *j = JOB_OF(d);

		dequeue(j);
		im_db_finish_job(j, IM_JOB_UNAVAILABLE, NULL);
	}
}

void
im_db_requeue_front(im_job *j)
{
	lws_dll2_add_head(&j->list, &q);
	q_other += j->kind != IM_JOB_AUTH;
}

static void
enqueue(im_job *j)
{
	lws_dll2_add_tail(&j->list, &q);
	q_other += j->kind != IM_JOB_AUTH;
}

void
im_db_pool_changed(void)
{
	int			i,
				n = 0;

	for (i = 0; i < im_db_npool; i++)
		if (im_db_conns[i].st == C_IDLE || im_db_conns[i].st == C_BUSY || im_db_conns[i].st == C_HELD)
			n++;
	im_db_stats_g.pool_ready = n;
	if (n == 0)
		fail_queue();
}

void
im_db_set_statement_timeout(int ms)
{
	im_db_statement_timeout_ms = ms < 0 ? 0 : ms;
}

void
im_db_end_txn(im_job *job, int commit)
{
	job->txn_ended = 1;
	job->txn_commit = commit;
	im_db_submit(job);
}

static void
take_incoming(void)
{
	lws_dll2_owner_t incoming = {0};
	struct lws_dll2 *d;
	char		buf[256];
	int			i,
				idle = 0;

	while (read(g_wake_pipe[0], buf, sizeof(buf)) > 0)
		;
	pthread_mutex_lock(&g_lock);
	move_all(&g_in, &incoming);
	pthread_mutex_unlock(&g_lock);
	for (i = 0; i < im_db_npool; i++)
		if (im_db_conns[i].st == C_IDLE)
			idle++;
	while ((d = lws_dll2_get_head(&incoming)))
	{
		im_job	   *l = JOB_OF(d);

		lws_dll2_remove(d);
		if (l->txn_ended)
			im_conn_end_txn(l);			/* goes to the connection it holds, not the queue */
		else if (im_db_stats_g.pool_ready == 0 || (int) q.count >= MAX_QUEUE)
			im_db_finish_job(l, IM_JOB_UNAVAILABLE, NULL);
		else
		{
			/* a job that finds no idle connection waits for one */
			if ((int) q.count >= idle)
				im_db_stats_g.pool_waits++;
			enqueue(l);
		}
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
	struct lws_dll2 *d;

	for (i = 0; i < im_db_npool; i++)
		if (im_db_conns[i].st == C_HELD || im_db_conns[i].batch.n > 0 ||
			(im_db_conns[i].job && im_db_conns[i].job->kind == IM_JOB_AUTH))
			auth_running++;
	/*
	 * hellos have their share and nothing else waits: no walk over the
	 * queued hellos (a storm queues hundreds; this runs per answer)
	 */
	if (q_other == 0 && im_db_npool > 1 && auth_running >= im_db_npool - 1)
		return NULL;
	for (d = lws_dll2_get_head(&q); d; d = d->next)
	{
		im_job	   *j = JOB_OF(d);

		if ((j->kind != IM_JOB_AUTH || im_db_npool == 1 || auth_running < im_db_npool - 1) &&
			!waits_for_device(j))
		{
			dequeue(j);
			im_hello_order_hold(j);
			return j;
		}
	}
	return NULL;
}

int
im_db_take_hellos(im_job **out, int max, const char *sql, int admitted)
{
	struct lws_dll2 *d,
			   *next;
	int			n = 0;

	for (d = lws_dll2_get_head(&q); d && n < max; d = next)
	{
		im_job	   *j = JOB_OF(d);

		next = d->next;
		if (j->kind != IM_JOB_AUTH || !j->txn || j->sql != sql || j->admitted != admitted ||
			waits_for_device(j))
			continue;
		dequeue(j);
		im_hello_order_hold(j);
		out[n++] = j;
	}
	return n;
}

/*
 * Hands queued jobs to idle pool connections.  A hello that finds more
 * hellos queued behind it takes them along into one transaction
 * (db_hello_batch.c) once its statement is prepared on the connection.
 */
static void
dispatch_queued(void)
{
	int			i;

	for (i = 0; i < im_db_npool && q.count > 0; i++)
	{
		dbconn	   *c = &im_db_conns[i];

		if (c->st == C_IDLE)
		{
			im_job	   *j = take_job();
			im_job	   *batch[IM_HELLO_BATCH_MAX];
			int			n;

			if (!j)
				break;			/* only hellos queued, and they have their share */
			if (j->kind == IM_JOB_AUTH && j->txn && im_conn_is_prepared(c, j->sql))
			{
				batch[0] = j;
				n = 1 + im_db_take_hellos(batch + 1, IM_HELLO_BATCH_MAX - 1, j->sql,
										   j->admitted);
				if (n > 1)
				{
					im_batch_start(c, batch, n);
					continue;
				}
			}
			im_conn_dispatch(c, j);
		}
	}
}

/*
 * The poll set: the wake pipe, then every connection that is up or coming
 * up (map[k]: its index).  *timeout shrinks to the next reconnect due.
 * Returns the number of entries.
 */
static int
build_pollset(struct pollfd *pfd, int *map, int nconns, double now, int *timeout)
{
	int			i,
				n = 0;

	pfd[n].fd = g_wake_pipe[0];
	pfd[n].events = POLLIN;
	map[n++] = -1;
	for (i = 0; i < nconns; i++)
	{
		dbconn	   *c = &im_db_conns[i];

		if (c->disabled)
			continue;
		if (c->st == C_DOWN)
		{
			int			ms = (int) ((c->retry_at - now) * 1000) + 1;

			if (ms < *timeout)
				*timeout = ms < 0 ? 0 : ms;
			continue;
		}
		pfd[n].fd = PQsocket(c->pg);
		if (pfd[n].fd < 0)
		{
			im_conn_down(c, "no socket");
			continue;
		}
		pfd[n].events = POLLIN | (c->want_write ? POLLOUT : 0);
		map[n++] = i;
	}
	return n;
}

/* The thread: reconnect what is due, take new jobs, run them, poll. */
static void *
db_main(void *arg)
{
	struct pollfd pfd[MAX_CONNS + 2 + MAX_NODES];
	int			map[MAX_CONNS + 2 + MAX_NODES];
	int			nconns = im_db_npool + 1 + MAX_NODES;
	int			i;

	(void) arg;
	while (!g_stop)
	{
		double		now = im_now();
		int			timeout = 1000;
		int			n;

		for (i = 0; i < nconns; i++)
		{
			if (im_db_conns[i].disabled)
				continue;
			if (im_db_conns[i].st == C_DOWN && now >= im_db_conns[i].retry_at)
				im_conn_start(&im_db_conns[i]);
			else
				im_conn_check_deadlines(&im_db_conns[i], now);
		}
		take_incoming();
		dispatch_queued();
		n = build_pollset(pfd, map, nconns, now, &timeout);
		if (poll(pfd, (nfds_t) n, timeout) < 0 && errno != EINTR)
			im_log("error", "event=poll_failed errno=%d", errno);
		for (i = 1; i < n; i++)
		{
			dbconn	   *c = &im_db_conns[map[i]];

			if (pfd[i].revents && c->pg)
				im_conn_io(c, pfd[i].revents);
		}
	}
	for (i = 0; i < nconns; i++)
		if (im_db_conns[i].pg)
			PQfinish(im_db_conns[i].pg);
	return NULL;
}

int
im_db_start(const char *conninfo, int pool, void (*wake) (void *), void *wake_arg)
{
	int			i;
	char	   *err = NULL;

	if (pool < 1)
		pool = 1;
	if (pool > MAX_CONNS)
		pool = MAX_CONNS;
	im_db_conninfo = strdup(conninfo ? conninfo : "");
	if (im_conninfo_parse(&im_db_main_conninfo, im_db_conninfo, NULL, &err) != 0)
	{
		im_log("error", "event=bad_conninfo msg=\"%s\"", err ? err : "out of memory");
		PQfreemem(err);
		return -1;
	}
	im_db_npool = pool;
	g_wake = wake;
	g_wake_arg = wake_arg;
	for (i = 0; i < pool + 1 + MAX_NODES; i++)
	{
		memset(&im_db_conns[i], 0, sizeof(dbconn));
		im_db_conns[i].st = C_DOWN;
		im_db_conns[i].listen = (i >= pool);
		im_db_conns[i].node = i > pool ? i - pool - 1 : -1;
		im_db_conns[i].disabled = i > pool;	/* node slots: when the router lists nodes */
		im_db_conns[i].ci = i > pool ? NULL : &im_db_main_conninfo;
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

