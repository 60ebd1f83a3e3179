/*
 * token.c — HMAC-SHA256 signed tokens and the key ring (contract §5, §8, §12).
 *
 * A token is base64url(claims || key_id || HMAC-SHA256(key, claims || key_id)).
 * The claims are a fixed big-endian layout (see put/get below) followed by the
 * device id, so every field a token binds is covered by the MAC.  Keys live in
 * im.token_key, readable only by the extension owner; the newest key signs,
 * every stored key verifies, so rotate_token_key keeps older tokens valid
 * until they expire.  Crypto is PostgreSQL's common/hmac.h; nothing home-made
 * except the constant-time comparison of the MAC.
 *
 * Invariant protected: a token is accepted only if it was produced by this
 * server with a stored key and not a single bit of it was changed.  The
 * base64url text must be the canonical encoding of its bytes, so no two
 * strings are the same token (flipping any character always fails).
 */
#include "im_sync.h"

#include "catalog/pg_type.h"
#include "common/base64.h"
#include "common/hmac.h"
#include "common/sha2.h"
#include "utils/builtins.h"

#define IM_KEY_LEN		32
#define IM_MAC_LEN		PG_SHA256_DIGEST_LENGTH
/* purpose(1) + 3 x int32 + 8 x int64 + device id length(1) */
#define IM_CLAIMS_FIXED (1 + 4 * 3 + 8 * 8 + 1)
#define IM_TOKEN_MAX_BYTES (IM_CLAIMS_FIXED + 64 + IM_MAC_LEN)
#define IM_TOKEN_VERSION 1

static void
put64(uint8 **p, int64 v)
{
	uint64		u = (uint64) v;

	for (int i = 7; i >= 0; i--)
		*(*p)++ = (uint8) (u >> (i * 8));
}

static void
put32(uint8 **p, int32 v)
{
	uint32		u = (uint32) v;

	for (int i = 3; i >= 0; i--)
		*(*p)++ = (uint8) (u >> (i * 8));
}

static int64
get64(const uint8 **p)
{
	uint64		u = 0;

	for (int i = 0; i < 8; i++)
		u = (u << 8) | *(*p)++;
	return (int64) u;
}

static int32
get32(const uint8 **p)
{
	uint32		u = 0;

	for (int i = 0; i < 4; i++)
		u = (u << 8) | *(*p)++;
	return (int32) u;
}

/* Constant-time: the time taken never depends on where the MACs differ. */
static bool
mac_equal(const uint8 *a, const uint8 *b, size_t len)
{
	uint8		acc = 0;

	for (size_t i = 0; i < len; i++)
		acc |= a[i] ^ b[i];
	return acc == 0;
}

static void
compute_mac(const uint8 *key, const uint8 *data, size_t len, uint8 *mac)
{
	pg_hmac_ctx *ctx = pg_hmac_create(PG_SHA256);

	if (ctx == NULL)
		elog(ERROR, "im_sync: out of memory creating HMAC context");
	if (pg_hmac_init(ctx, key, IM_KEY_LEN) < 0 ||
		pg_hmac_update(ctx, data, len) < 0 ||
		pg_hmac_final(ctx, mac, IM_MAC_LEN) < 0)
	{
		const char *err = pg_hmac_error(ctx);

		pg_hmac_free(ctx);
		elog(ERROR, "im_sync: HMAC-SHA256 failed: %s", err);
	}
	pg_hmac_free(ctx);
}

/*
 * Read key `key_id` (0: the newest) into key[]; returns its id, or 0 when no
 * such key exists.  Runs in its own SPI level so callers may or may not be
 * connected already.
 */
