/*
 * presence_report.h — the gateway tells im_sync which devices are connected
 * (contract §13), so fanout does not push to them: im.set_presence in
 * the hello's transaction (online, frame.c) and at close (offline),
 * im.refresh_presence for all its
 * sessions, a few calls of up to IM_PRESENCE_CHUNK sessions, every
 * IM_PRESENCE_REFRESH_S seconds (a third of the ttl: two refreshes may be
 * lost before a live session looks offline).  A gateway that dies leaves
 * presences that expire after the ttl.
 */
#ifndef IM_GW_PRESENCE_REPORT_H
#define IM_GW_PRESENCE_REPORT_H

#include "server/session.h"

#define IM_PRESENCE_TTL_S 90
#define IM_PRESENCE_REFRESH_S 30
#define IM_PRESENCE_CHUNK 2000

/* an authenticated session is going away */
extern void im_presence_offline(session *s);
/* from the one-second tick: renews every session's presence when due */
extern void im_presence_tick(double now);

#endif
