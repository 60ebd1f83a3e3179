/*
 * push_unseal.c — see push_unseal.h.  OpenSSL's EVP API only: RSA-OAEP
 * with SHA-256 and MGF1-SHA-256 (empty label) unwraps the AES-256-GCM key,
 * which opens the token and checks its tag.
 */
#include "relay/push_unseal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rsa.h>
#include <openssl/sha.h>
#include <openssl/crypto.h>

#define SEAL_VERSION 1
#define KEY_ID_LEN 8
#define NONCE_LEN 12
#define TAG_LEN 16
#define AES_KEY_LEN 32
#define MAX_KEYS 16

typedef struct PushKey
{
	EVP_PKEY   *pkey;
	unsigned char id[KEY_ID_LEN];
} PushKey;

static PushKey keys[MAX_KEYS];
static int	nkeys;

int
push_key_count(void)
{
	return nkeys;
}

int
push_key_load(const char *path, char *err, size_t errlen)
{
	FILE	   *f;
	EVP_PKEY   *pkey;
	unsigned char *der = NULL;
	unsigned char hash[SHA256_DIGEST_LENGTH];
	int			derlen;

	if (nkeys == MAX_KEYS)
	{
		snprintf(err, errlen, "at most %d --key files", MAX_KEYS);
		return -1;
	}
	f = fopen(path, "r");
	if (!f)
	{
		snprintf(err, errlen, "cannot open key file %s", path);
		return -1;
	}
	pkey = PEM_read_PrivateKey(f, NULL, NULL, NULL);
	fclose(f);
	if (!pkey)
	{
		snprintf(err, errlen, "%s holds no PEM private key", path);
		return -1;
	}
	if (EVP_PKEY_base_id(pkey) != EVP_PKEY_RSA || EVP_PKEY_bits(pkey) < 2048)
	{
		EVP_PKEY_free(pkey);
		snprintf(err, errlen, "%s is not an RSA key of at least 2048 bits", path);
		return -1;
	}
	/* the key id: SHA-256 of the public key's DER (SubjectPublicKeyInfo) */
	derlen = i2d_PUBKEY(pkey, &der);
	if (derlen <= 0)
	{
		EVP_PKEY_free(pkey);
		snprintf(err, errlen, "%s: cannot encode its public key", path);
		return -1;
	}
	SHA256(der, (size_t) derlen, hash);
	OPENSSL_free(der);
	keys[nkeys].pkey = pkey;
	memcpy(keys[nkeys].id, hash, KEY_ID_LEN);
	nkeys++;
	return 0;
}

static EVP_PKEY *
key_for(const unsigned char *id)
{
	for (int i = 0; i < nkeys; i++)
		if (memcmp(keys[i].id, id, KEY_ID_LEN) == 0)
			return keys[i].pkey;
	return NULL;
}

/* base64 (standard alphabet, padded) into a malloc'd buffer */
static unsigned char *
b64_decode(const char *in, size_t *outlen)
{
	size_t		len = strlen(in);
	unsigned char *out;
	int			n;

	if (len == 0 || len % 4 != 0)
		return NULL;
	out = malloc(len / 4 * 3 + 1);
	if (!out)
		return NULL;
	n = EVP_DecodeBlock(out, (const unsigned char *) in, (int) len);
	if (n < 0)
	{
		free(out);
		return NULL;
	}
	/* EVP_DecodeBlock counts the padding as data */
	if (in[len - 1] == '=')
		n--;
	if (in[len - 2] == '=')
		n--;
	*outlen = (size_t) n;
	return out;
}

static int
unwrap_key(EVP_PKEY *pkey, const unsigned char *wrapped, size_t wlen, unsigned char *aes_key)
{
	EVP_PKEY_CTX *ctx = EVP_PKEY_CTX_new(pkey, NULL);
	unsigned char out[1024];
	size_t		outlen = sizeof(out);
	int			ok;

	if (!ctx)
		return -1;
	ok = EVP_PKEY_decrypt_init(ctx) > 0 &&
		EVP_PKEY_CTX_set_rsa_padding(ctx, RSA_PKCS1_OAEP_PADDING) > 0 &&
		EVP_PKEY_CTX_set_rsa_oaep_md(ctx, EVP_sha256()) > 0 &&
		EVP_PKEY_CTX_set_rsa_mgf1_md(ctx, EVP_sha256()) > 0 &&
		EVP_PKEY_decrypt(ctx, out, &outlen, wrapped, wlen) > 0 &&
		outlen == AES_KEY_LEN;
	EVP_PKEY_CTX_free(ctx);
	if (ok)
		memcpy(aes_key, out, AES_KEY_LEN);
	OPENSSL_cleanse(out, sizeof(out));
	return ok ? 0 : -1;
}

