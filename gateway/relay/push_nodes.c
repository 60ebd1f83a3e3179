/*
 * push_nodes.c — see push_nodes.h.  Non-blocking libpq connects
 * (PQconnectStartParams/PQconnectPoll) so a node that is down or silent
 * never stalls the relay's loop: other nodes' wake-ups and the requests in
 * flight go on; a connect longer than NODE_CONNECT_TIMEOUT_S is abandoned.
 * A node whose LISTEN comes back wakes a claim (what was queued there
 * while we were deaf), the relay's equivalent of the gateway's re-check.
 */
#include "relay/push_nodes.h"
#include "relay/push_http.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NODE_CONNECT_TIMEOUT_S 5.0
#define NODE_MAX_BACKOFF_S 10.0

typedef enum
{
	N_DOWN, N_CONNECTING, N_LISTENING, N_UP
} node_state;

typedef struct PushNode
{
	int			used;
	int			seen;
	char		name[64];
	char	   *conninfo;
	PGconn	   *pg;
	node_state	st;
	int			want_write;
	double		deadline;
	double		retry_at;
	double		backoff;
} PushNode;

static PushNode nodes[PUSH_NODES_MAX];
static PQconninfoOption *base_opts;

/* where a server is: never taken from --db for a node */
static int
is_location(const char *kw)
{
	return !strcmp(kw, "host") || !strcmp(kw, "hostaddr") || !strcmp(kw, "port") ||
		!strcmp(kw, "dbname") || !strcmp(kw, "service");
}

static void
node_down(PushNode *n, const char *why)
{
	if (n->pg)
	{
		char		msg[256];

		snprintf(msg, sizeof(msg), "%s", why);
		msg[strcspn(msg, "\n")] = '\0';
		relay_log("warning", "event=node_listen_lost node=%s reason=\"%s\"", n->name, msg);
		PQfinish(n->pg);
	}
	n->pg = NULL;
	n->st = N_DOWN;
	n->want_write = 0;
	n->backoff = n->backoff <= 0 ? 1 : (n->backoff * 2 > NODE_MAX_BACKOFF_S ? NODE_MAX_BACKOFF_S : n->backoff * 2);
	n->retry_at = push_now() + n->backoff;
}

static void
node_start(PushNode *n, double now)
{
	const char *kw[80];
	const char *val[80];
	int			k = 0;

	kw[k] = "connect_timeout"; val[k++] = "5";
	kw[k] = "keepalives"; val[k++] = "1";
	kw[k] = "keepalives_idle"; val[k++] = "10";
	kw[k] = "keepalives_interval"; val[k++] = "5";
	kw[k] = "keepalives_count"; val[k++] = "3";
	kw[k] = "target_session_attrs"; val[k++] = "read-write";	/* NOTIFY comes from the primary */
	for (PQconninfoOption *o = base_opts; o && o->keyword && k < 76; o++)
		if (o->val && *o->val && !is_location(o->keyword) && strcmp(o->keyword, "application_name"))
		{
			kw[k] = o->keyword;
			val[k++] = o->val;
		}
	/* the node's conninfo, expanded, overrides what came before it */
	kw[k] = "dbname"; val[k++] = n->conninfo;
	kw[k] = "application_name"; val[k++] = "im_push_relay_listen";
	kw[k] = NULL; val[k] = NULL;
	n->pg = PQconnectStartParams(kw, val, 1);
	if (!n->pg || PQstatus(n->pg) == CONNECTION_BAD)
	{
		node_down(n, n->pg ? PQerrorMessage(n->pg) : "out of memory");
		return;
	}
	PQsetnonblocking(n->pg, 1);
	n->st = N_CONNECTING;
	n->want_write = 1;
	n->deadline = now + NODE_CONNECT_TIMEOUT_S;
}

/* One step of node n; returns 1 when it woke (notification or LISTEN up). */
static int
node_step(PushNode *n, int readable)
{
	int			wake = 0;

	if (n->st == N_CONNECTING)
	{
		PostgresPollingStatusType r = PQconnectPoll(n->pg);

		if (r == PGRES_POLLING_FAILED)
			node_down(n, PQerrorMessage(n->pg));
		else if (r == PGRES_POLLING_OK)
		{
			if (!PQsendQuery(n->pg, "LISTEN im_sync_push"))
				node_down(n, PQerrorMessage(n->pg));
			else
			{
				n->st = N_LISTENING;
				n->want_write = PQflush(n->pg) == 1;
			}
		}
		else
			n->want_write = r == PGRES_POLLING_WRITING;
		return 0;
	}
	if (n->want_write)
	{
		int			f = PQflush(n->pg);

		if (f < 0)
		{
			node_down(n, PQerrorMessage(n->pg));
			return 0;
		}
		n->want_write = f == 1;
	}
	if (!readable)
		return 0;
	if (!PQconsumeInput(n->pg))
	{
		node_down(n, PQerrorMessage(n->pg));
		return 0;
	}
	while (n->st == N_LISTENING && !PQisBusy(n->pg))
	{
		PGresult   *r = PQgetResult(n->pg);

		if (r)
		{
			int			ok = PQresultStatus(r) == PGRES_COMMAND_OK;

			PQclear(r);
			if (!ok)
			{
				node_down(n, "LISTEN failed");
				return 0;
			}
			continue;
		}
		n->st = N_UP;
		n->backoff = 0;
		relay_log("info", "event=node_listen_ready node=%s", n->name);
		wake = 1;				/* queued while we were deaf: claim now */
	}
	for (PGnotify *m; (m = PQnotifies(n->pg)) != NULL;)
	{
		PQfreemem(m);
		wake = 1;
	}
	if (PQstatus(n->pg) == CONNECTION_BAD)
		node_down(n, "connection closed");
	return wake;
}

