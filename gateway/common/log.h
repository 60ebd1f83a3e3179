/*
 * log.h — structured single-line logs (key=value) on stderr.  Callers never
 * pass message bodies or tokens.  With --log-format json (log_json.h, which
 * a program calling im_log links) the same record is written as one JSON
 * object line instead, so a process never mixes the two formats.
 */
#ifndef IM_GW_LOG_H
#define IM_GW_LOG_H

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#include "common/log_json.h"

static inline void
im_log(const char *level, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static inline void
im_log(const char *level, const char *fmt, ...)
{
	struct timespec ts;
	struct tm	tm;
	char		tbuf[32];
	char		line[1024];
	va_list		ap;

	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	strftime(tbuf, sizeof(tbuf), "%Y-%m-%dT%H:%M:%S", &tm);
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	/* libpq messages carry newlines: keep the record on one line */
	for (char *c = line; *c; c++)
		if (*c == '\n' || *c == '\r' || *c == '\t')
			*c = ' ';
	if (im_log_format_g == IM_LOG_FORMAT_JSON)
	{
		im_log_json_kv(level, line);
		return;
	}
	/* one fprintf so concurrent threads never interleave within a line */
	fprintf(im_log_stream(), "ts=%s.%03ldZ level=%s %s\n", tbuf, ts.tv_nsec / 1000000, level, line);
}

#endif
