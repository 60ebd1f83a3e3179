/*
 * recovery_wait.h — the fanout workers on a standby.
 *
 * A hot standby runs the same postgresql.conf as its primary, so it
 * preloads im_sync and starts the workers too (they start once the standby
 * is consistent, BgWorkerStart_ConsistentState).  In recovery every write
 * fails, so a worker that tried to fan out would log an error every
 * naptime for as long as the standby lives.  Instead it waits, read-only,
 * and starts working by itself when the standby is promoted: fanout runs on
 * the new primary without a restart (issue 14 item 2, design doc §16).
 */
#ifndef IM_RECOVERY_WAIT_H
#define IM_RECOVERY_WAIT_H

/*
 * For a background worker between transactions: true while the server is
 * in recovery (a standby, or a primary still replaying after a crash).
 * Logs one LOG line when this worker starts waiting and one when recovery
 * has ended and it starts working; nothing in between.
 */
extern bool im_worker_in_recovery(void);

#endif
