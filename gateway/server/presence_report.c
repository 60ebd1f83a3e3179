/*
 * presence_report.c — see presence_report.h.  Fire-and-forget jobs: their answers are
 * dropped (a lost call is repaired by the next refresh or by the ttl).
 */
#include "server/presence_report.h"
#include "server/db/db.h"
#include "server/frame.h"
#include "common/text_buf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


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
	j->params[4] = strdup(IM_PRESENCE_TTL_TEXT);
	im_db_submit(j);
}

void
im_presence_offline(session *s)
{
	if (s->authed && !s->is_http)
		set_presence(s, 0);
}

static void
submit_refresh(im_text_buf *users, im_text_buf *devices, im_text_buf *epochs)
{
	im_job	   *j = im_job_new(IM_JOB_PRESENCE, 0);

	im_text_printf(users, "}");
	im_text_printf(devices, "}");
	im_text_printf(epochs, "}");
	j->sql = "SELECT im.refresh_presence($1::bigint[], $2::text[], $3::bigint[], $4::interval)";
	j->nparams = 4;
	j->params[0] = users->b;
	j->params[1] = devices->b;
	j->params[2] = epochs->b;
	j->params[3] = strdup(IM_PRESENCE_TTL_TEXT);
	im_db_submit(j);
	memset(users, 0, sizeof(*users));
	memset(devices, 0, sizeof(*devices));
	memset(epochs, 0, sizeof(*epochs));
}

void
im_presence_tick(double now)
{
	im_text_buf users = {0},
				devices = {0},
				epochs = {0};
	int			n = 0;

	if (now < next_refresh)
		return;
	next_refresh = now + IM_PRESENCE_REFRESH_S;
	for (session *s = im_all_sessions; s; s = s->all_next)
	{
		const char *sep = n ? "," : "{";

		if (!s->authed || s->is_http || s->close_code)
			continue;

		im_text_printf(&users, "%s%lld", sep, (long long) s->user_id);
		/* device ids are [A-Za-z0-9._-]{1,64}: no quoting needed, quoted anyway */
		im_text_printf(&devices, "%s\"%s\"", sep, s->device_id);
		im_text_printf(&epochs, "%s%lld", sep, (long long) s->epoch);
		if (++n == IM_PRESENCE_CHUNK)
		{
			submit_refresh(&users, &devices, &epochs);
			n = 0;
		}
	}
	if (n > 0)
		submit_refresh(&users, &devices, &epochs);
}
