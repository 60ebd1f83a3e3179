/*
 * fanout.c — outbox -> per-user logs.
 * STUB: not implemented yet.
 */
#include "im_sync.h"

PG_FUNCTION_INFO_V1(im_run_fanout);
Datum
im_run_fanout(PG_FUNCTION_ARGS)
{
	ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					errmsg("run_fanout is not implemented yet")));
	PG_RETURN_NULL();
}

int64
im_fanout_batch(int max_items, StringInfo hints)
{
	return 0;
}

void
im_send_hints(StringInfo hints)
{
}
