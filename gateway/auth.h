/*
 * auth.h — who a session is and whether it may stay: the hello (im.authenticate
 * in a transaction held until the identity's limits are checked), the
 * welcome, refusals, and im.device_session re-checks after notifications.
 */
#ifndef IM_GW_AUTH_H
#define IM_GW_AUTH_H

#include <jansson.h>

struct session;
struct im_job;

/* A refusal: RATE_LIMITED with retry_after_ms, then close 4029. */
extern void im_refuse(struct session *s, json_t *id, long retry_ms, const char *why);

/* The session's hello is no longer in flight (answered or abandoned). */
extern void im_hello_done(struct session *s);

/*
 * A hello job's answer (first with the transaction open, then the COMMIT's).
 * Returns 1 when the job went back to the database thread (not to be freed).
 */
extern int	im_on_auth_job(struct session *s, struct im_job *j);

/*
 * Asks im.device_session whether the session's device is still current;
 * hint: also send a NEW_EVENTS hint afterwards.  At most one in flight and
 * one pending per session.
 */
extern void im_request_recheck(struct session *s, int hint);
extern void im_on_recheck_job(struct session *s, struct im_job *j);

#endif
