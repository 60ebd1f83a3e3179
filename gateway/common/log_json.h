/*
 * log_json.h — one-line JSON log records on stderr (jansson), for the
 * programs' --log-format json; either program may link it.
 *
 * A record is one JSON object on one line, "ts" (UTC, milliseconds, as the
 * text log's ts=) and "level" first, then the caller's members in the order
 * set.  Users and devices appear only as the keyed hashes of log_hash.h
 * (im_log_json_user / im_log_json_device); callers never put message
 * bodies or tokens in a record.
 */
#ifndef IM_LOG_JSON_H
#define IM_LOG_JSON_H

#include <stdint.h>
#include <jansson.h>

/* The format of every log line of the process: set once at start. */
typedef enum im_log_format
{
	IM_LOG_FORMAT_TEXT = 0,		/* key=value (log.h), the default */
	IM_LOG_FORMAT_JSON
} im_log_format;

extern im_log_format im_log_format_g;

/* "text" or "json": sets im_log_format_g and returns 0; else -1. */
extern int	im_log_format_set(const char *name);

/* Writes obj (consumed) as one line: ts, level, then obj's members. */
extern void im_log_json(const char *level, json_t *obj);

/* Sets "user" to the keyed hash of user_id (null when user_id is 0). */
extern void im_log_json_user(json_t *obj, int64_t user_id);
/* Sets "device" to the keyed hash of the device (null when none). */
extern void im_log_json_device(json_t *obj, int64_t user_id, const char *device_id);

/*
 * A text record of log.h ("k=v k2=\"v w\" …") as a JSON line: each k=v a
 * member (digits-only values as numbers, "quoted" values without their
 * quotes), anything else appended to "msg".  im_log calls this in JSON mode.
 */
extern void im_log_json_kv(const char *level, const char *kv);

#endif
