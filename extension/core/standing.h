/*
 * standing.h — account standing (contract §17): the one check every API
 * call made for a user runs, and the shared-memory state that lets the
 * common case (no account suspended on this node) skip the lookup.
 *
 * Any layer may call these (core is below every side).  The check opens
 * its own SPI level, so it may be called inside or outside SPI.
 */
#ifndef IM_STANDING_H
#define IM_STANDING_H

#include "postgres.h"

/*
 * True when user_id is suspended now (suspended_until NULL or later than
 * the transaction's now()).  Costs one atomic read while this node knows no
 * suspension; otherwise one index probe of im.user_suspension.
 */
extern bool im_user_suspended(int64 user_id);

/* Raises IS403 "account suspended" when user_id is suspended now. */
extern void im_user_check_standing(int64 user_id);

/* False only when this node is known to hold no active suspension. */
extern bool im_standing_any(void);

/*
 * Recounts the active suspensions and, when there are none and no writer
 * raced the count, lets the checks skip the lookup again.  Called by the
 * maintenance round; harmless anywhere (it never clears too early).
 */
extern void im_standing_recount(void);

#endif							/* IM_STANDING_H */
