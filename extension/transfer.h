/*
 * transfer.h — transfers between nodes (issue 15): the destination's apply
 * (transfer_in.c), called by the workers and im.run_fanout before fanout.
 */
#ifndef IM_TRANSFER_H
#define IM_TRANSFER_H

#include "postgres.h"

/*
 * Apply at most max_transfers pending inbound transfers in the caller's
 * transaction (each in its own subtransaction; a failing one is
 * quarantined).  Returns how many were applied; 0 when not sharded or
 * another applier holds the lock.  Must be called inside SPI_connect.
 */
extern int64 im_transfer_apply(int max_transfers);
extern void im_transfer_ack_settle_stored(void);
extern uint64 im_transfer_ack_release(void);

#endif
