/*
 * text_buf.h — a growing NUL-terminated text buffer (the /metrics page,
 * the presence refresh's array literals).  Starts zeroed ({0}); the caller
 * owns and frees b.  Allocation failure aborts, as elsewhere in the gateway.
 */
#ifndef IM_TEXT_BUF_H
#define IM_TEXT_BUF_H

#include <stddef.h>

typedef struct im_text_buf
{
	char	   *b;
	size_t		len,
				cap;
} im_text_buf;

extern void im_text_printf(im_text_buf *tb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
