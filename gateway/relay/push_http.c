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
#include "relay/push_http.h"

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

/*
 * The answer can name the token (a "rejected" list): grown by moving to a
 * new block and wiping the old one, never by realloc, which would leave
 * the old bytes in freed heap.
 */
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
		char	   *grown = malloc(r->answer_len + take + 1);

		if (!grown)
			return 0;
		if (r->answer)
		{
			memcpy(grown, r->answer, r->answer_len);
			OPENSSL_cleanse(r->answer, r->answer_len + 1);
			free(r->answer);
		}
		r->answer = grown;
		memcpy(r->answer + r->answer_len, data, take);
		r->answer_len += take;
		r->answer[r->answer_len] = '\0';
	}
	return n;
}

long
push_retry_after_ms(const char *value, size_t len, time_t now)
{
	const char *p = value;
	const char *end = value + len;
	long		secs = 0;

	while (p < end && (*p == ' ' || *p == '\t'))
		p++;
	while (end > p && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r' || end[-1] == '\n'))
		end--;
	if (p == end || memchr(p, '\0', (size_t) (end - p)))
		return -1;
	if (*p >= '0' && *p <= '9')
	{
		/* delay-seconds: 1*DIGIT, saturating at the cap (never overflows) */
		for (; p < end; p++)
		{
			if (*p < '0' || *p > '9')
				return -1;
			if (secs < PUSH_RETRY_AFTER_MAX_S)
				secs = secs * 10 + (*p - '0');
		}
	}
	else if ((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z'))
	{
		/* an HTTP-date ("Sun, 06 Nov 1994 08:49:37 GMT" and the two obsolete forms) */
		char		date[64];
		time_t		at;

		if ((size_t) (end - p) >= sizeof(date))
			return -1;
		memcpy(date, p, (size_t) (end - p));
		date[end - p] = '\0';
		at = curl_getdate(date, NULL);
		if (at == -1)
			return -1;
		if (at <= now)
			return 0;
		secs = at - now > PUSH_RETRY_AFTER_MAX_S ? PUSH_RETRY_AFTER_MAX_S : (long) (at - now);
	}
	else
		return -1;
	if (secs > PUSH_RETRY_AFTER_MAX_S)
		secs = PUSH_RETRY_AFTER_MAX_S;
	return secs * 1000;
}

/* Retry-After of the final answer (a status line starts each answer: 1xx ones come first) */
static size_t
on_header(char *data, size_t size, size_t nmemb, void *arg)
{
	PushRequest *r = arg;
	size_t		n = size * nmemb;
	const char *name = "retry-after:";
	size_t		nl = strlen(name);

	if (n >= 5 && strncmp(data, "HTTP/", 5) == 0)
		r->retry_after_ms = -1;
	else if (n > nl && strncasecmp(data, name, nl) == 0)
		r->retry_after_ms = push_retry_after_ms(data + nl, n - nl, time(NULL));
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
	size_t		need;

	if (!doc || !(devices = json_object_get(json_object_get(doc, "notification"), "devices")) ||
		!json_is_array(devices) || json_array_size(devices) != 1 ||
		!json_is_object(device = json_array_get(devices, 0)))
	{
		json_decref(doc);
		snprintf(err, errlen, "notification is not a Matrix push notification with one device");
		return NULL;
	}
	r = calloc(1, sizeof(*r));
	if (!r)
	{
		json_decref(doc);
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	r->job_id = job_id;
	r->push_target_id = push_target_id;
	r->retry_after_ms = -1;

	/*
	 * jansson's copy of the token (and every block of the document) comes
	 * from the wiping allocator (push_wipe.h); the body is serialised
	 * straight into a buffer of ours (json_dumpb: no intermediate copy),
	 * wiped in push_request_free.
	 */
	if (json_object_set_new(device, "pushkey", json_stringn(token, token_len)) != 0 ||
		(need = json_dumpb(doc, NULL, 0, JSON_COMPACT)) == 0 || !(r->body = malloc(need)) ||
		json_dumpb(doc, r->body, need, JSON_COMPACT) != need)
	{
		json_decref(doc);
		push_request_free(r);
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	r->body_len = need;
	json_decref(doc);
	r->easy = curl_easy_init();
	if (!r->easy)
	{
		push_request_free(r);
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	/*
	 * http and https only, redirects included (none is followed): a --url
	 * or a Location naming file://, gopher://, ftp:// … is refused by curl
	 * before any connection.
	 */
	if (curl_easy_setopt(r->easy, CURLOPT_PROTOCOLS_STR, "http,https") != CURLE_OK ||
		curl_easy_setopt(r->easy, CURLOPT_REDIR_PROTOCOLS_STR, "http,https") != CURLE_OK ||
		curl_easy_setopt(r->easy, CURLOPT_FOLLOWLOCATION, 0L) != CURLE_OK)
	{
		push_request_free(r);
		snprintf(err, errlen, "libcurl cannot restrict the request to http and https");
		return NULL;
	}
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
	/* the request owns the token from here on (on NULL above it stays the caller's) */
	r->pushkey = token;
	r->pushkey_len = token_len;
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
	if (r->answer)
	{
		OPENSSL_cleanse(r->answer, r->answer_len);
		free(r->answer);
	}
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
