/*
 * push_http.c — see push_http.h.
 *
 * Classification (contract §13; Sygnal, APNs and FCM result classes):
 *   2xx, the pushkey not in the answer's "rejected" list -> delivered;
 *   2xx with the pushkey in "rejected", or 410 Gone (token unregistered) ->
 *   rejected; 429 -> rate_limited (Retry-After honoured); 5xx, a timeout,
 *   a refused or closed connection, any transport error -> transient;
 *   any other 4xx (and an unexpected status) -> permanent.
 */
#include "push_http.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <jansson.h>
#include <openssl/crypto.h>

#define MAX_ANSWER 65536

double
push_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static size_t
on_body(char *data, size_t size, size_t nmemb, void *arg)
{
	PushRequest *r = arg;
	size_t		n = size * nmemb;
	size_t		take = n;

	if (r->answer_len + take > MAX_ANSWER)
		take = MAX_ANSWER - r->answer_len;
	if (take > 0)
	{
		char	   *grown = realloc(r->answer, r->answer_len + take + 1);

		if (!grown)
			return 0;
		r->answer = grown;
		memcpy(r->answer + r->answer_len, data, take);
		r->answer_len += take;
		r->answer[r->answer_len] = '\0';
	}
	return n;
}

/* Retry-After: delay-seconds or an HTTP-date */
static size_t
on_header(char *data, size_t size, size_t nmemb, void *arg)
{
	PushRequest *r = arg;
	size_t		n = size * nmemb;
	const char *name = "retry-after:";
	size_t		nl = strlen(name);

	if (n > nl && strncasecmp(data, name, nl) == 0)
	{
		char		value[128];
		size_t		vl = n - nl;
		char	   *end;
		long		secs;

		if (vl >= sizeof(value))
			vl = sizeof(value) - 1;
		memcpy(value, data + nl, vl);
		value[vl] = '\0';
		secs = strtol(value, &end, 10);
		while (*end == ' ' || *end == '\r' || *end == '\n')
			end++;
		if (end != value && *end == '\0' && secs >= 0)
			r->retry_after_ms = secs * 1000;
		else
		{
			time_t		at = curl_getdate(value, NULL);

			if (at > 0)
				r->retry_after_ms = at > time(NULL) ? (long) (at - time(NULL)) * 1000 : 0;
		}
	}
	return n;
}

PushRequest *
push_request_new(const char *url, int64_t job_id, int64_t push_target_id, const char *notification,
				 char *token, size_t token_len, long timeout_ms, char *err, size_t errlen)
{
	json_error_t jerr;
	json_t	   *doc = json_loads(notification, 0, &jerr);
	json_t	   *devices;
	json_t	   *device;
	PushRequest *r;

	if (!doc || !(devices = json_object_get(json_object_get(doc, "notification"), "devices")) ||
		!json_is_array(devices) || json_array_size(devices) != 1 ||
		!json_is_object(device = json_array_get(devices, 0)))
	{
		json_decref(doc);
		snprintf(err, errlen, "notification is not a Matrix push notification with one device");
		return NULL;
	}
	json_object_set_new(device, "pushkey", json_stringn(token, token_len));
	r = calloc(1, sizeof(*r));
	if (!r)
	{
		json_decref(doc);
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	r->job_id = job_id;
	r->push_target_id = push_target_id;
	r->pushkey = token;
	r->pushkey_len = token_len;
	r->retry_after_ms = -1;
	r->body = json_dumps(doc, JSON_COMPACT);
	json_decref(doc);
	r->easy = curl_easy_init();
	if (!r->body || !r->easy)
	{
		push_request_free(r);
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	r->body_len = strlen(r->body);
	r->headers = curl_slist_append(NULL, "Content-Type: application/json");
	curl_easy_setopt(r->easy, CURLOPT_URL, url);
	curl_easy_setopt(r->easy, CURLOPT_POST, 1L);
	curl_easy_setopt(r->easy, CURLOPT_POSTFIELDS, r->body);
	curl_easy_setopt(r->easy, CURLOPT_POSTFIELDSIZE, (long) r->body_len);
	curl_easy_setopt(r->easy, CURLOPT_HTTPHEADER, r->headers);
	curl_easy_setopt(r->easy, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(r->easy, CURLOPT_WRITEDATA, r);
	curl_easy_setopt(r->easy, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(r->easy, CURLOPT_HEADERDATA, r);
	curl_easy_setopt(r->easy, CURLOPT_PRIVATE, r);
	/* HTTP/2 where the gateway offers it over TLS, HTTP/1.1 otherwise */
	curl_easy_setopt(r->easy, CURLOPT_HTTP_VERSION, (long) CURL_HTTP_VERSION_2TLS);
	curl_easy_setopt(r->easy, CURLOPT_PIPEWAIT, 1L);
	curl_easy_setopt(r->easy, CURLOPT_TIMEOUT_MS, timeout_ms);
	curl_easy_setopt(r->easy, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms < 5000 ? timeout_ms : 5000L);
	curl_easy_setopt(r->easy, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(r->easy, CURLOPT_TCP_KEEPALIVE, 1L);
	r->started = push_now();
	return r;
}

void
push_request_free(PushRequest *r)
{
	if (!r)
		return;
	if (r->easy)
		curl_easy_cleanup(r->easy);
	curl_slist_free_all(r->headers);
	if (r->body)
	{
		OPENSSL_cleanse(r->body, r->body_len);
		free(r->body);
	}
	if (r->pushkey)
	{
		OPENSSL_cleanse(r->pushkey, r->pushkey_len);
		free(r->pushkey);
	}
	free(r->answer);
	free(r);
}

/* true if the 2xx answer lists this pushkey in "rejected" */
static int
listed_rejected(PushRequest *r)
{
	json_t	   *doc;
	json_t	   *rejected;
	size_t		i;
	json_t	   *v;
	int			found = 0;

	if (!r->answer)
		return 0;
	doc = json_loads(r->answer, 0, NULL);
	rejected = json_object_get(doc, "rejected");
	if (json_is_array(rejected))
		json_array_foreach(rejected, i, v)
			if (json_is_string(v) && json_string_length(v) == r->pushkey_len &&
				memcmp(json_string_value(v), r->pushkey, r->pushkey_len) == 0)
				found = 1;
	json_decref(doc);
	return found;
}

PushOutcome
push_classify(PushRequest *r, CURLcode code)
{
	PushOutcome o = {"transient", 0, -1, NULL};
	long		status = 0;

	if (code != CURLE_OK)
	{
		o.why = code == CURLE_OPERATION_TIMEDOUT ? "timeout" :
			code == CURLE_COULDNT_CONNECT ? "connection refused" :
			code == CURLE_GOT_NOTHING ? "connection closed without an answer" : curl_easy_strerror(code);
		return o;
	}
	curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &status);
	o.http_status = status;
	if (status >= 200 && status < 300)
	{
		o.result = listed_rejected(r) ? "rejected" : "delivered";
		o.why = strcmp(o.result, "rejected") == 0 ? "pushkey in rejected" : "accepted";
	}
	else if (status == 410)
	{
		o.result = "rejected";
		o.why = "token unregistered";
	}
	else if (status == 429)
	{
		o.result = "rate_limited";
		o.retry_after_ms = r->retry_after_ms;
		o.why = "rate limited";
	}
	else if (status >= 500 && status < 600)
	{
		o.result = "transient";
		o.why = "gateway error";
	}
	else
	{
		o.result = "permanent";
		o.why = "request refused";
	}
	return o;
}
