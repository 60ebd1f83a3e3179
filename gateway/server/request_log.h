/*
 * request_log.h — what the gateway knows about one request while it is
 * answered (contract §21): its trace id, type, conversation, start time
 * and the positions its reply names; at the answer, the request's log
 * line (--log-format json) and its latency in the per-type histogram.
 *
 * Invariant: a request line holds ids as keyed hashes and positions only,
 * never a body, a token or any other frame text.
 */
#ifndef IM_GW_REQUEST_LOG_H
#define IM_GW_REQUEST_LOG_H

#include "server/frame.h"

#include <stdint.h>

struct session;

typedef struct im_reqinfo
{
	double		t0;				/* when the frame was taken (im_now) */
	int			op;				/* im_op; IM_OP_COUNT: undecodable; -1: not read */
	int64_t		conversation_id;	/* 0: none */
	int64_t		msg_seq;		/* from the reply, -1: none */
	int64_t		sync_seq;		/* from the reply, -1: none */
	char		trace_id[IM_TRACE_ID_MAX + 1];
} im_reqinfo;

/* A new trace id: 32 lower-case hex digits from RAND_bytes (a W3C trace-id, never all zero). */
extern void im_trace_new(char out[IM_TRACE_ID_MAX + 1]);

/*
 * Starts rq for a decoded frame (req may be NULL: a frame not read, op -1):
 * a frame without a valid trace_id gets a new one, set into req too so a
 * write passes it to the database.
 */
extern void im_reqinfo_begin(im_reqinfo *rq, im_request *req);

/*
 * The request was answered: result is "ok" or the error code of contract
 * §10 ("closed" when the session was closed instead, with close_code).
 * Writes its JSON line (--log-format json) and counts its latency.
 */
extern void im_request_done(struct session *s, const im_reqinfo *rq, const char *result,
							int close_code);

#endif
