/*
 * gateway_metrics.c — counters of the lws thread and the /metrics page.
 *
 * /metrics cache: im.metrics() scans tables, and scrapes
 * need no authentication, so its result is reused for METRICS_MAX_AGE
 * seconds (aged from when the call was sent) and at most one call is in
 * flight; scrapes arriving meanwhile wait for it.  The gateway's own
 * counters are always current.
 */
#include "server/gateway_metrics.h"
#include "common/text_buf.h"
#include "server/admission.h"
#include "server/accept.h"
#include "server/db/db.h"
#include "server/http.h"
#include "server/session.h"

#include <libpq-fe.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define METRICS_MAX_AGE 5.0		/* seconds (contract §10) */

im_gw_stats im_stats;

static const char *const err_codes[IM_N_ERR_CODES] = {
	"BAD_FRAME", "INVALID_ARGUMENT", "FORBIDDEN", "NOT_FOUND", "CONFLICT",
	"RATE_LIMITED", "UNAVAILABLE", "INTERNAL", "NOT_AUTHENTICATED"
};
static const int close_codes[IM_N_CLOSE_CODES] = {1001, 1009, 1013, 4001, 4003, 4008, 4029};

void
im_count_error(const char *code)
{
	int			i;

	for (i = 0; i < IM_N_ERR_CODES; i++)
		if (strcmp(code, err_codes[i]) == 0)
			im_stats.errors[i]++;
}

void
im_count_close(int code)
{
	int			i;

	for (i = 0; i < IM_N_CLOSE_CODES; i++)
		if (close_codes[i] == code)
			im_stats.closes[i]++;
}

/* ---- the text ---- */

/* HELP, TYPE and the value of a metric without labels. */
static void
sb_metric(im_text_buf *sb, const char *name, const char *type, const char *help, long value)
{
	im_text_printf(sb, "# HELP %s %s\n# TYPE %s %s\n%s %ld\n", name, help, name, type, name, value);
}

static int
metric_name_ok(const char *s)
{
	if (!*s)
		return 0;
	for (; *s; s++)
		if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
			  (*s >= '0' && *s <= '9') || *s == '_' || *s == ':'))
			return 0;
	return 1;
}

/* The rows of im.metrics(): names checked, help text on one line. */
static void
sb_extra(im_text_buf *sb, PGresult *extra)
{
	int			i;

	for (i = 0; i < PQntuples(extra); i++)
	{
		const char *name = PQgetvalue(extra, i, 0);
		const char *h = PQgetvalue(extra, i, 2);
		char		help[256];
		size_t		k,
					o = 0;

		if (!metric_name_ok(name) || PQgetisnull(extra, i, 1))
			continue;
		for (k = 0; h[k] && o < sizeof(help) - 1; k++)
			help[o++] = (h[k] == '\n' || h[k] == '\\') ? ' ' : h[k];
		help[o] = '\0';
		im_text_printf(sb, "# HELP %s %s\n%s %s\n", name, help, name, PQgetvalue(extra, i, 1));
	}
}

