/*
 * accept.c — at most IM_MAX_HANDSHAKES accepted connections inside lws'
 * handshake at once (see accept.h for why); the rest wait as descriptors in
 * arrival order and are handed to lws (lws_adopt_socket_vhost) as
 * handshakes end.
 *
 * Invariants:
 *   - a connection is kept back only while others are in their handshake
 *     or ahead of it, and at least IM_ACCEPT_STEP waiting ones go to lws
 *     every IM_ACCEPT_STEP_US whatever the handshakes do;
 *   - none waits longer than IM_ACCEPT_MAX_WAIT_US: an older one is closed,
 *     never handed over;
 *   - per peer address, connections waiting plus those inside lws'
 *     handshake are at most --max-unauth-per-ip; one more is closed at
 *     accept, so one host's idle sockets cannot fill the ring;
 *   - waiting connections count against --max-connections: one is kept
 *     back only while sessions + handshakes + waiting stay under it, else
 *     it is closed at accept (one lws takes at once meets the cap at its
 *     upgrade: HTTP 503), so the descriptors of sessions, handshakes and
 *     the ring stay within --max-connections + IM_MAX_HANDSHAKES;
 *   - each lws connection is counted once (in handshakes and for its
 *     address), from SERVER_NEW_CLIENT_INSTANTIATED to the first of
 *     ESTABLISHED, HTTP or WSI_DESTROY; its opaque user data is its
 *     address's count while it is counted, NULL after.
 */
#define _GNU_SOURCE				/* accept4 */
#include "server/accept.h"
#include "server/admission.h"
#include "server/config.h"
#include "server/db/db.h"
#include "server/gateway_metrics.h"

#include <arpa/inet.h>
#include <libwebsockets.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

/* accepts from the kernel's queue per filter call: never starves the loop */
#define DRAIN_MAX 4096

typedef struct waiting_conn
{
	int			fd;
	double		t;				/* accepted at (im_now) */
	ip_count   *addr;			/* its peer address's pre-upgrade count */
} waiting_conn;

static int	handshakes;			/* connections in lws' handshake */
static waiting_conn *ring;		/* waiting connections, oldest at ring_head */
static int	ring_cap,
			ring_head,
			ring_len;
static struct lws_vhost *vhost;
static struct lws_context *context;
static lws_sorted_usec_list_t feed_sul;
static int	feed_scheduled;
/* the count adopt_oldest hands to the handshake lws starts inside the adopt */
static ip_count *handed_addr;

/* The peer address of fd as text ("unknown" when it has none). */
static void
peer_of(int fd, char *buf, size_t len)
{
	struct sockaddr_storage ss;
	socklen_t	sl = sizeof(ss);
	const char *r = NULL;

	if (getpeername(fd, (struct sockaddr *) &ss, &sl) == 0)
	{
		if (ss.ss_family == AF_INET)
			r = inet_ntop(AF_INET, &((struct sockaddr_in *) &ss)->sin_addr, buf, (socklen_t) len);
		else if (ss.ss_family == AF_INET6)
			r = inet_ntop(AF_INET6, &((struct sockaddr_in6 *) &ss)->sin6_addr, buf, (socklen_t) len);
	}
	if (!r)
		snprintf(buf, len, "unknown");
}

/* Whether one more connection of ip may wait (address cap, connection cap). */
static int
may_wait(const char *ip)
{
	return ring_len < im_cfg.max_connections &&
		im_stats.conns_current + handshakes + ring_len < im_cfg.max_connections &&
		im_preupgrade_count(ip) < im_cfg.max_unauth_per_ip;
}

static int
ring_push(int fd, const char *ip)
{
	waiting_conn *w;

	if (!ring)
	{
		ring_cap = im_cfg.max_connections;
		ring = malloc(sizeof(waiting_conn) * (size_t) ring_cap);
		if (!ring)
			return 0;
	}
	if (!may_wait(ip))
		return 0;
	w = &ring[(ring_head + ring_len++) % ring_cap];
	w->fd = fd;
	w->t = im_now();
	w->addr = im_preupgrade_take(ip);
	return 1;
}

static waiting_conn
ring_pop(void)
{
	waiting_conn w = ring[ring_head];

	ring_head = (ring_head + 1) % ring_cap;
	ring_len--;
	return w;
}

