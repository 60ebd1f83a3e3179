/*
 * conversation.h — the conversation side's cross-file API
 * (extension/conversation/): the single-writer append of a position
 * (append.c) and its fast path (direct_append.c), the idempotency key of
 * every request (request_key.c), the checks that send.c shares with
 * reactions, pins and replies (message_relations.c), and the SQL
 * a reader adds for reactions (history.c).  Conversations, membership, send
 * and the row rules (conversation.c, send.c, row_rules.c) export only SQL
 * functions.
 */
#ifndef IM_CONVERSATION_H
#define IM_CONVERSATION_H

#include "core/im_sync.h"
#include "core/common.h"
#include "core/locks.h"
#include "core/im_sql.h"

#include "datatype/timestamp.h"

/*
 * the single-writer append of a conversation position (append.c).
 */

/*
 * One new conversation position.  Zero / NULL fields are stored as NULL:
 * sender_id 0 and client_msg_id NULL for system events.
 */
typedef struct ImNewEvent
{
	const char *kind;			/* message create join leave recall edit mode takedown … */
	int64		sender_id;
	const char *client_msg_id;
	bytea	   *request_digest;
	const char *content_type;
	Datum		body;			/* jsonb; (Datum) 0 = NULL */
	int64		target_message_id;
	int64		subject_user_id;
	int64		reply_to_message_id;	/* a message's reply target */
	int64		pin_message_id; /* a pin's target */
	const char *trace_id;		/* the request's trace id (contract §21); NULL: none */
} ImNewEvent;

/*
 * Append ev at conv->head_msg_seq + 1.  The caller holds the conversation
 * row lock (im_lock_conversation), which makes msg_seq gap-free and unique.
 * Writes the event (with the mode in force), the new head and the outbox
 * item in one statement and asks the workers to wake at commit.  Returns
 * false, writing nothing, when (sender_id, client_msg_id) already exists.
 */
extern bool im_append_event(ImConversation *conv, const ImNewEvent *ev,
							int64 *message_id, int64 *msg_seq);
/*
 * The fast path's lock: UPDATE of the head to head + 1 (locks the row);
 * conv->head_msg_seq is the head before it.  False, nothing locked, for an
 * unknown conversation; IS421 when this node does not own it.
 */
extern bool im_take_next_position(int64 conversation_id, ImConversation *conv);
/* Moves the head back to conv->head_msg_seq (nothing was written at it). */
extern void im_give_back_position(const ImConversation *conv);

/*
 * The fast path of a member's message (ev->kind 'message', no target;
 * direct_append.c).  im_direct_append_begin, before the lock, opens and
 * checks what the writes need; NULL when this catalog's tables are not the
 * layout the direct path writes (then take the general path); traced: the
 * request has a trace id (the privileges checked are those of the general
 * path's traced statement).  After
 * im_take_next_position, im_append_member_message checks the sender's open
 * period and the idempotency key and writes event and outbox item at the
 * taken position.  False: nothing written (no member, or the key exists),
 * the position given back; the caller then takes the general path for the
 * right answer or error.  Wakes the workers at commit when true.
 */
typedef struct ImDirectAppend ImDirectAppend;
extern ImDirectAppend *im_direct_append_begin(bool traced);
extern bool im_append_member_message(ImDirectAppend *da, ImConversation *conv,
									 const ImNewEvent *ev, int64 *message_id, int64 *msg_seq);
extern void im_direct_append_end(ImDirectAppend *da);
/*
 * IS409 for a key reused for another request (request_key.c, the direct
 * path's raced insert): the message and hint, with client_msg_id and
 * sender_id as arguments of the message.
 */
#define IM_KEY_REUSED_ERRMSG \
	"client_msg_id \"%s\" of sender " INT64_FORMAT " was already used for a different request"
#define IM_KEY_REUSED_ERRHINT \
	"Use a new client_msg_id for a new message; reuse one only to retry the same request."

/* jsonb Datum from C text (for system event bodies). */
extern Datum im_jsonb_from_cstring(const char *json);

/*
 * reactions, pins and reply targets (message_relations.c, contract §14).
 */

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
 * A recall or takedown of target_message_id was just appended (send.c,
 * takedown.c, under the conversation lock): if the target is pinned, append a `pin` position
 * with the list without it, in the same transaction (with the recall's
 * trace id, NULL for none).
 */