static char *
metrics_text(PGresult *extra)
{
	im_text_buf		sb = {.b = malloc(4096), .len = 0, .cap = 4096};
	int			i;
	long		cum = 0;

	if (!sb.b)
		abort();
	sb_metric(&sb, "im_gateway_connections", "gauge", "Open WebSocket sessions.", im_stats.conns_current);
	sb_metric(&sb, "im_gateway_connections_total", "counter", "WebSocket sessions accepted.", im_stats.conns_total);
	im_text_printf(&sb, "# HELP im_gateway_frames_in_total Frames received by type.\n# TYPE im_gateway_frames_in_total counter\n");
	for (i = 0; i < IM_OP_COUNT; i++)
		im_text_printf(&sb, "im_gateway_frames_in_total{type=\"%s\"} %ld\n", im_ops[i].type, im_stats.frames_in[i]);
	im_text_printf(&sb, "im_gateway_frames_in_total{type=\"invalid\"} %ld\n", im_stats.frames_in[IM_OP_COUNT]);
	im_text_printf(&sb, "# HELP im_gateway_frames_out_total Frames sent by type.\n# TYPE im_gateway_frames_out_total counter\n");
	for (i = 0; i < IM_OP_COUNT; i++)
		im_text_printf(&sb, "im_gateway_frames_out_total{type=\"%s\"} %ld\n", im_ops[i].reply_type, im_stats.frames_out[i]);
	im_text_printf(&sb, "im_gateway_frames_out_total{type=\"error\"} %ld\nim_gateway_frames_out_total{type=\"hint\"} %ld\n",
			  im_stats.frames_out[IM_OUT_ERROR], im_stats.frames_out[IM_OUT_HINT]);
	im_text_printf(&sb, "# HELP im_gateway_errors_total Error frames by code.\n# TYPE im_gateway_errors_total counter\n");
	for (i = 0; i < IM_N_ERR_CODES; i++)
		im_text_printf(&sb, "im_gateway_errors_total{code=\"%s\"} %ld\n", err_codes[i], im_stats.errors[i]);
	im_text_printf(&sb, "# HELP im_gateway_closes_total Sessions closed by the gateway by close code.\n# TYPE im_gateway_closes_total counter\n");
	for (i = 0; i < IM_N_CLOSE_CODES; i++)
		im_text_printf(&sb, "im_gateway_closes_total{code=\"%d\"} %ld\n", close_codes[i], im_stats.closes[i]);
	sb_metric(&sb, "im_gateway_hints_sent_total", "counter", "Hint frames written.", im_stats.hints_sent);
	sb_metric(&sb, "im_gateway_hints_coalesced_total", "counter", "Hints merged into a pending one.", im_stats.hints_coalesced);
	sb_metric(&sb, "im_gateway_hints_dropped_total", "counter", "Conversation hints dropped (too many pending).", im_stats.hints_dropped);
	sb_metric(&sb, "im_gateway_notifications_total", "counter", "Notifications received.", im_stats.notifications);
	sb_metric(&sb, "im_gateway_device_rechecks_total", "counter", "im.device_session re-checks after notifications or a re-LISTEN.", im_stats.rechecks);
	sb_metric(&sb, "im_gateway_metrics_refreshes_total", "counter", "im.metrics() calls made for /metrics.", im_stats.metrics_refreshes);
	sb_metric(&sb, "im_gateway_replies_too_large_total", "counter", "Replies that did not fit a session's queue (answered UNAVAILABLE).", im_stats.replies_too_large);
	sb_metric(&sb, "im_gateway_refusals_total", "counter", "Connections refused by admission limits.", im_stats.refusals);
	sb_metric(&sb, "im_gateway_accepts_kept_back_total", "counter", "Accepted connections that waited for a handshake place (256 in lws at once).", im_stats.accepts_kept_back);
	sb_metric(&sb, "im_gateway_accepts_refused_total", "counter", "Accepted connections closed at once: their address's --max-unauth-per-ip connections before the upgrade, or --max-connections, reached.", im_stats.accepts_refused);
	sb_metric(&sb, "im_gateway_accepts_expired_total", "counter", "Accepted connections closed after waiting 5 s for a handshake place.", im_stats.accepts_expired);
	sb_metric(&sb, "im_gateway_handshakes", "gauge", "Accepted connections inside the HTTP/WebSocket handshake.", im_accept_handshakes());
	sb_metric(&sb, "im_gateway_accepts_waiting", "gauge", "Accepted connections waiting for a handshake place.", im_accept_waiting());
	sb_metric(&sb, "im_gateway_hellos_waited_total", "counter", "Hellos that waited for a place behind --max-pending-hello.", im_stats.hellos_waited);
	sb_metric(&sb, "im_gateway_hellos_in_flight", "gauge", "Hellos sent to the database and not yet answered.", im_hellos_in_flight());
	sb_metric(&sb, "im_gateway_hellos_waiting", "gauge", "Hellos waiting for a place (--max-waiting-hello).", im_hellos_waiting());
	im_text_printf(&sb, "# HELP im_gateway_upgrades_refused_total WebSocket upgrades refused before a session existed.\n# TYPE im_gateway_upgrades_refused_total counter\n"
			  "im_gateway_upgrades_refused_total{reason=\"cap\"} %ld\nim_gateway_upgrades_refused_total{reason=\"origin\"} %ld\n",
			  im_stats.upgrades_refused_cap, im_stats.upgrades_refused_origin);
	sb_metric(&sb, "im_gateway_hello_batches_total", "counter", "Transactions that authenticated several hellos.", im_db_stats_g.hello_batches);
	sb_metric(&sb, "im_gateway_hellos_batched_total", "counter", "Hellos authenticated in those transactions.", im_db_stats_g.hellos_batched);
	sb_metric(&sb, "im_gateway_hello_batch_reruns_total", "counter", "Hello batches rolled back because one hello was refused (the others ran again).", im_db_stats_g.hello_batch_reruns);
	sb_metric(&sb, "im_gateway_hello_device_waits_total", "counter", "Hellos that waited for an earlier hello of their device to end (hello_order.h).", im_db_stats_g.hello_device_waits);
	sb_metric(&sb, "im_gateway_pool_waits_total", "counter", "Job-polls that found every pool connection busy.", im_db_stats_g.pool_waits);
	sb_metric(&sb, "im_gateway_db_connects_total", "counter", "Database connection attempts.", im_db_stats_g.reconnects);
	sb_metric(&sb, "im_gateway_pool_ready", "gauge", "Pool connections up.", im_db_stats_g.pool_ready);
	sb_metric(&sb, "im_gateway_listen_ready", "gauge", "LISTEN connections up (the --db one and every node's).", im_db_stats_g.listen_ready);
	sb_metric(&sb, "im_gateway_listen_nodes", "gauge", "Nodes the router lists (im.shard_nodes(); 0: a single node).", im_db_stats_g.listen_nodes);
	sb_metric(&sb, "im_gateway_listen_nodes_ready", "gauge", "Nodes whose LISTEN connection is up.", im_db_stats_g.listen_nodes_ready);
	im_text_printf(&sb, "# HELP im_gateway_db_seconds Database round trip.\n# TYPE im_gateway_db_seconds histogram\n");
	for (i = 0; i < 11; i++)
	{
		cum += im_db_stats_g.hist[i];
		im_text_printf(&sb, "im_gateway_db_seconds_bucket{le=\"%g\"} %ld\n", im_db_hist_bounds[i], cum);
	}
	cum += im_db_stats_g.hist[11];
	im_text_printf(&sb, "im_gateway_db_seconds_bucket{le=\"+Inf\"} %ld\nim_gateway_db_seconds_sum %f\nim_gateway_db_seconds_count %ld\n",
			  cum, im_db_stats_g.hist_sum, im_db_stats_g.hist_count);
	if (extra)
		sb_extra(&sb, extra);
	return sb.b;
}

