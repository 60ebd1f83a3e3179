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
 * server with a stored, unretired key and not a single bit of it was
 * changed.  The base64url text must be the canonical encoding of its bytes,
 * so no two strings are the same token (flipping any character always fails).
 *
 * Key life (contract §8): the newest key signs; rotation marks the previous
 * one superseded (it still verifies); retirement wipes a key's secret, so
 * every token it signed fails from that commit on and a later pg_dump
 * carries nothing usable.  Maintenance retires a superseded key only once
 * no token it signed can still be live: device tokens record their latest
 * expiry on the key that signed them; batch, cursor and snapshot tokens
 * live at most the largest of token_ttl, recovery_ttl and snapshot_ttl
 * after the key stopped signing.
 */
#include "core/im_sync.h"
#include "core/common.h"
#include "core/locks.h"
#include "core/im_sql.h"
#include "im_sync/token_layout.h"
#include "user/user.h"

#include "catalog/pg_type.h"
#include "common/base64.h"
#include "common/hmac.h"
#include "common/sha2.h"
#include "utils/builtins.h"

#define IM_KEY_LEN		32
#define IM_MAC_LEN		PG_SHA256_DIGEST_LENGTH
/* the claims layout and sizes (im_sync/token_layout.h; with key id and MAC:
 * IM_TOKEN_MAX_BYTES) are also read by the gateway's hello order */
#define IM_CLAIMS_FIXED IM_TOKEN_CLAIMS_FIXED
StaticAssertDecl(IM_MAC_LEN == IM_TOKEN_MAC_LEN, "token MAC length");
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

/* Row 0 of the last SPI result is (key_id, secret): copy the secret out. */
static int32
copy_key_from_spi(uint8 *key)
{
	bool		isnull;
	bytea	   *secret;
	int32		key_id = im_get_int32(0, 1, NULL);

	secret = DatumGetByteaPP(SPI_getbinval(SPI_tuptable->vals[0],
										   SPI_tuptable->tupdesc, 2, &isnull));
	if (isnull || VARSIZE_ANY_EXHDR(secret) != IM_KEY_LEN)
		elog(ERROR, "im_sync: token key %d is damaged", key_id);
	memcpy(key, VARDATA_ANY(secret), IM_KEY_LEN);
	return key_id;
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
		/* a retired key has no secret: its tokens fail like unknown ones */
		im_prepare(&byid,
				   "SELECT key_id, secret FROM im.token_key "
				   "WHERE key_id" EQ "$1 AND secret IS NOT NULL", 1, INT4OID);
		args[0] = Int32GetDatum(key_id);
		im_exec(byid, args, NULL, 1);
	}
	if (SPI_processed == 1)
		found = copy_key_from_spi(key);
	SPI_finish();
	return found;
}

/*
 * The signing key for a device token that expires at `expires`: the newest
 * key, whose device_tokens_expire is raised to cover this token in the same
 * statement (the row lock orders it with a concurrent retirement, which
 * re-reads the raised value).  The stored value is rounded up to the next
 * second, so issuers with the same ttl write (and queue on) the key row at
 * most once a second; when it already covers the token nothing is written,
 * and no retirement can pass a stored expiry that is still in the future.
 * Returns 0 when no key exists yet.
 */
