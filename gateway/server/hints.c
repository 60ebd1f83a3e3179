/*
 * hints.c — from notifications to hint frames (contract §4, §10).
 *
 * im_sync_hint carries "user:hw" (NEW_EVENTS for that user's sessions) and
 * "c<conv>:<head>" (a shared_log conversation advanced: hinted to its
 * members connected here).  The gateway role cannot list a conversation's
 * members, so it asks im.members_among which of its connected users are
 * members and caches the answer for --members-ttl seconds, one lookup in
 * flight per slot.  im_sync_device never closes a session by itself (any
 * role can NOTIFY): it only triggers a device re-check.
 *
 * Hints may be lost (a full slot, too many pending): clients catch up from
 * sync and conversation_list, which is why losing one is allowed here.
 */
#include "server/hints.h"
#include "server/auth.h"
#include "server/config.h"
#include "server/db/db.h"
#include "server/frame.h"
#include "common/log.h"
#include "server/gateway_metrics.h"
#include "server/session.h"
#include "common/table_hash.h"

#include <libwebsockets.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CONV_HINTS 8

void
im_push_hint(session *s, int64_t hw)
{
	if (!s->authed || s->close_code)
		return;
	if (s->hint_hw >= 0)
	{
		im_stats.hints_coalesced++;
		if (hw > s->hint_hw)
			s->hint_hw = hw;
		return;
	}
	s->hint_hw = hw;
	lws_callback_on_writable(s->wsi);
}

static void
push_conv_hint(session *s, int64_t conv, int64_t head)
{
	int			i;

	if (!s->authed || s->close_code)
		return;
	for (i = 0; i < s->nchints; i++)
		if (s->chints[i].conv == conv)
		{
			im_stats.hints_coalesced++;
			if (head > s->chints[i].head)
				s->chints[i].head = head;
			return;
		}
	if (!s->chints)
	{
		s->chints = calloc(MAX_CONV_HINTS, sizeof(conv_hint));
		if (!s->chints)
			abort();
	}
	if (s->nchints == MAX_CONV_HINTS)
	{
		/* hints may be lost: conversation_list's head_msg_seq catches up */
		im_stats.hints_dropped++;
		memmove(s->chints, s->chints + 1, sizeof(conv_hint) * (MAX_CONV_HINTS - 1));
		s->nchints--;
	}
	s->chints[s->nchints].conv = conv;
	s->chints[s->nchints].head = head;
	s->nchints++;
	lws_callback_on_writable(s->wsi);
}

/* ---- shared_log member cache ---- */

#define NMEMBERS 256
typedef struct
{
	int64_t		conv;
	int64_t	   *users;
	int			nusers;
	double		fetched;
	int			inflight;
	int64_t		pending_head;	/* -1: none */
} members_slot;
static members_slot members[NMEMBERS];

static members_slot *
members_slot_of(int64_t conv)
{
	return &members[im_mix64((uint64_t) conv) % NMEMBERS];
}

static void
deliver_conv_hint(members_slot *ms, int64_t head)
{
	int			i;

	for (i = 0; i < ms->nusers; i++)
	{
		session    *s;

		for (s = im_user_chain(ms->users[i]); s; s = s->user_next)
			if (s->user_id == ms->users[i])
				push_conv_hint(s, ms->conv, head);
	}
}

/* "{u1,u2,…}": the users with an authenticated session here (malloc'd). */
static char *
connected_users_array(void)
{
	size_t		cap = 64,
				len = 0;
	char	   *b = malloc(cap);
	session    *s;

	if (!b)
		abort();
	b[len++] = '{';
	for (s = im_all_sessions; s; s = s->all_next)
	{
		if (!s->authed || s->close_code)
			continue;
		if (len + 24 > cap)
		{
			cap *= 2;
			b = realloc(b, cap);
			if (!b)
				abort();
		}
		len += (size_t) snprintf(b + len, cap - len, "%s%" PRId64, len > 1 ? "," : "", s->user_id);
	}
	b[len++] = '}';
	b[len] = '\0';
	return b;
}

