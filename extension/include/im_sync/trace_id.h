/*
 * im_sync/trace_id.h — the form of a trace id (contract §21: 1 to 64
 * characters of [A-Za-z0-9_-]), the one check the C code uses: the
 * extension (core/common.c, the trailing trace_id argument of the writes and
 * the workers' log lines), the gateway (server/frame.c, a frame's trace_id)
 * and the push relay (relay/im_push_relay.c, a claimed job's trace id before
 * it is logged).  Plain C, no PostgreSQL or jansson headers; included as
 * "im_sync/trace_id.h" with -I extension/include.
 *
 * The form keeps a trace id safe to print unquoted in a key=value log line
 * and to pass as a statement parameter: no space, quote, '=' or control byte.
 */
#ifndef IM_TRACE_ID_H
#define IM_TRACE_ID_H

#include <stddef.h>

#define IM_TRACE_ID_MAX 64		/* characters (bytes: the form is ASCII) */

/* 1 when s[0..len) is a trace id of that form (s may be NULL when len is 0). */
static inline int
im_trace_id_ok(const char *s, size_t len)
{
	if (!s || len < 1 || len > IM_TRACE_ID_MAX)
		return 0;
	for (size_t i = 0; i < len; i++)
	{
		char		c = s[i];

		if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
			  (c >= '0' && c <= '9') || c == '_' || c == '-'))
			return 0;
	}
	return 1;
}

#endif
