/*
 * fuzz_frame.c — libFuzzer target over frame decoding and argument
 * extraction (frame.c), plus the hint and device-event payload parsers.
 * Checks what must hold for any input: decoding never crashes or leaks,
 * an OK decode always has a statement and at most IM_MAX_PARAMS
 * parameters, $1 is always the session user, never frame data, and a
 * send or edit passes the frame text itself as the body parameter.
 */
#include "server/frame.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The highest $N a statement text names. */
static int
max_placeholder(const char *sql)
{
	int			max = 0;

	for (const char *p = sql; *p; p++)
		if (*p == '$' && p[1] >= '1' && p[1] <= '9')
		{
			int			n = atoi(p + 1);

			if (n > max)
				max = n;
		}
	return max;
}

static void ucb(void *a, int64_t u, int64_t h) { (void) a; (void) u; (void) h; }
static void ccb(void *a, int64_t c, int64_t h) { (void) a; (void) c; (void) h; }

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	im_request	req;
	im_decode_status st;
	char	   *s;
	im_device_event ev;

	/* as an unauthenticated and as an authenticated session */
	for (int authed = 0; authed < 2; authed++)
	{
		st = im_decode_frame((const char *) data, size, authed ? 42 : 0,
							 authed ? "phone-1" : NULL, &req);
		if (st == IM_DECODE_OK && req.op != IM_OP_PING)
		{
			if (!req.sql || req.nparams < 1 || req.nparams > IM_MAX_PARAMS)
				abort();
			if (req.op != IM_OP_HELLO && strcmp(req.params[0], authed ? "42" : "0") != 0)
				abort();
			/* bodies are never re-serialized: the parameter is the frame */
			if ((req.op == IM_OP_SEND || req.op == IM_OP_EDIT) &&
				(req.nparams < 4 || strlen(req.params[req.op == IM_OP_SEND ? 3 : 4]) != size ||
				 memcmp(req.params[req.op == IM_OP_SEND ? 3 : 4], data, size) != 0))
				abort();
			/* text parameters are C strings: no NUL was cut off */
			for (int k = 0; k < req.nparams; k++)
				if (req.params[k] && strlen(req.params[k]) > size + 32)
					abort();
			/* the statement names exactly the parameters passed */
			if (req.op != IM_OP_HELLO && max_placeholder(req.sql) != req.nparams)
				abort();
			/* a write's trace id is its last parameter, made when absent */
			if (req.trace_param >= 0)
			{
				im_request_set_trace(&req, "0123456789abcdef0123456789abcdef");
				if (req.trace_param != req.nparams - 1 || !req.params[req.trace_param] ||
					strcmp(req.params[req.trace_param], req.trace_id) != 0 ||
					!im_trace_id_ok(req.trace_id, strlen(req.trace_id)))
					abort();
			}
		}
		/* a trace id taken from a frame is always a valid one */
		if (req.trace_id[0] && !im_trace_id_ok(req.trace_id, strlen(req.trace_id)))
			abort();
		s = im_error_frame(req.id, req.trace_id, "BAD_FRAME", req.err, -1);
		free(s);
		im_request_free(&req);
	}
	s = malloc(size + 1);
	memcpy(s, data, size);
	s[size] = '\0';
	im_parse_hint_payload(s, ucb, ccb, NULL);
	im_parse_device_event(s, &ev);
	free(s);
	return 0;
}
