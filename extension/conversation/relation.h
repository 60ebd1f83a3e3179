/*
 * relation.h — reactions, pins and reply targets (relation.c, contract §14).
 */
#ifndef IM_RELATION_H
#define IM_RELATION_H

#include "im_sync.h"
#include "common.h"

/* Contract §14 limits. */
#define IM_MAX_REACTION_CHARS 32
#define IM_MAX_REACTION_KEYS 20
#define IM_MAX_PINS 50

/*
 * The checks of a reply target, in contract §14's order (P0002, 42501,
 * 22023, IS409).  The caller holds the conversation lock.
 */
extern void im_relation_check_reply(int64 conversation_id, int64 user_id, int64 target_message_id);

/*
 * A recall of target_message_id was just appended (send.c, under the
 * conversation lock): if the target is pinned, append a `pin` position
 * with the list without it, in the same transaction.
 */
extern void im_relation_recalled(ImConversation *conv, int64 target_message_id);

/*
 * Kinds fanned out through the dirty marker in a shared_log conversation
 * (contract §3, §4): messages, reactions and pins.  Only `message` raises
 * the marker's unread bound.
 */
extern bool im_kind_uses_marker(const char *kind);

/*
 * Whether this database's catalog is at 1.3 or later (the event columns and
 * kinds of contract §14).  The library may serve an older catalog until
 * ALTER EXTENSION im_sync UPDATE (extension/doc/upgrades.md); the read
 * paths then keep their older statements and objects: each keeps a second
 * plan slot, and im_relation_sql() gives the statement text without the
 * fragments of this issue (IM_EVENT_RELATION_KEYS_SQL and
 * IM_MESSAGE_REACTIONS_SQL become an empty object).  One catalog lookup
 * per transaction.
 */
extern bool im_relation_catalog(void);
extern const char *im_relation_sql(const char *sql);

/* send.c: the digest and idempotency lookup shared by every kind. */
extern bool im_request_lookup(const char *kind, int64 sender_id, int64 conversation_id,
							  const char *client_msg_id, int64 target_message_id,
							  const char *detail, const char *body_text,
							  bytea **digest, int64 *message_id, int64 *msg_seq);

/*
 * SQL: extra keys of a position object (contract §11, §14), for an
 * im.event row aliased `e`: a message's reply_to_message_id; a pin's target
 * (kept in pin_message_id) as target_message_id.  jsonb keeps the last of
 * two equal keys, so concatenated after the base object it wins.
 */
#define IM_EVENT_RELATION_KEYS_SQL \
	"(CASE e.kind WHEN 'message' THEN " \
	"   pg_catalog.jsonb_build_object('reply_to_message_id', e.reply_to_message_id) " \
	" WHEN 'pin' THEN " \
	"   pg_catalog.jsonb_build_object('target_message_id', e.pin_message_id) " \
	" ELSE '{}'::pg_catalog.jsonb END)"

/*
 * The same keys' columns, for statements that build §11 objects in C
 * (event_json.c); NULLs on a pre-1.3 catalog (im_relation_sql).
 */
#define IM_EVENT_RELATION_COLS_SQL "e.reply_to_message_id, e.pin_message_id"

#endif							/* IM_RELATION_H */
