/*
 * keepalive.c — the tick's per-session checks (contract §10: close 4001
 * without hello after --hello-timeout; a hello that waited --hello-timeout
 * for a place is refused with retry_after_ms; ping after --ping-interval of
 * silence, again every interval; close 1001 after --idle-timeout; re-checks
 * that found no database are asked again) on a timing wheel of one-second
 * slots.
 *
 * Each WebSocket session sits in exactly one slot, the second of its next
 * deadline (or the farthest slot when that is further away).  A frame or a
 * pong only moves t_heard, never the session: deadlines only move later
 * with activity, so a session whose slot comes up is checked with the same
 * conditions as before and, when nothing is due yet, put into the slot of
 * its new deadline.  A tick thus costs the sessions that are due (plus each
 * active session once per interval), not every session.  The one thing that
 * becomes due earlier, a re-check to retry, moves the session to the next
 * second (im_keepalive_soon).
 */
#include "server/keepalive.h"
#include "server/auth.h"
#include "server/config.h"
#include "server/db/db.h"
#include "server/session.h"

#include <libwebsockets.h>
#include <math.h>

#define WHEEL_SLOTS 64			/* seconds; later deadlines wait in the last slot */

static session *wheel[WHEEL_SLOTS];
static long wheel_done = -1;	/* last second whose slot was processed */

static void
link_slot(session *s, long sec)
{
	int			k = (int) (sec % WHEEL_SLOTS);

	s->kw_slot = k;
	s->kw_prev = NULL;
	s->kw_next = wheel[k];
	if (wheel[k])
		wheel[k]->kw_prev = s;
	wheel[k] = s;
}

/* Into the slot of deadline t: never one already processed, never beyond
 * the wheel. */
static void
schedule(session *s, double t)
{
	long		sec = (long) floor(t);
	long		now_sec = (long) floor(im_now());

	if (sec <= wheel_done)
		sec = wheel_done + 1;
	if (sec > now_sec + WHEEL_SLOTS - 1)
		sec = now_sec + WHEEL_SLOTS - 1;
	link_slot(s, sec);
}

void
im_keepalive_remove(session *s)
{
	if (s->kw_slot < 0)
		return;
	if (s->kw_prev)
		s->kw_prev->kw_next = s->kw_next;
	else
		wheel[s->kw_slot] = s->kw_next;
	if (s->kw_next)
		s->kw_next->kw_prev = s->kw_prev;
	s->kw_prev = s->kw_next = NULL;
	s->kw_slot = -1;
}

/* The earliest moment one of the tick's checks can fire for s. */
static double
next_deadline(const session *s)
{
	double		t = s->t_heard + im_cfg.idle_timeout;
	double		ping = s->t_heard + im_cfg.ping_interval;

	if (ping < s->t_ping + im_cfg.ping_interval)
		ping = s->t_ping + im_cfg.ping_interval;
	if (ping < t)
		t = ping;
	if (!s->authed && !s->hello_pending && s->t_open + im_cfg.hello_timeout < t)
		t = s->t_open + im_cfg.hello_timeout;
	if (s->hello_wait && im_hello_wait_deadline(s) < t)
		t = im_hello_wait_deadline(s);
	return t;
}

void
im_keepalive_add(session *s)
{
	s->kw_slot = -1;
	schedule(s, next_deadline(s));
}

void
im_keepalive_soon(session *s)
{
	if (s->kw_slot < 0)
		return;					/* closing: nothing more to check */
	im_keepalive_remove(s);
	schedule(s, im_now());
}

/* The checks the tick made of every session, made of one that is due. */
static void
check_session(session *s, double now)
{
	if (!s->authed && !s->hello_pending && now - s->t_open > im_cfg.hello_timeout)
		im_begin_close(s, 4001, "hello_timeout");
	else if (im_hello_wait_expired(s, now))
		;						/* refused: waited --hello-timeout for a place */
	else if (now - s->t_heard >= im_cfg.idle_timeout)
		im_begin_close(s, 1001, "idle_timeout");
	else if (now - s->t_heard >= im_cfg.ping_interval && now - s->t_ping >= im_cfg.ping_interval)
	{
		s->t_ping = now;
		s->ping_due = 1;
		lws_callback_on_writable(s->wsi);
	}
	if (!s->close_code && s->recheck_retry && !s->recheck_inflight)
	{
		s->recheck_retry = 0;
		im_request_recheck(s, 0);
	}
}

void
im_keepalive_tick(double now)
{
	long		now_sec = (long) floor(now);
	long		sec = wheel_done < 0 || now_sec - wheel_done > WHEEL_SLOTS ?
		now_sec - WHEEL_SLOTS + 1 : wheel_done + 1;

	for (; sec <= now_sec; sec++)
	{
		int			k = (int) (sec % WHEEL_SLOTS);
		session    *s = wheel[k];

		/* the slot's list is taken whole: checked sessions go to later slots */
		wheel[k] = NULL;
		wheel_done = sec;
		while (s)
		{
			session    *next = s->kw_next;

			s->kw_slot = -1;
			s->kw_prev = s->kw_next = NULL;
			if (!s->close_code)
				check_session(s, now);
			if (!s->close_code)
				schedule(s, s->recheck_retry && !s->recheck_inflight ? now : next_deadline(s));
			s = next;
		}
	}
}
