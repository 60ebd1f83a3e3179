/*
 * admission.c — connection admission that needs no database (contract §10):
 * per-address counts of unauthenticated sockets, the Origin rule, loopback.
 *
 * The per-address table is bounded by the sockets themselves: an entry
 * exists only while it counts at least one open unauthenticated socket.
 */
#include "admission.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define NIP 4096
static ip_count *ip_table[NIP];

static unsigned
ip_hash(const char *s)
{
	uint64_t	h = 1469598103934665603ULL;

	for (; *s; s++)
		h = (h ^ (unsigned char) *s) * 1099511628211ULL;
	return (unsigned) (h % NIP);
}

int
im_unauth_count(const char *ip)
{
	ip_count   *c;

	for (c = ip_table[ip_hash(ip)]; c; c = c->next)
		if (strcmp(c->ip, ip) == 0)
			return c->count;
	return 0;
}

ip_count *
im_unauth_take(const char *ip)
{
	unsigned	h = ip_hash(ip);
	ip_count   *c;

	for (c = ip_table[h]; c; c = c->next)
		if (strcmp(c->ip, ip) == 0)
			break;
	if (!c)
	{
		c = calloc(1, sizeof(ip_count));
		if (!c)
			abort();
		snprintf(c->ip, sizeof(c->ip), "%s", ip);
		c->next = ip_table[h];
		ip_table[h] = c;
	}
	c->count++;
	return c;
}

void
im_unauth_release(ip_count *c)
{
	ip_count  **pp;

	if (!c || --c->count > 0)
		return;
	for (pp = &ip_table[ip_hash(c->ip)]; *pp; pp = &(*pp)->next)
		if (*pp == c)
		{
			*pp = c->next;
			break;
		}
	free(c);
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
