/*
 * log_hash.c — see log_hash.h.
 */
#include "common/log_hash.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#define MIN_KEY 16
#define MAX_KEY 4096

static unsigned char g_key[MAX_KEY];
static size_t g_keylen;

int
im_log_key_load(const char *path, char *err, size_t errlen)
{
	FILE	   *f = fopen(path, "rb");
	size_t		n;

	if (!f)
	{
		snprintf(err, errlen, "cannot open %s", path);
		return -1;
	}
	n = fread(g_key, 1, sizeof(g_key), f);
	if (!feof(f))
	{
		fclose(f);
		snprintf(err, errlen, "%s: longer than %d bytes", path, MAX_KEY - 1);
		return -1;
	}
	fclose(f);
	if (n > 0 && g_key[n - 1] == '\n')
		n--;
	if (n > 0 && g_key[n - 1] == '\r')
		n--;
	if (n < MIN_KEY)
	{
		snprintf(err, errlen, "%s: a log key needs at least %d bytes", path, MIN_KEY);
		return -1;
	}
	g_keylen = n;
	return 0;
}

int
im_log_key_random(void)
{
	g_keylen = 32;
	return RAND_bytes(g_key, (int) g_keylen) == 1 ? 0 : -1;
}

static const char *
hash_text(const char *msg, char out[IM_LOG_HASH_BUF])
{
	unsigned char md[EVP_MAX_MD_SIZE];
	unsigned int mdlen = 0;
	int			i;

	if (!HMAC(EVP_sha256(), g_key, (int) g_keylen, (const unsigned char *) msg,
			  strlen(msg), md, &mdlen) || mdlen < 8)
	{
		snprintf(out, IM_LOG_HASH_BUF, "h:?");
		return out;
	}
	out[0] = 'h';
	out[1] = ':';
	for (i = 0; i < 8; i++)
		snprintf(out + 2 + 2 * i, 3, "%02x", md[i]);
	return out;
}

const char *
im_hash_user(int64_t user_id, char out[IM_LOG_HASH_BUF])
{
	char		msg[32];

	snprintf(msg, sizeof(msg), "u:%" PRId64, user_id);
	return hash_text(msg, out);
}

const char *
im_hash_device(int64_t user_id, const char *device_id, char out[IM_LOG_HASH_BUF])
{
	char		msg[128];

	snprintf(msg, sizeof(msg), "d:%" PRId64 ":%s", user_id, device_id);
	return hash_text(msg, out);
}

const char *
im_hash_push_target(int64_t push_target_id, char out[IM_LOG_HASH_BUF])
{
	char		msg[32];

	snprintf(msg, sizeof(msg), "t:%" PRId64, push_target_id);
	return hash_text(msg, out);
}