extern void im_relation_recalled(ImConversation *conv, int64 target_message_id,
								 const char *trace_id);

/*
 * The tombstone of a recall or takedown (under the conversation lock, after
 * its position): the target and every edit and reaction of it lose their
 * bodies and are marked recalled, and with taken_down also taken_down
 * (readers then show recalled false; a catalog with the column only).
 */
extern void im_tombstone_target(int64 target_message_id, bool taken_down);

/*
 * Kinds fanned out through the dirty marker in a shared_log conversation
 * (contract §3, §4): messages, reactions and pins.  Only `message` raises
 * the marker's unread bound.
 */
extern bool im_kind_uses_marker(const char *kind);

/*
 * Whether this database's catalog has the event columns and kinds of
 * contract §14 (IM_CATALOG_HAS_RELATIONS, core/version_check.h).  The
 * library may serve an older catalog until ALTER EXTENSION im_sync UPDATE
 * (extension/doc/upgrades.md); the read paths then answer as its release
 * did: their page statements are written once per catalog shape and
 * prepared into one plan slot per shape (IM_PREPARE_SHAPED), the relation
 * columns NULLs on the older shape, and the C builder of the objects
 * (user/event_json.c) then adds no reply key and no reactions.  One
 * catalog lookup per transaction.
 */
extern bool im_relation_catalog(void);

/*
 * the idempotency key of a request (request_key.c), shared by every kind
 * (send, recall, edit, react, pin: one client_msg_id namespace).
 */

/*
 * SHA-256 over kind, conversation, target, content_type and body text (and
 * a reply's target when reply_to_message_id is not 0), each length-prefixed.
 */
extern bytea *im_request_digest(const char *kind, int64 conversation_id,
								int64 target_message_id, const char *content_type,
								const char *body_text, int64 reply_to_message_id);
/*
 * If (sender_id, client_msg_id) exists: true with the original's ids when
 * its digest matches (the stored body may have been edited or recalled
 * since, hence the digest), IS409 when it does not; the transaction then
 * takes an xid so its commit waits for a synchronous standby as the
 * original's did.  False when the key is new.  Inside SPI.
 */
extern bool im_request_existing(int64 sender_id, const char *client_msg_id,
								const bytea *digest, int64 *message_id, int64 *msg_seq);
/*
 * The durability of an answered retry (an xid, so its commit waits for a
 * synchronous standby as the original's did; a standby refuses): every
 * lookup that answers a retry with the original calls it.
 */
extern void im_request_retry_durable(void);
/* Whether the bytea column col of SPI result row `row` is this digest. */
extern bool im_request_digest_matches(uint64 row, int col, const bytea *digest);
/*
 * Both, for a react or pin request: detail and body_text stand in for
 * content_type and body in the digest; *digest is the one to store.
 */
extern bool im_request_lookup(const char *kind, int64 sender_id, int64 conversation_id,
							  const char *client_msg_id, int64 target_message_id,
							  const char *detail, const char *body_text,
							  bytea **digest, int64 *message_id, int64 *msg_seq);

/*
 * what a reader sees of a message's reactions (contract
 * §14): the SQL that history.c (fetch_messages) adds to message objects.
 */

#define OP_GET_JSON " OPERATOR(pg_catalog.->) "

/*
 * What user $1 sees of the reactions to the messages of a fetch_messages
 * page (contract §14), read up to position $4: two CTEs for the history
 * statement (history.c), after its `per` (the reader's periods) and `top`
 * (the page's positions):
 *   rx_latest  per (target, reacting user) the latest reaction position the
 *              reader may see: one of its periods covers both the target
 *              and that position, so a member who left sees nothing made
 *              after it left; found from the page's messages through
 *              event_reaction_idx, in one statement for the whole page;
 *   rx_counts  per target, the count of each key over those sets;
 *   rx_mine    per target, the reader's own set.
 * The page's rows join them once (IM_MESSAGE_REACTIONS_JOIN_SQL), never a
 * subquery per row.
 * A recalled target's reactions are tombstones (body NULL, send.c): none.
 */
