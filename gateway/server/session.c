/*
 * session.c — sessions, their indexes and their output queue.
 *
 * Invariants kept here: a session is in the sid and all-sessions indexes
 * from register to unregister, and in the user index once authenticated;
 * frames are written in the order queued, exactly one lws_write per
 * LWS_CALLBACK_SERVER_WRITEABLE (im_session_write), replies before hints,
 * and the close only after everything queued is out; a session's queue is
 * bounded by --max-queue (plus IM_ERROR_HEADROOM for error frames).
 */
#include "server/session.h"
#include "server/auth.h"
#include "server/presence_report.h"
#include "server/admission.h"
#include "server/config.h"
#include "server/db/db.h"
#include "server/keepalive.h"
#include "common/log.h"
#include "common/log_hash.h"
#include "server/gateway_metrics.h"
#include "common/table_hash.h"

#include <libwebsockets.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define NBUCKETS 65536			/* chains stay short at 100,000 sessions */
static session *sid_table[NBUCKETS];
static session *user_table[NBUCKETS];
session    *im_all_sessions;
static uint64_t next_sid = 1;

static unsigned
bucket(uint64_t k)
{
	return (unsigned) (im_mix64(k) & (NBUCKETS - 1));
}

session *
im_session_find(uint64_t sid)
{
	session    *s;

	for (s = sid_table[bucket(sid)]; s; s = s->sid_next)
		if (s->sid == sid)
			return s;
	return NULL;
}

session *
im_user_chain(int64_t user_id)
{
	return user_table[bucket((uint64_t) user_id)];
}

session *
im_session_register(struct lws *wsi, int is_http)
{
	unsigned	h;
	session    *s = calloc(1, sizeof(session));

	if (!s)
		abort();
	s->sid = next_sid++;
	s->wsi = wsi;
	s->is_http = is_http;
	s->registered = 1;
	s->hint_hw = -1;
	s->kw_slot = -1;
	s->t_open = im_now();
	s->t_heard = s->t_open;
	s->frames.tokens = im_cfg.burst;
	s->frames.t = s->t_open;
	h = bucket(s->sid);
	s->sid_next = sid_table[h];
	sid_table[h] = s;
	s->all_next = im_all_sessions;
	if (im_all_sessions)
		im_all_sessions->all_prev = s;
	im_all_sessions = s;
	return s;
}

void
im_session_link_user(session *s)
{
	unsigned	h = bucket((uint64_t) s->user_id);

	s->user_next = user_table[h];
	user_table[h] = s;
}

static void
user_unlink(session *s)
{
	session   **pp = &user_table[bucket((uint64_t) s->user_id)];

	for (; *pp; pp = &(*pp)->user_next)
		if (*pp == s)
		{
			*pp = s->user_next;
			return;
		}
}

void
im_session_unregister(session *s)
{
	session   **pp;

	if (!s->registered)
		return;
	for (pp = &sid_table[bucket(s->sid)]; *pp; pp = &(*pp)->sid_next)
		if (*pp == s)
		{
			*pp = s->sid_next;
			break;
		}
	if (s->authed)
	{
		im_presence_offline(s);	/* offline for fanout's push decision */
		user_unlink(s);
	}
	im_keepalive_remove(s);
	if (s->all_prev)
		s->all_prev->all_next = s->all_next;
	else
		im_all_sessions = s->all_next;
	if (s->all_next)
		s->all_next->all_prev = s->all_prev;
	while (s->out_frames.head)
	{
		outmsg	   *o = lws_container_of(s->out_frames.head, outmsg, list);

		lws_dll2_remove(&o->list);
		free(o);
	}
	while (s->in_frames.head)
	{
		inframe    *f = lws_container_of(s->in_frames.head, inframe, list);

		lws_dll2_remove(&f->list);
		free(f);
	}
	im_hello_abandon(s);
	im_unauth_release(s->unauth_ip);
	free(s->rx);
	free(s->chints);
	free(s->http_body);
	s->registered = 0;
	free(s);
}

/* ---- output queue ---- */

/*
 * Queues text (consumed) for the session.  Returns -1 when the session's
 * queue has no room for it: replies stop at --max-queue, error frames may
 * use IM_ERROR_HEADROOM more.
 */
static int
enqueue_text(session *s, char *text, int out_type)
{
	size_t		len;
	size_t		cap = im_cfg.max_queue + (out_type == IM_OUT_ERROR ? IM_ERROR_HEADROOM : 0);
	outmsg	   *o;

	if (!text)
		return -1;
	len = strlen(text);
	if (s->close_code || s->out_bytes + len > cap)
	{
		free(text);
		return -1;
	}
	o = malloc(sizeof(outmsg) + LWS_PRE + len);
	if (!o)
		abort();
	memset(&o->list, 0, sizeof(o->list));
	o->len = len;
	memcpy(o->buf + LWS_PRE, text, len);
	free(text);
	lws_dll2_add_tail(&o->list, &s->out_frames);
	s->out_bytes += len;
	im_stats.frames_out[out_type]++;
	lws_callback_on_writable(s->wsi);
	return 0;
}

