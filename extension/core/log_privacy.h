/*
 * log_privacy.h — what the server log may say about API calls (log_privacy.c).
 *
 * One emit_log_hook serves two rules: a call that carries a message body
 * or a token never has its statement or context logged (common.c's
 * im_call_hiding_statement marks the call), and failed device
 * authentications are summarized, never logged one line per failure
 * (device.c raises them with IM_AUTH_FAILED_MSG).
 */
#ifndef IM_LOG_PRIVACY_H
#define IM_LOG_PRIVACY_H

/* errmsg of a failed authentication; the log hook recognizes it. */
#define IM_AUTH_FAILED_MSG "device token authentication failed"

/* Installs the hook (from _PG_init, once per backend). */
extern void im_log_privacy_install(void);

/* Brackets a sensitive call: while inside, nothing logged shows the
 * statement or the context. */
extern void im_sensitive_call_enter(void);
extern void im_sensitive_call_leave(void);

#endif							/* IM_LOG_PRIVACY_H */
