/*
 * audit.h — rows of im.audit (audit.c).
 */
#ifndef IM_AUDIT_H
#define IM_AUDIT_H

#include "core/im_sync.h"

/*
 * One row of im.audit about a device (device_id and detail_json may be
 * NULL: a moderation action names no device); no token or
 * body ever goes into it.  Runs inside the caller's SPI connection.
 */
extern void im_audit_device(const char *action, int64 user_id, const char *device_id,
							const char *detail_json);

#endif							/* IM_AUDIT_H */
