/*
 * device.h — devices, connection epochs, device tokens and their audit
 * (device.c).
 */
#ifndef IM_DEVICE_H
#define IM_DEVICE_H

/* emit_log_hook: keeps per-failure auth errors out of the server log. */
extern void im_auth_log_hook_install(void);

#endif							/* IM_DEVICE_H */
