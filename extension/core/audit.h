/*
 * audit.h — rows of im.audit (audit.c): devices, push targets and
 * moderation actions.
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

/*
 * One row of im.audit for a moderation action (contract §17; the actions
 * moderation_log lists, ops/moderation_log.c): user_id the affected user,
 * detail_json the keys moderator, conversation_id, message_id, reason (absent
 * when none) and the action's own; never a body.  Inside SPI.
 */
extern void im_audit_moderation(const char *action, int64 user_id, const char *detail_json);

#endif							/* IM_AUDIT_H */
