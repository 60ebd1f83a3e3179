/*
 * hints.h — notifications from the LISTEN connection turned into hints and
 * device re-checks for the sessions of this gateway, with the cache of
 * which connected users are members of a shared_log conversation.
 */
#ifndef IM_GW_HINTS_H
#define IM_GW_HINTS_H

#include <stdint.h>

struct session;
struct im_job;

/*
 * Marks a NEW_EVENTS hint up to high watermark hw as pending for the
 * session; pending hints coalesce (at most one per kind, per conversation
 * for CONVERSATION_ADVANCED) and are written after the queued replies.
 */
extern void im_push_hint(struct session *s, int64_t hw);

/* Finished jobs of this module: a notification, LISTEN (re)established
 * for the users of the buckets in mask (bit b: user_id % 64 == b), a member
 * lookup. */
extern void im_on_notify_job(struct im_job *j);
extern void im_on_listen_up(uint64_t buckets);
extern void im_on_members_job(struct im_job *j);

#endif
