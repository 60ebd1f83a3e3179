/*
 * locks.h — the row locks, always in the contract's lock order (§4):
 * the conversation row, then device rows, then user heads by user_id, then
 * user conversation states by (user_id, conversation_id) (locks.c).  A
 * writer asks placement before it locks (core/shard_map.h).
 */
#ifndef IM_LOCKS_H
#define IM_LOCKS_H

#include "core/im_sync.h"
#include "core/common.h"

typedef struct ImConversation
{
	int64		conversation_id;
	char		kind[8];		/* "direct" | "group" */
	char		mode[12];		/* "fanout" | "shared_log" */
	int64		head_msg_seq;
} ImConversation;

/*
 * Read the conversation row without locking it; P0002 when unknown.  conv
 * may be NULL when only existence matters.
 */
extern void im_require_conversation(int64 conversation_id, ImConversation *conv);
/* SELECT … FOR UPDATE on the conversation row; P0002 when unknown. */
extern void im_lock_conversation(int64 conversation_id, ImConversation *conv);
/* The same lock; false (nothing locked) when the conversation is unknown. */
extern bool im_try_lock_conversation(int64 conversation_id, ImConversation *conv);
/*
 * The one way a writer locks a conversation row: IS421 first when this node
 * does not own it (placement), then `sql` (kept in *plan; $1 the
 * conversation; result columns kind, mode, head_msg_seq of the locked row)
 * fills conv.  False, nothing locked, when the conversation is unknown.
 */
extern bool im_lock_conversation_with(SPIPlanPtr *plan, const char *sql,
									  int64 conversation_id, ImConversation *conv);

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
 * Ensure user heads exist and lock them in user_id order (n may be 0).
 * Sorts and deduplicates user_ids in place.  On a sharded node only the
 * users placed there (the others are left out, in place too).
 */
extern void im_lock_user_heads(int64 *user_ids, int n);

#endif							/* IM_LOCKS_H */
