/*
 * presence.c — see presence.h.  Fire-and-forget jobs: their answers are
 * dropped (a lost call is repaired by the next refresh or by the ttl).
 */
#include "presence.h"
#include "db.h"
#include "frame.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TTL_TEXT "90 seconds"

static double next_refresh;

static void
set_presence(session *s, int online)
{
	im_job	   *j = im_job_new(IM_JOB_PRESENCE, 0);

	j->sql = "SELECT im.set_presence($1::bigint, $2::text, $3::bigint, $4::boolean, $5::interval)";
	j->nparams = 5;
	j->params[0] = im_int64_text(s->user_id);
	j->params[1] = strdup(s->device_id);
	j->params[2] = im_int64_text(s->epoch);
	j->params[3] = strdup(online ? "true" : "false");
	j->params[4] = strdup(TTL_TEXT);
	im_db_submit(j);
}

void
im_presence_online(session *s)
{
	set_presence(s, 1);
}

void
im_presence_offline(session *s)
{
	if (s->authed && !s->is_http)
		set_presence(s, 0);
}

/* a growing text buffer for the three array literals */
typedef struct sbuf
{
	char	   *p;
	size_t		len,
				cap;
} sbuf;

static void
sb_add(sbuf *b, const char *text)
{
	size_t		n = strlen(text);

	if (b->len + n + 1 > b->cap)
	{
		b->cap = (b->len + n + 1) * 2;
		b->p = realloc(b->p, b->cap);
		if (!b->p)
			abort();
	}
	memcpy(b->p + b->len, text, n + 1);
	b->len += n;
}

static void
submit_refresh(sbuf *users, sbuf *devices, sbuf *epochs)
{
	im_job	   *j = im_job_new(IM_JOB_PRESENCE, 0);

	sb_add(users, "}");
	sb_add(devices, "}");
	sb_add(epochs, "}");
	j->sql = "SELECT im.refresh_presence($1::bigint[], $2::text[], $3::bigint[], $4::interval)";
	j->nparams = 4;
	j->params[0] = users->p;
	j->params[1] = devices->p;
	j->params[2] = epochs->p;
	j->params[3] = strdup(TTL_TEXT);
	im_db_submit(j);
	memset(users, 0, sizeof(*users));
	memset(devices, 0, sizeof(*devices));
	memset(epochs, 0, sizeof(*epochs));
}

void
im_presence_tick(double now)
{
	sbuf		users = {0},
				devices = {0},
				epochs = {0};
	int			n = 0;
	char		num[32];

	if (now < next_refresh)
		return;
	next_refresh = now + IM_PRESENCE_REFRESH_S;
	for (session *s = im_all_sessions; s; s = s->all_next)
	{
		if (!s->authed || s->is_http || s->close_code)
			continue;
		sb_add(&users, n ? "," : "{");
		sb_add(&devices, n ? "," : "{");
		sb_add(&epochs, n ? "," : "{");
		snprintf(num, sizeof(num), "%lld", (long long) s->user_id);
		sb_add(&users, num);
		/* device ids are [A-Za-z0-9._-]{1,64}: no quoting needed, quoted anyway */
		sb_add(&devices, "\"");
		sb_add(&devices, s->device_id);
		sb_add(&devices, "\"");
		snprintf(num, sizeof(num), "%lld", (long long) s->epoch);
		sb_add(&epochs, num);
		if (++n == IM_PRESENCE_CHUNK)
		{
			submit_refresh(&users, &devices, &epochs);
			n = 0;
		}
	}
	if (n > 0)
		submit_refresh(&users, &devices, &epochs);
}
