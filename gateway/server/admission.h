/*
 * admission.h — the limits a connection meets (contract §10-§11.3), all
 * decided without the database: unauthenticated sessions and connections
 * before their upgrade per peer address,
 * the Origin check of a WebSocket upgrade, whether a listen address is
 * loopback (plain ws:// is only served there unless --insecure), the token
 * buckets (frames per session, reconnects per device and per account) and
 * the pacing of hellos in flight.  No lws or libpq here.
 */
#ifndef IM_GW_ADMISSION_H
#define IM_GW_ADMISSION_H

#include <stdint.h>

/* Sockets of one peer address in one of the tables below. */
typedef struct ip_count
{
	struct ip_count *next;
	struct ip_count **table;	/* the table it is in */
	int			count;
	char		ip[48];
} ip_count;

/* Current count for ip (0 when none). */
extern int	im_unauth_count(const char *ip);
/* Counts one more socket of ip; the handle is given back to im_unauth_release. */
extern ip_count *im_unauth_take(const char *ip);
extern void im_unauth_release(ip_count *c);

/*
 * Accepted connections of one peer address that have not finished their
 * upgrade: waiting for a handshake place or inside lws' handshake
 * (accept.c).  Capped by --max-unauth-per-ip as well, at accept.
 */
extern int	im_preupgrade_count(const char *ip);
extern ip_count *im_preupgrade_take(const char *ip);
extern void im_preupgrade_release(ip_count *c);

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
 * Hellos gateway-wide: at most --max-pending-hello in flight to the
 * database, and behind them at most --max-waiting-hello held on their own
 * connections in arrival order (auth.c keeps the queue).  A hello that finds
 * the database's share full waits instead of being refused, so the pool runs
 * at its full rate during a reconnect storm and no client reconnects only to
 * be told to wait; only a hello that finds the waiting queue full, or that
 * waited --hello-timeout, is refused.
 *
 * im_hello_admit counts the hello in flight (IM_HELLO_SEND) or waiting
 * (IM_HELLO_WAIT), or counts nothing (IM_HELLO_REFUSE).  im_hello_start_one
 * moves one waiting hello into flight when there is room (1) or not (0).
 * im_hello_unwait: a waiting hello left without starting (its socket
 * closed, its wait ran out).  im_hello_release ends one in flight
 * (answered: it counts towards the rate).  im_hello_retry_ms is the wait
 * handed to a refused hello: the next free slot at the measured hello rate
 * behind the hellos in flight (and the waiting ones when the queue was
 * full: behind_waiting), so refused clients come back spread out instead
 * of as one herd.  im_hello_tick runs once a second.
 */
typedef enum im_hello_verdict
{
	IM_HELLO_SEND, IM_HELLO_WAIT, IM_HELLO_REFUSE
} im_hello_verdict;
extern im_hello_verdict im_hello_admit(void);
extern int	im_hello_start_one(void);
extern void im_hello_unwait(void);
extern void im_hello_release(int answered);
extern long im_hello_retry_ms(int behind_waiting);
extern void im_hello_tick(void);
/* Hellos in flight and waiting now (for /metrics). */
extern int	im_hellos_in_flight(void);
extern int	im_hellos_waiting(void);

#endif
