/*
 * xact_horizon.h — the start of the oldest transaction running now besides
 * the caller's (xact_horizon.c): the horizon before which every commit is
 * visible.  maintenance.c's ack mark and transfer_ack.c's settling pass
 * read it.
 */
#ifndef IM_XACT_HORIZON_H
#define IM_XACT_HORIZON_H

#include "datatype/timestamp.h"

/*
 * The oldest transaction start among the other backends, from a fresh read
 * of the backend status array, whoever the current user is; 0 when no
 * other transaction runs.
 */
extern TimestampTz im_oldest_other_xact_start(void);

#endif							/* IM_XACT_HORIZON_H */
