/*
 * metrics.c — metrics.
 * STUB: not implemented yet.
 */
#include "im_sync.h"

PG_FUNCTION_INFO_V1(im_metrics);
Datum
im_metrics(PG_FUNCTION_ARGS)
{
	ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					errmsg("metrics is not implemented yet")));
	PG_RETURN_NULL();
}