static int32
load_key(int32 key_id, uint8 *key)
{
	static SPIPlanPtr newest;
	static SPIPlanPtr byid;
	Datum		args[1];
	int32		found = 0;

	im_spi_connect();
	if (key_id == 0)
	{
		im_prepare(&newest,
				   "SELECT key_id, secret FROM im.token_key "
				   "ORDER BY key_id DESC LIMIT 1", 0);
		im_exec(newest, NULL, NULL, 1);
	}
	else
	{
		im_prepare(&byid,
				   "SELECT key_id, secret FROM im.token_key "
				   "WHERE key_id OPERATOR(pg_catalog.=) $1", 1, INT4OID);
		args[0] = Int32GetDatum(key_id);
		im_exec(byid, args, NULL, 1);
	}
	if (SPI_processed == 1)
	{
		bool		isnull;
		bytea	   *secret;

		found = im_get_int32(0, 1, NULL);
		secret = DatumGetByteaPP(SPI_getbinval(SPI_tuptable->vals[0],
											   SPI_tuptable->tupdesc, 2, &isnull));
		if (isnull || VARSIZE_ANY_EXHDR(secret) != IM_KEY_LEN)
			elog(ERROR, "im_sync: token key %d is damaged", found);
		memcpy(key, VARDATA_ANY(secret), IM_KEY_LEN);
	}
	SPI_finish();
	return found;
}

/*
 * Insert a new key with id `key_id` (ON CONFLICT DO NOTHING: two first users
 * racing both end up reading the one that won).
 */
static void
insert_key(int32 key_id)
{
	static SPIPlanPtr ins;
	uint8		secret[IM_KEY_LEN];
	bytea	   *b;
	Datum		args[2];

	if (!pg_strong_random(secret, IM_KEY_LEN))
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("could not generate a random token key")));
	b = palloc(VARHDRSZ + IM_KEY_LEN);
	SET_VARSIZE(b, VARHDRSZ + IM_KEY_LEN);
	memcpy(VARDATA(b), secret, IM_KEY_LEN);
	explicit_bzero(secret, IM_KEY_LEN);

	im_spi_connect();
	im_prepare(&ins,
			   "INSERT INTO im.token_key (key_id, secret) VALUES ($1, $2) "
			   "ON CONFLICT (key_id) DO NOTHING", 2, INT4OID, BYTEAOID);
	args[0] = Int32GetDatum(key_id);
	args[1] = PointerGetDatum(b);
	im_exec(ins, args, NULL, 0);
	SPI_finish();
	pfree(b);
}

/* rotate_token_key support: add key max+1 and return its id. */
static int32
rotate_key(void)
{
	static SPIPlanPtr lock;
	static SPIPlanPtr maxid;
	int32		next;

	im_spi_connect();
	/* Serialize rotations so two of them never pick the same id. */
	im_prepare(&lock, "LOCK TABLE im.token_key IN SHARE ROW EXCLUSIVE MODE", 0);
	im_exec(lock, NULL, NULL, 0);
	im_prepare(&maxid,
			   "SELECT COALESCE(pg_catalog.max(key_id), 0) FROM im.token_key", 0);
	im_exec(maxid, NULL, NULL, 1);
	next = im_get_int32(0, 1, NULL) + 1;
	SPI_finish();
	insert_key(next);
	return next;
}

char *
im_token_sign(const ImTokenClaims *claims)
{
	uint8		key[IM_KEY_LEN];
	uint8		buf[IM_TOKEN_MAX_BYTES + 4];
	uint8	   *p = buf;
	size_t		devlen = strnlen(claims->device_id, 64);
	int32		key_id;
	int			enclen;
	char	   *out;

	key_id = load_key(0, key);
	if (key_id == 0)
	{
		/* First use: create key 1 (concurrency-safe), then read it back. */
		insert_key(1);
		key_id = load_key(0, key);
		if (key_id == 0)
			elog(ERROR, "im_sync: no token key after creating one");
	}

	*p++ = (uint8) claims->purpose;
	put32(&p, IM_TOKEN_VERSION);
	put32(&p, claims->registration);
	put32(&p, claims->sync_generation);
	put64(&p, claims->user_id);
	put64(&p, claims->resume_from);
	put64(&p, claims->watermark);
	put64(&p, claims->recovery_session_id);
	put64(&p, claims->position);
	put64(&p, claims->snapshot_id);
	put64(&p, claims->issued_at);
	put64(&p, claims->expires_at);
	*p++ = (uint8) devlen;
	memcpy(p, claims->device_id, devlen);
	p += devlen;
	put32(&p, key_id);
	compute_mac(key, buf, p - buf, p);
	p += IM_MAC_LEN;
	explicit_bzero(key, IM_KEY_LEN);

	enclen = pg_b64_enc_len(p - buf);
	out = palloc(enclen + 1);
	enclen = pg_b64_encode((const char *) buf, p - buf, out, enclen);
	if (enclen < 0)
		elog(ERROR, "im_sync: base64 encoding failed");
	/* base64url without padding: safe in JSON, URLs and headers */
	while (enclen > 0 && out[enclen - 1] == '=')
		enclen--;
	out[enclen] = '\0';
	for (int i = 0; i < enclen; i++)
	{
		if (out[i] == '+')
			out[i] = '-';
		else if (out[i] == '/')
			out[i] = '_';
	}
	return out;
}