/* ---- the cache of im.metrics() ---- */

static struct
{
	PGresult   *res;			/* NULL: none usable */
	double		at;
	int			inflight;
	uint64_t   *waiting;		/* sids of HTTP sessions waiting */
	int			nwaiting,
				capwaiting;
} mcache;

static int
cache_fresh(void)
{
	return mcache.res && im_now() - mcache.at <= METRICS_MAX_AGE;
}

static void
answer_metrics(session *s)
{
	im_http_answer(s, 200, metrics_text(cache_fresh() ? mcache.res : NULL));
}

void
im_request_metrics(session *s)
{
	im_job	   *j;

	if (cache_fresh())
	{
		answer_metrics(s);
		return;
	}
	if (mcache.nwaiting == mcache.capwaiting)
	{
		mcache.capwaiting = mcache.capwaiting ? mcache.capwaiting * 2 : 16;
		mcache.waiting = realloc(mcache.waiting, sizeof(uint64_t) * (size_t) mcache.capwaiting);
		if (!mcache.waiting)
			abort();
	}
	mcache.waiting[mcache.nwaiting++] = s->sid;
	if (mcache.inflight)
		return;
	mcache.inflight = 1;
	im_stats.metrics_refreshes++;
	j = im_job_new(IM_JOB_METRICS, 0);
	j->sql = "SELECT name, value, help FROM im.metrics()";
	im_db_submit(j);
}

void
im_on_metrics_job(im_job *j)
{
	int			i;

	mcache.inflight = 0;
	if (mcache.res)
		PQclear(mcache.res);
	mcache.res = NULL;
	if (j->status == IM_JOB_OK)
	{
		mcache.res = j->res;	/* kept: the job no longer owns it */
		j->res = NULL;
		mcache.at = j->t_submit;
	}
	for (i = 0; i < mcache.nwaiting; i++)
	{
		session    *s = im_session_find(mcache.waiting[i]);

		if (s)
			answer_metrics(s);
	}
	mcache.nwaiting = 0;
}
