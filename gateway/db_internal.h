/*
 * db_internal.h — what the database thread's files share (db.c: queues,
 * thread and loop; db_conn.c: the connection state machine; db_listen.c:
 * LISTEN and notifications; db_reply.c: reply frames).  Nothing here is
 * touched by the lws thread, which sees only db.h.
 */
#ifndef IM_GW_DB_INTERNAL_H
#define IM_GW_DB_INTERNAL_H

#include "db.h"

#include <stdint.h>
#include <libpq-fe.h>

#define MAX_CONNS 64
#define MAX_PREPARED 64			/* distinct statements per connection */

typedef enum
{
	C_DOWN, C_CONNECTING, C_SETUP, C_IDLE, C_BUSY,
	C_HELD						/* transaction open, waiting for im_db_end_txn */
} cstate;

/* Where a txn job (im_job.txn) is on its connection. */
typedef enum
{
	TXN_NONE, TXN_BEGIN, TXN_STMT, TXN_ABORT, TXN_END,
	TXN_PIPE					/* BEGIN and the statement sent as one pipeline */
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
	/*
	 * TXN_PIPE: a hello whose statement is prepared here sends BEGIN, the
	 * statement and a Sync in one round trip (libpq pipeline mode); results
	 * arrive as BEGIN's, NULL, the statement's, NULL, PIPELINE_SYNC.  This
	 * counts the NULLs seen (2: the Sync is next).
	 */
	int			pipe_nulls;
	uint64_t	hold_id;		/* bumped per hold: a stale im_db_end_txn never matches */
	double		connect_deadline;	/* C_CONNECTING/C_SETUP: give up then (db_conninfo.c) */
	int			first_host;		/* the host list starts here (rotated after a timeout) */
	int			unreplicated;	/* the running job's commit was not confirmed by the sync standby */
	PGresult   *txn_saved;		/* failed statement's result while ROLLBACK runs */
} dbconn;

/* db.c: the connections and settings, owned by the database thread */
extern char *im_db_conninfo;
extern int	im_db_npool;
extern int	im_db_statement_timeout_ms;
extern dbconn im_db_conns[MAX_CONNS + 1];	/* [0..npool) pool, [npool] listen */

/* db.c: answers to the lws thread and the queue of jobs waiting for a connection */
extern void im_db_post_done(im_job *job);
/* Sets the job's outcome from res (consumed) and posts it. */
extern void im_db_finish_job(im_job *job, im_job_status st, PGresult *res);
extern void im_db_requeue_front(im_job *j);
/* A pool connection went down or came up: pool_ready, and fail the queue
 * when none is left. */
extern void im_db_pool_changed(void);

/* db_conn.c: the state machine of one connection */
extern void im_conn_start(dbconn *c);
extern void im_conn_down(dbconn *c, const char *why);
extern void im_conn_dispatch(dbconn *c, im_job *j);
extern void im_conn_end_txn(im_job *j);
extern void im_conn_io(dbconn *c, short revents);
/* After a PQsend* call on c: flushes, or takes c down when it failed.  Returns ok. */
extern int	im_conn_sent(dbconn *c, int ok);

/* Takes c down when it is past a deadline: connecting for longer than
 * connect_timeout, or a job running for longer than the statement timeout
 * plus IM_DB_REPLY_GRACE_S (the server stopped answering). */
extern void im_conn_check_deadlines(dbconn *c, double now);

/* db_conninfo.c: the --db conninfo, parsed once, and each attempt's keywords */
extern int	im_conninfo_init(const char *conninfo, char **err);
extern double im_conninfo_connect_timeout(void);
extern int	im_conninfo_nhosts(void);
/*
 * Fills kw/val (room for 64 + 1, NULL-terminated) for an attempt whose host
 * list starts at first_host; buf holds rotated lists.  Returns the count.
 */
extern int	im_conninfo_params(int first_host, const char *application_name,
							   const char **kw, const char **val, char *buf, size_t buflen);

/* db_listen.c */
extern int	im_listen_send(dbconn *c);
extern void im_listen_ready(void);
extern void im_listen_drain(dbconn *c);

/* db_reply.c: the reply frame text of a finished API job (job->res consumed) */
extern void im_db_build_reply(im_job *job);

#endif
