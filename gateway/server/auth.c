/*
 * auth.c — the hello, the welcome and device re-checks.
 *
 * Invariants kept here: a session's user and device come only from
 * im.authenticate (frames naming others are refused in frame.c); a refused
 * hello changes nothing in the database (its transaction is rolled back);
 * a session is closed 4003/4008/4005 only on im.device_session's answer (or
 * 4005 on authenticate's IS403 at hello), never on a notification alone.
 */
#include "server/auth.h"
#include "server/presence_report.h"
#include "server/admission.h"
#include "server/config.h"
#include "server/db/db.h"
#include "server/frame.h"
#include "server/hints.h"
#include "server/keepalive.h"
#include "common/log.h"
#include "common/log_hash.h"
#include "server/gateway_metrics.h"
#include "server/receive.h"
#include "server/session.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Columns of im.device_session, as the hello and the re-check select them. */
enum
{
	DS_STATE, DS_SYNC_GENERATION, DS_SERVER_ACKED_SYNC_SEQ, DS_HIGH_WATERMARK, DS_CURRENT,
	DS_ACCOUNT_STATE, DS_NCOLS
};

/* The hello result: user_id, device_id, epoch, then the device_session columns. */
enum
{
	HELLO_USER_ID, HELLO_DEVICE_ID, HELLO_EPOCH, HELLO_DEVICE_SESSION
};

void
im_refuse(session *s, json_t *id, long retry_ms, const char *why)
{
	im_stats.refusals++;
	im_send_error(s, id, &s->rq, "RATE_LIMITED", why, retry_ms);	/* the hello's answer */
	im_begin_close(s, 4029, why);
}

/* ---- hellos waiting for a place (--max-waiting-hello) ---- */

/*
 * A hello that found --max-pending-hello in flight waits here, on its own
 * connection, with its job built but not sent: in arrival order, started as
 * hellos in flight finish, refused (RATE_LIMITED + retry_after_ms) only when
 * the queue is full or after --hello-timeout of waiting.  A socket that
 * closes leaves the queue at once (its place goes to the next).
 */
typedef struct hello_wait
{
	lws_dll2_t	list;			/* in waiting, oldest first */
	session    *s;
	im_job	   *job;
	double		t;				/* when it began to wait */
} hello_wait;

static lws_dll2_owner_t waiting;

#define BUSY_WHY "gateway busy authenticating, retry later"

static void
wait_unlink(hello_wait *w)
{
	lws_dll2_remove(&w->list);
	w->s->hello_wait = NULL;
}

/* Starts waiting hellos, oldest first, while there is room in flight. */
static void
start_waiting(void)
{
	while (waiting.count > 0 && im_hello_start_one())
	{
		hello_wait *w = lws_container_of(lws_dll2_get_head(&waiting), hello_wait, list);
		im_job	   *j = w->job;

		wait_unlink(w);
		free(w);
		im_db_submit(j);
	}
}

void
im_hello_submit(session *s, im_job *j)
{
	hello_wait *w;

	switch (im_hello_admit())
	{
		case IM_HELLO_SEND:
			s->hello_pending = 1;
			im_db_submit(j);
			return;
		case IM_HELLO_WAIT:
			w = calloc(1, sizeof(hello_wait));
			if (!w)
				abort();
			w->s = s;
			w->job = j;
			w->t = im_now();
			lws_dll2_add_tail(&w->list, &waiting);
			s->hello_wait = w;
			s->hello_pending = 1;
			im_stats.hellos_waited++;
			return;
		case IM_HELLO_REFUSE:
			im_refuse(s, j->id, im_hello_retry_ms(1), BUSY_WHY);
			im_job_free(j);
			return;
	}
}

/* A waiting hello leaves the queue without starting; its job is freed. */
static void
unwait(session *s)
{
	hello_wait *w = s->hello_wait;

	wait_unlink(w);
	im_job_free(w->job);
	free(w);
	im_hello_unwait();
	s->hello_pending = 0;
}

void
im_hello_abandon(session *s)
{
	if (s->hello_wait)
		unwait(s);
	else if (s->hello_pending)
	{
		s->hello_pending = 0;
		im_hello_release(0);
		start_waiting();
	}
}

double
im_hello_wait_deadline(const session *s)
{
	return s->hello_wait ? s->hello_wait->t + im_cfg.hello_timeout : 0;
}

int
im_hello_wait_expired(session *s, double now)
{
	json_t	   *id;

	if (!s->hello_wait || now < s->hello_wait->t + im_cfg.hello_timeout)
		return 0;
	id = s->hello_wait->job->id ? json_incref(s->hello_wait->job->id) : NULL;
	unwait(s);
	im_refuse(s, id, im_hello_retry_ms(0), BUSY_WHY);
	json_decref(id);
	return 1;
}

