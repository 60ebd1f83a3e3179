/*
 * admission.h — decisions the gateway takes on a connection before any
 * database work (contract §10): unauthenticated sockets per peer address,
 * the Origin check of a WebSocket upgrade, and whether a listen address is
 * loopback (plain ws:// is only served there unless --insecure).
 * No lws or libpq here.
 */
#ifndef IM_GW_ADMISSION_H
#define IM_GW_ADMISSION_H

/* Unauthenticated sockets of one peer address. */
typedef struct ip_count
{
	struct ip_count *next;
	int			count;
	char		ip[48];
} ip_count;

/* Current count for ip (0 when none). */
extern int	im_unauth_count(const char *ip);
/* Counts one more socket of ip; the handle is given back to im_unauth_release. */
extern ip_count *im_unauth_take(const char *ip);
extern void im_unauth_release(ip_count *c);

/*
 * Whether an upgrade with this Origin header (NULL: absent) may proceed:
 * absent is allowed (not a browser); with an allow-list the origin must be
 * listed (case-insensitive, trailing '/' ignored); without one its
 * host[:port] must equal the Host header (default ports 80/443 implied).
 */
extern int	im_origin_allowed(const char *origin, const char *host_header,
							  const char *const *allowed, int n_allowed);

/* 127.0.0.0/8, ::1 or "localhost". */
extern int	im_host_is_loopback(const char *host);

#endif
