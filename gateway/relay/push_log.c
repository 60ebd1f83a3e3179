/*
 * push_log.c — see push_log.h.
 */
#include "relay/push_log.h"
#include "common/log_hash.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <jansson.h>

static const char *log_relay = "";

void
push_log_setup(const char *relay_id)
{
	log_relay = relay_id;
}

/* a JSON line's members before the record's own: the relay */
static json_t *
json_line(void)
{
	json_t	   *o = json_object();

	im_log_json_text(o, "relay", log_relay);
	return o;
}

/* a text line: "ts=<ISO 8601 UTC, seconds> level=... relay=... <line>", one write */
static void
text_line(const char *level, const char *line)
{
	struct timespec ts;
	struct tm	tm;
	char		s[32];

	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	strftime(s, sizeof(s), "%Y-%m-%dT%H:%M:%SZ", &tm);
	fprintf(im_log_stream(), "ts=%s level=%s relay=%s %s\n", s, level, log_relay, line);
	fflush(im_log_stream());
}

void
relay_log(const char *level, const char *fmt,...)
{
	char		line[1024];
	va_list		ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	if (im_log_format_g == IM_LOG_FORMAT_JSON)
	{
		json_t	   *o = json_line();

		im_log_json_kv_set(o, line);
		im_log_json(level, o);
	}
	else
		text_line(level, line);
}

void
push_log_job(const char *level, const PushJobLog *j)
{
	char		h[IM_LOG_HASH_BUF];
	int			traced = j->trace_id && j->trace_id[0];

	if (im_log_format_g == IM_LOG_FORMAT_JSON)
	{
		json_t	   *o = json_line();

		json_object_set_new(o, "type", json_string("push"));
		json_object_set_new(o, "event", json_string(j->event));
		json_object_set_new(o, "job_id", json_integer(j->job_id));
		json_object_set_new(o, "trace_id", traced ? json_string(j->trace_id) : json_null());
		if (j->push_target_id > 0)
			json_object_set_new(o, "target", json_string(im_hash_push_target(j->push_target_id, h)));
		if (j->provider)
			im_log_json_text(o, "provider", j->provider);
		if (j->result)
			json_object_set_new(o, "result", json_string(j->result));
		if (j->http_status > 0)
			json_object_set_new(o, "http_status", json_integer(j->http_status));
		if (j->latency_ms >= 0)
			json_object_set_new(o, "latency_ms", json_real((double) (long long) (j->latency_ms * 10 + 0.5) / 10));
		if (j->state)
			json_object_set_new(o, "state", json_string(j->state));
		if (j->why)
			im_log_json_text(o, "why", j->why);
		im_log_json(level, o);
	}
	else
	{
		char		line[1024];
		size_t		n;

		n = (size_t) snprintf(line, sizeof(line), "event=%s job=%lld trace_id=%s", j->event,
							  (long long) j->job_id, traced ? j->trace_id : "-");
#define ADD(...) \
		do { if (n < sizeof(line)) n += (size_t) snprintf(line + n, sizeof(line) - n, __VA_ARGS__); } while (0)
		if (j->push_target_id > 0)
			ADD(" target=%s", im_hash_push_target(j->push_target_id, h));
		if (j->provider)
			ADD(" provider=%s", j->provider);
		if (j->result)
			ADD(" result=%s", j->result);
		if (j->http_status >= 0)
			ADD(" status=%ld", j->http_status);
		if (j->latency_ms >= 0)
			ADD(" ms=%.0f", j->latency_ms);
		if (j->state)
			ADD(" state=%s", j->state);
		if (j->why)
			ADD(" why=\"%s\"", j->why);
#undef ADD
		text_line(level, line);
	}
}
