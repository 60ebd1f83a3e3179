/*
 * push_seal.c — push tokens never rest in the clear (contract §13, §12;
 * design §17.3).
 *
 * A token is sealed for the relay with its RSA public key
 * (im_sync.push_public_key_file, SPKI PEM, RSA >= 2048 bits): a random
 * AES-256-GCM key per token encrypts it, and that key is wrapped with
 * RSA-OAEP (SHA-256, MGF1-SHA-256, empty label) through OpenSSL's EVP API.
 * sealed_token = base64(version ‖ key id ‖ wrapped key ‖ nonce ‖ ciphertext
 * ‖ tag); the key id is the SHA-256 of the public key's DER cut to 8 bytes,
 * so a relay holding several private keys picks the right one.  Only the
 * relay, holding the private key, can open it: no table, dump or role does.
 *
 * Duplicates (the same token registered again on another device) are found
 * by an HMAC-SHA256 of the token under a random key in im.push_secret.
 */
#include "core/im_sync.h"
#include "core/common.h"
#include "core/im_sql.h"
#include "push/push.h"

#include <sys/stat.h>

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rsa.h>
#include <openssl/sha.h>

#include "catalog/pg_type.h"
#include "common/base64.h"
#include "common/hmac.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/memutils.h"

#define IM_SEAL_VERSION 1
#define IM_SEAL_KEY_ID_LEN 8
#define IM_SEAL_NONCE_LEN 12
#define IM_SEAL_TAG_LEN 16
#define IM_SEAL_AES_KEY_LEN 32

/* The loaded public key; re-read when the setting or the file changes. */
static EVP_PKEY *loaded_key;
static char *loaded_path;
static struct timespec loaded_mtime;
static off_t loaded_size;
static uint8 loaded_key_id[IM_SEAL_KEY_ID_LEN];

static void
no_usable_key(const char *why)
{
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("push tokens cannot be sealed: %s", why),
			 errhint("Set im_sync.push_public_key_file to the push relay's RSA public key (SPKI PEM, at least 2048 bits).")));
}

static char *
key_path(void)
{
	if (im_push_public_key_file == NULL || im_push_public_key_file[0] == '\0')
		no_usable_key("im_sync.push_public_key_file is not set");
	if (is_absolute_path(im_push_public_key_file))
		return pstrdup(im_push_public_key_file);
	return psprintf("%s/%s", DataDir, im_push_public_key_file);
}

/* The relay's public key, loaded and checked (RSA, >= 2048 bits). */
static EVP_PKEY *
public_key(void)
{
	char	   *path = key_path();
	struct stat st;
	FILE	   *f;
	EVP_PKEY   *key;
	unsigned char *der = NULL;
	int			derlen;
	uint8		hash[SHA256_DIGEST_LENGTH];

	if (stat(path, &st) != 0)
		no_usable_key(psprintf("im_sync.push_public_key_file \"%s\" cannot be read: %m", path));
	if (loaded_key != NULL && strcmp(loaded_path, path) == 0 &&
		st.st_mtim.tv_sec == loaded_mtime.tv_sec && st.st_mtim.tv_nsec == loaded_mtime.tv_nsec &&
		st.st_size == loaded_size)
		return loaded_key;

	f = AllocateFile(path, "r");
	if (f == NULL)
		no_usable_key(psprintf("im_sync.push_public_key_file \"%s\" cannot be read: %m", path));
	key = PEM_read_PUBKEY(f, NULL, NULL, NULL);
	FreeFile(f);
	if (key == NULL)
		no_usable_key(psprintf("im_sync.push_public_key_file \"%s\" holds no public key (SPKI PEM)", path));
	if (EVP_PKEY_base_id(key) != EVP_PKEY_RSA || EVP_PKEY_bits(key) < 2048)
	{
		EVP_PKEY_free(key);
		no_usable_key(psprintf("the key in im_sync.push_public_key_file \"%s\" is not an RSA key of at least 2048 bits", path));
	}
	derlen = i2d_PUBKEY(key, &der);
	if (derlen <= 0)
	{
		EVP_PKEY_free(key);
		no_usable_key("the public key cannot be encoded");
	}
	SHA256(der, derlen, hash);
	OPENSSL_free(der);

	if (loaded_key != NULL)
		EVP_PKEY_free(loaded_key);
	if (loaded_path != NULL)
		pfree(loaded_path);
	loaded_key = key;
	loaded_path = MemoryContextStrdup(TopMemoryContext, path);
	loaded_mtime = st.st_mtim;
	loaded_size = st.st_size;
	memcpy(loaded_key_id, hash, IM_SEAL_KEY_ID_LEN);
	return loaded_key;
}

static void
seal_failed(const char *what)
{
	ereport(ERROR,
			(errcode(ERRCODE_INTERNAL_ERROR),
			 errmsg("im_sync: sealing a push token failed at %s", what)));
}

/* RSA-OAEP (SHA-256, MGF1-SHA-256, empty label) of the AES key into out */
static size_t
wrap_key(EVP_PKEY *key, const uint8 *aes_key, uint8 *out, size_t outmax)
{
	EVP_PKEY_CTX *ctx = EVP_PKEY_CTX_new(key, NULL);
	size_t		outlen = outmax;

	if (ctx == NULL)
		seal_failed("EVP_PKEY_CTX_new");
	if (EVP_PKEY_encrypt_init(ctx) <= 0 ||
		EVP_PKEY_CTX_set_rsa_padding(ctx, RSA_PKCS1_OAEP_PADDING) <= 0 ||
		EVP_PKEY_CTX_set_rsa_oaep_md(ctx, EVP_sha256()) <= 0 ||
		EVP_PKEY_CTX_set_rsa_mgf1_md(ctx, EVP_sha256()) <= 0 ||
		EVP_PKEY_encrypt(ctx, out, &outlen, aes_key, IM_SEAL_AES_KEY_LEN) <= 0)
	{
		EVP_PKEY_CTX_free(ctx);
		seal_failed("RSA-OAEP");
	}
	EVP_PKEY_CTX_free(ctx);
	return outlen;
}

