/*
 * ops.h — operations' cross-file API (extension/ops/): inbox GC (gc.c) and
 * the rest of maintenance: key ring and retention (maintenance.c).  Run by
 * im.gc_inbox and by the first worker.  Reconcile and metrics (reconcile.c,
 * metrics.c) export only SQL functions.
 */
#ifndef IM_OPS_H
#define IM_OPS_H

#include "core/im_sync.h"

/*
 * One chunk of inbox GC in the caller's transaction: at most max_users
 * users (<= 0: all) after the stored cursor, wrapping around.  Emits rows
 * into fcinfo's tuplestore when fcinfo is not NULL.  Returns true when the
 * chunk ended a round of all users (or wrapped to start the next).  The
 * deleted rows are counted (im_gc_deleted_total) when the chunk commits.
 */
extern bool im_gc_inbox_chunk(int max_users, FunctionCallInfo fcinfo);
/* Key ring and retention (everything but inbox GC), caller's transaction. */
extern void im_maintain(void);

#endif							/* IM_OPS_H */
