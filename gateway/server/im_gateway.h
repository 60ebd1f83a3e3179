/*
 * im_gateway.h — the gateway's lifecycle as the other modules see it.
 */
#ifndef IM_GW_IM_GATEWAY_H
#define IM_GW_IM_GATEWAY_H

/*
 * Set once SIGTERM/SIGINT was seen: no new sessions or frames are taken,
 * requests in flight are answered, then every session is closed 1001.
 */
extern int	im_draining;

/*
 * Called after each batch of wake-ups and each tick: starts the drain after
 * SIGTERM/SIGINT and ends the event loop once it is done.
 */
extern void im_gateway_poll_state(void);

#endif
