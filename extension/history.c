/*
 * history.c — fetch_messages.
 * STUB: not implemented yet.
 */
#include "im_sync.h"

PG_FUNCTION_INFO_V1(im_fetch_messages);
Datum
im_fetch_messages(PG_FUNCTION_ARGS)
{
	ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					errmsg("fetch_messages is not implemented yet")));
	PG_RETURN_NULL();
}
