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
#include "im_gateway.h"
#include "admission.h"
#include "auth.h"
#include "config.h"
#include "db.h"
#include "log.h"
#include "log_hash.h"
#include "metrics.h"
#include "protocol.h"
#include "session.h"

#include <libwebsockets.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#define DRAIN_SECONDS 5

int			im_draining;
static struct lws_context *g_ctx;
static volatile sig_atomic_t g_terminate;
static lws_sorted_usec_list_t g_tick;

/*
 * Once a second: hello pacing's rate, hello timeouts, keepalive (contract
 * §10: ping after ping_interval of silence, again every ping_interval;
 * close 1001 after idle_timeout) and re-checks that found no database.
 */
static void
tick(lws_sorted_usec_list_t *sul)
{
	session    *s;
	double		now = im_now();

	im_hello_tick();
	for (s = im_all_sessions; s; s = s->all_next)
	{
		if (s->is_http || s->close_code)
			continue;
		if (!s->authed && !s->hello_pending && now - s->t_open > im_cfg.hello_timeout)
			im_begin_close(s, 4001, "hello_timeout");
		else if (now - s->t_heard >= im_cfg.idle_timeout)
			im_begin_close(s, 1001, "idle_timeout");
		else if (now - s->t_heard >= im_cfg.ping_interval && now - s->t_ping >= im_cfg.ping_interval)
		{
			s->t_ping = now;
			s->ping_due = 1;
			lws_callback_on_writable(s->wsi);
		}
		if (!s->close_code && s->recheck_retry && !s->recheck_inflight)
		{
			s->recheck_retry = 0;
			im_request_recheck(s, 0);
		}
	}
	lws_sul_schedule(g_ctx, 0, &g_tick, tick, LWS_US_PER_SEC);
}

static void
on_signal(int sig)
{
	(void) sig;
	g_terminate = 1;
	if (g_ctx)
		lws_cancel_service(g_ctx);
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

static struct lws_context *
create_context(void)
{
	struct lws_context_creation_info info;

	lws_set_log_level(LLL_ERR, NULL);
	memset(&info, 0, sizeof(info));
	info.port = im_cfg.port;
	info.iface = (strcmp(im_cfg.host, "0.0.0.0") == 0 || strcmp(im_cfg.host, "*") == 0) ? NULL : im_cfg.host;
	info.protocols = im_protocols;
	info.options = LWS_SERVER_OPTION_DISABLE_IPV6;
	info.timeout_secs = 20;
	if (im_cfg.tls_cert)
	{
		/* OpenSSL through lws: wss:// and https:// on the one port */
		info.options |= LWS_SERVER_OPTION_DO_SSL_GLOBAL_INIT;
		info.ssl_cert_filepath = im_cfg.tls_cert;
		info.ssl_private_key_filepath = im_cfg.tls_key;
	}
	return lws_create_context(&info);
}

int
main(int argc, char **argv)
{
	struct rlimit rl;
	char		err[256];
	double		drain_deadline = 0;
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
	/* many idle connections need many descriptors */
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max)
	{
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}

	g_ctx = create_context();
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
	im_log("info", "event=started listen=%s:%d tls=%s pool=%d max_frame=%zu statement_timeout_ms=%d",
		   im_cfg.host, im_cfg.port, im_cfg.tls_cert ? "on" : "off", im_cfg.pool,
		   im_cfg.max_frame, im_cfg.statement_timeout_ms);

	while (lws_service(g_ctx, 0) >= 0)
	{
		if (g_terminate && !im_draining)
		{
			drain_deadline = im_now() + DRAIN_SECONDS;
			begin_drain();
		}
		if (im_draining && (im_stats.conns_current == 0 || im_now() > drain_deadline))
			break;
	}
	lws_context_destroy(g_ctx);
	im_db_stop();
	im_log("info", "event=stopped");
	return 0;
}
