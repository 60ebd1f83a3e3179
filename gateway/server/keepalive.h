/*
 * keepalive.h — the per-session deadlines of the one-second tick (hello
 * timeout, keepalive ping, idle close, re-checks that found no database) in
 * a timing wheel, so a tick touches only the sessions with something due,
 * never every session (100,000 idle sessions cost nothing per tick but the
 * pings that are due).
 */
#ifndef IM_GW_KEEPALIVE_H
#define IM_GW_KEEPALIVE_H

struct session;

/* A new WebSocket session enters the wheel (its hello timeout). */
extern void im_keepalive_add(struct session *s);
/* The session leaves the wheel (unregister); no-op when it is not in it. */
extern void im_keepalive_remove(struct session *s);
/* Something became due before the session's slot (a re-check to retry). */
extern void im_keepalive_soon(struct session *s);
/* Once a second: the checks of every session whose deadline has come. */
extern void im_keepalive_tick(double now);

#endif
