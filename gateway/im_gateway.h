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

#endif
