/*
 * gc.c — gc_inbox.
 * STUB: not implemented yet.
 */
#include "im_sync.h"

PG_FUNCTION_INFO_V1(im_gc_inbox);
Datum
im_gc_inbox(PG_FUNCTION_ARGS)
{
	ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					errmsg("gc_inbox is not implemented yet")));
	PG_RETURN_NULL();
}
