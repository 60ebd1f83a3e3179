/*
 * accept.h — how many accepted connections are inside libwebsockets' HTTP
 * handshake at once.  lws 4.1 puts every accepted socket's handshake
 * timeout into one deadline-sorted list, inserting each new one by walking
 * the list from its head (twice per accept): with 10,000 connections
 * arriving at once that walk was 75 % of the gateway's CPU in a reconnect
 * storm's first seconds.  So at most IM_MAX_HANDSHAKES sockets are handed to
 * lws at a time; the others wait as plain descriptors, in arrival order,
 * and are handed over as handshakes finish (and IM_ACCEPT_STEP every
 * IM_ACCEPT_STEP_US regardless, so stalled handshakes only slow them).
 * Waiting is bounded three ways: per peer address (--max-unauth-per-ip
 * connections waiting or in the handshake), by --max-connections (sessions,
 * handshakes and waiting ones together) and in time (IM_ACCEPT_MAX_WAIT_US);
 * a connection past a bound is closed, before any HTTP.
 */
#ifndef IM_GW_ACCEPT_H
#define IM_GW_ACCEPT_H

struct lws;

#define IM_MAX_HANDSHAKES 256
/* handed over even without room: a stalled handshake cannot hold others back */
#define IM_ACCEPT_STEP 64
#define IM_ACCEPT_STEP_US 50000
/* a connection waiting longer than this is closed (lws' own handshake
 * timeouts take over once it is handed over) */
#define IM_ACCEPT_MAX_WAIT_US 5000000

/*
 * LWS_CALLBACK_FILTER_NETWORK_CONNECTION on the listen socket (listen_wsi)
 * for the accepted descriptor fd.  Returns 1 when the connection was kept
 * back (lws then closes fd, a duplicate of which waits here) or refused
 * (over a bound: lws closes fd, nothing waits), 0 when lws may take it now.
 */
extern int	im_accept_filter(struct lws *listen_wsi, int fd);

/* LWS_CALLBACK_SERVER_NEW_CLIENT_INSTANTIATED: a handshake begins. */
extern void im_accept_handshake_begins(struct lws *wsi);

/*
 * The handshake is over (upgraded, a plain HTTP request, or closed before
 * either): room for a waiting connection.  Safe to call more than once.
 */
extern void im_accept_handshake_over(struct lws *wsi);

/* Connections waiting to be handed to lws, and handshakes in lws (tests, logs). */
extern int	im_accept_waiting(void);
extern int	im_accept_handshakes(void);

#endif
