/*
 * admission.c — connection admission that needs no database (contract §10,
 * §11.3): per-address counts of unauthenticated sessions and of connections
 * before their upgrade, the Origin rule,
 * loopback, token buckets for frames and reconnects, hello pacing.
 *
 * Every table here is bounded: the two per-address tables by the sockets
 * themselves (an entry exists only while it counts at least one open
 * socket: an unauthenticated session, or a connection before its upgrade),
 * the reconnect buckets by a fixed slot count.
 */
#include "server/admission.h"
#include "server/config.h"
#include "server/db/db.h"
#include "common/table_hash.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define NIP 4096
static ip_count *ip_table[NIP];		/* sessions without welcome */
static ip_count *preup_table[NIP];	/* connections before their upgrade */

static unsigned
ip_hash(const char *s)
{
	return (unsigned) (im_fnv1a(s, IM_FNV_OFFSET) % NIP);
}

static int
count_in(ip_count **table, const char *ip)
{
	ip_count   *c;

	for (c = table[ip_hash(ip)]; c; c = c->next)
		if (strcmp(c->ip, ip) == 0)
			return c->count;
	return 0;
}

static ip_count *
take_in(ip_count **table, const char *ip)
{
	unsigned	h = ip_hash(ip);
	ip_count   *c;

	for (c = table[h]; c; c = c->next)
		if (strcmp(c->ip, ip) == 0)
			break;
	if (!c)
	{
		c = calloc(1, sizeof(ip_count));
		if (!c)
			abort();
		snprintf(c->ip, sizeof(c->ip), "%s", ip);
		c->table = table;
		c->next = table[h];
		table[h] = c;
	}
	c->count++;
	return c;
}

static void
release_in(ip_count *c)
{
	ip_count  **pp;

	if (!c || --c->count > 0)
		return;
	for (pp = &c->table[ip_hash(c->ip)]; *pp; pp = &(*pp)->next)
		if (*pp == c)
		{
			*pp = c->next;
			break;
		}
	free(c);
}

int
im_unauth_count(const char *ip)
{
	return count_in(ip_table, ip);
}

ip_count *
im_unauth_take(const char *ip)
{
	return take_in(ip_table, ip);
}

void
im_unauth_release(ip_count *c)
{
	release_in(c);
}

int
im_preupgrade_count(const char *ip)
{
	return count_in(preup_table, ip);
}

ip_count *
im_preupgrade_take(const char *ip)
{
	return take_in(preup_table, ip);
}

void
im_preupgrade_release(ip_count *c)
{
	release_in(c);
}

/* Lower-cased "host:port" of an authority, the port filled in from dflt. */
static void
authority_norm(const char *a, size_t len, const char *dflt, char *out, size_t outsz)
{
	size_t		i,
				o = 0;
	const char *colon = NULL;

	for (i = 0; i < len; i++)
		if (a[i] == ':')
			colon = a + i;
		else if (a[i] == ']')
			colon = NULL;		/* an IPv6 literal's colons are not the port's */
	for (i = 0; i < len && o + 1 < outsz; i++)
		out[o++] = (char) tolower((unsigned char) a[i]);
	if (!colon && o + strlen(dflt) + 1 < outsz)
	{
		out[o++] = ':';
		memcpy(out + o, dflt, strlen(dflt));
		o += strlen(dflt);
	}
	out[o] = '\0';
}

static size_t
trimmed_len(const char *s)
{
	size_t		n = strlen(s);

	while (n > 0 && s[n - 1] == '/')
		n--;
	return n;
}

int
im_origin_allowed(const char *origin, const char *host_header,
				  const char *const *allowed, int n_allowed)
{
	const char *auth;
	const char *dflt;
	char		o_norm[300],
				h_norm[300];
	int			i;

	if (!origin)
		return 1;
	if (n_allowed > 0)
	{
		size_t		n = trimmed_len(origin);

		for (i = 0; i < n_allowed; i++)
			if (trimmed_len(allowed[i]) == n && strncasecmp(allowed[i], origin, n) == 0)
				return 1;
		return 0;
	}
	/* same host: scheme://host[:port] against Host */
	if (!host_header || !*host_header)
		return 0;
	if (strncasecmp(origin, "http://", 7) == 0)
		auth = origin + 7, dflt = "80";
	else if (strncasecmp(origin, "https://", 8) == 0)
		auth = origin + 8, dflt = "443";
	else
		return 0;				/* "null" and other schemes are foreign */
	authority_norm(auth, trimmed_len(auth), dflt, o_norm, sizeof(o_norm));
	/* the Host header has no scheme: a missing port means the origin's default */
	authority_norm(host_header, strlen(host_header), dflt, h_norm, sizeof(h_norm));
	return strcmp(o_norm, h_norm) == 0;
}

