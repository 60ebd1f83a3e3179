/*
 * shard_reconcile.h — im.reconcile() and im.metrics() on a sharded node
 * (issue 15, shard_reconcile.c, shard_metrics.c).
 */
#ifndef IM_SHARD_RECONCILE_H
#define IM_SHARD_RECONCILE_H

#include "postgres.h"
#include "fmgr.h"

/* emit the current SPI result of a single-node check, keeping this node's rows */
extern void im_shard_reconcile_rows_from_spi(FunctionCallInfo fcinfo);

/* the transfer checks; nothing on an unsharded node */
extern void im_shard_reconcile(FunctionCallInfo fcinfo);

/* the transfer rows of im.metrics() (shard_metrics.c); nothing unsharded */
extern void im_shard_metrics(FunctionCallInfo fcinfo);

#endif
