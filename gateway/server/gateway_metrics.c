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

#include <inttypes.h>
#include <libpq-fe.h>
#include <jansson.h>
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

/* request latency buckets (seconds) and sync page sizes (events) */
static const double req_bounds[IM_REQ_NBOUNDS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
0.1, 0.25, 0.5, 1, 2.5, 5};
static const double page_bounds[IM_PAGE_NBOUNDS] = {0, 1, 5, 10, 25, 50, 100, 200, 1000};

void
im_observe_request(int op, double seconds)
{
	int			b;

	if (op < 0 || op > IM_OP_COUNT)
		return;
	for (b = 0; b < IM_REQ_NBOUNDS && seconds > req_bounds[b]; b++)
		;
	im_stats.req_hist[op][b]++;
	im_stats.req_sum[op] += seconds;
}

void
im_observe_sync_page(long n)
{
	int			b;

	for (b = 0; b < IM_PAGE_NBOUNDS && (double) n > page_bounds[b]; b++)
		;
	im_stats.page_hist[b]++;
	im_stats.page_sum += (double) n;
	im_stats.page_count++;
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

/* The rows of an im.metrics() without type and labels: names checked,
 * help text on one line, no TYPE (untyped). */
static void
sb_extra_untyped(im_text_buf *sb, PGresult *extra, int cname, int cvalue, int chelp)
{
	int			i;

	for (i = 0; i < PQntuples(extra); i++)
	{
		const char *name = PQgetvalue(extra, i, cname);
		const char *h = chelp >= 0 ? PQgetvalue(extra, i, chelp) : "";
		char		help[256];
		size_t		k,
					o = 0;

		if (!metric_name_ok(name) || PQgetisnull(extra, i, cvalue))
			continue;
		for (k = 0; h[k] && o < sizeof(help) - 1; k++)
			help[o++] = (h[k] == '\n' || h[k] == '\\') ? ' ' : h[k];
		help[o] = '\0';
		im_text_printf(sb, "# HELP %s %s\n%s %s\n", name, help, name, PQgetvalue(extra, i, cvalue));
	}
}

static int
ends_with(const char *s, const char *suffix)
{
	size_t		n = strlen(s),
				m = strlen(suffix);

	return n >= m && strcmp(s + n - m, suffix) == 0;
}

static int
label_name_ok(const char *s)
{
	if (!*s || (*s >= '0' && *s <= '9'))
		return 0;
	for (; *s; s++)
		if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
			  (*s >= '0' && *s <= '9') || *s == '_'))
			return 0;
	return 1;
}

/* A label value escaped as the exposition format asks: \\, \" and \n. */
static void
sb_label_value(im_text_buf *sb, const char *v)
{
	for (; *v; v++)
	{
		if (*v == '\\')
			im_text_printf(sb, "\\\\");
		else if (*v == '"')
			im_text_printf(sb, "\\\"");
		else if (*v == '\n')
			im_text_printf(sb, "\\n");
		else
			im_text_printf(sb, "%c", *v);
	}
}

/* A sample value: PostgreSQL's float8 text, infinities as the format spells them. */
static const char *
sample_value(const char *v)
{
	if (strcmp(v, "Infinity") == 0)
		return "+Inf";
	if (strcmp(v, "-Infinity") == 0)
		return "-Inf";
	return v;
}

/* One row of a typed im.metrics() as it is read. */
typedef struct mrow
{
	char		family[128];	/* HELP/TYPE name */
	char		sample[136];	/* the sample's name */
	const char *type;			/* counter, gauge, histogram; NULL: untyped */
	json_t	   *labels;			/* object or NULL */
	int			row;
} mrow;

/*
 * The rows of an im.metrics() with type and labels: one HELP and one TYPE
 * per family (a histogram's _bucket/_sum/_count rows are one family, a
 * bucket row's sample name gains _bucket), its samples after them with
 * their label sets; rows with a bad name, label or type are left out, as
 * are families the gateway writes itself.
 */