int
im_host_is_loopback(const char *host)
{
	struct in_addr a4;
	struct in6_addr a6;

	if (strcasecmp(host, "localhost") == 0)
		return 1;
	if (inet_pton(AF_INET, host, &a4) == 1)
		return (ntohl(a4.s_addr) >> 24) == 127;
	if (inet_pton(AF_INET6, host, &a6) == 1)
		return memcmp(&a6, &in6addr_loopback, sizeof(a6)) == 0;
	return 0;
}

/* ---- token buckets ---- */

long
im_bucket_take(im_bucket *b, double rate, double burst, double now)
{
	b->tokens += (now - b->t) * rate;
	if (b->tokens > burst)
		b->tokens = burst;
	b->t = now;
	if (b->tokens < 1)
		return (long) ceil((1 - b->tokens) / rate * 1000);
	b->tokens -= 1;
	return 0;
}

/* Small direct-mapped buckets for reconnect rates; a collision only makes
 * the limit approximate, never unbounded memory. */
#define NRATE 65536
typedef struct
{
	uint64_t	key;
	im_bucket	b;
} rate_slot;
static rate_slot dev_rates[NRATE],
			user_rates[NRATE];

static long
take_rate(rate_slot *tab, uint64_t key, double rate, double burst)
{
	rate_slot  *r = &tab[im_mix64(key) & (NRATE - 1)];
	double		now = im_now();

	if (r->key != key || r->b.t == 0)
	{
		/* a new key (or a collision) starts with a full bucket */
		r->key = key;
		r->b.tokens = burst;
		r->b.t = now;
	}
	return im_bucket_take(&r->b, rate, burst, now);
}

long
im_reconnect_wait(int64_t user_id, const char *device_id)
{
	long		wait;

	wait = take_rate(dev_rates, im_fnv1a(device_id, (uint64_t) user_id * IM_FNV_OFFSET),
					 im_cfg.hello_rate_device, im_cfg.hello_burst_device);
	if (!wait)
		wait = take_rate(user_rates, (uint64_t) user_id,
						 im_cfg.hello_rate_user, im_cfg.hello_burst_user);
	return wait;
}

/* ---- hello pacing ---- */

/*
 * Hellos in flight and waiting, hellos answered per second (moving average
 * over the 1 s tick, from seconds with hellos in flight) and the time
 * handed to the last refused client.  While hellos wait, the ones in
 * flight keep the pool busy, so the rate measured then is the database's
 * (before the wait queue, refused clients were the only ones that came
 * back, and the rate measured was the rate they were told: it confirmed
 * itself at ~100/s).  Only a refusal's retry_after_ms uses the estimate;
 * no hello is refused because of it.
 */
static int	pending_hellos;
static int	waiting_hellos;
static long hellos_done;
static double hello_rate = 200;
static double hello_slot;

long
im_hello_retry_ms(int behind_waiting)
{
	double		now = im_now();
	double		rate = hello_rate < 20 ? 20 : hello_rate;
	double		ahead = (pending_hellos + (behind_waiting ? waiting_hellos : 0)) / rate;

	/*
	 * those in flight (and, for a full queue, those waiting) go first, then
	 * one slot per refused client.  A hello refused after waiting its
	 * timeout does not count the hellos still waiting: they queued in the
	 * same moments and meet the same deadline, and counting them left the
	 * database idle while a storm's refused half waited to come back.
	 */
	if (hello_slot < now + ahead)
		hello_slot = now + ahead;
	hello_slot += 1 / rate;
	if (hello_slot > now + 60)
		hello_slot = now + 60;
	return (long) ceil((hello_slot - now) * 1000);
}

im_hello_verdict
im_hello_admit(void)
{
	/* nobody overtakes a waiting hello */
	if (pending_hellos < im_cfg.max_pending_hello && waiting_hellos == 0)
	{
		pending_hellos++;
		return IM_HELLO_SEND;
	}
	if (waiting_hellos < im_cfg.max_waiting_hello)
	{
		waiting_hellos++;
		return IM_HELLO_WAIT;
	}
	return IM_HELLO_REFUSE;
}

int
im_hello_start_one(void)
{
	if (waiting_hellos == 0 || pending_hellos >= im_cfg.max_pending_hello)
		return 0;
	waiting_hellos--;
	pending_hellos++;
	return 1;
}

void
im_hello_unwait(void)
{
	waiting_hellos--;
}

void
im_hello_release(int answered)
{
	pending_hellos--;
	if (answered)
		hellos_done++;
}

void
im_hello_tick(void)
{
	/* only seconds with hellos in flight tell the rate */
	if (pending_hellos > 0 || hellos_done > 0)
		hello_rate = 0.5 * hello_rate + 0.5 * (double) hellos_done;
	hellos_done = 0;
}

int
im_hellos_in_flight(void)
{
	return pending_hellos;
}

int
im_hellos_waiting(void)
{
	return waiting_hellos;
}
