/*
 * receive.c — frames from a WebSocket session to the database and back.
 *
 * Invariants kept here: a session processes its frames one at a time, in
 * order (busy / hello_pending hold the queue); before welcome a socket
 * holds at most one frame of at most MAX_HELLO_BYTES (contract §10); at
 * most MAX_INQUEUE frames wait per session before reading stops (flow
 * control); every frame is rate-limited before it is queued; a bad frame
 * only ever touches its own session.
 */
#include "server/receive.h"
#include "server/admission.h"
#include "server/auth.h"
#include "server/config.h"
#include "server/db/db.h"
#include "server/frame.h"
#include "server/db/hello_order.h"
#include "server/im_gateway.h"
#include "common/log.h"
#include "common/log_hash.h"
#include "server/gateway_metrics.h"
#include "server/session.h"

#include <libwebsockets.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define MAX_INQUEUE 32
/* Before welcome only a hello of at most this size is read (contract §10):
 * an unauthenticated socket never holds more than this much frame data. */
#define MAX_HELLO_BYTES 8192

/* A decoded request becomes job j: the statement, its id and parameters. */
static void
take_request(im_job *j, im_request *req, const im_reqinfo *rq)
{
	int			i;

	memcpy(j->trace_id, rq->trace_id, sizeof(j->trace_id));
	j->op = req->op;
	j->sql = req->sql;
	j->id = req->id;
	req->id = NULL;
	j->nparams = req->nparams;
	for (i = 0; i < req->nparams; i++)
	{
		j->params[i] = req->params[i];
		req->params[i] = NULL;
	}
	req->nparams = 0;
}

static void
submit_request(im_job *j, im_request *req, const im_reqinfo *rq)
{
	take_request(j, req, rq);
	im_db_submit(j);
}

static void
send_pong(session *s, json_t *id, const im_reqinfo *rq)
{
	json_t	   *p = json_object();

	json_object_set_new(p, "type", json_string("pong"));
	if (id)
		json_object_set(p, "id", id);
	json_object_set_new(p, "trace_id", json_string(rq->trace_id));
	im_send_reply(s, id, json_dumps(p, JSON_COMPACT), IM_OP_PING, rq);
	json_decref(p);
}

/* The first frame: a valid hello, sent or held by --max-pending-hello /
 * --max-waiting-hello. */
static void
process_hello(session *s, im_decode_status st, im_request *req, const im_reqinfo *rq)
{
	im_job	   *j;

	if (st != IM_DECODE_OK || req->op != IM_OP_HELLO)
	{
		im_send_error(s, req->id, rq, "NOT_AUTHENTICATED", "the first frame must be a valid hello", -1);
		im_begin_close(s, 4001, "no_hello");
		return;
	}
	s->rq = *rq;				/* answered by auth.c */
	j = im_job_new(IM_JOB_AUTH, s->sid);
	j->txn = 1;					/* limits are checked before COMMIT: see auth.c */
	take_request(j, req, rq);
	j->device_key = im_hello_device_key(j->params[0]);	/* hello_order.h */
	j->token_key = im_hello_token_key(j->params[0]);
	im_hello_submit(s, j);		/* sent, waiting for a place, or refused */
}