static int32
load_device_signing_key(TimestampTz expires, uint8 *key)
{
	static SPIPlanPtr plan;
	Datum		args[1];
	int32		found = 0;

	im_spi_connect();
	im_prepare(&plan,
			   "WITH k AS (SELECT key_id, secret FROM im.token_key ORDER BY key_id DESC LIMIT 1), "
			   "u AS (UPDATE im.token_key t SET device_tokens_expire = "
			   "        pg_catalog.date_trunc('second', $1)" PLUS "'1 second'::pg_catalog.interval "
			   "      FROM k WHERE t.key_id" EQ "k.key_id AND t.secret IS NOT NULL "
			   "      AND (t.device_tokens_expire IS NULL OR t.device_tokens_expire" LT "$1) "
			   "      RETURNING 1) "
			   "SELECT key_id, secret FROM k", 1, TIMESTAMPTZOID);
	args[0] = TimestampTzGetDatum(expires);
	im_exec(plan, args, NULL, 0);
	if (SPI_processed == 1)
		found = copy_key_from_spi(key);
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

/*
 * Serialize rotations and retirements (so two never pick the same id and
 * "newest" means the same key to both).  Caller is connected to SPI.
 */
static void
lock_key_ring(void)
{
	static SPIPlanPtr lock;

	im_prepare(&lock, "LOCK TABLE im.token_key IN SHARE ROW EXCLUSIVE MODE", 0);
	im_exec(lock, NULL, NULL, 0);
}

/*
 * rotate_token_key support: add key max+1, mark the previous newest
 * superseded now (clock time, late in the transaction: it keeps signing
 * until this commits) and return the new id.
 */
static int32
rotate_key(void)
{
	static SPIPlanPtr maxid;
	static SPIPlanPtr supersede;
	int32		next;

	im_spi_connect();
	lock_key_ring();
	im_prepare(&maxid,
			   "SELECT COALESCE(pg_catalog.max(key_id), 0) FROM im.token_key", 0);
	im_exec(maxid, NULL, NULL, 1);
	next = im_get_int32(0, 1, NULL) + 1;
	im_prepare(&supersede,
			   "UPDATE im.token_key SET superseded_at = pg_catalog.clock_timestamp() "
			   "WHERE superseded_at IS NULL", 0);
	im_exec(supersede, NULL, NULL, 0);
	SPI_finish();
	insert_key(next);
	return next;
}

/*
 * The key that signs `claims` (device tokens raise their key's
 * device_tokens_expire, see load_device_signing_key): returns its id.
 */
static int32
signing_key(const ImTokenClaims *claims, uint8 *key)
{
	int32		key_id;

	key_id = claims->purpose == IM_TOKEN_DEVICE ?
		load_device_signing_key(claims->expires_at, key) : load_key(0, key);
	if (key_id == 0)
	{
		/* First use: create key 1 (concurrency-safe), then read it back. */
		insert_key(1);
		key_id = claims->purpose == IM_TOKEN_DEVICE ?
			load_device_signing_key(claims->expires_at, key) : load_key(0, key);
		if (key_id == 0)
			elog(ERROR, "im_sync: no token key after creating one");
	}
	return key_id;
}

/* claims || key_id || MAC, base64url without padding; palloc'd. */
static char *
encode_signed(const ImTokenClaims *claims, int32 key_id, const uint8 *key)
{
	uint8		buf[IM_TOKEN_MAX_BYTES];
	uint8	   *p = buf;
	size_t		devlen = strnlen(claims->device_id, 64);
	int			enclen;
	char	   *out;

	*p++ = (uint8) claims->purpose;
	put32(&p, IM_TOKEN_VERSION);
	put32(&p, claims->registration);
	put32(&p, claims->sync_generation);
	Assert(p - buf == IM_TOKEN_USER_ID_AT);
	put64(&p, claims->user_id);
	Assert(p - buf == IM_TOKEN_USER_ID_AT + IM_TOKEN_USER_ID_LEN);
	put64(&p, claims->resume_from);
	put64(&p, claims->watermark);
	put64(&p, claims->recovery_session_id);
	put64(&p, claims->position);
	put64(&p, claims->snapshot_id);
	put64(&p, claims->issued_at);
	put64(&p, claims->expires_at);
	Assert(p - buf == IM_TOKEN_DEVLEN_AT);
	*p++ = (uint8) devlen;
	memcpy(p, claims->device_id, devlen);
	p += devlen;
	put32(&p, key_id);
	compute_mac(key, buf, p - buf, p);
	p += IM_MAC_LEN;

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

char *
im_token_sign(const ImTokenClaims *claims)
{
	char	   *out;

	im_token_sign_several(claims, 1, &out);
	return out;
}

void
im_token_sign_several(const ImTokenClaims *claims, int n, char **out)
{
	uint8		key[IM_KEY_LEN];
	int32		key_id;

	Assert(n >= 1);
	for (int i = 1; i < n; i++)
		if (claims[i].purpose == IM_TOKEN_DEVICE || claims[0].purpose == IM_TOKEN_DEVICE)
			elog(ERROR, "im_sync: device tokens are signed one at a time");
	key_id = signing_key(&claims[0], key);
	for (int i = 0; i < n; i++)
		out[i] = encode_signed(&claims[i], key_id, key);
	explicit_bzero(key, IM_KEY_LEN);
}

bool
im_token_verify(const char *token, char purpose, ImTokenClaims *out)
{
	size_t		len;
	char	   *std;
	char	   *canon;
	uint8		buf[IM_TOKEN_MAX_BYTES + 3];
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

PG_FUNCTION_INFO_V1(im_retire_token_key);
/*
 * retire_token_key(key_id): wipes the key's secret, so every token it signed
 * fails (28000 / INVALID_TOKEN) from this commit on.  True if retired now,
 * false if it was already retired; the newest key cannot be retired (22023:
 * it signs every new token); an unknown key is P0002.  An operator's
 * decision (a leaked key): live tokens of that key die with it.
 */
Datum
im_retire_token_key(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr sel;
	static SPIPlanPtr retire;
	int32		key_id;
	Datum		args[1];
	bool		retired_before;
	bool		newest;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("key_id must not be NULL")));
	key_id = PG_GETARG_INT32(0);

	im_spi_connect();
	lock_key_ring();
	im_prepare(&sel,
			   "SELECT retired_at IS NOT NULL, "
			   "  key_id" EQ "(SELECT pg_catalog.max(key_id) FROM im.token_key) "
			   "FROM im.token_key WHERE key_id" EQ "$1", 1, INT4OID);
	args[0] = Int32GetDatum(key_id);
	if (im_exec(sel, args, NULL, 1) != 1)
		ereport(ERROR,
				(errcode(ERRCODE_NO_DATA_FOUND),
				 errmsg("token key %d does not exist", key_id)));
	retired_before = im_get_bool(0, 1, NULL);
	newest = im_get_bool(0, 2, NULL);
	if (retired_before)
	{
		SPI_finish();
		PG_RETURN_BOOL(false);
	}
	if (newest)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("token key %d is the newest key and cannot be retired", key_id),
				 errdetail("The newest key signs every new token."),
				 errhint("Call im.rotate_token_key() first, then retire this key.")));
	im_prepare(&retire,
			   "UPDATE im.token_key SET secret = NULL, retired_at = pg_catalog.now() "
			   "WHERE key_id" EQ "$1", 1, INT4OID);
	im_exec(retire, args, NULL, 0);
	SPI_finish();
	PG_RETURN_BOOL(true);
}

