/*
 * receive.h — frames in: the receive handler, the session's frame queue
 * and the requests it sends to the database, one at a time per session.
 */
#ifndef IM_GW_RECEIVE_H
#define IM_GW_RECEIVE_H

#include <stddef.h>

struct lws;
struct session;
struct im_job;

/* LWS_CALLBACK_RECEIVE: one fragment.  -1 tells lws to close. */
extern int	im_on_receive(struct lws *wsi, struct session *s, const void *in, size_t len);

/* Runs queued frames in order while no request of the session is in flight. */
extern void im_pump(struct session *s);

/* An API request's answer: the reply or an error frame, then the next frame. */
extern void im_on_api_job(struct session *s, struct im_job *j);

#endif
