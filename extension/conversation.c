/*
 * conversation.c — create/direct/join/leave/mode and conversation_list.
 * STUB: not implemented yet.
 */
#include "im_sync.h"

PG_FUNCTION_INFO_V1(im_create_conversation);
Datum
im_create_conversation(PG_FUNCTION_ARGS)
{
	ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					errmsg("create_conversation is not implemented yet")));
	PG_RETURN_NULL();
}

PG_FUNCTION_INFO_V1(im_direct_conversation);
Datum
im_direct_conversation(PG_FUNCTION_ARGS)
{
	ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					errmsg("direct_conversation is not implemented yet")));
	PG_RETURN_NULL();
}

PG_FUNCTION_INFO_V1(im_join_conversation);
Datum
im_join_conversation(PG_FUNCTION_ARGS)
{
	ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					errmsg("join_conversation is not implemented yet")));
	PG_RETURN_NULL();
}

PG_FUNCTION_INFO_V1(im_leave_conversation);
Datum
im_leave_conversation(PG_FUNCTION_ARGS)
{
	ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					errmsg("leave_conversation is not implemented yet")));
	PG_RETURN_NULL();
}

PG_FUNCTION_INFO_V1(im_conversation_list);
Datum
im_conversation_list(PG_FUNCTION_ARGS)
{
	ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					errmsg("conversation_list is not implemented yet")));
	PG_RETURN_NULL();
}