void
im_hello_done(session *s)
{
	if (s->hello_pending && !s->hello_wait)
	{
		s->hello_pending = 0;
		im_hello_release(1);
		start_waiting();
	}
}

/*
 * Closes the session when device_session (columns from off) says the
 * account is suspended (4005), the device was revoked (4003) or the session
 * is no longer current (4008).  Returns 1 when it closed.
 */
static int
closed_by_device_state(session *s, const PGresult *r, int off)
{
	if (strcmp(PQgetvalue(r, 0, off + DS_ACCOUNT_STATE), "suspended") == 0)
	{
		im_begin_close(s, 4005, "suspended");
		return 1;
	}
	if (strcmp(PQgetvalue(r, 0, off + DS_STATE), "REVOKED") == 0)
	{
		im_begin_close(s, 4003, "revoked");
		return 1;
	}
	if (PQgetvalue(r, 0, off + DS_CURRENT)[0] != 't')
	{
		im_begin_close(s, 4008, "superseded");
		return 1;
	}
	return 0;
}

static json_t *
int_or_null(const PGresult *r, int col)
{
	return PQgetisnull(r, 0, col) ? json_null() : json_integer(strtoll(PQgetvalue(r, 0, col), NULL, 10));
}

static void
welcome(session *s, im_job *j)
{
	const int	off = HELLO_DEVICE_SESSION;
	PGresult   *r = j->res;
	json_t	   *w;
	char		hu[IM_LOG_HASH_BUF],
				hd[IM_LOG_HASH_BUF];

	im_hello_done(s);
	if (closed_by_device_state(s, r, off))
	{
		im_request_done(s, &s->rq, "closed", s->close_code);
		return;
	}
	s->authed = 1;
	im_unauth_release(s->unauth_ip);
	s->unauth_ip = NULL;
	im_session_link_user(s);
	/* its presence was set online by the hello statement */
	w = json_object();
	json_object_set_new(w, "type", json_string("welcome"));
	if (j->id)
		json_object_set(w, "id", j->id);
	json_object_set_new(w, "trace_id", json_string(s->rq.trace_id));
	json_object_set_new(w, "user_id", json_integer(s->user_id));
	json_object_set_new(w, "device_id", json_string(s->device_id));
	json_object_set_new(w, "connection_epoch", json_integer(s->epoch));
	json_object_set_new(w, "sync_generation", int_or_null(r, off + DS_SYNC_GENERATION));
	json_object_set_new(w, "server_acked_sync_seq", int_or_null(r, off + DS_SERVER_ACKED_SYNC_SEQ));
	json_object_set_new(w, "high_watermark", int_or_null(r, off + DS_HIGH_WATERMARK));
	json_object_set_new(w, "state", json_string(PQgetvalue(r, 0, off + DS_STATE)));
	im_send_reply(s, j->id, json_dumps(w, JSON_COMPACT), IM_OP_HELLO, &s->rq);
	json_decref(w);
	if (j->superseded_in_batch)
		im_request_recheck(s, 0);	/* its SUPERSEDED came before it could hear it */
	im_log("info", "event=welcome sid=%" PRIu64 " user=%s device=%s epoch=%" PRId64 " trace_id=%s",
		   s->sid, im_hash_user(s->user_id, hu), im_hash_device(s->user_id, s->device_id, hd),
		   s->epoch, s->rq.trace_id);
	im_pump(s);
}

static void
hello_unavailable(session *s, im_job *j)
{
	im_hello_done(s);
	im_send_error(s, j->id, &s->rq, "UNAVAILABLE", "database unavailable", IM_RETRY_UNAVAILABLE_MS);
	im_begin_close(s, 1013, "db_unavailable");
}

/* Refuses an authenticated hello: its transaction is rolled back. */
static int
refuse_hello(session *s, im_job *j, long retry_ms, const char *why)
{
	im_hello_done(s);
	im_refuse(s, j->id, retry_ms, why);
	im_db_end_txn(j, 0);
	return 1;
}

/*
 * A hello's authenticate runs in an explicit transaction that the database
 * thread holds open (im_job.txn): this first sees its result with the
 * transaction still open, checks the limits that need the identity, and
 * COMMITs only a hello it will welcome.  A refused hello is rolled back, so
 * its connection-epoch bump and NOTIFY SUPERSEDED never happen and the live
 * session of the device stays current.  The job comes back
 * once more after the COMMIT, and only then is the session welcomed.
 */
