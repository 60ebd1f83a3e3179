/*
 * push_log.c — see push_log.h.
 */
#include "relay/push_log.h"
#include "common/log_hash.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <jansson.h>

static PushLogFormat log_format = PUSH_LOG_TEXT;
static const char *log_relay = "";
static FILE *log_out;

void
push_log_setup(PushLogFormat format, const char *relay_id, FILE *out)
{
	log_format = format;
	log_relay = relay_id;
	log_out = out;
}

PushLogFormat
push_log_format(void)
{
	return log_format;
}

int
push_trace_id_ok(const char *s)
{
	size_t		n = s ? strlen(s) : 0;

	if (n < 1 || n > PUSH_TRACE_ID_MAX)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= 'a' && s[i] <= 'z') ||
			  (s[i] >= '0' && s[i] <= '9') || s[i] == '_' || s[i] == '-'))
			return 0;
	return 1;
}

static FILE *
out(void)
{
	return log_out ? log_out : stderr;
}

/* ISO 8601 UTC; milliseconds in JSON lines */
static void
timestamp(char *buf, size_t len, int millis)
{
	struct timespec ts;
	struct tm	tm;
	char		s[32];

	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	strftime(s, sizeof(s), "%Y-%m-%dT%H:%M:%S", &tm);
	if (millis)
		snprintf(buf, len, "%s.%03dZ", s, (int) (ts.tv_nsec / 1000000) % 1000);
	else
		snprintf(buf, len, "%sZ", s);
}

/* a JSON object with ts, level and relay, the start of every JSON line */
static json_t *
json_line(const char *level)
{
	char		ts[64];
	json_t	   *o = json_object();

	timestamp(ts, sizeof(ts), 1);
	json_object_set_new(o, "ts", json_string(ts));
	json_object_set_new(o, "level", json_string(level));
	json_object_set_new(o, "relay", json_string(log_relay));
	return o;
}

/* compact and ASCII only: one line whatever the values hold; one write per line */
static void
json_emit(json_t *o)
{
	char	   *s = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII | JSON_REAL_PRECISION(6));
	json_free_t release;

	if (s)
	{
		fprintf(out(), "%s\n", s);
		fflush(out());
		/* from jansson's allocator (the relay installs a wiping one: push_wipe.c) */
		json_get_alloc_funcs(NULL, &release);
		release(s);
	}
	json_decref(o);
}

/* a string field that is never invalid UTF-8 (jansson refuses that: the field would be lost) */
static void
set_text(json_t *o, const char *key, const char *v)
{
	json_t	   *s = json_string(v);

	if (!s)
	{
		char	   *copy = strdup(v);

		for (char *c = copy; c && *c; c++)
			if ((unsigned char) *c >= 0x80)
				*c = '?';
		s = json_string(copy ? copy : "");
		free(copy);
	}
	json_object_set_new(o, key, s);
}

void
relay_log(const char *level, const char *fmt,...)
{
	char		line[1024];
	va_list		ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	if (log_format == PUSH_LOG_JSON)
	{
		json_t	   *o = json_line(level);
		const char *rest = line;

		if (strncmp(line, "event=", 6) == 0)
		{
			size_t		n = strcspn(line + 6, " ");

			json_object_set_new(o, "event", json_stringn(line + 6, n));
			rest = line + 6 + n;
			while (*rest == ' ')
				rest++;
		}
		if (*rest)
			set_text(o, "detail", rest);
		json_emit(o);
	}
	else
	{
		char		ts[64];

		timestamp(ts, sizeof(ts), 0);
		fprintf(out(), "ts=%s level=%s relay=%s %s\n", ts, level, log_relay, line);
		fflush(out());
	}
}

void
push_log_job(const char *level, const PushJobLog *j)
{
	char		h[IM_LOG_HASH_BUF];
	int			traced = j->trace_id && j->trace_id[0];

	if (log_format == PUSH_LOG_JSON)
	{
		json_t	   *o = json_line(level);

		json_object_set_new(o, "type", json_string("push"));
		json_object_set_new(o, "event", json_string(j->event));
		json_object_set_new(o, "job_id", json_integer(j->job_id));
		json_object_set_new(o, "trace_id", traced ? json_string(j->trace_id) : json_null());
		if (j->push_target_id > 0)
			json_object_set_new(o, "target", json_string(im_hash_push_target(j->push_target_id, h)));
		if (j->provider)
			set_text(o, "provider", j->provider);
		if (j->result)
			json_object_set_new(o, "result", json_string(j->result));
		if (j->http_status > 0)
			json_object_set_new(o, "http_status", json_integer(j->http_status));
		if (j->latency_ms >= 0)
			json_object_set_new(o, "latency_ms", json_real((double) (long long) (j->latency_ms * 10 + 0.5) / 10));
		if (j->state)
			json_object_set_new(o, "state", json_string(j->state));
		if (j->why)
			set_text(o, "why", j->why);
		json_emit(o);
	}
	else
	{
		char		line[1024];
		size_t		n;
		char		ts[64];

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
		timestamp(ts, sizeof(ts), 0);
		fprintf(out(), "ts=%s level=%s relay=%s %s\n", ts, level, log_relay, line);
		fflush(out());
	}
}
