/*
 * push_nodes.h — the push relay's LISTEN connections to the nodes of a
 * sharded installation: a push job is queued, and im_sync_push
 * notified, on the node that owns its user, and NOTIFY does not cross
 * PL/Proxy.  Claims and completions still go through the router.
 */
#ifndef IM_PUSH_NODES_H
#define IM_PUSH_NODES_H

#include <curl/curl.h>
#include <libpq-fe.h>

#define PUSH_NODES_MAX 32

#include "relay/push_log.h"		/* relay_log */

/*
 * Asks the router (blocking, on the relay's connection) for its nodes:
 * none when im.shard_nodes() does not exist (a single node: the relay's own
 * LISTEN is the one).  base_conninfo (--db) gives who connects; each node's
 * conninfo where.  Returns 0, or -1 when the query failed (the connection
 * may be lost: the caller checks).
 */
extern int	push_nodes_refresh(PGconn *router, const char *base_conninfo);

/* Adds the sockets to wait on (at most max); returns how many. */
extern int	push_nodes_waitfds(struct curl_waitfd *fds, int max);

/*
 * Connects, reconnects (each node on its own, with backoff), reads
 * results and notifications after a wait whose descriptors push_nodes_waitfds
 * filled.  Returns 1 when a node notified im_sync_push or its LISTEN came
 * (back) up: jobs may be waiting, claim now.
 */
extern int	push_nodes_io(const struct curl_waitfd *fds, int n, double now);

/* Milliseconds until a node's reconnect is due (capped at cap_ms). */
extern int	push_nodes_timeout_ms(double now, int cap_ms);

extern void push_nodes_close(void);

#endif
