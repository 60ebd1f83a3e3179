/*
 * config.h — the gateway's settings: one struct filled from the defaults,
 * the environment (IM_GATEWAY_LISTEN, IM_GATEWAY_DB) and the command line,
 * checked once at start and read-only afterwards.
 */
#ifndef IM_GW_CONFIG_H
#define IM_GW_CONFIG_H

#include <stddef.h>

#define IM_MAX_ALLOWED_ORIGINS 16

typedef struct im_config
{
	char		host[128];
	int			port;
	const char *db;
	size_t		max_frame;
	int			pool;
	double		rate;			/* frames per second per session */
	double		burst;
	int			max_conn_user;	/* concurrent sessions per account */
	double		hello_rate_device;	/* hellos per second per device (bucket) */
	double		hello_burst_device;
	double		hello_rate_user;
	double		hello_burst_user;
	int			max_pending_hello;	/* hellos in flight, gateway wide */
	int			max_waiting_hello;	/* hellos held behind them, gateway wide */
	int			hello_timeout;	/* seconds */
	int			members_ttl;	/* seconds a member list is cached */
	/* admission before any database work (contract §10) */
	int			max_connections;	/* WebSocket sessions, gateway wide */
	int			max_unauth_per_ip;	/* sessions without welcome, per peer address */
	/* transport */
	const char *tls_cert;
	const char *tls_key;
	int			insecure;		/* allow a non-loopback --listen without TLS */
	const char *allowed_origins[IM_MAX_ALLOWED_ORIGINS];
	int			n_allowed_origins;
	int			ping_interval;	/* seconds of silence before a ping */
	int			idle_timeout;	/* seconds of silence before close 1001 */
	int			statement_timeout_ms;	/* on every pool connection, 0: none */
	size_t		max_queue;		/* bytes of replies queued per session */
	const char *log_key;		/* file with the key of logged id hashes */
	const char *web_root;		/* folder served at /web/ (NULL: web/ next to the binary) */
} im_config;

extern im_config im_cfg;

/*
 * Fills im_cfg from the environment and argv and checks it.  Returns -1 when
 * the gateway should start, else the exit status (0 after --help, 2 for a bad
 * option or limit, with the reason on stderr).
 */
extern int	im_config_load(int argc, char **argv);

#endif
