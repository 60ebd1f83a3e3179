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

/*
 * A hello's job (built, not yet sent): sent now, held in the waiting queue
 * (--max-waiting-hello) or refused, as admission.c decides.
 */
extern void im_hello_submit(struct session *s, struct im_job *j);
/* The session's hello in flight was answered: the next waiting one starts. */
extern void im_hello_done(struct session *s);
/* The session is going away: its hello, in flight or waiting, gives up its place. */
extern void im_hello_abandon(struct session *s);
/*
 * A waiting hello's deadline (0: not waiting), and its refusal once it has
 * waited --hello-timeout (returns 1 when it refused).
 */
extern double im_hello_wait_deadline(const struct session *s);
extern int	im_hello_wait_expired(struct session *s, double now);

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
