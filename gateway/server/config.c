/*
 * config.c — defaults, command line and environment of im_gateway.
 *
 * Every limit is checked here, before the event loop exists, so the rest
 * of the gateway can rely on them (idle_timeout > ping_interval, a pool of
 * at least one, TLS files readable, plain ws:// only on loopback unless
 * --insecure).
 */
#include "server/config.h"
#include "server/admission.h"
#include "server/db/db.h"
#include "common/log_json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

im_config	im_cfg = {
	.host = "127.0.0.1",
	.port = 8080,
	.db = "",
	.max_frame = 1024 * 1024,
	.pool = 4,
	.rate = 50,
	.burst = 100,
	.max_conn_user = 16,
	.hello_rate_device = 1,
	.hello_burst_device = 5,
	.hello_rate_user = 5,
	.hello_burst_user = 20,
	.max_pending_hello = 512,
	.max_waiting_hello = 16384,
	.hello_timeout = 10,
	.members_ttl = 5,
	.max_connections = 50000,
	.max_unauth_per_ip = 256,
	.tls_cert = NULL,
	.tls_key = NULL,
	.insecure = 0,
	.allowed_origins = {NULL},
	.n_allowed_origins = 0,
	.ping_interval = 30,
	.idle_timeout = 60,
	.statement_timeout_ms = IM_DB_DEFAULT_STATEMENT_TIMEOUT_MS,
	.max_queue = 16 * 1024 * 1024,
	.log_key = NULL,
};

static void
usage(void)
{
	fprintf(stderr,
			"usage: im_gateway [options]\n"
			"  --listen HOST:PORT        (env IM_GATEWAY_LISTEN, default 127.0.0.1:8080)\n"
			"  --db CONNINFO             (env IM_GATEWAY_DB, default: libpq environment)\n"
			"  --max-frame BYTES         largest frame, bigger closes 1009 (default 1048576)\n"
			"  --pool N                  database connections for requests (default 4)\n"
			"  --rate R --burst B        per-connection frames/s token bucket (50/100)\n"
			"  --max-conn-per-user N     concurrent sessions per account (16)\n"
			"  --hello-rate-device R     reconnects/s per device, burst 5 (1)\n"
			"  --hello-rate-user R       reconnects/s per account, burst 20 (5)\n"
			"  --max-pending-hello N     hellos in flight gateway-wide (512)\n"
			"  --max-waiting-hello N     hellos held behind them, in order (16384)\n"
			"  --hello-timeout S         seconds to send hello (10)\n"
			"  --max-connections N       WebSocket sessions gateway-wide, over it HTTP 503 (50000)\n"
			"  --max-unauth-per-ip N     sessions without welcome per peer address, over it HTTP 503,\n"
			"                            and connections before their upgrade, over it closed (256)\n"
			"  --tls-cert FILE --tls-key FILE  serve wss:// and https:// (PEM files)\n"
			"  --insecure                allow a non-loopback --listen without TLS\n"
			"  --allowed-origin ORIGIN   accepted Origin (repeatable; default: same host only)\n"
			"  --ping-interval S         ping a session silent this long (30)\n"
			"  --idle-timeout S          close 1001 a session silent this long (60)\n"
			"  --statement-timeout MS    statement_timeout of pool connections, 0 none (10000)\n"
			"  --max-queue BYTES         replies queued per session; a reply over it is\n"
			"                            answered UNAVAILABLE (16777216)\n"
			"  --log-key FILE            key of the user/device hashes in the log\n"
			"                            (default: random per process)\n"
			"  --log-format text|json    log lines as key=value (default) or one JSON\n"
			"                            object each, with one line per request\n"
			"  --web-root DIR            the web client served at / and /web/\n"
			"                            (default: web/ beside the binary)\n");
}

static int
parse_listen(const char *v)
{
	const char *c = strrchr(v, ':');

	if (!c || c == v || (size_t) (c - v) >= sizeof(im_cfg.host))
		return -1;
	memcpy(im_cfg.host, v, (size_t) (c - v));
	im_cfg.host[c - v] = '\0';
	im_cfg.port = atoi(c + 1);
	return im_cfg.port > 0 && im_cfg.port < 65536 ? 0 : -1;
}

