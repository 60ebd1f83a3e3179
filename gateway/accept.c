/*
 * accept.c — at most IM_MAX_HANDSHAKES accepted connections inside lws'
 * handshake at once (see accept.h for why); the rest wait as descriptors in
 * arrival order and are handed to lws (lws_adopt_socket_vhost) as
 * handshakes end.
 *
 * Invariants: a connection is kept back only while others are in their
 * handshake or ahead of it, and at least IM_ACCEPT_STEP waiting ones go to
 * lws every IM_ACCEPT_STEP_US whatever the handshakes do, so none waits
 * long; the waiting ring is
 * bounded by --max-connections (a full ring lets lws take the connection
 * at once, as before); each lws connection is counted once, from
 * SERVER_NEW_CLIENT_INSTANTIATED to the first of ESTABLISHED, HTTP or
 * WSI_DESTROY (marked by its opaque user data).
 */
#define _GNU_SOURCE				/* accept4 */
#include "accept.h"
#include "config.h"
#include "metrics.h"

#include <libwebsockets.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

static int	handshakes;			/* connections in lws' handshake */
static int *ring;				/* waiting descriptors, oldest at ring_head */
static int	ring_cap,
			ring_head,
			ring_len;
static struct lws_vhost *vhost;
static struct lws_context *context;
static lws_sorted_usec_list_t feed_sul;
static int	feed_scheduled;
static char handshaking_mark;	/* opaque user data of a counted connection */

static int
ring_push(int fd)
{
	if (!ring)
	{
		ring_cap = im_cfg.max_connections;
		ring = malloc(sizeof(int) * (size_t) ring_cap);
		if (!ring)
			return 0;
	}
	if (ring_len == ring_cap)
		return 0;
	ring[(ring_head + ring_len++) % ring_cap] = fd;
	return 1;
}

static void
adopt_oldest(void)
{
	int			fd = ring[ring_head];

	ring_head = (ring_head + 1) % ring_cap;
	ring_len--;
	/* a failed adopt closes fd itself */
	lws_adopt_socket_vhost(vhost, fd);
}

static void schedule_feed(void);

/*
 * Hands waiting connections to lws while there is room, and every
 * IM_ACCEPT_STEP_US at least IM_ACCEPT_STEP of them even without room:
 * sockets that never finish their handshake (until lws' own timeouts close
 * them) can slow new connections down, never hold them back.
 */
static void
feed(lws_sorted_usec_list_t *sul)
{
	int			forced = 0;

	feed_scheduled = 0;
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
keep_back(int fd)
{
	int			d = dup(fd);

	if (d < 0)
		return 0;
	if (!ring_push(d))
	{
		close(d);
		return 0;
	}
	return 1;
}

int
im_accept_filter(struct lws *listen_wsi, int fd)
{
	int			lfd,
				c,
				one = 1;

	if (handshakes < IM_MAX_HANDSHAKES && ring_len == 0)
		return 0;				/* room, nobody ahead: lws takes it */
	vhost = lws_get_vhost(listen_wsi);
	context = lws_get_context(listen_wsi);
	if (!keep_back(fd))
		return 0;
	im_stats.accepts_kept_back++;
	/*
	 * lws ends its accept loop after a kept-back connection: take the rest
	 * of the kernel's queue now (lws' own accept would set TCP_NODELAY).
	 */
	lfd = lws_get_socket_fd(listen_wsi);
	while (ring_len < ring_cap &&
		   (c = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0)
	{
		setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		if (!ring_push(c))
			close(c);
		else
			im_stats.accepts_kept_back++;
	}
	schedule_feed();
	return 1;
}

void
im_accept_handshake_begins(struct lws *wsi)
{
	handshakes++;
	lws_set_opaque_user_data(wsi, &handshaking_mark);
}

void
im_accept_handshake_over(struct lws *wsi)
{
	if (lws_get_opaque_user_data(wsi) != &handshaking_mark)
		return;
	lws_set_opaque_user_data(wsi, NULL);
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
