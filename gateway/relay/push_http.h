/*
 * push_http.h — one POST to the push gateway (Matrix push gateway API,
 * /_matrix/push/v1/notify) through libcurl's multi interface, and the
 * classification of its answer into contract §13's results.
 */
#ifndef IM_PUSH_HTTP_H
#define IM_PUSH_HTTP_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include <curl/curl.h>

#include "im_sync/trace_id.h"

typedef struct PushRequest
{
	int64_t		job_id;
	int64_t		push_target_id;
	CURL	   *easy;
	struct curl_slist *headers;
	char	   *body;			/* holds the token: wiped when freed */
	size_t		body_len;
	char	   *pushkey;		/* the token (wiped when freed) */
	size_t		pushkey_len;
	char	   *answer;			/* the response body, capped */
	size_t		answer_len;
	long		retry_after_ms; /* -1: none */
	double		started;		/* monotonic seconds */
	char		provider[33];	/* for the log: the target's provider ("" if not known) */
	char		trace_id[IM_TRACE_ID_MAX + 1];	/* for the log: the trace id of the job's message ("" if none) */
} PushRequest;

/* What a request ended as: a contract §13 result and its details. */
typedef struct PushOutcome
{
	const char *result;			/* delivered rejected rate_limited transient permanent */
	long		http_status;	/* 0: no HTTP answer */
	long		retry_after_ms; /* -1: none */
	const char *why;			/* a short reason for the log, never a token or body */
} PushOutcome;

/*
 * A request for notification (the claimed jsonb text) with pushkey filled
 * in; it then owns token (wiped and freed with the request).  NULL with err
 * on a notification that is not the expected shape; token is then still
 * the caller's.
 */
extern PushRequest *push_request_new(const char *url, int64_t job_id, int64_t push_target_id,
									 const char *notification, char *token, size_t token_len,
									 long timeout_ms, char *err, size_t errlen);
extern void push_request_free(PushRequest *r);

/* Classify a finished request (curl result code and the answer). */
extern PushOutcome push_classify(PushRequest *r, CURLcode code);

/*
 * A Retry-After value (the header's field value, len bytes, surrounding
 * blanks and CRLF allowed) in milliseconds: delay-seconds or an HTTP-date
 * (a date gone by: 0), capped at PUSH_RETRY_AFTER_MAX_S; -1 for anything
 * else (negative, fractional, signed, trailing garbage), which the relay
 * ignores (the database's backoff applies).
 */
#define PUSH_RETRY_AFTER_MAX_S 3600
extern long push_retry_after_ms(const char *value, size_t len, time_t now);

/* Monotonic seconds: request start times, poll and reconnect deadlines. */
extern double push_now(void);

#endif
