/*
 * push_log.h — the push relay's log lines on stderr: key=value text (the
 * default) or, with --log-format json, one JSON object per line (jansson),
 * and the one line per job attempt both carry (contract §21: the trace id
 * of the message the job pushes, so a relay line joins the gateway's and
 * the database's lines about that message).
 *
 * What a line never holds: a token (sealed or clear), a notification, a
 * message body or a push gateway's answer.  Targets appear as keyed hashes
 * (log_hash.h); the relay does not know the user or device of a job.
 */
#ifndef IM_PUSH_LOG_H
#define IM_PUSH_LOG_H

#include <stdint.h>
#include <stdio.h>

/* contract §21: 1..64 of [A-Za-z0-9_-] */
#define PUSH_TRACE_ID_MAX 64

typedef enum PushLogFormat
{
	PUSH_LOG_TEXT,
	PUSH_LOG_JSON
} PushLogFormat;

/* Where lines go (stderr unless a test passes its own stream) and how. */
extern void push_log_setup(PushLogFormat format, const char *relay_id, FILE *out);
extern PushLogFormat push_log_format(void);

/*
 * A line that is not about a job: fmt is "event=NAME key=value ...".  As
 * JSON: {"ts","level","relay","event":NAME,"detail":"key=value ..."}.
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

/* true if s is a trace id of contract §21's form (anything else is dropped, never logged) */
extern int	push_trace_id_ok(const char *s);

#endif