static int
open_token(const unsigned char *aes_key, const unsigned char *nonce, const unsigned char *ct, size_t len,
		   const unsigned char *tag, unsigned char *out)
{
	EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
	int			n = 0;
	int			fin = 0;
	int			ok;

	if (!ctx)
		return -1;
	ok = EVP_DecryptInit_ex(ctx, EVP_aes_256_gcm(), NULL, NULL, NULL) == 1 &&
		EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_IVLEN, NONCE_LEN, NULL) == 1 &&
		EVP_DecryptInit_ex(ctx, NULL, NULL, aes_key, nonce) == 1 &&
		EVP_DecryptUpdate(ctx, out, &n, ct, (int) len) == 1 &&
		EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, TAG_LEN, (void *) tag) == 1 &&
		EVP_DecryptFinal_ex(ctx, out + n, &fin) == 1;	/* the tag check */
	EVP_CIPHER_CTX_free(ctx);
	return ok ? 0 : -1;
}

int
push_unseal(const char *sealed, char **token, size_t *token_len, char *err, size_t errlen)
{
	size_t		len;
	unsigned char *buf = b64_decode(sealed, &len);
	unsigned char aes_key[AES_KEY_LEN];
	EVP_PKEY   *pkey;
	size_t		wlen;
	size_t		ctlen;
	const unsigned char *p;
	char	   *out;

	if (!buf)
	{
		snprintf(err, errlen, "sealed token is not base64");
		return -1;
	}
	if (len < 1 + KEY_ID_LEN || buf[0] != SEAL_VERSION)
	{
		free(buf);
		snprintf(err, errlen, "sealed token has an unknown version");
		return -1;
	}
	pkey = key_for(buf + 1);
	if (!pkey)
	{
		char		hex[2 * KEY_ID_LEN + 1];

		for (int i = 0; i < KEY_ID_LEN; i++)
			snprintf(hex + 2 * i, 3, "%02x", buf[1 + i]);
		free(buf);
		snprintf(err, errlen, "no --key file holds key id %s", hex);
		return -1;
	}
	wlen = (size_t) EVP_PKEY_get_size(pkey);
	if (len < 1 + KEY_ID_LEN + wlen + NONCE_LEN + TAG_LEN + 1)
	{
		free(buf);
		snprintf(err, errlen, "sealed token is too short");
		return -1;
	}
	p = buf + 1 + KEY_ID_LEN;
	if (unwrap_key(pkey, p, wlen, aes_key) != 0)
	{
		free(buf);
		snprintf(err, errlen, "sealed token's key does not unwrap (RSA-OAEP)");
		return -1;
	}
	p += wlen;
	ctlen = len - (1 + KEY_ID_LEN + wlen + NONCE_LEN + TAG_LEN);
	out = malloc(ctlen + 1);
	if (!out || open_token(aes_key, p, p + NONCE_LEN, ctlen, p + NONCE_LEN + ctlen, (unsigned char *) out) != 0)
	{
		OPENSSL_cleanse(aes_key, sizeof(aes_key));
		/* GCM decrypts before the tag is checked: out holds the would-be token */
		if (out)
			OPENSSL_cleanse(out, ctlen + 1);
		free(out);
		free(buf);
		snprintf(err, errlen, "sealed token does not open (AES-256-GCM tag)");
		return -1;
	}
	OPENSSL_cleanse(aes_key, sizeof(aes_key));
	free(buf);
	out[ctlen] = '\0';
	*token = out;
	*token_len = ctlen;
	return 0;
}

void
push_token_free(char *token, size_t len)
{
	if (token)
	{
		OPENSSL_cleanse(token, len);
		free(token);
	}
}