/* AES-256-GCM of in[0..len) into out (same length) and tag */
static void
encrypt_token(const uint8 *aes_key, const uint8 *nonce, const char *in, size_t len,
			  uint8 *out, uint8 *tag)
{
	EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
	int			n = 0;
	int			fin = 0;

	if (ctx == NULL)
		seal_failed("EVP_CIPHER_CTX_new");
	if (EVP_EncryptInit_ex(ctx, EVP_aes_256_gcm(), NULL, NULL, NULL) != 1 ||
		EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_IVLEN, IM_SEAL_NONCE_LEN, NULL) != 1 ||
		EVP_EncryptInit_ex(ctx, NULL, NULL, aes_key, nonce) != 1 ||
		EVP_EncryptUpdate(ctx, out, &n, (const uint8 *) in, (int) len) != 1 ||
		EVP_EncryptFinal_ex(ctx, out + n, &fin) != 1 ||
		EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, IM_SEAL_TAG_LEN, tag) != 1)
	{
		EVP_CIPHER_CTX_free(ctx);
		seal_failed("AES-256-GCM");
	}
	EVP_CIPHER_CTX_free(ctx);
}

char *
im_push_seal_token(const char *token, size_t len)
{
	EVP_PKEY   *key = public_key();
	size_t		wrapped_max = (size_t) EVP_PKEY_size(key);
	size_t		total_max = 1 + IM_SEAL_KEY_ID_LEN + wrapped_max + IM_SEAL_NONCE_LEN + len + IM_SEAL_TAG_LEN;
	uint8	   *buf = palloc(total_max);
	uint8		aes_key[IM_SEAL_AES_KEY_LEN];
	uint8	   *p = buf;
	size_t		wrapped;
	char	   *out;
	int			outlen;

	if (!pg_strong_random(aes_key, sizeof(aes_key)))
		seal_failed("random key");
	*p++ = IM_SEAL_VERSION;
	memcpy(p, loaded_key_id, IM_SEAL_KEY_ID_LEN);
	p += IM_SEAL_KEY_ID_LEN;
	wrapped = wrap_key(key, aes_key, p, wrapped_max);
	p += wrapped;
	if (!pg_strong_random(p, IM_SEAL_NONCE_LEN))
		seal_failed("random nonce");
	encrypt_token(aes_key, p, token, len, p + IM_SEAL_NONCE_LEN, p + IM_SEAL_NONCE_LEN + len);
	explicit_bzero(aes_key, sizeof(aes_key));
	p += IM_SEAL_NONCE_LEN + len + IM_SEAL_TAG_LEN;

	out = palloc(pg_b64_enc_len(p - buf) + 1);
	outlen = pg_b64_encode((const char *) buf, p - buf, out, pg_b64_enc_len(p - buf));
	if (outlen < 0)
		seal_failed("base64");
	out[outlen] = '\0';
	return out;
}

/* The digest key: one random row of im.push_secret, made on first use. */
static void
digest_key(uint8 key[32])
{
	static SPIPlanPtr make;
	static SPIPlanPtr get;
	uint8		fresh[32];
	bytea	   *b = palloc(VARHDRSZ + 32);
	Datum		args[1];
	bool		isnull;
	bytea	   *got;

	if (!pg_strong_random(fresh, sizeof(fresh)))
		seal_failed("random digest key");
	SET_VARSIZE(b, VARHDRSZ + 32);
	memcpy(VARDATA(b), fresh, 32);
	explicit_bzero(fresh, sizeof(fresh));
	im_prepare(&make,
			   "INSERT INTO im.push_secret (secret_id, digest_key) VALUES (1, $1) "
			   "ON CONFLICT (secret_id) DO NOTHING",
			   1, BYTEAOID);
	args[0] = PointerGetDatum(b);
	im_exec(make, args, NULL, 0);
	im_prepare(&get, "SELECT digest_key FROM im.push_secret WHERE secret_id" EQ "1", 0);
	if (im_exec(get, NULL, NULL, 0) != 1)
		seal_failed("digest key");
	got = DatumGetByteaPP(im_get_datum_copy(0, 1, &isnull));
	memcpy(key, VARDATA_ANY(got), 32);
}

void
im_push_token_digest(const char *provider, const char *app_id, const char *token, size_t len,
					 uint8 digest[32])
{
	uint8		key[32];
	pg_hmac_ctx *ctx = pg_hmac_create(PG_SHA256);
	const uint8 zero = 0;

	if (ctx == NULL)
		elog(ERROR, "im_sync: out of memory creating HMAC context");
	digest_key(key);
	/* provider and app_id never hold a NUL, so the fields cannot run together */
	if (pg_hmac_init(ctx, key, sizeof(key)) < 0 ||
		pg_hmac_update(ctx, (const uint8 *) provider, strlen(provider)) < 0 ||
		pg_hmac_update(ctx, &zero, 1) < 0 ||
		pg_hmac_update(ctx, (const uint8 *) app_id, strlen(app_id)) < 0 ||
		pg_hmac_update(ctx, &zero, 1) < 0 ||
		pg_hmac_update(ctx, (const uint8 *) token, len) < 0 ||
		pg_hmac_final(ctx, digest, 32) < 0)
	{
		pg_hmac_free(ctx);
		elog(ERROR, "im_sync: HMAC-SHA256 of a push token failed");
	}
	pg_hmac_free(ctx);
	explicit_bzero(key, sizeof(key));
}
