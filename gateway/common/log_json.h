/*
 * log_json.h — one-line JSON log records on stderr (jansson), for the
 * programs' --log-format json; either program may link it.
 *
 * A record is one JSON object on one line, "ts" (UTC, milliseconds, as the
 * text log's ts=) and "level" first, then the caller's members in the order
 * set.  Users and devices appear only as the keyed hashes of log_hash.h
 * (im_log_json_user / im_log_json_device); callers never put message
 * bodies or tokens in a record.  Both programs write through here: the
 * gateway (log.h's im_log, server/request_log.c) and the push relay
 * (relay/push_log.c, whose jansson allocator wipes: a line is released
 * through json_get_alloc_funcs, never free()).
 */
#ifndef IM_LOG_JSON_H
#define IM_LOG_JSON_H

#include <stdint.h>
#include <stdio.h>
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

/*
 * Where every line of the process goes, text or JSON: stderr unless set
 * (a test passes its own stream; NULL: stderr again).  Set once at start.
 */
extern void im_log_stream_set(FILE *out);
extern FILE *im_log_stream(void);

/* Writes obj (consumed) as one line: ts, level, then obj's members. */
extern void im_log_json(const char *level, json_t *obj);

/*
 * Sets key to the string v; when v is not valid UTF-8 (jansson refuses it:
 * the member would be lost) its bytes >= 0x80 become '?'.
 */
extern void im_log_json_text(json_t *obj, const char *key, const char *v);

/* Sets "user" to the keyed hash of user_id (null when user_id is 0). */
extern void im_log_json_user(json_t *obj, int64_t user_id);
/* Sets "device" to the keyed hash of the device (null when none). */
extern void im_log_json_device(json_t *obj, int64_t user_id, const char *device_id);

/*
 * A text record of log.h ("k=v k2=\"v w\" …") as members of obj: each k=v
 * a member (digits-only values as numbers, "quoted" values without their
 * quotes, as im_log_json_text), anything else appended to "msg".
 */
extern void im_log_json_kv_set(json_t *obj, const char *kv);

/* im_log_json_kv_set on a new object, written as one line: im_log calls this in JSON mode. */
extern void im_log_json_kv(const char *level, const char *kv);

#endif
