/*
 * im_sync/token_layout.h — the byte layout of a token's claims, the one definition
 * the C readers use: extension/user/token.c writes and verifies tokens, and the
 * gateway (gateway/server/db/hello_order.c) reads a device token's user and device to
 * keep a device's hellos in order, without verifying it (the database
 * does).  Plain C, no PostgreSQL headers; included as "im_sync/token_layout.h"
 * with -I extension/include.  The JS client's
 * deviceTokenClaims (gateway/web/im_sync_client.js) reads the same offsets
 * to name the page's local database before it connects; keep it in step.
 *
 * claims: purpose(1) version(4) registration(4) sync_generation(4)
 *         user_id(8) resume_from(8) watermark(8) recovery_session_id(8)
 *         position(8) snapshot_id(8) issued_at(8) expires_at(8)
 *         devlen(1) device_id(devlen, 1..64)
 * then key_id(4) and the HMAC-SHA256 of everything before it (32),
 * all integers big-endian; the whole is base64url without padding.
 */
#ifndef IM_TOKEN_LAYOUT_H
#define IM_TOKEN_LAYOUT_H

#define IM_TOKEN_USER_ID_AT		13	/* purpose + 3 x int32 */
#define IM_TOKEN_USER_ID_LEN	8	/* an int64 */
#define IM_TOKEN_DEVLEN_AT		(IM_TOKEN_USER_ID_AT + 8 * 8)	/* + 8 x int64 */
#define IM_TOKEN_CLAIMS_FIXED	(IM_TOKEN_DEVLEN_AT + 1)	/* where device_id starts */
#define IM_TOKEN_DEVICE_MAX		64
#define IM_TOKEN_KEY_ID_LEN		4
#define IM_TOKEN_MAC_LEN		32
#define IM_TOKEN_MAX_BYTES		(IM_TOKEN_CLAIMS_FIXED + IM_TOKEN_DEVICE_MAX + \
								 IM_TOKEN_KEY_ID_LEN + IM_TOKEN_MAC_LEN)

#endif							/* IM_TOKEN_LAYOUT_H */
