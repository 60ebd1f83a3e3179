/*
 * http.c — HTTP on the gateway's port: admission of WebSocket upgrades
 * (contract §10: caps and Origin decided before a session exists, without
 * the database) and the two GET endpoints, /healthz (SELECT 1 through the
 * pool) and /metrics (gateway_metrics.c).
 */
#include "server/http.h"
#include "server/web_mount.h"
#include "server/admission.h"
#include "server/config.h"
#include "server/db/db.h"
#include "server/im_gateway.h"
#include "common/log.h"
#include "server/gateway_metrics.h"
#include "server/session.h"

#include <libwebsockets.h>
#include <stdlib.h>
#include <string.h>

/* ---- upgrades ---- */

/*
 * Refuses with an HTTP status; returning 1 tells lws the response is sent.
 * The status line is written here: lws_return_http_status would say
 * HTTP/1.0 at this stage (the request version is parsed later), which
 * WebSocket clients reject as a response to their HTTP/1.1 upgrade.
 */
static int
refuse_upgrade(struct lws *wsi, unsigned status, const char *why, const char *ip)
{
	unsigned char buf[LWS_PRE + 768];
	unsigned char *start = buf + LWS_PRE,
			   *p = start,
			   *end = buf + sizeof(buf) - 1;
	char		line[64],
				body[160],
				clen[16];
	int			nline,
				nbody,
				nclen;

	im_log("info", "event=upgrade_refused status=%u reason=\"%s\" peer=%s", status, why, ip);
	nline = snprintf(line, sizeof(line), "HTTP/1.1 %u %s", status,
					 status == HTTP_STATUS_FORBIDDEN ? "Forbidden" : "Service Unavailable");
	nbody = snprintf(body, sizeof(body), "%s\n", why);
	nclen = snprintf(clen, sizeof(clen), "%d", nbody);
	if (lws_add_http_header_by_name(wsi, NULL, (unsigned char *) line, nline, &p, end) ||
		lws_add_http_header_by_token(wsi, WSI_TOKEN_HTTP_CONTENT_TYPE,
									 (unsigned char *) "text/plain", 10, &p, end) ||
		lws_add_http_header_by_token(wsi, WSI_TOKEN_HTTP_CONTENT_LENGTH,
									 (unsigned char *) clen, nclen, &p, end) ||
		lws_add_http_header_by_token(wsi, WSI_TOKEN_CONNECTION,
									 (unsigned char *) "close", 5, &p, end) ||
		lws_finalize_http_header(wsi, &p, end) ||
		end - p < nbody)
		return -1;
	memcpy(p, body, (size_t) nbody);
	p += nbody;
	if (lws_write(wsi, start, (size_t) (p - start), LWS_WRITE_HTTP) != (int) (p - start))
		return -1;
	return 1;
}

/* Header value (copied into buf) or NULL when absent. */
static const char *
header(struct lws *wsi, enum lws_token_indexes t, char *buf, int len)
{
	if (lws_hdr_total_length(wsi, t) <= 0 || lws_hdr_total_length(wsi, t) >= len)
		return NULL;
	return lws_hdr_copy(wsi, buf, len, t) < 0 ? NULL : buf;
}

/*
 * Over the global connection cap or the address's unauthenticated cap,
 * HTTP 503; an Origin that is neither listed (--allowed-origin) nor, without
 * a list, the same host as the Host header, HTTP 403.
 */
int
im_admit_upgrade(struct lws *wsi)
{
	char		ip[48],
				origin[256],
				host[256];
	const char *o,
			   *h;

	lws_get_peer_simple(wsi, ip, sizeof(ip));
	if (im_draining || im_stats.conns_current >= im_cfg.max_connections)
	{
		im_stats.upgrades_refused_cap++;
		return refuse_upgrade(wsi, HTTP_STATUS_SERVICE_UNAVAILABLE,
							  "too many connections", ip);
	}
	if (im_unauth_count(ip) >= im_cfg.max_unauth_per_ip)
	{
		im_stats.upgrades_refused_cap++;
		return refuse_upgrade(wsi, HTTP_STATUS_SERVICE_UNAVAILABLE,
							  "too many unauthenticated connections from this address", ip);
	}
	o = header(wsi, WSI_TOKEN_ORIGIN, origin, sizeof(origin));
	if (!o && lws_hdr_total_length(wsi, WSI_TOKEN_ORIGIN) > 0)
		o = "";					/* present but unreadable: not allowed */
	h = header(wsi, WSI_TOKEN_HOST, host, sizeof(host));
	if (!im_origin_allowed(o, h, im_cfg.allowed_origins, im_cfg.n_allowed_origins))
	{
		im_stats.upgrades_refused_origin++;
		return refuse_upgrade(wsi, HTTP_STATUS_FORBIDDEN, "origin not allowed", ip);
	}
	return 0;
}

/* ---- GET /healthz, /metrics ---- */

void
im_http_answer(session *s, int status, char *body)
{
	free(s->http_body);
	s->http_status = status;
	s->http_body = body;
	lws_callback_on_writable(s->wsi);
}

void
im_on_http(struct lws *wsi, session *s, const char *uri)
{
	im_stats.http_requests++;
	free(s->http_body);
	s->http_body = NULL;
	if (uri && strcmp(uri, "/healthz") == 0)
	{
		im_job	   *j = im_job_new(IM_JOB_HEALTH, s->sid);

		j->sql = "SELECT 1";
		im_db_submit(j);
	}
	else if (uri && strcmp(uri, "/metrics") == 0)
		im_request_metrics(s);
	else if (uri && strcmp(uri, "/") == 0)
	{
		/* the web client lives under the /web/ mount */
		if (im_web_redirect_root(wsi) != 0)
			lws_set_timeout(wsi, PENDING_TIMEOUT_CLOSE_SEND, LWS_TO_KILL_ASYNC);
	}
	else
		im_http_answer(s, 404, strdup("not found\n"));
}

void
im_on_health_job(session *s, im_job *j)
{
	int			ok = j->status == IM_JOB_OK;

	im_http_answer(s, ok ? 200 : 503, strdup(ok ? "ok\n" : "database unavailable\n"));
}

int
im_on_http_writeable(struct lws *wsi, session *s)
{
	unsigned char hdr[LWS_PRE + 512];
	unsigned char *start = hdr + LWS_PRE,
			   *p = start,
			   *end = hdr + sizeof(hdr) - 1;
	size_t		blen;
	unsigned char *body;
	int			rc;

	if (!s || !s->http_body)
		return 0;
	blen = strlen(s->http_body);
	if (lws_add_http_common_headers(wsi, (unsigned) s->http_status,
									"text/plain; version=0.0.4", (lws_filepos_t) blen, &p, end) ||
		lws_finalize_write_http_header(wsi, start, &p, end))
		return 1;
	body = malloc(LWS_PRE + blen + 1);
	if (!body)
		abort();
	memcpy(body + LWS_PRE, s->http_body, blen);
	rc = lws_write(wsi, body + LWS_PRE, blen, LWS_WRITE_HTTP_FINAL);
	free(body);
	free(s->http_body);
	s->http_body = NULL;
	if (rc < (int) blen)
		return -1;
	if (lws_http_transaction_completed(wsi))
		return -1;
	return 0;
}