static void
adopt_oldest(void)
{
	waiting_conn w = ring_pop();

	/* its count goes on with the handshake (im_accept_handshake_begins) */
	handed_addr = w.addr;
	/* a failed adopt closes fd itself */
	lws_adopt_socket_vhost(vhost, w.fd);
	if (handed_addr)
	{
		/* no handshake began */
		im_preupgrade_release(handed_addr);
		handed_addr = NULL;
	}
}

static void
drop_oldest(void)
{
	waiting_conn w = ring_pop();

	close(w.fd);
	im_preupgrade_release(w.addr);
	im_stats.accepts_expired++;
}

static void schedule_feed(void);

/*
 * Closes waiting connections older than IM_ACCEPT_MAX_WAIT_US (the oldest
 * are at the head), then hands waiting connections to lws while there is
 * room, and every IM_ACCEPT_STEP_US at least IM_ACCEPT_STEP of them even
 * without room: sockets that never finish their handshake (until lws' own
 * timeouts close them) can slow new connections down, never hold them back.
 */
static void
feed(lws_sorted_usec_list_t *sul)
{
	double		oldest = im_now() - IM_ACCEPT_MAX_WAIT_US / 1e6;
	int			forced = 0;

	feed_scheduled = 0;
	while (ring_len > 0 && ring[ring_head].t < oldest)
		drop_oldest();
	while (ring_len > 0 && (handshakes < IM_MAX_HANDSHAKES || forced++ < IM_ACCEPT_STEP))
		adopt_oldest();
	schedule_feed();
}

/* feed_scheduled: 1 soon (there is room), 2 after IM_ACCEPT_STEP_US */
static void
schedule_feed(void)
{
	int			room = handshakes < IM_MAX_HANDSHAKES;

	if (ring_len == 0 || !context || feed_scheduled == 1 || (feed_scheduled == 2 && !room))
		return;
	/* not from inside the callback that freed the room (a wsi may be mid-close) */
	feed_scheduled = room ? 1 : 2;
	lws_sul_schedule(context, 0, &feed_sul, feed, room ? 1 : IM_ACCEPT_STEP_US);
}

/* Keeps fd back: a duplicate waits (lws closes fd itself). */
static int
keep_back(int fd, const char *ip)
{
	int			d;

	if (!may_wait(ip) || (d = dup(fd)) < 0)
		return 0;
	if (!ring_push(d, ip))
	{
		close(d);
		return 0;
	}
	return 1;
}

int
im_accept_filter(struct lws *listen_wsi, int fd)
{
	char		ip[48];
	int			lfd,
				c,
				n = 0,
				one = 1;

	peer_of(fd, ip, sizeof(ip));
	if (im_preupgrade_count(ip) >= im_cfg.max_unauth_per_ip)
	{
		im_stats.accepts_refused++;
		return 1;				/* lws closes fd */
	}
	if (handshakes < IM_MAX_HANDSHAKES && ring_len == 0)
		return 0;				/* room, nobody ahead: lws takes it */
	vhost = lws_get_vhost(listen_wsi);
	context = lws_get_context(listen_wsi);
	if (!keep_back(fd, ip))
	{
		im_stats.accepts_refused++;
		return 1;
	}
	im_stats.accepts_kept_back++;
	/*
	 * lws ends its accept loop after a kept-back connection: take the rest
	 * of the kernel's queue now (lws' own accept would set TCP_NODELAY);
	 * what may not wait is closed at once.
	 */
	lfd = lws_get_socket_fd(listen_wsi);
	while (n++ < DRAIN_MAX &&
		   (c = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0)
	{
		peer_of(c, ip, sizeof(ip));
		setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		if (!ring_push(c, ip))
		{
			close(c);
			im_stats.accepts_refused++;
		}
		else
			im_stats.accepts_kept_back++;
	}
	schedule_feed();
	return 1;
}

void
im_accept_handshake_begins(struct lws *wsi)
{
	ip_count   *a = handed_addr;

	handed_addr = NULL;
	if (!a)
	{
		char		ip[48];

		peer_of(lws_get_socket_fd(wsi), ip, sizeof(ip));
		a = im_preupgrade_take(ip);
	}
	handshakes++;
	lws_set_opaque_user_data(wsi, a);
}

void
im_accept_handshake_over(struct lws *wsi)
{
	ip_count   *a = lws_get_opaque_user_data(wsi);

	if (!a)
		return;
	lws_set_opaque_user_data(wsi, NULL);
	im_preupgrade_release(a);
	handshakes--;
	schedule_feed();
}

int
im_accept_waiting(void)
{
	return ring_len;
}

int
im_accept_handshakes(void)
{
	return handshakes;
}
