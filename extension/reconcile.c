/*
 * reconcile.c — reconcile.
 * STUB: not implemented yet.
 */
#include "im_sync.h"

PG_FUNCTION_INFO_V1(im_reconcile);
Datum
im_reconcile(PG_FUNCTION_ARGS)
{
	ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					errmsg("reconcile is not implemented yet")));
	PG_RETURN_NULL();
}
