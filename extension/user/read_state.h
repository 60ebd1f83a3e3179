/*
 * read_state.h — the user's read state (read_state.c).
 */
#ifndef IM_READ_STATE_H
#define IM_READ_STATE_H

#include "im_sync.h"

/*
 * Record a private event of user_id (kind "read_cursor" with read_msg_seq,
 * or "delete_for_me" with message_id; the unused one 0) and its outbox item
 * (msg_seq NULL, private_user_id set) in the caller's transaction, and ask
 * the workers to wake at commit.  Fanout alone assigns its sync_seq.  The
 * caller holds the user's head lock.  Returns the private_event_id.
 */
extern int64 im_enqueue_private_event(int64 user_id, int64 conversation_id,
									  const char *kind, int64 read_msg_seq,
									  int64 message_id);

#endif							/* IM_READ_STATE_H */
