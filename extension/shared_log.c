/*
 * shared_log.c — large groups.
 * STUB: not implemented yet.
 */
#include "im_sync.h"

PG_FUNCTION_INFO_V1(im_set_conversation_mode);
Datum
im_set_conversation_mode(PG_FUNCTION_ARGS)
{
	ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					errmsg("set_conversation_mode is not implemented yet")));
	PG_RETURN_NULL();
}

PG_FUNCTION_INFO_V1(im_clear_dirty);
Datum
im_clear_dirty(PG_FUNCTION_ARGS)
{
	ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					errmsg("clear_dirty is not implemented yet")));
	PG_RETURN_NULL();
}

void
im_shared_log_deliver(int64 conversation_id, int64 msg_seq, int64 message_id, StringInfo hints)
{
	ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					errmsg("shared_log mode is not implemented yet")));
}