int
im_on_auth_job(session *s, im_job *j)
{
	long		wait;
	int			nuser = 0;
	session    *o;

	if (j->txn_ended)
	{
		/* the COMMIT's answer */
		if (j->status != IM_JOB_OK)
			hello_unavailable(s, j);
		else
			welcome(s, j);
		return 0;
	}
	if (j->status == IM_JOB_UNAVAILABLE)
	{
		hello_unavailable(s, j);
		return 0;
	}
	if (j->status != IM_JOB_OK || PQntuples(j->res) != 1)
	{
		int			held = j->txn_held;

		im_hello_done(s);
		im_log("info", "event=auth_failed sid=%" PRIu64 " sqlstate=%s trace_id=%s", s->sid,
			   j->status == IM_JOB_SQL_ERROR ? j->sqlstate : "-", s->rq.trace_id);
		if (j->status == IM_JOB_SQL_ERROR && strcmp(j->sqlstate, "IS403") == 0)
		{
			/* a suspended account (contract §17): told why, and no reconnect */
			im_send_error_reason(s, j->id, &s->rq, "FORBIDDEN", "account suspended", -1, "suspended");
			im_begin_close(s, 4005, "suspended");
		}
		else
		{
			im_send_error(s, j->id, &s->rq, "NOT_AUTHENTICATED", "authentication failed", -1);
			im_begin_close(s, 4001, "auth_failed");
		}
		if (held)
			im_db_end_txn(j, 0);
		return held;
	}
	s->user_id = strtoll(PQgetvalue(j->res, 0, HELLO_USER_ID), NULL, 10);
	snprintf(s->device_id, sizeof(s->device_id), "%s", PQgetvalue(j->res, 0, HELLO_DEVICE_ID));
	s->epoch = strtoll(PQgetvalue(j->res, 0, HELLO_EPOCH), NULL, 10);
	if (j->admitted)
	{
		/* its limits passed once; its batch was rolled back for another hello */
		im_db_end_txn(j, 1);
		return 1;
	}

	/* §11.3: per-account concurrency and per-device/account reconnect rate */
	for (o = im_user_chain(s->user_id); o; o = o->user_next)
		if (o->user_id == s->user_id && o->authed && !o->close_code &&
			strcmp(o->device_id, s->device_id) != 0)
			nuser++;
	if (nuser >= im_cfg.max_conn_user)
		return refuse_hello(s, j, 5000, "too many connections for this account");
	wait = im_reconnect_wait(s->user_id, s->device_id);
	if (wait)
		return refuse_hello(s, j, wait, "reconnecting too fast");
	im_db_end_txn(j, 1);		/* welcome when the COMMIT answers */
	return 1;
}

/*
 * A notification never closes a session by itself (any role can NOTIFY,
 * whatever it says): it only triggers this.  Per session at most one re-check
 * is in flight and one pending, so a flood of notifications costs at most
 * two calls per round trip.  hint: also hint afterwards (after a re-LISTEN,
 * hints may have been lost).
 */
void
im_request_recheck(session *s, int hint)
{
	im_job	   *j;

	if (!s->authed || s->close_code)
		return;
	if (hint)
		s->recheck_hint = 1;
	if (s->recheck_inflight)
	{
		s->recheck_pending = 1;
		return;
	}
	s->recheck_inflight = 1;
	im_stats.rechecks++;
	j = im_job_new(IM_JOB_RECHECK, s->sid);
	j->key = s->recheck_hint;
	s->recheck_hint = 0;
	j->sql = "SELECT state, sync_generation, server_acked_sync_seq, high_watermark, current, "
		"account_state FROM im.device_session($1::bigint, $2::text, $3::bigint)";
	j->nparams = 3;
	j->params[0] = im_int64_text(s->user_id);
	j->params[1] = strdup(s->device_id);
	j->params[2] = im_int64_text(s->epoch);
	im_db_submit(j);
}

void
im_on_recheck_job(session *s, im_job *j)
{
	PGresult   *r = j->res;

	s->recheck_inflight = 0;
	if (s->authed && j->status == IM_JOB_OK && PQntuples(r) == 1)
	{
		if (closed_by_device_state(s, r, 0))
			return;
		if (j->key && !PQgetisnull(r, 0, DS_HIGH_WATERMARK))
			im_push_hint(s, strtoll(PQgetvalue(r, 0, DS_HIGH_WATERMARK), NULL, 10));
	}
	else if (s->authed && j->status == IM_JOB_UNAVAILABLE)
	{
		/*
		 * Not answered (pool not up yet after a restart, timeout): the
		 * question stays open and is asked again on the next tick, hint
		 * included, never in a loop.  An SQL error is not retried.
		 */
		s->recheck_retry = 1;
		s->recheck_hint |= j->key ? 1 : 0;
		im_keepalive_soon(s);
	}
	if (s->recheck_pending)
	{
		s->recheck_pending = 0;
		im_request_recheck(s, 0);
	}
}