static void
sb_extra_typed(im_text_buf *sb, PGresult *extra, int cname, int cvalue, int chelp,
			   int ctype, int clabels)
{
	int			n = PQntuples(extra);
	mrow	   *rows = calloc((size_t) n + 1, sizeof(mrow));
	char	   *done = calloc((size_t) n + 1, 1);
	int			i,
				k;

	if (!rows || !done)
		abort();
	for (i = 0; i < n; i++)
	{
		mrow	   *r = &rows[i];
		const char *name = PQgetvalue(extra, i, cname);
		const char *t = PQgetisnull(extra, i, ctype) ? "" : PQgetvalue(extra, i, ctype);
		size_t		len = strlen(name);

		r->row = i;
		done[i] = 1;			/* until it proves usable */
		if (!metric_name_ok(name) || len >= sizeof(r->family) || PQgetisnull(extra, i, cvalue) ||
			strncmp(name, "im_gateway_", 11) == 0)
			continue;
		r->type = strcmp(t, "counter") == 0 ? "counter" : strcmp(t, "gauge") == 0 ? "gauge" :
			strcmp(t, "histogram") == 0 ? "histogram" : NULL;
		if (!PQgetisnull(extra, i, clabels))
		{
			json_error_t jerr;
			const char *lk;
			json_t	   *lv;
			int			ok = 1;

			r->labels = json_loads(PQgetvalue(extra, i, clabels), 0, &jerr);
			if (!r->labels || !json_is_object(r->labels))
				ok = 0;
			else
				json_object_foreach(r->labels, lk, lv)
					if (!label_name_ok(lk) || strncmp(lk, "__", 2) == 0 ||
						!(json_is_string(lv) || json_is_number(lv)))
					ok = 0;
			if (!ok)
				continue;
		}
		snprintf(r->family, sizeof(r->family), "%s", name);
		snprintf(r->sample, sizeof(r->sample), "%s", name);
		if (r->type && strcmp(r->type, "histogram") == 0)
		{
			static const char *const sfx[] = {"_bucket", "_sum", "_count"};
			int			s;

			for (s = 0; s < 3; s++)
				if (ends_with(name, sfx[s]))
				{
					r->family[len - strlen(sfx[s])] = '\0';
					break;
				}
			if (s == 3 && r->labels && json_object_get(r->labels, "le"))
				snprintf(r->sample, sizeof(r->sample), "%s_bucket", name);
		}
		done[i] = 0;
	}
	for (i = 0; i < n; i++)
	{
		const char *h;
		size_t		o;

		if (done[i])
			continue;
		/* the family's HELP and TYPE from its first row, then all its rows */
		h = chelp >= 0 ? PQgetvalue(extra, rows[i].row, chelp) : "";
		im_text_printf(sb, "# HELP %s ", rows[i].family);
		for (o = 0; h[o]; o++)
		{
			if (h[o] == '\n')
				im_text_printf(sb, "\\n");
			else if (h[o] == '\\')
				im_text_printf(sb, "\\\\");
			else
				im_text_printf(sb, "%c", h[o]);
		}
		im_text_printf(sb, "\n");
		if (rows[i].type)
			im_text_printf(sb, "# TYPE %s %s\n", rows[i].family, rows[i].type);
		for (k = i; k < n; k++)
		{
			mrow	   *r = &rows[k];

			if (done[k] || strcmp(r->family, rows[i].family) != 0)
				continue;
			done[k] = 1;
			im_text_printf(sb, "%s", r->sample);
			if (r->labels && json_object_size(r->labels) > 0)
			{
				const char *lk;
				json_t	   *lv;
				int			first = 1;

				im_text_printf(sb, "{");
				json_object_foreach(r->labels, lk, lv)
				{
					im_text_printf(sb, "%s%s=\"", first ? "" : ",", lk);
					if (json_is_string(lv))
						sb_label_value(sb, json_string_value(lv));
					else if (json_is_integer(lv))
						im_text_printf(sb, "%" JSON_INTEGER_FORMAT, json_integer_value(lv));
					else
						im_text_printf(sb, "%g", json_number_value(lv));
					im_text_printf(sb, "\"");
					first = 0;
				}
				im_text_printf(sb, "}");
			}
			im_text_printf(sb, " %s\n", sample_value(PQgetvalue(extra, r->row, cvalue)));
		}
	}
	for (i = 0; i < n; i++)
		json_decref(rows[i].labels);
	free(rows);
	free(done);
}

/*
 * The rows of im.metrics(), read by column name: with type and labels
 * (contract §21) typed families, else (an older im.metrics()) as before.
 */
static void
sb_extra(im_text_buf *sb, PGresult *extra)
{
	int			cname = PQfnumber(extra, "name"),
				cvalue = PQfnumber(extra, "value"),
				chelp = PQfnumber(extra, "help"),
				ctype = PQfnumber(extra, "type"),
				clabels = PQfnumber(extra, "labels");

	if (cname < 0 || cvalue < 0)
		return;
	if (ctype >= 0 && clabels >= 0)
		sb_extra_typed(sb, extra, cname, cvalue, chelp, ctype, clabels);
	else
		sb_extra_untyped(sb, extra, cname, cvalue, chelp);
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
	sb_metric(&sb, "im_gateway_db_up", "gauge", "1 when the gateway has a ready database pool connection, else 0.",
			  im_db_stats_g.pool_ready > 0 ? 1 : 0);
	im_text_printf(&sb, "# HELP im_gateway_request_duration_seconds Requests by frame type, from the frame taken to its answer queued.\n"
				   "# TYPE im_gateway_request_duration_seconds histogram\n");
	for (i = 0; i <= IM_OP_COUNT; i++)
	{
		const char *type = i < IM_OP_COUNT ? im_ops[i].type : "invalid";
		int			b;

		cum = 0;
		for (b = 0; b < IM_REQ_NBOUNDS; b++)
		{
			cum += im_stats.req_hist[i][b];
			im_text_printf(&sb, "im_gateway_request_duration_seconds_bucket{type=\"%s\",le=\"%g\"} %ld\n",
						   type, req_bounds[b], cum);
		}
		cum += im_stats.req_hist[i][IM_REQ_NBOUNDS];
		im_text_printf(&sb, "im_gateway_request_duration_seconds_bucket{type=\"%s\",le=\"+Inf\"} %ld\n"
					   "im_gateway_request_duration_seconds_sum{type=\"%s\"} %.6f\n"
					   "im_gateway_request_duration_seconds_count{type=\"%s\"} %ld\n",
					   type, cum, type, im_stats.req_sum[i], type, cum);
	}
	im_text_printf(&sb, "# HELP im_gateway_sync_page_events Events in each sync page answered.\n"
				   "# TYPE im_gateway_sync_page_events histogram\n");
	cum = 0;
	for (i = 0; i < IM_PAGE_NBOUNDS; i++)
	{
		cum += im_stats.page_hist[i];
		im_text_printf(&sb, "im_gateway_sync_page_events_bucket{le=\"%g\"} %ld\n", page_bounds[i], cum);
	}
	im_text_printf(&sb, "im_gateway_sync_page_events_bucket{le=\"+Inf\"} %ld\nim_gateway_sync_page_events_sum %.0f\n"
				   "im_gateway_sync_page_events_count %ld\n", im_stats.page_count, im_stats.page_sum, im_stats.page_count);
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
	/* by column name: an older im.metrics() lacks type and labels */
	j->sql = "SELECT * FROM im.metrics()";
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
