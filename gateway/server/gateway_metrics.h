/*
 * gateway_metrics.h — the gateway's own counters and GET /metrics (Prometheus
 * text): these counters, the database thread's (db.h) and the rows of
 * im.metrics(), cached for a few seconds.
 */
#ifndef IM_GW_GATEWAY_METRICS_H
#define IM_GW_GATEWAY_METRICS_H

#include "server/frame.h"

struct session;
struct im_job;

/* frames_out slots after the im_op replies */
enum
{
	IM_OUT_ERROR = IM_OP_COUNT, IM_OUT_HINT, IM_OUT_NTYPES
};

#define IM_N_ERR_CODES 9
#define IM_N_CLOSE_CODES 7
#define IM_REQ_NBOUNDS 12		/* request latency buckets, 1 ms to 5 s */
#define IM_PAGE_NBOUNDS 9		/* sync page size buckets, 0 to 1000 events */

/* Written by the lws thread only. */
typedef struct im_gw_stats
{
	long		conns_current,
				conns_total,
				http_requests;
	long		frames_in[IM_OP_COUNT + 1];	/* last: undecodable */
	long		frames_out[IM_OUT_NTYPES];
	long		errors[IM_N_ERR_CODES];
	long		closes[IM_N_CLOSE_CODES];
	long		hints_sent,
				hints_coalesced,
				hints_dropped;
	long		notifications;
	long		refusals;
	long		accepts_kept_back;	/* connections that waited before lws' handshake (accept.c) */
	long		accepts_refused;	/* closed at accept: address or connection cap (accept.c) */
	long		accepts_expired;	/* closed after waiting IM_ACCEPT_MAX_WAIT_US (accept.c) */
	long		hellos_waited;	/* hellos that waited for a place (--max-waiting-hello) */
	long		upgrades_refused_cap,	/* HTTP 503: a connection cap */
				upgrades_refused_origin;	/* HTTP 403: Origin not allowed */
	long		rechecks;		/* device_session re-checks sent */
	long		metrics_refreshes;	/* im.metrics() calls */
	long		replies_too_large;	/* replies answered UNAVAILABLE instead */
	/* request latency by type (im_op; IM_OP_COUNT: undecodable), seconds */
	long		req_hist[IM_OP_COUNT + 1][IM_REQ_NBOUNDS + 1];	/* last: +Inf */
	double		req_sum[IM_OP_COUNT + 1];
	/* events per sync page */
	long		page_hist[IM_PAGE_NBOUNDS + 1];
	double		page_sum;
	long		page_count;
} im_gw_stats;

extern im_gw_stats im_stats;

/* Counts an error frame by its contract code, a close by its close code. */
extern void im_count_error(const char *code);
extern void im_count_close(int code);
/* A request of type op (IM_OP_COUNT: undecodable) answered after seconds. */
extern void im_observe_request(int op, double seconds);
/* A sync page of n events was answered. */
extern void im_observe_sync_page(long n);

/*
 * GET /metrics for an HTTP session: answered at once from the cache when
 * im.metrics() was asked at most METRICS_MAX_AGE seconds ago, else after
 * the one call in flight (im_on_metrics_job) answers.
 */
extern void im_request_metrics(struct session *s);
extern void im_on_metrics_job(struct im_job *j);

#endif