#define IM_MESSAGE_REACTIONS_CTE_SQL \
	"rx_latest AS (" \
	"  SELECT DISTINCT ON (r.target_message_id, r.sender_id) " \
	"         r.target_message_id AS mid, r.sender_id, r.body" OP_GET_JSON "'reactions' AS keys " \
	"  FROM top t JOIN im.event r ON r.target_message_id" EQ "t.message_id " \
	"   AND r.kind" EQ "'reaction' AND r.msg_seq" LE "$4 " \
	"  WHERE EXISTS (SELECT 1 FROM per rp WHERE rp.join_seq" LE "t.msg_seq " \
	"                  AND (rp.leave_seq IS NULL OR rp.leave_seq" GE "r.msg_seq)) " \
	"  ORDER BY r.target_message_id, r.sender_id, r.msg_seq DESC), " \
	"rx_counts AS (" \
	"  SELECT c.mid, pg_catalog.jsonb_object_agg(c.k, c.n) AS counts FROM (" \
	"    SELECT l.mid, k.k, pg_catalog.count(*) AS n FROM rx_latest l " \
	"    CROSS JOIN LATERAL pg_catalog.jsonb_array_elements_text(l.keys) AS k(k) " \
	"    WHERE l.keys IS NOT NULL GROUP BY l.mid, k.k) c " \
	"  GROUP BY c.mid), " \
	"rx_mine AS (" \
	"  SELECT l.mid, l.keys FROM rx_latest l WHERE l.sender_id" EQ "$1 AND l.keys IS NOT NULL)"

/* Joined to the page's im.event rows `e` (history.c's ev). */
#define IM_MESSAGE_REACTIONS_JOIN_SQL \
	" LEFT JOIN rx_counts rxc ON rxc.mid" EQ "e.message_id " \
	" LEFT JOIN rx_mine rxm ON rxm.mid" EQ "e.message_id "

/*
 * The values of the keys a message of the page gets (history.c adds them to
 * messages only, user/event_json.c builds the object): `reactions`
 * ({"👍":2,…}, {} when none) and `my_reactions` (the reader's keys, [] when
 * none).
 */
#define IM_MESSAGE_REACTIONS_COLS_SQL \
	"COALESCE(rxc.counts, '{}'::pg_catalog.jsonb), COALESCE(rxm.keys, '[]'::pg_catalog.jsonb)"

/*
 * roles, mutes and bans in groups (roles.c, contract §17).
 */

/* IS403 "member muted" when muted_until (not NULL) is after now(). */
extern void im_roles_check_muted(TimestampTz muted_until, bool isnull, int64 user_id,
								 int64 conversation_id);
/* IS403 when user_id's open period in the conversation is muted now. */
extern void im_roles_require_not_muted(int64 conversation_id, int64 user_id);
/* 42501 when user_id is banned from the conversation (join). */
extern void im_roles_require_not_banned(int64 conversation_id, int64 user_id);
/* A new group's owner: user_id's open period gets the role. */
extern void im_roles_set_owner(int64 conversation_id, int64 user_id);
/*
 * After a leave position of leaver_id (caller holds the lock): when it was
 * the owner, the successor's `role` position.
 */
extern void im_roles_after_leave(ImConversation *conv, int64 leaver_id, bool was_owner);
/* After a join position: an ownerless group's joiner becomes owner. */
extern void im_roles_after_join(ImConversation *conv, int64 user_id, int64 period_id);
/* Close a period at leave_seq by the leave position leave_event_id (conversation.c). */
extern void im_close_period(int64 period_id, int64 leave_seq, int64 leave_event_id);

/*
 * The caller's role and mute in conversation `conv` (SQL expressions, for
 * conversation_list, recent_conversations and snapshot items): role NULL
 * in direct conversations and without an open period; muted_until NULL
 * unless a mute is in force now.
 */
#define IM_MY_ROLE_SQL(kind, user, conv) \
	"CASE WHEN " kind EQ "'group' THEN (SELECT COALESCE(rp.role, 'member') " \
	"  FROM im.membership_period rp WHERE rp.user_id" EQ user \
	"   AND rp.conversation_id" EQ conv " AND rp.leave_seq IS NULL) END"
#define IM_MY_MUTED_UNTIL_SQL(user, conv) \
	"(SELECT mp.muted_until FROM im.membership_period mp WHERE mp.user_id" EQ user \
	"   AND mp.conversation_id" EQ conv " AND mp.leave_seq IS NULL " \
	"   AND mp.muted_until" GT "pg_catalog.now())"

#endif							/* IM_CONVERSATION_H */
