/*
 * token.c — HMAC-SHA256 signed tokens and the key ring.
 * STUB: not implemented yet.
 */
#include "im_sync.h"

char *
im_token_sign(const ImTokenClaims *claims)
{
	ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					errmsg("token signing is not implemented yet")));
	return NULL;
}

bool
im_token_verify(const char *token, char purpose, ImTokenClaims *out)
{
	return false;
}
