/*
 * ops.h — operations' cross-file API (extension/ops/): inbox GC (gc.c) and
 * the rest of maintenance: key ring and retention (maintenance.c).  Run by
 * im.gc_inbox and by the first worker.  Reconcile exports only SQL
 * functions; metrics.c also the row emitters shard_metrics.c uses.
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

/*
 * One row of im.metrics() (metrics.c): type "counter", "gauge" or
 * "histogram", at most one label (label_key NULL: none).  On an older
 * catalog's three-column result the label is spelled into the name.
 */
extern void im_metric_row(FunctionCallInfo fcinfo, const char *name, double value,
						  const char *help, const char *type,
						  const char *label_key, const char *label_value);
/* the last SPI result's rows: name, value, help[, type[, label_key, label_value]] */
extern void im_metric_rows_from_spi(FunctionCallInfo fcinfo, const char *default_type);

#endif							/* IM_OPS_H */
