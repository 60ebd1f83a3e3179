/*
 * push.h — offline push (contract §13): push targets with sealed tokens
 * (push_target.c, push_seal.c), notification settings (push_settings.c),
 * presence (presence.c) and the push queue filled by fanout and drained by
 * relays (push_queue.c).  All of it is on the user side of the seam.
 */
#ifndef IM_PUSH_H
#define IM_PUSH_H

#include "postgres.h"

/* true when this database's catalog has the push tables (1.4 or later) */
extern bool im_push_catalog(void);
/* 55000 unless it is (for the push API functions) */
extern void im_push_require_catalog(void);

/*
 * Fanout hook (fanout.c, fanout_shared_log.c): queue push jobs for the
 * `message` positions message_ids[0..n) of conversation just written to
 * their recipients' logs, in the caller's (fanout) transaction.  A no-op on
 * an older catalog.
 */
extern void im_push_queue_delivered(int64 conversation_id, const int64 *message_ids, int n);

/* revoke_device: the device's push target goes with it (contract §13) */
extern void im_push_remove_device_target(int64 user_id, const char *device_id);

/*
 * Seal a push token for the relay (push_seal.c): base64 of version ‖ key id
 * ‖ RSA-OAEP-SHA256-wrapped AES key ‖ nonce ‖ AES-256-GCM ciphertext ‖ tag.
 * Raises 55000 without a usable im_sync.push_public_key_file.
 */
extern char *im_push_seal_token(const char *token, size_t len);
/* keyed digest (HMAC-SHA256, key in im.push_secret) of provider, app_id, token */
extern void im_push_token_digest(const char *provider, const char *app_id,
								 const char *token, size_t len, uint8 digest[32]);

/* the relay result counted by IM_COUNTER_PUSH_DELIVERED + i (i < IM_PUSH_RESULTS) */
#define IM_PUSH_RESULTS 5
extern const char *im_push_result_name(int i);

/* preview levels, least revealing first */
extern int	im_push_preview_level(const char *preview);	/* -1: not a preview */

#endif
