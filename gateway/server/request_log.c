/*
 * request_log.c — see request_log.h.
 */
#include "server/request_log.h"
#include "server/db/db.h"
#include "server/gateway_metrics.h"
#include "server/session.h"
#include "common/log_json.h"

#include <stdio.h>
#include <string.h>
#include <openssl/rand.h>

void
im_trace_new(char out[IM_TRACE_ID_MAX + 1])
{
	unsigned char b[16];
	int			i,
				nonzero = 0;

	/* W3C trace-context: 16 random bytes, all zero is invalid */
	while (!nonzero)
	{
		if (RAND_bytes(b, sizeof(b)) != 1)
		{
			/* no random bytes: still unique within the process */
			static uint64_t fallback;
			double		t = im_now();

			memcpy(b, &t, 8);
			fallback++;
			memcpy(b + 8, &fallback, 8);
		}
		for (i = 0; i < 16; i++)
			nonzero |= b[i];
	}
	for (i = 0; i < 16; i++)
		snprintf(out + 2 * i, 3, "%02x", b[i]);
}

void
im_reqinfo_begin(im_reqinfo *rq, im_request *req)
{
	memset(rq, 0, sizeof(*rq));
	rq->t0 = im_now();
	rq->op = req ? (int) req->op : -1;
	rq->msg_seq = -1;
	rq->sync_seq = -1;
	if (req && req->trace_id[0])
		memcpy(rq->trace_id, req->trace_id, sizeof(rq->trace_id));
	else
	{
		im_trace_new(rq->trace_id);
		if (req)
			im_request_set_trace(req, rq->trace_id);
	}
	if (req)
		rq->conversation_id = req->conversation_id;
}

void
im_request_done(session *s, const im_reqinfo *rq, const char *result, int close_code)
{
	double		dt = im_now() - rq->t0;
	json_t	   *o;

	if (rq->op >= 0)
		im_observe_request(rq->op, dt);
	if (im_log_format_g != IM_LOG_FORMAT_JSON)
		return;
	o = json_object();
	json_object_set_new(o, "event", json_string("request"));
	json_object_set_new(o, "trace_id", json_string(rq->trace_id));
	im_log_json_user(o, s->user_id);
	im_log_json_device(o, s->user_id, s->device_id);
	json_object_set_new(o, "type", rq->op < 0 ? json_null() :
						json_string(rq->op < IM_OP_COUNT ? im_ops[rq->op].type : "invalid"));
	json_object_set_new(o, "conversation_id", rq->conversation_id ?
						json_integer(rq->conversation_id) : json_null());
	if (rq->msg_seq >= 0)
		json_object_set_new(o, "msg_seq", json_integer(rq->msg_seq));
	if (rq->sync_seq >= 0)
		json_object_set_new(o, "sync_seq", json_integer(rq->sync_seq));
	json_object_set_new(o, "result", json_string(result));
	if (close_code)
		json_object_set_new(o, "close_code", json_integer(close_code));
	json_object_set_new(o, "latency_ms", json_real((double) (long) (dt * 1e6) / 1e3));
	json_object_set_new(o, "sid", json_integer((json_int_t) s->sid));
	im_log_json("info", o);
}
