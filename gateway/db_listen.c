/*
 * db_listen.c — the LISTEN connection: it listens on im_sync_hint and
 * im_sync_device and passes every notification to the lws thread as an
 * IM_JOB_NOTIFY job.  After each (re)LISTEN an IM_JOB_LISTEN_UP job tells
 * the lws thread that notifications may have been missed meanwhile.
 */
#include "db_internal.h"
#include "log.h"

#include <stdlib.h>
#include <string.h>

int
im_listen_send(dbconn *c)
{
	return PQsendQuery(c->pg, "LISTEN im_sync_hint; LISTEN im_sync_device");
}

void
im_listen_ready(void)
{
	im_db_stats_g.listen_ready = 1;
	im_log("info", "event=listen_ready");
	im_db_post_done(im_job_new(IM_JOB_LISTEN_UP, 0));
}

void
im_listen_drain(dbconn *c)
{
	PGnotify   *n;

	while ((n = PQnotifies(c->pg)) != NULL)
	{
		im_job	   *j = im_job_new(IM_JOB_NOTIFY, 0);

		j->channel = strdup(n->relname);
		j->payload = strdup(n->extra);
		PQfreemem(n);
		im_db_post_done(j);
	}
}
