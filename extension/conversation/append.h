/*
 * append.h — the single-writer append of a conversation position (append.c).
 */
#ifndef IM_APPEND_H
#define IM_APPEND_H

#include "im_sync.h"

/*
 * One new conversation position.  Zero / NULL fields are stored as NULL:
 * sender_id 0 and client_msg_id NULL for system events.
 */
typedef struct ImNewEvent
{
	const char *kind;			/* message create join leave recall edit mode */
	int64		sender_id;
	const char *client_msg_id;
	bytea	   *request_digest;
	const char *content_type;
	Datum		body;			/* jsonb; (Datum) 0 = NULL */
	int64		target_message_id;
	int64		subject_user_id;
	int64		reply_to_message_id;	/* issue 11: a message's reply target */
	int64		pin_message_id; /* issue 11: a pin's target */
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
 * layout the direct path writes (then take the general path).  After
 * im_take_next_position, im_append_member_message checks the sender's open
 * period and the idempotency key and writes event and outbox item at the
 * taken position.  False: nothing written (no member, or the key exists),
 * the position given back; the caller then takes the general path for the
 * right answer or error.  Wakes the workers at commit when true.
 */
typedef struct ImDirectAppend ImDirectAppend;
extern ImDirectAppend *im_direct_append_begin(void);
extern bool im_append_member_message(ImDirectAppend *da, ImConversation *conv,
									 const ImNewEvent *ev, int64 *message_id, int64 *msg_seq);
extern void im_direct_append_end(ImDirectAppend *da);
/*
 * IS409 for a key reused for another request (send.c's lookup, the direct
 * path's raced insert): the message and hint, with client_msg_id and
 * sender_id as arguments of the message.
 */
#define IM_KEY_REUSED_ERRMSG \
	"client_msg_id \"%s\" of sender " INT64_FORMAT " was already used for a different request"
#define IM_KEY_REUSED_ERRHINT \
	"Use a new client_msg_id for a new message; reuse one only to retry the same request."

/* jsonb Datum from C text (for system event bodies). */
extern Datum im_jsonb_from_cstring(const char *json);

#endif							/* IM_APPEND_H */
