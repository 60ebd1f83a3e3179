/*
 * im_gateway.c — the WebSocket gateway of im_sync (contract §10-§11):
 * main, signals, the one-second tick and the drain on SIGTERM.
 *
 * One libwebsockets event loop serves the "im-sync.v1" protocol and HTTP
 * (/healthz, /metrics) on one port (protocol.c routes the callback); the
 * database lives in db.c's thread, which wakes this loop with
 * lws_cancel_service when results or notifications are ready.  Shape as in
 * libwebsockets' minimal-ws-server-ring: main apart from the protocol.
 */
#include "server/im_gateway.h"
#include "server/accept.h"
#include "server/web_mount.h"
#include "server/admission.h"
#include "server/auth.h"
#include "server/config.h"
#include "server/db/db.h"
#include "server/keepalive.h"
#include "server/presence_report.h"
#include "common/log.h"
#include "common/log_hash.h"
#include "server/gateway_metrics.h"
#include "server/protocol.h"
#include "server/session.h"

#include <libwebsockets.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#define DRAIN_SECONDS 5
/* descriptors kept beyond --max-connections: stdio, the wake pipes, lws'
 * own, the LISTEN connection, HTTP clients and upgrades being refused,
 * and the handshakes lws takes at once beyond the cap (accept.c) */
#define FD_RESERVE (128 + IM_MAX_HANDSHAKES)

int			im_draining;
static struct lws_context *g_ctx;
static volatile sig_atomic_t g_terminate;
static lws_sorted_usec_list_t g_tick;

/*
 * Once a second: hello pacing's rate, then the sessions with a deadline
 * due (keepalive.c: hello timeouts, pings, idle closes, re-checks that
 * found no database) — not every session.
 */
static void
tick(lws_sorted_usec_list_t *sul)
{
	im_hello_tick();
	im_keepalive_tick(im_now());
	im_presence_tick(im_now());	/* presence refresh when due */
	lws_sul_schedule(g_ctx, 0, &g_tick, tick, LWS_US_PER_SEC);
	im_gateway_poll_state();
}

static void
on_signal(int sig)
{
	(void) sig;
	g_terminate = 1;
	if (g_ctx)
		lws_cancel_service(g_ctx);
}

/* libev delivers SIGINT itself (a watcher): the same as the handler. */
static void
on_lws_signal(void *handle, int sig)
{
	(void) handle;
	on_signal(sig);
}

static void
wake_lws(void *arg)
{
	lws_cancel_service((struct lws_context *) arg);
}

/* Drain: answer what is in flight, then close 1001 (idle sessions now). */
static void
begin_drain(void)
{
	session    *s;

	im_draining = 1;
	im_log("info", "event=draining sessions=%ld", im_stats.conns_current);
	for (s = im_all_sessions; s; s = s->all_next)
		if (!s->is_http && !s->busy)
			im_begin_close(s, 1001, "shutdown");
}

/*
 * No lws "validity" timers: by default lws 4.1 gives every WebSocket a
 * 300 s ping/hangup timer (the context's default retry policy) and puts it
 * into one deadline-sorted list per thread, re-inserted at the establish
 * and at every pong.  A new deadline is the latest, so each insert walks
 * the whole list: O(sessions) per connect and per pong, most of the
 * gateway's CPU with 15,000 sessions open.  keepalive.c does the pings and
 * idle closes (with close 1001) instead; secs_since_valid_hangup = 0 turns
 * lws' off (_lws_validity_confirmed_role returns early).
 */
static const lws_retry_bo_t no_validity_timers = {
	.secs_since_valid_ping = 0,
	.secs_since_valid_hangup = 0,
};

/*
 * The event loop: lws' libev loop (epoll) when its plugin loads, else lws'
 * poll() loop.  poll() hands the kernel every descriptor on every wake-up:
 * with 15,000 sessions open that was most of the gateway's CPU (sock_poll,
 * tcp_poll), O(sessions) per database answer, frame or pong; epoll costs
 * what is ready.
 */
static int	g_event_lib;

