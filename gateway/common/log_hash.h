/*
 * log_hash.h — keyed hashes of user and device ids for the gateway's logs
 * (contract §12): HMAC-SHA256 (OpenSSL) cut to 16 hex digits, printed as
 * "h:<16 hex>".  The key comes from --log-key FILE, or is random per
 * process, so a log alone never tells who was connected, while lines of one
 * process (or of all processes sharing a key) can still be correlated.
 */
#ifndef IM_GW_LOG_HASH_H
#define IM_GW_LOG_HASH_H

#include <stddef.h>
#include <stdint.h>

#define IM_LOG_HASH_BUF 20		/* "h:" + 16 hex + NUL */

/*
 * Key from a file: its bytes without one trailing newline, at least 16.
 * 0 on success, else -1 with a reason in err.
 */
extern int	im_log_key_load(const char *path, char *err, size_t errlen);
/* A random key for this process (used when no --log-key is given). */
extern int	im_log_key_random(void);

/* HMAC(key, "u:<user_id>") */
extern const char *im_hash_user(int64_t user_id, char out[IM_LOG_HASH_BUF]);
/* HMAC(key, "d:<user_id>:<device_id>"): device ids repeat across users */
extern const char *im_hash_device(int64_t user_id, const char *device_id,
								  char out[IM_LOG_HASH_BUF]);

/* HMAC(key, "t:<push_target_id>"): the push relay's logs */
extern const char *im_hash_push_target(int64_t push_target_id, char out[IM_LOG_HASH_BUF]);

#endif