static void
process_frame(session *s, const char *buf, size_t len)
{
	im_request	req;
	im_decode_status st;
	im_reqinfo	rq;

	st = im_decode_frame(buf, len, s->user_id, s->authed ? s->device_id : NULL, &req);
	im_stats.frames_in[st == IM_DECODE_BAD_FRAME ? IM_OP_COUNT : (int) req.op]++;	/* op COUNT: unreadable */
	/* its trace id: the frame's, or a new one (also the write's parameter) */
	im_reqinfo_begin(&rq, &req);
	if (!s->authed)
		process_hello(s, st, &req, &rq);
	else if (st == IM_DECODE_BAD_FRAME)
		im_send_error(s, req.id, &rq, "BAD_FRAME", req.err, -1);
	else if (st == IM_DECODE_INVALID)
		im_send_error(s, req.id, &rq, "INVALID_ARGUMENT", req.err, -1);
	else if (st == IM_DECODE_FORBIDDEN)
		im_send_error(s, req.id, &rq, "FORBIDDEN", req.err, -1);
	else if (req.op == IM_OP_HELLO)
		im_send_error(s, req.id, &rq, "BAD_FRAME", "already authenticated", -1);
	else if (req.op == IM_OP_PING)
		send_pong(s, req.id, &rq);
	else
	{
		s->busy = 1;
		s->rq = rq;				/* answered by im_on_api_job */
		submit_request(im_job_new(IM_JOB_API, s->sid), &req, &rq);
	}
	im_request_free(&req);
}

void
im_pump(session *s)
{
	while (!s->busy && !s->hello_pending && !s->close_code && s->in_frames.head)
	{
		inframe    *f = lws_container_of(s->in_frames.head, inframe, list);

		lws_dll2_remove(&f->list);
		process_frame(s, f->buf, f->len);
		free(f);
	}
	if (s->flow_off && (int) s->in_frames.count < MAX_INQUEUE / 2)
	{
		s->flow_off = 0;
		lws_rx_flow_control(s->wsi, 1);
	}
}

static void
free_rx(session *s)
{
	free(s->rx);
	s->rx = NULL;
	s->rxcap = 0;
}

/* Pre-welcome violation: NOT_AUTHENTICATED, then close 4001; its receive
 * buffer goes at once and nothing more is read into it. */
static void
not_authenticated(session *s, const char *why)
{
	im_reqinfo	rq;

	im_reqinfo_begin(&rq, NULL);	/* a frame not read */
	im_send_error(s, NULL, &rq, "NOT_AUTHENTICATED", why, -1);
	im_begin_close(s, 4001, "not_authenticated");
	free_rx(s);
	s->rxlen = 0;
}

/* Rate limit (--rate/--burst): 0 when the frame may be queued. */
static int
frame_rate_limited(session *s)
{
	long		wait = im_bucket_take(&s->frames, im_cfg.rate, im_cfg.burst, im_now());
	im_reqinfo	rq;

	if (!wait)
	{
		s->rl_streak = 0;
		return 0;
	}
	im_reqinfo_begin(&rq, NULL);	/* refused unread */
	if (++s->rl_streak >= 10)
	{
		im_send_error(s, NULL, &rq, "RATE_LIMITED", "rate limit exceeded persistently", wait);
		im_begin_close(s, 4029, "rate_limited");
	}
	else
		im_send_error(s, NULL, &rq, "RATE_LIMITED", "rate limit exceeded", wait);
	return 1;
}

static void
frame_arrived(session *s, const char *buf, size_t len)
{
	inframe    *f;

	if (s->close_code || im_draining)
		return;
	if (!s->authed && (s->hello_pending || s->in_frames.head))
	{
		/*
		 * Before welcome the hello is the only frame (contract §10): nothing
		 * is queued behind a pending hello, so an unauthenticated socket
		 * holds at most one frame of at most MAX_HELLO_BYTES.
		 */
		not_authenticated(s, "no frame may follow hello before welcome");
		return;
	}
	if (frame_rate_limited(s))
		return;
	if (!s->busy && !s->hello_pending && !s->in_frames.head)
	{
		/* nothing ahead of it: handled at once, never queued (order kept) */
		process_frame(s, buf, len);
		return;
	}
	f = malloc(sizeof(inframe) + len + 1);
	if (!f)
		abort();
	memset(&f->list, 0, sizeof(f->list));
	f->len = len;
	memcpy(f->buf, buf, len);
	f->buf[len] = '\0';
	lws_dll2_add_tail(&f->list, &s->in_frames);
	if ((int) s->in_frames.count >= MAX_INQUEUE && !s->flow_off)
	{
		s->flow_off = 1;
		lws_rx_flow_control(s->wsi, 0);
	}
	im_pump(s);
}

