/* text_buf.c — see text_buf.h. */
#include "common/text_buf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void
im_text_printf(im_text_buf *tb, const char *fmt, ...)
{
	va_list		ap;
	int			n;

	for (;;)
	{
		va_start(ap, fmt);
		n = vsnprintf(tb->b ? tb->b + tb->len : NULL, tb->cap - tb->len, fmt, ap);
		va_end(ap);
		if (n >= 0 && (size_t) n < tb->cap - tb->len)
		{
			tb->len += (size_t) n;
			return;
		}
		tb->cap = tb->cap * 2 + (size_t) n + 64;
		tb->b = realloc(tb->b, tb->cap);
		if (!tb->b)
			abort();
	}
}
