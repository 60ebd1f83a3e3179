/*
 * device.h — devices, connection epochs, device tokens and their audit
 * (device.c).
 */
#ifndef IM_DEVICE_H
#define IM_DEVICE_H

/*
 * One row of im.audit about a device (detail_json may be NULL); no token or
 * body ever goes into it.  Runs inside the caller's SPI connection.
 */
extern void im_audit_device(const char *action, int64 user_id, const char *device_id,
							const char *detail_json);

#endif							/* IM_DEVICE_H */