/* An error frame's text, queued, counted and its request done. */
static void
send_error_text(session *s, const im_reqinfo *rq, const char *code, char *text)
{
	im_count_error(code);
	/* a client that reads none of its replies is closed, never left with a
	 * request that silently got no answer */
	if (enqueue_text(s, text, IM_OUT_ERROR) != 0 && !s->close_code)
		im_begin_close(s, 1013, "send_queue_full");
	im_request_done(s, rq, code, 0);
}

void
im_send_error(session *s, json_t *id, const im_reqinfo *rq, const char *code, const char *msg,
			  long retry_ms)
{
	send_error_text(s, rq, code, im_error_frame(id, rq->trace_id, code, msg, retry_ms));
}

void
im_send_error_reason(session *s, json_t *id, const im_reqinfo *rq, const char *code, const char *msg,
					 long retry_ms, const char *reason)
{
	send_error_text(s, rq, code, im_error_frame_reason(id, rq->trace_id, code, msg, retry_ms, reason));
}

/* Every request gets a reply: one too large for the send queue is answered UNAVAILABLE. */
void
im_send_reply(session *s, json_t *id, char *text, int out_type, const im_reqinfo *rq)
{
	int			closing = s->close_code;

	if (enqueue_text(s, text, out_type) == 0 || closing)
	{
		/* a session already closing is sent nothing more */
		im_request_done(s, rq, closing ? "closed" : "ok", closing);
		return;
	}
	im_stats.replies_too_large++;
	im_send_error(s, id, rq, "UNAVAILABLE",
				  "reply does not fit the session's send queue: read pending replies, "
				  "or ask for a smaller page", IM_RETRY_UNAVAILABLE_MS);
}

void
im_begin_close(session *s, int code, const char *why)
{
	char		hu[IM_LOG_HASH_BUF],
				hd[IM_LOG_HASH_BUF];

	if (s->close_code)
		return;
	s->close_code = code;
	im_count_close(code);
	im_log("info", "event=close sid=%" PRIu64 " user=%s device=%s code=%d reason=%s",
		   s->sid, s->user_id ? im_hash_user(s->user_id, hu) : "-",
		   s->device_id[0] ? im_hash_device(s->user_id, s->device_id, hd) : "-", code, why);
	lws_callback_on_writable(s->wsi);
}

/* ---- the writeable handler ---- */

/* Writes a hint frame built in buf (LWS_PRE bytes of room first). */
static int
write_hint(session *s, unsigned char *buf, int n)
{
	im_stats.hints_sent++;
	im_stats.frames_out[IM_OUT_HINT]++;
	return lws_write(s->wsi, buf + LWS_PRE, (size_t) n, LWS_WRITE_TEXT) < n ? -1 : 0;
}

/*
 * One lws_write per writeable callback: a due ping, then replies (in
 * order), then the pending hints, then the close once everything queued is
 * out.  Re-arms itself while more is waiting.
 */
int
im_session_write(session *s)
{
	unsigned char buf[LWS_PRE + 160];
	int			n;

	if (s->ping_due && !s->close_code)
	{
		/*
		 * keepalive: the pong (or any frame) proves life.  The ping carries
		 * a byte because lws 4.1 reports no LWS_CALLBACK_RECEIVE_PONG for an
		 * empty pong.
		 */
		s->ping_due = 0;
		buf[LWS_PRE] = 'k';
		if (lws_write(s->wsi, buf + LWS_PRE, 1, LWS_WRITE_PING) < 1)
			return -1;
	}
	else if (s->out_frames.head)
	{
		outmsg	   *o = lws_container_of(s->out_frames.head, outmsg, list);

		n = lws_write(s->wsi, o->buf + LWS_PRE, o->len, LWS_WRITE_TEXT);
		if (n < (int) o->len)
			return -1;
		lws_dll2_remove(&o->list);
		s->out_bytes -= o->len;
		free(o);
	}
	else if (s->hint_hw >= 0 && !s->close_code)
	{
		n = snprintf((char *) buf + LWS_PRE, 160,
					 "{\"type\":\"hint\",\"high_watermark\":%" PRId64 ",\"reason\":\"NEW_EVENTS\"}",
					 s->hint_hw);
		s->hint_hw = -1;
		if (write_hint(s, buf, n) != 0)
			return -1;
	}
	else if (s->nchints > 0 && !s->close_code)
	{
		conv_hint	h = s->chints[0];

		memmove(s->chints, s->chints + 1, sizeof(conv_hint) * (size_t) (s->nchints - 1));
		s->nchints--;
		n = snprintf((char *) buf + LWS_PRE, 160,
					 "{\"type\":\"hint\",\"reason\":\"CONVERSATION_ADVANCED\",\"conversation_id\":%" PRId64 ",\"head_msg_seq\":%" PRId64 "}",
					 h.conv, h.head);
		if (write_hint(s, buf, n) != 0)
			return -1;
	}
	else if (s->close_code)
	{
		lws_close_reason(s->wsi, (enum lws_close_status) s->close_code, NULL, 0);
		return -1;
	}
	if (s->out_frames.head || (!s->close_code && (s->hint_hw >= 0 || s->nchints > 0)) || s->close_code)
		lws_callback_on_writable(s->wsi);
	return 0;
}