int
im_on_receive(struct lws *wsi, session *s, const void *in, size_t len)
{
	if (!s || s->close_code)
		return 0;
	if (!s->in_msg)
	{
		s->rxlen = 0;
		s->in_msg = 1;
		s->bad_binary = lws_frame_is_binary(wsi) ? 1 : 0;
	}
	s->t_heard = im_now();
	if (s->rxlen == 0 && lws_is_final_fragment(wsi) && !s->bad_binary &&
		(s->authed || len <= MAX_HELLO_BYTES) && len <= im_cfg.max_frame)
	{
		/* a whole frame in one callback (the usual case): no copy into rx */
		s->in_msg = 0;
		frame_arrived(s, in, len);
		if (!s->in_frames.head)
			free_rx(s);
		return 0;
	}
	if (!s->authed && s->rxlen + len > MAX_HELLO_BYTES)
	{
		/* stop accumulating: the hello may not be larger */
		not_authenticated(s, "hello larger than 8 KiB");
		return 0;
	}
	if (s->rxlen + len > im_cfg.max_frame)
	{
		im_begin_close(s, 1009, "frame_too_large");
		lws_close_reason(wsi, LWS_CLOSE_STATUS_MESSAGE_TOO_LARGE, NULL, 0);
		return -1;
	}
	if (s->rxlen + len > s->rxcap)
	{
		size_t		cap = s->rxcap ? s->rxcap : 1024;

		while (cap < s->rxlen + len)
			cap *= 2;
		s->rx = realloc(s->rx, cap);
		if (!s->rx)
			abort();
		s->rxcap = cap;
	}
	memcpy(s->rx + s->rxlen, in, len);
	s->rxlen += len;
	if (!lws_is_final_fragment(wsi))
		return 0;
	s->in_msg = 0;
	if (s->bad_binary)
		frame_arrived(s, "\x01", 1);	/* binary frames are not JSON text:
										 * decoded as garbage */
	else
		frame_arrived(s, s->rx, s->rxlen);
	/* idle sessions keep no receive buffer */
	if (s->rxcap > 4096 || !s->in_frames.head)
		free_rx(s);
	return 0;
}

void
im_on_api_job(session *s, im_job *j)
{
	im_reqinfo *rq = &s->rq;

	s->busy = 0;
	if (j->status == IM_JOB_OK)
	{
		rq->msg_seq = j->msg_seq;
		rq->sync_seq = j->sync_seq;
		if (j->page_events >= 0)
			im_observe_sync_page(j->page_events);
		im_send_reply(s, j->id, j->reply, j->op, rq);
		j->reply = NULL;
	}
	else if (j->status == IM_JOB_UNAVAILABLE)
		im_send_error(s, j->id, rq, "UNAVAILABLE",
					  strcmp(j->sqlstate, "57014") == 0 ? "request took too long (statement timeout), retry later"
					  : "database unavailable, retry later", IM_RETRY_UNAVAILABLE_MS);
	else
	{
		const char *reason;
		const char *code = im_api_error_code(j->sqlstate, j->errmsg, &reason);

		if (strcmp(code, "INTERNAL") == 0)
		{
			char		hu[IM_LOG_HASH_BUF];

			im_log("error", "event=internal_error sid=%" PRIu64 " user=%s op=%s trace_id=%s sqlstate=%s msg=\"%s\"",
				   s->sid, im_hash_user(s->user_id, hu), im_ops[j->op].type, rq->trace_id, j->sqlstate,
				   j->errmsg ? j->errmsg : "");
			im_send_error(s, j->id, rq, code, "internal error", -1);
		}
		else
			im_send_error_reason(s, j->id, rq, code, j->errmsg, -1, reason);
	}
	if (im_draining)
		im_begin_close(s, 1001, "shutdown");
	else
		im_pump(s);
}