/* One option that takes a value.  Returns 0, or the exit status. */
static int
set_option(const char *a, const char *v)
{
	if (!strcmp(a, "--listen"))
	{
		if (parse_listen(v) != 0)
		{
			fprintf(stderr, "bad --listen %s\n", v);
			return 2;
		}
	}
	else if (!strcmp(a, "--db"))
		im_cfg.db = v;
	else if (!strcmp(a, "--max-frame"))
		im_cfg.max_frame = (size_t) strtoull(v, NULL, 10);
	else if (!strcmp(a, "--pool"))
		im_cfg.pool = atoi(v);
	else if (!strcmp(a, "--rate"))
		im_cfg.rate = atof(v);
	else if (!strcmp(a, "--burst"))
		im_cfg.burst = atof(v);
	else if (!strcmp(a, "--max-conn-per-user"))
		im_cfg.max_conn_user = atoi(v);
	else if (!strcmp(a, "--hello-rate-device"))
		im_cfg.hello_rate_device = atof(v);
	else if (!strcmp(a, "--hello-rate-user"))
		im_cfg.hello_rate_user = atof(v);
	else if (!strcmp(a, "--max-pending-hello"))
		im_cfg.max_pending_hello = atoi(v);
	else if (!strcmp(a, "--max-waiting-hello"))
		im_cfg.max_waiting_hello = atoi(v);
	else if (!strcmp(a, "--hello-timeout"))
		im_cfg.hello_timeout = atoi(v);
	else if (!strcmp(a, "--max-connections"))
		im_cfg.max_connections = atoi(v);
	else if (!strcmp(a, "--max-unauth-per-ip"))
		im_cfg.max_unauth_per_ip = atoi(v);
	else if (!strcmp(a, "--tls-cert"))
		im_cfg.tls_cert = v;
	else if (!strcmp(a, "--tls-key"))
		im_cfg.tls_key = v;
	else if (!strcmp(a, "--allowed-origin"))
	{
		if (im_cfg.n_allowed_origins == IM_MAX_ALLOWED_ORIGINS)
		{
			fprintf(stderr, "im_gateway: at most %d --allowed-origin\n", IM_MAX_ALLOWED_ORIGINS);
			return 2;
		}
		im_cfg.allowed_origins[im_cfg.n_allowed_origins++] = v;
	}
	else if (!strcmp(a, "--ping-interval"))
		im_cfg.ping_interval = atoi(v);
	else if (!strcmp(a, "--idle-timeout"))
		im_cfg.idle_timeout = atoi(v);
	else if (!strcmp(a, "--statement-timeout"))
		im_cfg.statement_timeout_ms = atoi(v);
	else if (!strcmp(a, "--max-queue"))
		im_cfg.max_queue = (size_t) strtoull(v, NULL, 10);
	else if (!strcmp(a, "--log-key"))
		im_cfg.log_key = v;
	else if (!strcmp(a, "--log-format"))
	{
		if (im_log_format_set(v) != 0)
		{
			fprintf(stderr, "im_gateway: --log-format is text or json\n");
			return 2;
		}
	}
	else if (!strcmp(a, "--web-root"))
		im_cfg.web_root = v;
	else
	{
		usage();
		return 2;
	}
	return 0;
}

/* The limits the rest of the gateway relies on.  0, or the exit status. */
static int
check_config(void)
{
	if (im_cfg.max_frame < 64 || im_cfg.rate <= 0 || im_cfg.burst < 1 || im_cfg.pool < 1 ||
		im_cfg.max_connections < 1 || im_cfg.max_unauth_per_ip < 1 ||
		im_cfg.ping_interval < 1 || im_cfg.idle_timeout <= im_cfg.ping_interval ||
		im_cfg.statement_timeout_ms < 0 || im_cfg.max_queue < 1024 ||
		im_cfg.max_pending_hello < 1 || im_cfg.max_waiting_hello < 0 || im_cfg.hello_timeout < 1)
	{
		fprintf(stderr, "im_gateway: bad limits (--idle-timeout must exceed --ping-interval)\n");
		return 2;
	}
	if (!im_cfg.tls_cert != !im_cfg.tls_key)
	{
		fprintf(stderr, "im_gateway: --tls-cert and --tls-key go together\n");
		return 2;
	}
	if (im_cfg.tls_cert && (access(im_cfg.tls_cert, R_OK) != 0 || access(im_cfg.tls_key, R_OK) != 0))
	{
		fprintf(stderr, "im_gateway: cannot read --tls-cert %s or --tls-key %s\n",
				im_cfg.tls_cert, im_cfg.tls_key);
		return 2;
	}
	/* plain ws:// carries tokens in clear text: loopback only, unless asked */
	if (!im_cfg.tls_cert && !im_cfg.insecure && !im_host_is_loopback(im_cfg.host))
	{
		fprintf(stderr, "im_gateway: refusing to listen on %s without TLS: give --tls-cert/--tls-key, "
				"or --insecure to serve plain ws:// on a non-loopback address\n", im_cfg.host);
		return 2;
	}
	return 0;
}

int
im_config_load(int argc, char **argv)
{
	const char *env;
	int			i,
				rc;

	if ((env = getenv("IM_GATEWAY_LISTEN")) && parse_listen(env) != 0)
	{
		fprintf(stderr, "bad IM_GATEWAY_LISTEN\n");
		return 2;
	}
	if ((env = getenv("IM_GATEWAY_DB")))
		im_cfg.db = env;
	for (i = 1; i < argc; i++)
	{
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!strcmp(a, "--help") || !strcmp(a, "-h"))
		{
			usage();
			return 0;
		}
		if (!strcmp(a, "--insecure"))
		{
			im_cfg.insecure = 1;
			continue;
		}
		if (!v)
		{
			usage();
			return 2;
		}
		i++;
		if ((rc = set_option(a, v)) != 0)
			return rc;
	}
	rc = check_config();
	return rc ? rc : -1;
}