static void
node_forget(PushNode *n)
{
	if (n->pg)
		PQfinish(n->pg);
	free(n->conninfo);
	memset(n, 0, sizeof(*n));
}

int
push_nodes_refresh(PGconn *router, const char *base_conninfo)
{
	PGresult   *res;
	int			sharded;

	if (!base_opts)
		base_opts = PQconninfoParse(base_conninfo, NULL);
	res = PQexec(router, "SELECT pg_catalog.to_regprocedure('im.shard_nodes()') IS NOT NULL");
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		PQclear(res);
		return -1;
	}
	sharded = PQgetvalue(res, 0, 0)[0] == 't';
	PQclear(res);
	for (int i = 0; i < PUSH_NODES_MAX; i++)
		nodes[i].seen = 0;
	if (sharded)
	{
		res = PQexec(router, "SELECT node_name, conninfo FROM im.shard_nodes()");
		if (PQresultStatus(res) != PGRES_TUPLES_OK)
		{
			relay_log("warning", "event=node_map_failed reason=\"%.200s\"", PQresultErrorMessage(res));
			PQclear(res);
			return -1;
		}
		for (int r = 0; r < PQntuples(res); r++)
		{
			const char *name = PQgetvalue(res, r, 0);
			const char *ci = PQgetvalue(res, r, 1);
			int			i,
						slot = -1;

			for (i = 0; i < PUSH_NODES_MAX; i++)
			{
				if (nodes[i].used && !strcmp(nodes[i].name, name))
					break;
				if (!nodes[i].used && slot < 0)
					slot = i;
			}
			if (i < PUSH_NODES_MAX && strcmp(nodes[i].conninfo, ci) == 0)
			{
				nodes[i].seen = 1;
				continue;
			}
			if (i < PUSH_NODES_MAX)
			{
				node_forget(&nodes[i]);		/* re-pointed: listen afresh */
				slot = i;
			}
			if (slot < 0)
			{
				relay_log("error", "event=too_many_nodes node=%s max=%d", name, PUSH_NODES_MAX);
				continue;
			}
			nodes[slot].used = 1;
			nodes[slot].seen = 1;
			snprintf(nodes[slot].name, sizeof(nodes[slot].name), "%s", name);
			nodes[slot].conninfo = strdup(ci);
			nodes[slot].st = N_DOWN;
			nodes[slot].retry_at = 0;
			relay_log("info", "event=node_added node=%s", nodes[slot].name);
		}
		PQclear(res);
	}
	for (int i = 0; i < PUSH_NODES_MAX; i++)
		if (nodes[i].used && !nodes[i].seen)
		{
			relay_log("info", "event=node_removed node=%s", nodes[i].name);
			node_forget(&nodes[i]);
		}
	return 0;
}

int
push_nodes_waitfds(struct curl_waitfd *fds, int max)
{
	int			k = 0;

	for (int i = 0; i < PUSH_NODES_MAX && k < max; i++)
	{
		PushNode   *n = &nodes[i];

		if (!n->used || !n->pg || PQsocket(n->pg) < 0)
			continue;
		fds[k].fd = PQsocket(n->pg);
		fds[k].events = CURL_WAIT_POLLIN | (n->want_write ? CURL_WAIT_POLLOUT : 0);
		fds[k].revents = 0;
		k++;
	}
	return k;
}

int
push_nodes_io(const struct curl_waitfd *fds, int nfds, double now)
{
	int			wake = 0;

	for (int i = 0; i < PUSH_NODES_MAX; i++)
	{
		PushNode   *n = &nodes[i];
		short		rev = 0;

		if (!n->used)
			continue;
		if (n->st == N_DOWN)
		{
			if (now >= n->retry_at)
				node_start(n, now);
			continue;
		}
		if ((n->st == N_CONNECTING || n->st == N_LISTENING) && now > n->deadline)
		{
			node_down(n, "connect timeout");
			continue;
		}
		for (int k = 0; k < nfds; k++)
			if (fds[k].fd == PQsocket(n->pg))
				rev = fds[k].revents;
		if (rev || n->st == N_CONNECTING)
			wake |= node_step(n, (rev & CURL_WAIT_POLLIN) != 0);
	}
	return wake;
}

int
push_nodes_timeout_ms(double now, int cap_ms)
{
	int			ms = cap_ms;

	for (int i = 0; i < PUSH_NODES_MAX; i++)
		if (nodes[i].used && nodes[i].st == N_DOWN)
		{
			int			t = (int) ((nodes[i].retry_at - now) * 1000) + 1;

			if (t < ms)
				ms = t < 0 ? 0 : t;
		}
	return ms;
}

void
push_nodes_close(void)
{
	for (int i = 0; i < PUSH_NODES_MAX; i++)
		if (nodes[i].used)
			node_forget(&nodes[i]);
	if (base_opts)
		PQconninfoFree(base_opts);
	base_opts = NULL;
}
