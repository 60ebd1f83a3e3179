/*
 * push_unseal.h — the relay's side of contract §13's sealed push tokens:
 * the private keys given with --key, and opening a sealed_token.
 *
 * sealed_token = base64(version ‖ key id ‖ RSA-OAEP-SHA256-wrapped AES key
 * ‖ nonce ‖ AES-256-GCM ciphertext ‖ tag); the key id (SHA-256 of the
 * public key's DER, 8 bytes) picks the private key, so during a key change
 * the relay holds the old and the new one.
 */
#ifndef IM_PUSH_UNSEAL_H
#define IM_PUSH_UNSEAL_H

#include <stddef.h>

/* Load one PEM private key (RSA >= 2048). 0 on success, else -1 with err. */
extern int	push_key_load(const char *path, char *err, size_t errlen);
extern int	push_key_count(void);

/*
 * Open a sealed token: a malloc'd NUL-terminated token in *token (wipe and
 * free it with push_token_free), 0 on success; -1 with a reason (never the
 * token) in err.
 */
extern int	push_unseal(const char *sealed, char **token, size_t *token_len, char *err, size_t errlen);
extern void push_token_free(char *token, size_t len);

#endif
