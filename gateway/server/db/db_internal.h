/*
 * db_internal.h — what the database thread's files share (db.c: queues,
 * thread and loop; db_conn.c: the connection state machine; db_listen.c:
 * LISTEN and notifications; db_nodes.c: a sharded installation's nodes;
 * db_conninfo.c: each attempt's keywords; db_reply.c: reply frames).
 * Nothing here is touched by the lws thread, which sees only db.h.
 */
#ifndef IM_GW_DB_INTERNAL_H
#define IM_GW_DB_INTERNAL_H

#include "server/db/db.h"

#include <stdint.h>
#include <libpq-fe.h>

#define MAX_CONNS 64
#define MAX_PREPARED 64			/* distinct statements per connection */
#define MAX_NODES 32			/* nodes of a sharded installation */

/* A conninfo parsed once (db_conninfo.c). */
typedef struct im_conninfo
{
	PQconninfoOption *opts;
	int			nhosts;
	double		connect_timeout;
} im_conninfo;

/* What a LISTEN connection's own query in flight is (db_listen.c). */
typedef enum
{
	LQ_NONE,					/* none: only notifications arrive */
	LQ_LISTEN,					/* LISTEN im_sync_hint; LISTEN im_sync_device */
	LQ_PROBE,					/* router: does im.shard_nodes() exist? */
	LQ_NODES					/* router: SELECT * FROM im.shard_nodes() */
} listen_query;

typedef enum
{
	C_DOWN, C_CONNECTING, C_SETUP, C_IDLE, C_BUSY,
	C_HELD						/* transaction open, waiting for im_db_end_txn */
} cstate;

/* Where a txn job (im_job.txn) is on its connection. */
typedef enum
{
	TXN_NONE, TXN_BEGIN, TXN_STMT, TXN_ABORT, TXN_END,
	TXN_PIPE,					/* BEGIN and the statement sent as one pipeline */
	TXN_BATCH					/* several hellos in one transaction (db_hello_batch.c) */
} txn_stage;

/*
 * Hellos authenticated in one transaction: at most this many, so their
 * subtransactions (a savepoint each) stay within PostgreSQL's cache of 64
 * subtransaction ids per backend (beyond it every snapshot gets dearer).
 */
#define IM_HELLO_BATCH_MAX 32

/* Where one hello of a batch is (whose the job is: db or lws thread). */
typedef enum
{
	HB_RUNNING,					/* its statement not answered yet (db thread's) */
	HB_GONE,					/* answered failed, requeued: no longer in the batch */
	HB_HELD,					/* posted to the lws thread, its decision pending */
	HB_COMMIT,					/* decided: COMMIT (db thread's again) */
	HB_ROLLBACK					/* decided: refused (db thread's again) */
} hb_state;

typedef struct hello_batch
{
	int			n;				/* hellos in the batch (0: no batch) */
	im_job	   *job[IM_HELLO_BATCH_MAX];
	hb_state	st[IM_HELLO_BATCH_MAX];
	PGresult   *res[IM_HELLO_BATCH_MAX];	/* statement result while running */
	int			seg_first;		/* first hello of the pipeline segment in flight */
	int			seg_cmd;		/* commands of that segment whose results are in */
	int			seg_lead;		/* the segment starts with BEGIN / ROLLBACK TO (1) */
	int			failed;			/* hello whose statement failed in this segment, -1 */
	PGresult   *fail_res;		/* its error result */
	int			undecided;		/* HB_HELD hellos */
	int			ending;			/* COMMIT or ROLLBACK of the batch sent */
	int			rerun;			/* a hello was refused: ROLLBACK, the others again */
} hello_batch;

typedef struct dbconn
{
	PGconn	   *pg;
	cstate		st;
	int			listen;			/* a LISTEN connection (the router's or a node's) */
	int			node;			/* a node's LISTEN connection: its index; else -1 */
	int			disabled;		/* a node slot not in use: never connected */
	const im_conninfo *ci;		/* where it connects */
	listen_query lq;
	double		next_refresh;	/* router LISTEN connection: next node-map query */
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
	hello_batch batch;			/* TXN_BATCH: the hellos of the open transaction */
} dbconn;