static struct lws_context *
create_context(const char *argv0)
{
	struct lws_context_creation_info info;
	struct lws_context *ctx;

	lws_set_log_level(LLL_ERR, NULL);
	memset(&info, 0, sizeof(info));
	info.port = im_cfg.port;
	info.iface = (strcmp(im_cfg.host, "0.0.0.0") == 0 || strcmp(im_cfg.host, "*") == 0) ? NULL : im_cfg.host;
	info.protocols = im_protocols;
	info.options = LWS_SERVER_OPTION_DISABLE_IPV6;
	info.timeout_secs = 20;
	info.retry_and_idle_policy = &no_validity_timers;
	if (im_cfg.tls_cert)
	{
		/* OpenSSL through lws: wss:// and https:// on the one port */
		info.options |= LWS_SERVER_OPTION_DO_SSL_GLOBAL_INIT;
		info.ssl_cert_filepath = im_cfg.tls_cert;
		info.ssl_private_key_filepath = im_cfg.tls_key;
	}
	info.options |= LWS_SERVER_OPTION_LIBEV;
	info.signal_cb = on_lws_signal;
	/* the web client at /web/ (contract §16) */
	if (im_web_mount_setup(&info, argv0) != 0)
		return NULL;
	if ((ctx = lws_create_context(&info)) != NULL)
	{
		g_event_lib = 1;
		im_web_mount_confine(ctx);
		return ctx;
	}
	/* no libev plugin (or the listen failed: then poll fails the same way) */
	im_log("warn", "event=context_failed event_loop=libev retry=poll");
	info.options &= ~(uint64_t) LWS_SERVER_OPTION_LIBEV;
	if ((ctx = lws_create_context(&info)) != NULL)
		im_web_mount_confine(ctx);
	return ctx;
}

/*
 * After each batch of wake-ups (signals, database answers) and each tick:
 * SIGTERM starts the drain; once no session is left (or DRAIN_SECONDS
 * passed) the loop ends.  With libev lws_service runs the whole loop, so
 * the end is lws_context_destroy from inside it (lws defers the teardown
 * until the loop is out); main finishes it.
 */
static double g_drain_deadline;
static int	g_stopped;

void
im_gateway_poll_state(void)
{
	if (g_stopped)
		return;
	if (g_terminate && !im_draining)
	{
		g_drain_deadline = im_now() + DRAIN_SECONDS;
		begin_drain();
	}
	if (im_draining && (im_stats.conns_current == 0 || im_now() > g_drain_deadline))
	{
		g_stopped = 1;
		if (g_event_lib)
			lws_context_destroy(g_ctx);
	}
}

int
main(int argc, char **argv)
{
	struct rlimit rl;
	char		err[256];
	int			rc;

	if ((rc = im_config_load(argc, argv)) >= 0)
		return rc;
	if (im_cfg.log_key ? im_log_key_load(im_cfg.log_key, err, sizeof(err)) != 0
		: im_log_key_random() != 0)
	{
		fprintf(stderr, "bad --log-key: %s\n", im_cfg.log_key ? err : "no random bytes");
		return 2;
	}
	im_db_set_statement_timeout(im_cfg.statement_timeout_ms);
	/*
	 * Every session is a descriptor: raise the soft limit to the hard one
	 * (lws sizes its fd table from it).  --max-connections above what the
	 * descriptors allow would turn into failed accepts instead of HTTP 503,
	 * so it is lowered to fit, leaving room for the database connections,
	 * the listen socket and HTTP clients.
	 */
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
	{
		long		room;

		if (rl.rlim_cur < rl.rlim_max)
		{
			rl.rlim_cur = rl.rlim_max;
			if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
				getrlimit(RLIMIT_NOFILE, &rl);
		}
		room = (long) rl.rlim_cur - FD_RESERVE - im_cfg.pool;
		if (rl.rlim_cur != RLIM_INFINITY && im_cfg.max_connections > room)
		{
			im_log("warn", "event=max_connections_lowered from=%d to=%ld nofile=%ld",
				   im_cfg.max_connections, room < 1 ? 1 : room, (long) rl.rlim_cur);
			im_cfg.max_connections = room < 1 ? 1 : (int) room;
		}
	}

	g_ctx = create_context(argv[0]);
	if (!g_ctx)
	{
		im_log("error", "event=listen_failed listen=%s:%d", im_cfg.host, im_cfg.port);
		return 1;
	}
	signal(SIGPIPE, SIG_IGN);
	signal(SIGTERM, on_signal);
	signal(SIGINT, on_signal);
	if (im_db_start(im_cfg.db, im_cfg.pool, wake_lws, g_ctx) != 0)
	{
		im_log("error", "event=db_thread_failed");
		return 1;
	}
	lws_sul_schedule(g_ctx, 0, &g_tick, tick, LWS_US_PER_SEC);
	im_log("info", "event=started listen=%s:%d tls=%s pool=%d max_frame=%zu statement_timeout_ms=%d max_connections=%d event_loop=%s",
		   im_cfg.host, im_cfg.port, im_cfg.tls_cert ? "on" : "off", im_cfg.pool,
		   im_cfg.max_frame, im_cfg.statement_timeout_ms, im_cfg.max_connections,
		   g_event_lib ? "libev" : "poll");

	while (!g_stopped && lws_service(g_ctx, 0) >= 0)
		im_gateway_poll_state();
	lws_context_destroy(g_ctx);
	im_db_stop();
	im_log("info", "event=stopped");
	return 0;
}
