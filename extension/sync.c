/*
 * sync.c — sync_changes, ack_sync, recovery sessions.
 * STUB: not implemented yet.
 */
#include "im_sync.h"

PG_FUNCTION_INFO_V1(im_sync_changes);
Datum
im_sync_changes(PG_FUNCTION_ARGS)
{
	ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					errmsg("sync_changes is not implemented yet")));
	PG_RETURN_NULL();
}

PG_FUNCTION_INFO_V1(im_ack_sync);
Datum
im_ack_sync(PG_FUNCTION_ARGS)
{
	ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					errmsg("ack_sync is not implemented yet")));
	PG_RETURN_NULL();
}
