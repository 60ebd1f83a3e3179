/*
 * protocol.c — the protocol callback of "im-sync.v1": it only routes each
 * lws reason to its handler (receive.c, session.c's writer, http.c) and
 * hands finished database jobs to the module that asked for them.
 *
 * Jobs in flight carry a session id, never a pointer: a session may be gone
 * when its answer arrives, and then the answer is dropped (an open hello
 * transaction is rolled back first).
 */
#include "server/protocol.h"
#include "server/accept.h"
#include "server/admission.h"
#include "server/auth.h"
#include "server/db/db.h"
#include "server/hints.h"
#include "server/http.h"
#include "server/im_gateway.h"
#include "server/keepalive.h"
#include "server/gateway_metrics.h"
#include "server/receive.h"
#include "server/session.h"

/* lws per-session data: only the pointer to our own session (session.h). */
typedef struct pss
{
	session    *s;
} pss;

/* A finished job that belongs to a session (sid); s may be gone (NULL).
 * Returns 1 when the job went back to the database thread. */
static int
on_session_job(session *s, im_job *j)
{
	if ((!s || s->close_code) && j->txn_held && !j->txn_ended)
	{
		/* an open hello transaction of a gone session is rolled back; the
		 * job is the database thread's from here on */
		if (s)
			im_hello_done(s);
		im_db_end_txn(j, 0);
		return 1;
	}
	if (!s)
		return 0;				/* session gone: drop */
	if (j->kind == IM_JOB_HEALTH)
		im_on_health_job(s, j);
	else if (s->close_code)
	{
		im_hello_done(s);
		s->busy = 0;
	}
	else if (j->kind == IM_JOB_API)
		im_on_api_job(s, j);
	else if (j->kind == IM_JOB_AUTH)
		return im_on_auth_job(s, j);
	else if (j->kind == IM_JOB_RECHECK)
		im_on_recheck_job(s, j);
	return 0;
}

/* LWS_CALLBACK_EVENT_WAIT_CANCELLED: the database thread has answers. */
static void
on_db_results(void)
{
	lws_dll2_owner_t done = {0};
	struct lws_dll2 *d;

	im_db_take_done(&done);
	while ((d = lws_dll2_get_head(&done)))
	{
		im_job	   *j = lws_container_of(d, im_job, list);
		int			handed_back = 0;

		/* out of the list first: a job handed back is submitted again */
		lws_dll2_remove(d);

		switch (j->kind)
		{
			case IM_JOB_NOTIFY:
				im_on_notify_job(j);
				break;
			case IM_JOB_LISTEN_UP:
				im_on_listen_up((uint64_t) j->key);
				break;
			case IM_JOB_MEMBERS:
				im_on_members_job(j);
				break;
			case IM_JOB_METRICS:
				im_on_metrics_job(j);
				break;
			default:
				handed_back = on_session_job(j->sid ? im_session_find(j->sid) : NULL, j);
				break;
		}
		if (!handed_back)
			im_job_free(j);
	}
}

static int
on_established(struct lws *wsi, pss *p)
{
	char		ip[48];
	session    *s;

	if (im_draining)
		return -1;
	s = p->s = im_session_register(wsi, 0);
	im_stats.conns_current++;
	im_stats.conns_total++;
	lws_get_peer_simple(wsi, ip, sizeof(ip));
	s->unauth_ip = im_unauth_take(ip);
	im_keepalive_add(s);
	return 0;
}

static int
callback_im(struct lws *wsi, enum lws_callback_reasons reason,
			void *user, void *in, size_t len)
{
	pss		   *p = (pss *) user;
	session    *s = p ? p->s : NULL;

	switch (reason)
	{
		case LWS_CALLBACK_EVENT_WAIT_CANCELLED:
			on_db_results();
			im_gateway_poll_state();	/* a signal also wakes the loop this way */
			break;
		case LWS_CALLBACK_FILTER_NETWORK_CONNECTION:
			return im_accept_filter(wsi, (int) (lws_intptr_t) in);
		case LWS_CALLBACK_SERVER_NEW_CLIENT_INSTANTIATED:
			im_accept_handshake_begins(wsi);
			break;
		case LWS_CALLBACK_WSI_DESTROY:
			im_accept_handshake_over(wsi);
			break;
		case LWS_CALLBACK_HTTP_CONFIRM_UPGRADE:
			return im_admit_upgrade(wsi);
		case LWS_CALLBACK_ESTABLISHED:
			im_accept_handshake_over(wsi);
			return on_established(wsi, p);
		case LWS_CALLBACK_RECEIVE_PONG:
			if (s)
				s->t_heard = im_now();
			break;
		case LWS_CALLBACK_RECEIVE:
			return im_on_receive(wsi, s, in, len);
		case LWS_CALLBACK_SERVER_WRITEABLE:
			return s ? im_session_write(s) : 0;
		case LWS_CALLBACK_CLOSED:
			if (s)
			{
				im_stats.conns_current--;
				im_session_unregister(s);
				p->s = NULL;
				if (im_draining && im_stats.conns_current == 0)
					lws_cancel_service(lws_get_context(wsi));	/* drained: end the loop */
			}
			break;
		case LWS_CALLBACK_HTTP:
			im_accept_handshake_over(wsi);
			if (!s)
				s = p->s = im_session_register(wsi, 1);
			im_on_http(wsi, s, (const char *) in);
			break;
		case LWS_CALLBACK_HTTP_WRITEABLE:
			return im_on_http_writeable(wsi, s);
		case LWS_CALLBACK_HTTP_FILE_COMPLETION:
			/* a /web/ file sent; ready for the next keep-alive request */
			return lws_http_transaction_completed(wsi) ? -1 : 0;
		case LWS_CALLBACK_CLOSED_HTTP:
		case LWS_CALLBACK_HTTP_DROP_PROTOCOL:
			if (s && s->is_http)
			{
				im_session_unregister(s);
				p->s = NULL;
			}
			break;
		default:
			break;
	}
	return 0;
}

const struct lws_protocols im_protocols[] = {
	{
		.name = "im-sync.v1",
		.callback = callback_im,
		.per_session_data_size = sizeof(pss),
		/*
		 * lws allocates this much per connection for its whole life
		 * (rx_ubuf), idle or not: 4096 was most of an idle session's cost.
		 * A frame longer than this arrives in several RECEIVE callbacks,
		 * which receive.c joins; typical request frames fit in one.
		 */
		.rx_buffer_size = IM_RX_BUFFER_SIZE,
	},
	{.name = NULL}
};
