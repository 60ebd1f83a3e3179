/*
 * push_log.h — the push relay's log lines: key=value text (the default) or,
 * with --log-format json, one JSON object per line, written through
 * common/log_json.h (its format switch im_log_format_set, its stream and
 * its writer im_log_json); and the one line per job attempt both carry
 * (contract §21: the trace id of the message the job pushes, so a relay
 * line joins the gateway's and the database's lines about that message).
 *
 * What a line never holds: a token (sealed or clear), a notification, a
 * message body or a push gateway's answer.  Targets appear as keyed hashes
 * (log_hash.h); the relay does not know the user or device of a job.
 */
#ifndef IM_PUSH_LOG_H
#define IM_PUSH_LOG_H

#include <stdint.h>

#include "common/log_json.h"
#include "im_sync/trace_id.h"

/* The relay's id, on every line ("relay"); set once at start. */
extern void push_log_setup(const char *relay_id);

/*
 * A line that is not about a job: fmt is "event=NAME key=value ...".  As
 * JSON: {"ts","level","relay","event":NAME, then each key=value a member}
 * (im_log_json_kv_set: digits-only values as numbers, quoted ones without
 * their quotes).
 */
extern void relay_log(const char *level, const char *fmt,...) __attribute__((format(printf, 2, 3)));

/* A line about a job; absent fields are NULL, 0 or negative as noted. */
typedef struct PushJobLog
{
	const char *event;			/* sent, unseal_failed, bad_notification, completed, complete_failed */
	int64_t		job_id;
	const char *trace_id;		/* NULL or "": none */
	int64_t		push_target_id; /* 0: not known */
	const char *provider;		/* NULL: not known */
	const char *result;			/* delivered rejected rate_limited transient permanent; NULL: none */
	long		http_status;	/* < 0: not printed; 0: no HTTP answer */
	double		latency_ms;		/* < 0: none */
	const char *state;			/* the job's state complete_push_job returned; "unreported"; NULL: none */
	const char *why;			/* a fixed short reason or a database error; NULL: none */
} PushJobLog;

/*
 * Text: "event=... job=... trace_id=... target=h:... provider=... result=...
 * status=... ms=... state=... why=\"...\"" (absent fields left out,
 * trace_id=- when the job has none).  JSON: {"ts","level","relay",
 * "type":"push","event","job_id","trace_id" (null when none),"target",
 * "provider","result","http_status" (only for an HTTP answer),
 * "latency_ms","state","why"}.
 */
extern void push_log_job(const char *level, const PushJobLog *j);

#endif
