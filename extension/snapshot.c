/*
 * snapshot.c — snapshots.
 * STUB: not implemented yet.
 */
#include "im_sync.h"

PG_FUNCTION_INFO_V1(im_begin_snapshot);
Datum
im_begin_snapshot(PG_FUNCTION_ARGS)
{
	ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					errmsg("begin_snapshot is not implemented yet")));
	PG_RETURN_NULL();
}

PG_FUNCTION_INFO_V1(im_fetch_snapshot);
Datum
im_fetch_snapshot(PG_FUNCTION_ARGS)
{
	ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					errmsg("fetch_snapshot is not implemented yet")));
	PG_RETURN_NULL();
}

PG_FUNCTION_INFO_V1(im_ack_snapshot);
Datum
im_ack_snapshot(PG_FUNCTION_ARGS)
{
	ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					errmsg("ack_snapshot is not implemented yet")));
	PG_RETURN_NULL();
}