/* db.c: the connections and settings, owned by the database thread */
extern char *im_db_conninfo;
extern int	im_db_npool;
extern int	im_db_statement_timeout_ms;
/* [0..npool) pool, [npool] the --db LISTEN connection, then MAX_NODES node slots */
extern dbconn im_db_conns[MAX_CONNS + 1 + MAX_NODES];
#define IM_DB_ROUTER_LISTEN (&im_db_conns[im_db_npool])
#define IM_DB_NODE_CONN(i) (&im_db_conns[im_db_npool + 1 + (i)])

/* db.c: answers to the lws thread and the queue of jobs waiting for a connection */
extern void im_db_post_done(im_job *job);
/* Sets the job's outcome from res (consumed) and posts it. */
extern void im_db_finish_job(im_job *job, im_job_status st, PGresult *res);
extern void im_db_requeue_front(im_job *j);
/* Frees a job whose ROLLBACK was sent (it never comes back): a hello's
 * device is released first (hello_order.h). */
extern void im_db_free_ended(im_job *j);
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

/* Keeps the first result of a statement in c->res; an error wins over later ones. */
extern void im_conn_keep_result(dbconn *c, PGresult *r);

/* db_conninfo.c: conninfos parsed once, and each attempt's keywords */
extern im_conninfo im_db_main_conninfo;		/* --db */
/*
 * Parses conninfo into ci; with base, keywords conninfo lacks other than
 * where the server is (host, hostaddr, port, dbname, service) come from
 * base (a node's conninfo + the gateway's user, password, TLS files).
 * Returns 0, or -1 with *err (PQfreemem) set.
 */
extern int	im_conninfo_parse(im_conninfo *ci, const char *conninfo, const im_conninfo *base, char **err);
extern void im_conninfo_free(im_conninfo *ci);
/*
 * Fills kw/val (room for 64 + 1, NULL-terminated) for an attempt whose host
 * list starts at first_host; buf holds rotated lists.  Returns the count.
 */
extern int	im_conninfo_params(const im_conninfo *ci, int first_host, const char *application_name,
							   const char **kw, const char **val, char *buf, size_t buflen);

/* db_conn.c: the answer of a finished job from its result (consumed), with
 * the retry and unavailable rules; c is the connection it ran on.  Returns
 * -1 when that took c down (25006), else 0. */
extern int	im_conn_answer(dbconn *c, im_job *j, PGresult *res);
/* db_conn.c: counts one round trip of dt seconds in the histogram */
extern void im_conn_observe(double dt);
/* db_conn.c: sends a prepared statement of the job (prepared_index >= 0) */
extern int	im_conn_is_prepared(const dbconn *c, const char *sql);
extern int	im_conn_send_job(dbconn *c, im_job *j);

/* db_hello_batch.c: several hellos in one transaction, a savepoint each */
extern void im_batch_start(dbconn *c, im_job **jobs, int n);
/* One PQgetResult of a TXN_BATCH connection (r may be NULL). */
extern void im_batch_result(dbconn *c, PGresult *r);
/* A hello of the batch held on c was decided (im_db_end_txn). */
extern void im_batch_decided(dbconn *c, im_job *j);
/* c went down: every hello of its batch answered or freed. */
extern void im_batch_lost(dbconn *c);
/* Queued hellos a batch may take (db.c): up to max with the same statement
 * (prepared on the batch's connection) and the same admitted flag. */
extern int	im_db_take_hellos(im_job **out, int max, const char *sql, int admitted);

/* db_listen.c: a LISTEN connection's queries, notifications and "up" */
extern int	im_listen_send(dbconn *c);
extern void im_listen_drain(dbconn *c);
extern void im_listen_results(dbconn *c);
/* Router LISTEN connection: re-reads the node map when due. */
extern void im_listen_tick(dbconn *c, double now);
/* im_db_stats_g.listen_ready from the LISTEN connections' states */
extern void im_listen_update_ready(void);

/* db_nodes.c: the node map of a sharded installation */
extern int	im_db_sharded;
/* The router answered im.shard_nodes() with res: node slots follow it. */
extern void im_nodes_apply(const PGresult *res);
/* No im.shard_nodes(): a single node.  Returns 1 when it was sharded. */
extern int	im_nodes_none(void);
extern const char *im_node_name(int i);
/* The buckets node i owns (bit b: bucket b); every bit when not known. */
extern uint64_t im_node_buckets(int i);

/* db_reply.c: the reply frame text of a finished API job (job->res consumed) */
extern void im_db_build_reply(im_job *job);

#endif
