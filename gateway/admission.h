/*
 * admission.h — the limits a connection meets (contract §10-§11.3), all
 * decided without the database: unauthenticated sockets per peer address,
 * the Origin check of a WebSocket upgrade, whether a listen address is
 * loopback (plain ws:// is only served there unless --insecure), the token
 * buckets (frames per session, reconnects per device and per account) and
 * the pacing of hellos in flight.  No lws or libpq here.
 */
#ifndef IM_GW_ADMISSION_H
#define IM_GW_ADMISSION_H

#include <stdint.h>

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

/*
 * A token bucket: tokens refill at rate per second up to burst.  Takes one
 * token at time now; returns 0 when there was one, else the milliseconds
 * until there is (nothing taken).
 */
typedef struct im_bucket
{
	double		tokens;
	double		t;				/* last refill */
} im_bucket;
extern long im_bucket_take(im_bucket *b, double rate, double burst, double now);

/*
 * Reconnect rate of a device and of its account (--hello-rate-device,
 * --hello-rate-user): 0 when this hello may proceed, else milliseconds to
 * wait.  Called once per authenticated hello.
 */
extern long im_reconnect_wait(int64_t user_id, const char *device_id);

/*
 * Hellos in flight gateway-wide (--max-pending-hello).  im_hello_admit
 * counts one more and returns 0, or returns the milliseconds the refused
 * client should wait: the next free slot at the measured hello rate, so
 * refused clients come back spread out instead of as one herd.
 * im_hello_release ends one (answered: it counts towards the rate);
 * im_hello_tick runs once a second.
 */
extern long im_hello_admit(void);
extern void im_hello_release(int answered);
extern void im_hello_tick(void);

#endif
