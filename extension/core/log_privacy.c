/*
 * log_privacy.c — the one emit_log_hook of im_sync (rules in log_privacy.h).
 *
 * Invariants protected: no message body or token reaches the server log
 * through a statement or error context (sql/ regress-log-privacy suite), and
 * anyone who can reach the gateway cannot fill the server log with failed
 * authentications (device.c's auth_fail logs at most one summary line per
 * interval).
 */
#include "core/im_sync.h"
#include "core/log_privacy.h"

#include "utils/elog.h"

/* > 0 while an IM_SENSITIVE_FUNCTION runs in this backend */
static int	sensitive_depth = 0;
static emit_log_hook_type prev_emit_log_hook = NULL;

void
im_sensitive_call_enter(void)
{
	sensitive_depth++;
}

void
im_sensitive_call_leave(void)
{
	sensitive_depth--;
}

static bool
is_failed_authentication(const ErrorData *edata)
{
	return edata->elevel == ERROR &&
		edata->sqlerrcode == ERRCODE_INVALID_AUTHORIZATION_SPECIFICATION &&
		edata->message_id != NULL && strcmp(edata->message_id, IM_AUTH_FAILED_MSG) == 0;
}

/*
 * Anything reported while a sensitive call runs and reported there and then
 * — a FATAL (pg_terminate_backend, shutdown), a WARNING or a LOG line —
 * leaves out the statement and the context (an ERROR is reported only after
 * it unwound out of the call; im_call_hiding_statement marks it).  A failed
 * authentication goes to the caller only.
 */
static void
im_emit_log_hook(ErrorData *edata)
{
	if (sensitive_depth > 0)
	{
		edata->hide_stmt = true;
		edata->hide_ctx = true;
	}
	if (is_failed_authentication(edata))
		edata->output_to_server = false;
	if (prev_emit_log_hook)
		prev_emit_log_hook(edata);
}

void
im_log_privacy_install(void)
{
	prev_emit_log_hook = emit_log_hook;
	emit_log_hook = im_emit_log_hook;
}
