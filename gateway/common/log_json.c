/*
 * log_json.c — see log_json.h.
 */
#include "common/log_json.h"
#include "common/log_hash.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

im_log_format im_log_format_g = IM_LOG_FORMAT_TEXT;
static FILE *log_out;

int
im_log_format_set(const char *name)
{
	if (strcmp(name, "text") == 0)
		im_log_format_g = IM_LOG_FORMAT_TEXT;
	else if (strcmp(name, "json") == 0)
		im_log_format_g = IM_LOG_FORMAT_JSON;
	else
		return -1;
	return 0;
}

void
im_log_stream_set(FILE *out)
{
	log_out = out;
}

FILE *
im_log_stream(void)
{
	return log_out ? log_out : stderr;
}

void
im_log_json(const char *level, json_t *obj)
{
	struct timespec ts;
	struct tm	tm;
	char		tbuf[40];
	json_t	   *line = json_object();
	const char *k;
	json_t	   *v;
	char	   *text;
	json_free_t release;

	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	strftime(tbuf, sizeof(tbuf), "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(tbuf + strlen(tbuf), sizeof(tbuf) - strlen(tbuf), ".%03ldZ", ts.tv_nsec / 1000000);
	json_object_set_new(line, "ts", json_string(tbuf));
	json_object_set_new(line, "level", json_string(level));
	json_object_foreach(obj, k, v)
		json_object_set(line, k, v);
	json_decref(obj);
	/* compact and ASCII only: one line whatever the values hold; reals as
	 * written (latency_ms to the microsecond), not to 17 digits */
	text = json_dumps(line, JSON_COMPACT | JSON_ENSURE_ASCII | JSON_REAL_PRECISION(9));
	json_decref(line);
	if (!text)
		return;
	/* one fprintf so concurrent threads never interleave within a line */
	fprintf(im_log_stream(), "%s\n", text);
	fflush(im_log_stream());
	/* from jansson's allocator: the relay installs a wiping one (relay/push_wipe.c) */
	json_get_alloc_funcs(NULL, &release);
	release(text);
}

/* v[0..n) as a JSON string, never NULL: invalid UTF-8 has its bytes >= 0x80 as '?' */
static json_t *
text_value(const char *v, size_t n)
{
	json_t	   *s = json_stringn(v, n);
	char	   *copy;

	if (s)
		return s;
	copy = strndup(v, n);
	if (!copy)
		abort();
	for (char *c = copy; *c; c++)
		if ((unsigned char) *c >= 0x80)
			*c = '?';
	s = json_string(copy);
	free(copy);
	return s ? s : json_string("");
}

void
im_log_json_text(json_t *obj, const char *key, const char *v)
{
	json_object_set_new(obj, key, text_value(v, strlen(v)));
}

void
im_log_json_user(json_t *obj, int64_t user_id)
{
	char		h[IM_LOG_HASH_BUF];

	json_object_set_new(obj, "user", user_id ? json_string(im_hash_user(user_id, h)) : json_null());
}

void
im_log_json_device(json_t *obj, int64_t user_id, const char *device_id)
{
	char		h[IM_LOG_HASH_BUF];

	json_object_set_new(obj, "device", device_id && device_id[0] ?
						json_string(im_hash_device(user_id, device_id, h)) : json_null());
}

/* A value of a text record: an integer when it is one, else a string. */
static json_t *
kv_value(const char *v, size_t n)
{
	size_t		i = (n > 0 && v[0] == '-') ? 1 : 0;
	char		buf[24];

	if (n > i && n - i <= 18)
	{
		size_t		k;

		for (k = i; k < n && v[k] >= '0' && v[k] <= '9'; k++)
			;
		if (k == n)
		{
			memcpy(buf, v, n);
			buf[n] = '\0';
			return json_integer(strtoll(buf, NULL, 10));
		}
	}
	return text_value(v, n);
}

/* After spaces, a key= (lower-case letters, digits, '_'). */
static int
starts_key(const char *p)
{
	const char *k;

	while (*p == ' ')
		p++;
	for (k = p; (*k >= 'a' && *k <= 'z') || (*k >= '0' && *k <= '9') || *k == '_'; k++)
		;
	return k > p && *k == '=';
}

void
im_log_json_kv_set(json_t *o, const char *kv)
{
	char	   *rest = NULL;
	size_t		restlen = 0;
	const char *p = kv;

	while (*p)
	{
		const char *k = p,
				   *eq,
				   *v,
				   *end;
		size_t		vn;

		while (*p == ' ')
			p++;
		if (!*p)
			break;
		k = p;
		while (*p && *p != ' ' && *p != '=')
			p++;
		eq = p;
		if (*eq != '=' || eq == k)
		{
			/* not key=value: kept as text */
			while (*p && *p != ' ')
				p++;
			rest = realloc(rest, restlen + (size_t) (p - k) + 2);
			if (!rest)
				abort();
			if (restlen)
				rest[restlen++] = ' ';
			memcpy(rest + restlen, k, (size_t) (p - k));
			restlen += (size_t) (p - k);
			rest[restlen] = '\0';
			continue;
		}
		v = eq + 1;
		if (*v == '"')
		{
			/*
			 * to the first quote that ends the record or is followed by
			 * the next key= (server messages may hold quotes themselves)
			 */
			v++;
			end = v + strlen(v);
			for (const char *q = v; *q; q++)
				if (*q == '"' && (q[1] == '\0' || (q[1] == ' ' && starts_key(q + 1))))
				{
					end = q;
					break;
				}
			vn = (size_t) (end - v);
			p = *end ? end + 1 : end;
		}
		else
		{
			end = v;
			while (*end && *end != ' ')
				end++;
			vn = (size_t) (end - v);
			p = end;
		}
		{
			char	   *key = strndup(k, (size_t) (eq - k));

			if (!key)
				abort();
			json_object_set_new(o, key, kv_value(v, vn));
			free(key);
		}
	}
	if (rest)
	{
		im_log_json_text(o, "msg", rest);
		free(rest);
	}
}

void
im_log_json_kv(const char *level, const char *kv)
{
	json_t	   *o = json_object();

	im_log_json_kv_set(o, kv);
	im_log_json(level, o);
}
