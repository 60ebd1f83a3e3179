/*
 * db.h — the gateway's database side: a thread owning a small pool of
 * non-blocking libpq connections plus one LISTEN connection, talking to the
 * libwebsockets thread through two mutex-protected queues.  The lws thread
 * is woken with lws_cancel_service (through the wake callback).
 */
#ifndef IM_GW_DB_H
#define IM_GW_DB_H

#include <stdint.h>
#include <libpq-fe.h>
#include <jansson.h>
#include <libwebsockets.h>

#include "server/frame.h"

/* What the lws thread wants done with a result. */
typedef enum im_job_kind
{
	IM_JOB_API,					/* frame request: reply text built by db thread */
	IM_JOB_AUTH,				/* hello: im.authenticate + im.device_session */
	IM_JOB_RECHECK,				/* re-check after (re)LISTEN */
	IM_JOB_MEMBERS,				/* members of a shared_log conversation */
	IM_JOB_HEALTH,				/* GET /healthz */
	IM_JOB_METRICS,				/* GET /metrics */
	IM_JOB_NOTIFY,				/* db -> lws: a notification (no query) */
	IM_JOB_LISTEN_UP,			/* db -> lws: LISTEN (re)established; key: its bucket mask */
	IM_JOB_PRESENCE				/* set/refresh_presence, answer dropped */
} im_job_kind;

typedef enum im_job_status
{
	IM_JOB_OK = 0,
	IM_JOB_SQL_ERROR,			/* sqlstate/errmsg set */
	IM_JOB_UNAVAILABLE			/* no connection / connection lost / retries out */
} im_job_status;

typedef struct im_job
{
	lws_dll2_t	list;			/* in exactly one queue of db.c at a time, or none */
	im_job_kind kind;
	uint64_t	sid;			/* session to deliver to (0: none) */
	int			op;				/* im_op for API jobs */
	int64_t		key;			/* conversation id for MEMBERS etc. */
	json_t	   *id;				/* echoed id, owned by whichever thread holds the job */
	const char *sql;
	int			nparams;
	char	   *params[8];
	int			attempts;
	double		t_submit;
	/*
	 * Explicit transaction (IM_JOB_AUTH): txn = 1 runs BEGIN, the statement,
	 * and then holds the connection with the transaction open; the job comes
	 * back with txn_held = 1 and the lws thread must answer it once with
	 * im_db_end_txn (COMMIT or ROLLBACK).  txn_conn/txn_hold name the held
	 * connection (db thread's business).
	 */
	int			txn;
	int			txn_held;
	int			txn_ended;		/* im_db_end_txn was called */
	int			txn_commit;		/* its decision: 1 COMMIT, 0 ROLLBACK */
	int			txn_conn;
	uint64_t	txn_hold;
	/*
	 * A hello the lws thread already decided to COMMIT whose batch was
	 * rolled back because another hello in it was refused: it runs again
	 * and is committed without its limits being checked (and counted) twice.
	 */
	int			admitted;
	/*
	 * A later hello of the same device is in the same batch (committed with
	 * it): both SUPERSEDED notifications come at that commit, possibly
	 * before this session is welcomed and can hear them, so the welcome
	 * asks for a re-check itself (auth.c).
	 */
	int			superseded_in_batch;
	/*
	 * The device its token names (hello_order.h; 0: unreadable), its token's
	 * own key, and whether it holds its order key (the device once the
	 * token was accepted, else the token) in the database thread: no later
	 * hello with that key starts before this one's transaction is over.
	 */
	uint64_t	device_key;
	uint64_t	token_key;		/* the token's own key (hello_order.h) */
	uint64_t	order_key;		/* the key it holds while device_held */
	int			device_held;
	int			device_waited;	/* counted once in hello_device_waits */
	/* results */
	im_job_status status;
	char		sqlstate[6];
	char	   *errmsg;
	PGresult   *res;
	char	   *reply;			/* API: finished reply frame text */
	/*
	 * The request's trace id (contract §21), put into the reply; and what
	 * the reply says for the request's log line (db_reply.c): msg_seq and
	 * sync_seq (-1: none), events in a sync page (-1: not a sync page).
	 */
	char		trace_id[IM_TRACE_ID_MAX + 1];
	int64_t		msg_seq;
	int64_t		sync_seq;
	long		page_events;
	double		db_seconds;
	/* notifications */
	char	   *channel;
	char	   *payload;
} im_job;

typedef struct im_db_stats
{
	/* written by the db thread, read racily by /metrics (counters only) */
	volatile long pool_waits;
	volatile long reconnects;
	volatile int pool_ready;
	volatile int listen_ready;	/* every LISTEN connection (router's, nodes') up */
	volatile int listen_nodes;	/* nodes the router lists */
	volatile int listen_nodes_ready;
	volatile long hist[12];		/* DB round trip histogram buckets */
	volatile double hist_sum;
	volatile long hist_count;
	volatile long hello_batches;	/* transactions authenticating several hellos */
	volatile long hellos_batched;	/* hellos in them */
	volatile long hello_batch_reruns;	/* batches rolled back for a refusal */
	volatile long hello_device_waits;	/* hellos that waited for an earlier one of their device */
} im_db_stats;

extern const double im_db_hist_bounds[11];
extern im_db_stats im_db_stats_g;

/* statement_timeout of every pool connection (0: none); set before im_db_start */
#define IM_DB_DEFAULT_STATEMENT_TIMEOUT_MS 10000
extern void im_db_set_statement_timeout(int ms);
extern int	im_db_start(const char *conninfo, int pool, void (*wake) (void *), void *wake_arg);
extern void im_db_stop(void);
extern void im_db_submit(im_job *job);
/* Takes every finished job (a list, oldest first) for the lws thread. */
extern void im_db_take_done(lws_dll2_owner_t *out);
/*
 * Ends the transaction a txn job holds open (job->txn_held).  COMMIT: the job
 * comes back once more, status OK when the commit succeeded (res still the
 * statement's result), else UNAVAILABLE/SQL error.  ROLLBACK: the job never
 * comes back (the db thread frees it).
 */
extern void im_db_end_txn(im_job *job, int commit);
/* A zeroed job of kind for session sid (0: none); aborts when out of memory. */
extern im_job *im_job_new(im_job_kind kind, uint64_t sid);
extern void im_job_free(im_job *job);
extern double im_now(void);

#endif
