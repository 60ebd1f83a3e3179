/*
 * session.h — one WebSocket or HTTP connection of the gateway, its indexes
 * (by sid, by user, all) and its output queue.
 *
 * Sessions are malloc'd, not lws per-session data: lws frees and re-binds
 * the user space of HTTP connections between transactions, and jobs in
 * flight find sessions by sid, never by pointer.
 */
#ifndef IM_GW_SESSION_H
#define IM_GW_SESSION_H

#include "server/admission.h"
#include "server/request_log.h"

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>
#include <libwebsockets.h>

struct lws;

/* A frame queued for writing: LWS_PRE bytes of room, then the text. */
typedef struct outmsg
{
	lws_dll2_t	list;			/* in the session's out_frames */
	size_t		len;
	unsigned char buf[];
} outmsg;

/* A frame received and waiting for the session's request in flight. */
typedef struct inframe
{
	lws_dll2_t	list;			/* in the session's in_frames */
	size_t		len;
	char		buf[];
} inframe;

/* A pending CONVERSATION_ADVANCED hint. */
typedef struct conv_hint
{
	int64_t		conv;
	int64_t		head;
} conv_hint;

typedef struct session
{
	uint64_t	sid;
	struct lws *wsi;
	/* hello_pending: the hello is in flight or waiting (hello_wait) */
	unsigned	is_http:1, registered:1, authed:1, hello_pending:1, busy:1,
				flow_off:1, in_msg:1, bad_binary:1, ping_due:1;
	int			close_code;
	int64_t		user_id;
	int64_t		epoch;
	char		device_id[65];
	double		t_open;
	double		t_heard;		/* last frame or pong from the peer */
	double		t_ping;			/* last ping sent */
	struct ip_count *unauth_ip;	/* counted as unauthenticated there */
	struct hello_wait *hello_wait;	/* its hello waits for a place (auth.c) */
	/* inbound */
	char	   *rx;
	size_t		rxlen,
				rxcap;
	lws_dll2_owner_t in_frames;	/* inframe, oldest first */
	/* outbound */
	lws_dll2_owner_t out_frames;	/* outmsg, oldest first */
	size_t		out_bytes;
	int64_t		hint_hw;		/* -1: none pending */
	/* device_session re-checks: at most one in flight and one pending */
	unsigned	recheck_inflight:1, recheck_pending:1, recheck_hint:1, recheck_retry:1;
	conv_hint  *chints;			/* allocated on first use */
	int			nchints;
	/* frames per second (--rate/--burst) */
	im_bucket	frames;
	int			rl_streak;
	/* the request in flight (busy or hello_pending): its trace id, type, start */
	im_reqinfo	rq;
	/* http */
	int			http_status;
	char	   *http_body;
	/* indexes */
	struct session *sid_next;
	struct session *user_next;
	struct session *all_prev,
			   *all_next;
	/* keepalive.c's wheel: the slot of the next deadline (-1: none) */
	struct session *kw_prev,
			   *kw_next;
	int			kw_slot;
} session;

/* Every registered session, newest first (linked by all_next). */
extern session *im_all_sessions;

extern session *im_session_register(struct lws *wsi, int is_http);
/* Frees the session and everything queued on it; no-op when not registered. */
extern void im_session_unregister(session *s);
extern session *im_session_find(uint64_t sid);
/* Indexes an authenticated session under its user_id. */
extern void im_session_link_user(session *s);
/*
 * The chain holding user_id's sessions (follow user_next); it may hold
 * other users' sessions too, so callers compare user_id.
 */
extern session *im_user_chain(int64_t user_id);

/*
 * Output.  Frames go out in the order queued, one lws_write per
 * LWS_CALLBACK_SERVER_WRITEABLE (im_session_write); out_type is the
 * frames_out counter (an im_op, IM_OUT_ERROR or IM_OUT_HINT).
 *
 * im_send_reply queues a reply (text consumed); one that does not fit
 * --max-queue is answered UNAVAILABLE with its id instead, so every
 * request gets an answer.  im_send_error may use IM_ERROR_HEADROOM more; a
 * session whose queue cannot take even that is closed 1013.
 *
 * rq is the request answered (contract §21): an error frame carries its
 * trace id, and either answer ends it (its log line and latency,
 * request_log.h).  A reply's text already holds the trace id.
 */
#define IM_ERROR_HEADROOM (1024 * 1024)
#define IM_RETRY_UNAVAILABLE_MS 1000
extern void im_send_reply(session *s, json_t *id, char *text, int out_type,
						  const im_reqinfo *rq);
extern void im_send_error(session *s, json_t *id, const im_reqinfo *rq, const char *code,
						  const char *msg, long retry_ms);
/* The same with the error's "reason" (NULL: none; contract §17). */
extern void im_send_error_reason(session *s, json_t *id, const im_reqinfo *rq, const char *code,
								 const char *msg, long retry_ms, const char *reason);
/* Closes with code once everything queued is written; the first code wins. */
extern void im_begin_close(session *s, int code, const char *why);
/* The writeable handler: writes one frame.  -1 tells lws to close. */
extern int	im_session_write(session *s);

#endif
