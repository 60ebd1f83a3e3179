/*
 * db_nodes.c — the nodes of a sharded installation (contract
 * §15): the router lists them (`SELECT * FROM im.shard_nodes()`: node_name,
 * conninfo, and optionally buckets int[], the buckets the node owns), and
 * the gateway keeps one LISTEN connection per node, because hints, device
 * events and push wake-ups are NOTIFYs on the node that owns the user or
 * the conversation, and NOTIFY does not cross PL/Proxy.  Calls still go to
 * the router's pool.
 *
 * A node's slot keeps its connection while the router lists it with the
 * same conninfo and buckets; a changed entry reconnects (its LISTEN_UP
 * re-checks the sessions of its buckets, which may have moved); a node no
 * longer listed is closed.  Without a buckets column every bucket counts as
 * the node's: a node coming back then re-checks every session (more calls,
 * never a missed revocation).
 */
#include "server/db/db_internal.h"
#include "common/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define IM_BUCKETS 64			/* shard design: bucket(user_id) = user_id % 64 */

typedef struct im_node
{
	int			used;
	char		name[64];
	char	   *conninfo;		/* as the router gave it */
	uint64_t	buckets;
	im_conninfo ci;
} im_node;

static im_node nodes[MAX_NODES];
int			im_db_sharded;

const char *
im_node_name(int i)
{
	return nodes[i].name;
}

uint64_t
im_node_buckets(int i)
{
	return nodes[i].buckets;
}

/* "{0,3,6}" → bit mask; every bit when absent or not an int array */
static uint64_t
parse_buckets(const PGresult *res, int row, int col)
{
	const char *p;
	uint64_t	m = 0;

	if (col < 0 || PQgetisnull(res, row, col))
		return ~(uint64_t) 0;
	p = PQgetvalue(res, row, col);
	if (*p++ != '{')
		return ~(uint64_t) 0;
	while (*p && *p != '}')
	{
		char	   *end;
		long		b = strtol(p, &end, 10);

		if (end == p || b < 0 || b >= IM_BUCKETS)
			return ~(uint64_t) 0;
		m |= (uint64_t) 1 << b;
		p = *end == ',' ? end + 1 : end;
	}
	return m;
}

static void
node_close(int i)
{
	dbconn	   *c = IM_DB_NODE_CONN(i);

	if (c->pg)
		im_conn_down(c, "node left the map");
	c->disabled = 1;
	c->ci = NULL;
	im_conninfo_free(&nodes[i].ci);
	free(nodes[i].conninfo);
	memset(&nodes[i], 0, sizeof(nodes[i]));
}

static void
node_open(int i, const char *name, const char *conninfo, uint64_t buckets)
{
	dbconn	   *c = IM_DB_NODE_CONN(i);
	char	   *err = NULL;

	nodes[i].used = 1;
	snprintf(nodes[i].name, sizeof(nodes[i].name), "%s", name);
	nodes[i].conninfo = strdup(conninfo);
	nodes[i].buckets = buckets;
	if (!nodes[i].conninfo || im_conninfo_parse(&nodes[i].ci, conninfo, &im_db_main_conninfo, &err) != 0)
	{
		/* kept as a used slot without a connection: listen_ready stays 0 */
		im_log("error", "event=bad_node_conninfo node=%s msg=\"%s\"", nodes[i].name, err ? err : "out of memory");
		PQfreemem(err);
		return;
	}
	c->ci = &nodes[i].ci;
	c->disabled = 0;
	c->st = C_DOWN;
	c->retry_at = 0;			/* connect now */
	c->backoff = 0;
	c->first_host = 0;
	im_log("info", "event=node_added node=%s", nodes[i].name);
}

void
im_nodes_apply(const PGresult *res)
{
	int			seen[MAX_NODES] = {0};
	int			cname = PQfnumber(res, "node_name"),
				cconn = PQfnumber(res, "conninfo"),
				cbuck = PQfnumber(res, "buckets");

	if (cname < 0 || cconn < 0)
	{
		im_log("error", "event=bad_node_map msg=\"im.shard_nodes() lacks node_name or conninfo\"");
		return;
	}
	im_db_sharded = 1;
	for (int r = 0; r < PQntuples(res); r++)
	{
		const char *name = PQgetvalue(res, r, cname);
		const char *conninfo = PQgetvalue(res, r, cconn);
		uint64_t	buckets = parse_buckets(res, r, cbuck);
		int			i,
					free_slot = -1;

		for (i = 0; i < MAX_NODES; i++)
		{
			if (nodes[i].used && strcmp(nodes[i].name, name) == 0)
				break;
			if (!nodes[i].used && free_slot < 0)
				free_slot = i;
		}
		if (i < MAX_NODES && !seen[i])
		{
			seen[i] = 1;
			if (strcmp(nodes[i].conninfo, conninfo) == 0 && nodes[i].buckets == buckets)
				continue;
			node_close(i);		/* moved or re-pointed: listen afresh */
			node_open(i, name, conninfo, buckets);
		}
		else if (i == MAX_NODES && free_slot >= 0)
		{
			seen[free_slot] = 1;
			node_open(free_slot, name, conninfo, buckets);
		}
		else if (i == MAX_NODES)
			im_log("error", "event=too_many_nodes node=%s max=%d", name, MAX_NODES);
	}
	for (int i = 0; i < MAX_NODES; i++)
		if (nodes[i].used && !seen[i])
		{
			im_log("info", "event=node_removed node=%s", nodes[i].name);
			node_close(i);
		}
	im_listen_update_ready();
}

int
im_nodes_none(void)
{
	int			was = im_db_sharded;

	for (int i = 0; i < MAX_NODES; i++)
		if (nodes[i].used)
			node_close(i);
	im_db_sharded = 0;
	return was;
}
