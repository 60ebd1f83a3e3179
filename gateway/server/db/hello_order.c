/*
 * hello_order.c — one hello of a device at a time (see hello_order.h).
 *
 * The key a hello holds is decided when it starts (im_job.order_key) and
 * released with that same key; a token enters the verified table only on
 * the database's word, so a claim read from an unverified token never
 * decides whom a hello waits for.  The verified table is direct-mapped
 * (65,536 keys): a token pushed out is ordered by itself again until its
 * next accepted hello, which loses order across tokens, never correctness.
 *
 * A hello holds its device from the moment the database thread takes it
 * off the queue until its transaction is over: the statement failed, the
 * COMMIT answered, the ROLLBACK was sent after a refusal or a closed
 * socket, or its connection was lost.  A batch rolled back for another
 * hello's refusal keeps the holds of the hellos it runs again, so nothing
 * of their device overtakes them.  Holds are counted in a table indexed by
 * the key's low bits: two devices sharing a slot only wait for each other
 * (order, never correctness; at most 64 x 32 hellos run at once against
 * 65,536 slots).
 */
#include "server/db/hello_order.h"
#include "server/db/db.h"

#include <libwebsockets.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <stdlib.h>
#include <string.h>

/* the token's claims as extension/user/token.c writes them (one definition,
 * read here only by its names) */
#include "im_sync/token_layout.h"
#include "common/table_hash.h"

#define SLOTS (1 << 16)

static uint16_t held[SLOTS];	/* running hellos per slot */
static uint64_t verified[SLOTS];	/* token keys the database accepted */
static unsigned char token_hmac_key[32];
static int	token_hmac_ready;

uint64_t
im_hello_device_key(const char *token)
{
	char		raw[IM_TOKEN_MAX_BYTES + 4];
	size_t		len = token ? strlen(token) : 0;
	uint64_t	h;
	int			n,
				devlen;

	if (len == 0 || len > (IM_TOKEN_MAX_BYTES + 2) / 3 * 4)
		return 0;
	n = lws_b64_decode_string_len(token, (int) len, raw, sizeof(raw));
	if (n <= IM_TOKEN_DEVLEN_AT)
		return 0;
	devlen = (unsigned char) raw[IM_TOKEN_DEVLEN_AT];
	if (devlen < 1 || devlen > IM_TOKEN_DEVICE_MAX || n < IM_TOKEN_CLAIMS_FIXED + devlen)
		return 0;
	h = im_fnv1a_bytes(raw + IM_TOKEN_USER_ID_AT, IM_TOKEN_USER_ID_LEN, IM_FNV_OFFSET);
	/* devlen, device_id */
	h = im_fnv1a_bytes(raw + IM_TOKEN_DEVLEN_AT, IM_TOKEN_CLAIMS_FIXED + devlen - IM_TOKEN_DEVLEN_AT, h);
	return h ? h : 1;
}

uint64_t
im_hello_token_key(const char *token)
{
	unsigned char md[EVP_MAX_MD_SIZE];
	unsigned int mdlen = 0;
	uint64_t	k = 0;
	int			i;

	if (!token || !*token)
		return 0;
	if (!token_hmac_ready)
	{
		if (RAND_bytes(token_hmac_key, sizeof(token_hmac_key)) != 1)
			abort();
		token_hmac_ready = 1;
	}
	if (!HMAC(EVP_sha256(), token_hmac_key, sizeof(token_hmac_key),
			  (const unsigned char *) token, strlen(token), md, &mdlen) || mdlen < 8)
		abort();
	for (i = 0; i < 8; i++)
		k = k << 8 | md[i];
	return k ? k : 1;
}

/* The key j is ordered by now: its device once its token was accepted. */
static uint64_t
order_key(const im_job *j)
{
	if (j->device_held)
		return j->order_key;
	if (j->device_key && j->token_key && verified[j->token_key % SLOTS] == j->token_key)
		return j->device_key;
	return j->token_key;
}

int
im_hello_order_blocked(im_job *j)
{
	uint64_t	k = order_key(j);

	return j->kind == IM_JOB_AUTH && k && !j->device_held && held[k % SLOTS] > 0;
}

void
im_hello_order_hold(im_job *j)
{
	uint64_t	k = order_key(j);

	if (j->kind != IM_JOB_AUTH || !k || j->device_held)
		return;
	j->device_held = 1;
	j->order_key = k;
	held[k % SLOTS]++;
}

void
im_hello_order_release(im_job *j)
{
	if (!j->device_held)
		return;
	j->device_held = 0;
	held[j->order_key % SLOTS]--;
}

void
im_hello_order_verified(im_job *j)
{
	if (j->kind == IM_JOB_AUTH && j->token_key)
		verified[j->token_key % SLOTS] = j->token_key;
}
