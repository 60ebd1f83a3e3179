/*
 * token.h — signed tokens and the key ring (token.c).
 */
#ifndef IM_TOKEN_H
#define IM_TOKEN_H

#include "im_sync.h"

#include "datatype/timestamp.h"
#include "device_state.h"

/*
 * Batch tokens, page cursors, snapshot tokens and device tokens are all
 * "claims + key id + HMAC-SHA256" (PostgreSQL common/hmac.h), base64url.
 * Fields a purpose does not use are 0 / empty.
 */
typedef enum ImTokenPurpose
{
	IM_TOKEN_DEVICE = 'D',		/* issue_device_token / authenticate */
	IM_TOKEN_BATCH = 'B',		/* sync_changes batch_token */
	IM_TOKEN_CURSOR = 'C',		/* sync_changes next_cursor */
	IM_TOKEN_SNAPSHOT = 'S'		/* begin_snapshot snapshot_token */
} ImTokenPurpose;

typedef struct ImTokenClaims
{
	char		purpose;		/* ImTokenPurpose */
	int64		user_id;
	char		device_id[65];
	int32		registration;	/* device registration the token was issued to */
	int32		sync_generation;
	int64		resume_from;
	int64		watermark;		/* batch high watermark / snapshot base */
	int64		recovery_session_id;	/* 0 when none */
	int64		position;		/* cursor: last sync_seq returned */
	int64		snapshot_id;
	TimestampTz issued_at;
	TimestampTz expires_at;
} ImTokenClaims;

/* Sign claims with the newest key (created on first use); palloc'd text. */
extern char *im_token_sign(const ImTokenClaims *claims);
/*
 * Sign n claims (no device tokens) with the newest key, read once: a sync
 * page's batch token and cursor.  out[i] is the token of claims[i].
 */
extern void im_token_sign_several(const ImTokenClaims *claims, int n, char **out);
/*
 * Verify format, key and signature (constant time) and the purpose.
 * Returns false for anything malformed, unknown key or bad signature
 * (INVALID_TOKEN).  Expiry is NOT checked here: callers check the
 * contract's order (user/device, revoked, generation, expiry).
 */
extern bool im_token_verify(const char *token, char purpose, ImTokenClaims *out);
/*
 * Key ring maintenance (contract §8) in the caller's transaction: rotate an
 * over-age newest key, retire superseded keys no live token needs.
 * Returns the number retired; *rotated: a new key was made.
 */
extern int	im_token_keys_maintain(bool *rotated);

/*
 * How a token issued to an earlier registration of the device reads
 * (extension/doc/decisions.md): a sync batch token or cursor of an earlier registration is
 * STALE_GENERATION (the device may sync again at once), a snapshot token
 * DEVICE_REVOKED (it was revoked with its registration, contract §5).
 */
typedef enum ImEarlierRegistration
{
	IM_EARLIER_REGISTRATION_STALE,
	IM_EARLIER_REGISTRATION_REVOKED
} ImEarlierRegistration;

/*
 * The common token checks of contract §5, in its order, for a token of
 * `purpose` presented with (user_id, dev), dev being the locked device the
 * arguments name: format and signature, user and device, revoked device,
 * earlier registration, generation, expiry.  Returns NULL when the token
 * may be used (claims in *c), else the status to answer.
 */
extern const char *im_token_check(const char *token, char purpose, int64 user_id,
								  const ImDevice *dev, ImEarlierRegistration earlier,
								  ImTokenClaims *c);

#endif							/* IM_TOKEN_H */