/*
 * Maintenance of the key ring (contract §8), in the caller's transaction:
 * rotate when the newest key is older than im_sync.token_key_max_age, and
 * retire every superseded key once now is past the latest expiry of any
 * token it signed (see the file comment).  Never creates the first key.
 * The condition is re-checked on the locked row, so a device token issued
 * concurrently with the old key (it raises device_tokens_expire under the
 * row lock) keeps its key alive.  Returns the number of keys retired;
 * *rotated tells whether a new key was made.
 */
int
im_token_keys_maintain(bool *rotated)
{
	static SPIPlanPtr old_newest;
	static SPIPlanPtr retire;
	Datum		args[1];
	int			nretired;
	bool		rotate;
	int64		live_s = Max(Max(im_token_ttl_s, im_recovery_ttl_s), im_snapshot_ttl_s);

	im_spi_connect();
	im_prepare(&old_newest,
			   "SELECT created_at" LT "(pg_catalog.now()" MINUS
			   "  pg_catalog.make_interval(secs => $1)) "
			   "FROM im.token_key ORDER BY key_id DESC LIMIT 1", 1, FLOAT8OID);
	args[0] = Float8GetDatum((double) im_token_key_max_age_s);
	rotate = im_exec(old_newest, args, NULL, 1) == 1 && im_get_bool(0, 1, NULL);
	SPI_finish();
	if (rotate)
		(void) rotate_key();
	*rotated = rotate;

	im_spi_connect();
	im_prepare(&retire,
			   "UPDATE im.token_key k SET secret = NULL, retired_at = pg_catalog.now() "
			   "WHERE k.retired_at IS NULL AND k.superseded_at IS NOT NULL "
			   "  AND k.key_id" LT "(SELECT pg_catalog.max(key_id) FROM im.token_key) "
			   "  AND pg_catalog.now()" GT "GREATEST("
			   "      k.superseded_at" PLUS "pg_catalog.make_interval(secs => $1), "
			   "      k.device_tokens_expire) "
			   "RETURNING k.key_id", 1, FLOAT8OID);
	args[0] = Float8GetDatum((double) live_s);
	nretired = (int) im_exec(retire, args, NULL, 0);
	SPI_finish();
	return nretired;
}

const char *
im_token_check(const char *token, char purpose, int64 user_id,
			   const ImDevice *dev, ImEarlierRegistration earlier, ImTokenClaims *c)
{
	if (!im_token_verify(token, purpose, c))
		return "INVALID_TOKEN";
	if (c->user_id != user_id || strcmp(c->device_id, dev->device_id) != 0)
		return "INVALID_TOKEN";
	if (strcmp(dev->state, "REVOKED") == 0)
		return "DEVICE_REVOKED";
	if (c->registration != dev->registration)
		return earlier == IM_EARLIER_REGISTRATION_REVOKED ? "DEVICE_REVOKED" : "STALE_GENERATION";
	if (c->sync_generation != dev->sync_generation)
		return "STALE_GENERATION";
	if (GetCurrentTimestamp() >= c->expires_at)
		return "EXPIRED";
	return NULL;
}
