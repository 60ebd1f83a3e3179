/*
 * device_state.h — the one owner of a device's sync state (device_state.c):
 * its row lock, its generation, its GC leases and its last-seen time
 * (user side).
 */
#ifndef IM_DEVICE_STATE_H
#define IM_DEVICE_STATE_H

#include "im_sync.h"

typedef struct ImDevice
{
	int64		user_id;
	char		device_id[65];
	char		state[12];		/* NEW ACTIVE RECOVERING RESETTING REVOKED */
	int32		sync_generation;
	int64		acked_sync_seq;
	int64		issued_sync_seq;	/* highest sync_seq ever given to it */
	int64		connection_epoch;
	int32		registration;
} ImDevice;

/*
 * SELECT … FOR UPDATE on the device row; P0002 when never registered.  The
 * row lock orders every call of one device (contract §4 lock order: after
 * the conversation row, before user heads).
 */
extern void im_lock_device(int64 user_id, const char *device_id, ImDevice *dev);
/*
 * The same row without a lock: for a call that writes nothing (a sync
 * cursor page) and is correct as of the moment it read the row.
 */
extern void im_read_device(int64 user_id, const char *device_id, ImDevice *dev);
/*
 * Generation + 1 (kills every older token of the device) and new_state;
 * touches the device.  Caller holds the row lock; dev is updated in place.
 */
extern void im_device_bump_generation(ImDevice *dev, const char *new_state);
/* issued_sync_seq = max(issued, watermark): what was ever given to it. */
extern void im_device_note_issued(ImDevice *dev, int64 watermark);
/*
 * End the device's ACTIVE recovery sessions with `how` (ENDED when replaced
 * or revoked, EXPIRED when the lease ran out): releases their GC leases.
 */
extern void im_device_end_recovery_sessions(int64 user_id, const char *device_id,
											const char *how);
/*
 * End every lease the device holds on the log (contract §8): its active
 * recovery sessions (ENDED) and its unfinished snapshots (ABANDONED), which
 * can never be used once the generation moved or the device is revoked.
 */
extern void im_device_end_leases(int64 user_id, const char *device_id);
/* last_seen_at = now (the inactivity rule of the GC fence reads it). */
extern void im_device_touch(int64 user_id, const char *device_id);
/*
 * The same, unless last_seen_at is already within the last second: then
 * nothing is written, so a read that touches many times a second (sync
 * cursor pages) needs no WAL flush at commit.  The fence's inactivity
 * window is im_sync.device_inactive_after (30 days by default).
 */
extern void im_device_touch_coarse(int64 user_id, const char *device_id);

#endif							/* IM_DEVICE_STATE_H */
