/*
 * push_wipe.c — see push_wipe.h.
 */
#include "relay/push_wipe.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <curl/curl.h>
#include <jansson.h>
#include <openssl/crypto.h>

/* the block's size, kept in front of it; 16 bytes keep malloc's alignment */
#define WIPE_HEADER 16

void *
push_wipe_malloc(size_t n)
{
	unsigned char *p;

	if (n > SIZE_MAX - WIPE_HEADER)
		return NULL;
	p = malloc(WIPE_HEADER + n);
	if (!p)
		return NULL;
	memcpy(p, &n, sizeof(n));
	return p + WIPE_HEADER;
}

void
push_wipe_free(void *ptr)
{
	unsigned char *p;
	size_t		n;

	if (!ptr)
		return;
	p = (unsigned char *) ptr - WIPE_HEADER;
	memcpy(&n, p, sizeof(n));
	OPENSSL_cleanse(p, WIPE_HEADER + n);
	free(p);
}

void *
push_wipe_calloc(size_t count, size_t n)
{
	void	   *p;

	if (n != 0 && count > SIZE_MAX / n)
		return NULL;
	p = push_wipe_malloc(count * n);
	if (p)
		memset(p, 0, count * n);
	return p;
}

/*
 * Never grows in place: realloc would leave the old bytes behind when it
 * moves the block, so the contents move to a new block and the old one is
 * wiped.  A size of 0 frees and returns NULL (what OpenSSL expects).
 */
void *
push_wipe_realloc(void *ptr, size_t n)
{
	size_t		old;
	void	   *q;

	if (!ptr)
		return push_wipe_malloc(n);
	if (n == 0)
	{
		push_wipe_free(ptr);
		return NULL;
	}
	memcpy(&old, (unsigned char *) ptr - WIPE_HEADER, sizeof(old));
	q = push_wipe_malloc(n);
	if (!q)
		return NULL;
	memcpy(q, ptr, old < n ? old : n);
	push_wipe_free(ptr);
	return q;
}

char *
push_wipe_strdup(const char *s)
{
	size_t		n = strlen(s) + 1;
	char	   *p = push_wipe_malloc(n);

	if (p)
		memcpy(p, s, n);
	return p;
}

/* OpenSSL's signatures carry the caller's file and line */
static void *
ossl_malloc(size_t n, const char *file, int line)
{
	return push_wipe_malloc(n);
}

static void *
ossl_realloc(void *ptr, size_t n, const char *file, int line)
{
	return push_wipe_realloc(ptr, n);
}

static void
ossl_free(void *ptr, const char *file, int line)
{
	push_wipe_free(ptr);
}

int
push_wipe_install(char *err, size_t errlen)
{
	if (!CRYPTO_set_mem_functions(ossl_malloc, ossl_realloc, ossl_free))
	{
		snprintf(err, errlen, "OpenSSL allocated before the wiping allocator could be installed");
		return -1;
	}
	json_set_alloc_funcs(push_wipe_malloc, push_wipe_free);
	if (curl_global_init_mem(CURL_GLOBAL_DEFAULT, push_wipe_malloc, push_wipe_free, push_wipe_realloc,
							 push_wipe_strdup, push_wipe_calloc) != CURLE_OK)
	{
		snprintf(err, errlen, "libcurl did not initialise");
		return -1;
	}
	return 0;
}
