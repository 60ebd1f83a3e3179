/*
 * db_listen.c — the LISTEN connections.  Each listens on im_sync_hint and
 * im_sync_device and passes every notification to the lws thread as an
 * IM_JOB_NOTIFY job; once it is listening, an IM_JOB_LISTEN_UP job tells
 * the lws thread that notifications of the buckets it carries may have been
 * missed meanwhile (job->key: the bucket mask; hints.c re-checks those
 * sessions).
 *
 * The --db connection also asks whether the database is a router (issue
 * 15: `im.shard_nodes()` exists), on every (re)connect and every
 * IM_NODES_REFRESH_S.  A single node (no such function) is today's
 * gateway: this connection's LISTEN_UP covers every session.  On a router
 * the notifications come from the nodes (db_nodes.c keeps one LISTEN
 * connection per node, each reconnecting on its own), so a node that is
 * down delays only the sessions of the users it owns, and its LISTEN_UP
 * re-checks only those.
 */
#include "server/db/db_internal.h"
#include "common/log.h"

#include <stdlib.h>
#include <string.h>

#define IM_NODES_REFRESH_S 30.0
/* a node-map query unanswered this long: the router is gone without a word */
#define IM_NODES_QUERY_TIMEOUT_S 30.0
#define ALL_BUCKETS (~(uint64_t) 0)

int
im_listen_send(dbconn *c)
{
	c->lq = LQ_LISTEN;
	return PQsendQuery(c->pg, "LISTEN im_sync_hint; LISTEN im_sync_device");
}

void
im_listen_update_ready(void)
{
	int			ready = IM_DB_ROUTER_LISTEN->st == C_IDLE,
				nodes = 0,
				nodes_ready = 0;

	for (int i = 0; i < MAX_NODES; i++)
	{
		const dbconn *c = IM_DB_NODE_CONN(i);

		if (c->disabled)
			continue;
		nodes++;
		nodes_ready += c->st == C_IDLE;
	}
	im_db_stats_g.listen_nodes = nodes;
	im_db_stats_g.listen_nodes_ready = nodes_ready;
	im_db_stats_g.listen_ready = ready && nodes_ready == nodes;
}

static void
post_listen_up(uint64_t buckets)
{
	im_job	   *j = im_job_new(IM_JOB_LISTEN_UP, 0);

	j->key = (int64_t) buckets;
	im_db_post_done(j);
}

void
im_listen_drain(dbconn *c)
{
	PGnotify   *n;

	while ((n = PQnotifies(c->pg)) != NULL)
	{
		im_job	   *j = im_job_new(IM_JOB_NOTIFY, 0);

		j->channel = strdup(n->relname);
		j->payload = strdup(n->extra);
		PQfreemem(n);
		im_db_post_done(j);
	}
}

static int
send_query(dbconn *c, listen_query lq, const char *sql)
{
	c->lq = lq;
	c->t_sent = im_now();
	return im_conn_sent(c, PQsendQuery(c->pg, sql));
}

/* The connection is listening and knows what it carries. */
static void
listening(dbconn *c, uint64_t buckets, int post)
{
	int			first = c->st == C_SETUP;

	c->lq = LQ_NONE;
	c->st = C_IDLE;
	c->next_refresh = im_now() + IM_NODES_REFRESH_S;
	im_listen_update_ready();
	if (first && c->node >= 0)
		im_log("info", "event=listen_ready node=%s", im_node_name(c->node));
	else if (first)
		im_log("info", "event=listen_ready%s", im_db_sharded ? " router=1" : "");
	if (post)
		post_listen_up(buckets);
}

/* One query's results are all in (c->res: its first, or its error). */
static void
query_done(dbconn *c)
{
	PGresult   *res = c->res;
	int			ok = res && (PQresultStatus(res) == PGRES_COMMAND_OK ||
							 PQresultStatus(res) == PGRES_TUPLES_OK);
	listen_query lq = c->lq;
	int			first = c->st == C_SETUP;

	c->res = NULL;
	if (!ok)
	{
		const char *ss = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;

		im_log("warn", "event=listen_query_failed query=%s sqlstate=%s",
			   lq == LQ_LISTEN ? "listen" : lq == LQ_PROBE ? "probe" : "shard_nodes", ss ? ss : "-");
		if (res)
			PQclear(res);
		im_conn_down(c, lq == LQ_LISTEN ? "LISTEN failed" : "node map query failed");
		return;
	}
	switch (lq)
	{
		case LQ_LISTEN:
			if (c->node >= 0)
				listening(c, im_node_buckets(c->node), 1);
			else
				send_query(c, LQ_PROBE, "SELECT pg_catalog.to_regprocedure('im.shard_nodes()') IS NOT NULL");
			break;
		case LQ_PROBE:
			if (PQntuples(res) == 1 && PQgetvalue(res, 0, 0)[0] == 't')
				send_query(c, LQ_NODES, "SELECT * FROM im.shard_nodes()");
			else
			{
				/* a single node; back from sharded, this connection carries all */
				int			was = im_nodes_none();

				listening(c, ALL_BUCKETS, first || was);
			}
			break;
		case LQ_NODES:
			im_nodes_apply(res);
			listening(c, 0, 0);
			break;
		case LQ_NONE:
			break;
	}
	PQclear(res);
}

void
im_listen_results(dbconn *c)
{
	while (c->pg && c->lq != LQ_NONE && !PQisBusy(c->pg))
	{
		PGresult   *r = PQgetResult(c->pg);

		if (r)
			im_conn_keep_result(c, r);
		else
			query_done(c);
	}
}

void
im_listen_tick(dbconn *c, double now)
{
	if (c->st != C_IDLE)
		return;
	if (c->lq != LQ_NONE)
	{
		if (now > c->t_sent + IM_NODES_QUERY_TIMEOUT_S)
			im_conn_down(c, "no answer to the node map query");
		return;
	}
	if (now >= c->next_refresh)
		send_query(c, LQ_PROBE, "SELECT pg_catalog.to_regprocedure('im.shard_nodes()') IS NOT NULL");
}
