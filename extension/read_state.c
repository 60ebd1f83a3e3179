/*
 * read_state.c — read cursors, delete_for_me, message_status.
 * STUB: not implemented yet.
 */
#include "im_sync.h"

PG_FUNCTION_INFO_V1(im_report_read);
Datum
im_report_read(PG_FUNCTION_ARGS)
{
	ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					errmsg("report_read is not implemented yet")));
	PG_RETURN_NULL();
}

PG_FUNCTION_INFO_V1(im_delete_for_me);
Datum
im_delete_for_me(PG_FUNCTION_ARGS)
{
	ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					errmsg("delete_for_me is not implemented yet")));
	PG_RETURN_NULL();
}

PG_FUNCTION_INFO_V1(im_message_status);
Datum
im_message_status(PG_FUNCTION_ARGS)
{
	ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					errmsg("message_status is not implemented yet")));
	PG_RETURN_NULL();
}