static void
conv_hint_cb(void *arg, int64_t conv, int64_t head)
{
	members_slot *ms = members_slot_of(conv);
	im_job	   *j;

	(void) arg;
	if (ms->conv == conv && !ms->inflight && im_now() - ms->fetched < im_cfg.members_ttl)
	{
		deliver_conv_hint(ms, head);
		return;
	}
	if (ms->conv == conv && ms->inflight)
	{
		if (head > ms->pending_head)
			ms->pending_head = head;
		return;
	}
	if (ms->inflight)
		return;					/* slot busy for another conversation: hint lost */
	free(ms->users);
	ms->users = NULL;
	ms->nusers = 0;
	ms->conv = conv;
	ms->inflight = 1;
	ms->pending_head = head;
	j = im_job_new(IM_JOB_MEMBERS, 0);
	j->key = conv;
	/*
	 * Only which of this gateway's connected users are active members
	 * (least privilege): the gateway role cannot list a conversation's
	 * members.
	 */
	j->sql = "SELECT u FROM im.members_among($1::bigint, $2::bigint[]) u";
	j->nparams = 2;
	j->params[0] = im_int64_text(conv);
	j->params[1] = connected_users_array();
	im_db_submit(j);
}

void
im_on_members_job(im_job *j)
{
	members_slot *ms = members_slot_of(j->key);
	int			i;

	if (ms->conv != j->key)
		return;
	ms->inflight = 0;
	if (j->status != IM_JOB_OK)
	{
		ms->fetched = 0;
		im_log("warn", "event=members_lookup_failed conv=%" PRId64 " sqlstate=%s", j->key,
			   j->status == IM_JOB_SQL_ERROR ? j->sqlstate : "-");
		return;
	}
	ms->nusers = PQntuples(j->res);
	ms->users = calloc((size_t) ms->nusers + 1, sizeof(int64_t));
	if (!ms->users)
		abort();
	for (i = 0; i < ms->nusers; i++)
		ms->users[i] = strtoll(PQgetvalue(j->res, i, 0), NULL, 10);
	ms->fetched = im_now();
	if (ms->pending_head >= 0)
		deliver_conv_hint(ms, ms->pending_head);
	ms->pending_head = -1;
}

/* ---- notifications ---- */

static void
user_hint_cb(void *arg, int64_t user, int64_t hw)
{
	session    *s;

	(void) arg;
	for (s = im_user_chain(user); s; s = s->user_next)
		if (s->user_id == user)
			im_push_hint(s, hw);
}

static void
on_device_event(const char *payload)
{
	im_device_event ev;
	session    *s;

	if (im_parse_device_event(payload, &ev) != 0)
	{
		im_log("warn", "event=bad_device_payload");
		return;
	}
	for (s = im_user_chain(ev.user_id); s; s = s->user_next)
	{
		if (s->user_id != ev.user_id || strcmp(s->device_id, ev.device_id) != 0)
			continue;
		/* a supersession is by a newer epoch; anything else is re-checked */
		if (ev.revoked || s->epoch < ev.epoch)
			im_request_recheck(s, 0);
	}
}

void
im_on_notify_job(im_job *j)
{
	im_stats.notifications++;
	if (strcmp(j->channel, "im_sync_hint") == 0)
	{
		if (im_parse_hint_payload(j->payload, user_hint_cb, conv_hint_cb, NULL) > 0)
			im_log("warn", "event=bad_hint_payload");
	}
	else if (strcmp(j->channel, "im_sync_device") == 0)
		on_device_event(j->payload);
}

void
im_on_listen_up(uint64_t buckets)
{
	session    *s;

	/*
	 * After a (re)LISTEN, notifications may have been missed: re-check every
	 * session whose user the connection carries (all on a single node; on a
	 * router, the users of the node that came back: their NOTIFYs come from
	 * it alone) and hint it, so revocations, supersessions and new events
	 * sent while we were deaf are not lost.
	 */
	for (s = im_all_sessions; s; s = s->all_next)
		if (buckets >> (uint64_t) (((s->user_id % 64) + 64) % 64) & 1)
			im_request_recheck(s, 1);
}