bool
im_token_verify(const char *token, char purpose, ImTokenClaims *out)
{
	size_t		len;
	char	   *std;
	char	   *canon;
	uint8		buf[IM_TOKEN_MAX_BYTES + 4 + 3];
	int			n;
	const uint8 *p;
	uint8		key[IM_KEY_LEN];
	uint8		mac[IM_MAC_LEN];
	int32		key_id;
	size_t		devlen;
	int			enclen;
	bool		ok;

	memset(out, 0, sizeof(*out));
	if (token == NULL)
		return false;
	len = strlen(token);
	if (len < 4 || len > (size_t) pg_b64_enc_len(sizeof(buf) - 3))
		return false;

	/* base64url -> base64 with padding; only the url alphabet is accepted */
	std = palloc(len + 4);
	for (size_t i = 0; i < len; i++)
	{
		char		c = token[i];

		if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'))
			std[i] = c;
		else if (c == '-')
			std[i] = '+';
		else if (c == '_')
			std[i] = '/';
		else
			return false;
	}
	if (len % 4 == 1)
		return false;
	n = len;
	while (n % 4 != 0)
		std[n++] = '=';
	std[n] = '\0';
	n = pg_b64_decode(std, n, (char *) buf, sizeof(buf));
	if (n < IM_CLAIMS_FIXED + 4 + IM_MAC_LEN)
		return false;

	/* Canonical form only: unused low bits of the last character must be 0. */
	canon = palloc(pg_b64_enc_len(n) + 1);
	enclen = pg_b64_encode((const char *) buf, n, canon, pg_b64_enc_len(n));
	if (enclen < 0 || (size_t) enclen != strlen(std) || memcmp(canon, std, enclen) != 0)
		return false;

	p = buf;
	out->purpose = (char) *p++;
	if (get32(&p) != IM_TOKEN_VERSION)
		return false;
	out->registration = get32(&p);
	out->sync_generation = get32(&p);
	out->user_id = get64(&p);
	out->resume_from = get64(&p);
	out->watermark = get64(&p);
	out->recovery_session_id = get64(&p);
	out->position = get64(&p);
	out->snapshot_id = get64(&p);
	out->issued_at = get64(&p);
	out->expires_at = get64(&p);
	devlen = *p++;
	if (devlen < 1 || devlen > 64 ||
		n != (int) (IM_CLAIMS_FIXED + devlen + 4 + IM_MAC_LEN))
		return false;
	memcpy(out->device_id, p, devlen);
	out->device_id[devlen] = '\0';
	p += devlen;
	key_id = get32(&p);
	if (key_id <= 0 || load_key(key_id, key) != key_id)
		return false;
	compute_mac(key, buf, p - buf, mac);
	explicit_bzero(key, IM_KEY_LEN);
	ok = mac_equal(mac, p, IM_MAC_LEN);
	if (!ok || out->purpose != purpose)
	{
		memset(out, 0, sizeof(*out));
		return false;
	}
	return true;
}

PG_FUNCTION_INFO_V1(im_rotate_token_key);
/*
 * rotate_token_key: adds a new signing key; older keys keep verifying so
 * tokens already handed out stay valid until they expire.  If no key exists
 * yet the new key is key 1.
 */
Datum
im_rotate_token_key(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT32(rotate_key());
}
