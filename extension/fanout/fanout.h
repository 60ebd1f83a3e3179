/*
 * fanout.h — the bridge from the conversation side to the user side:
 * outbox items become per-user log events (fanout.c, the only writer of
 * sync_seq) or, in shared_log mode, dirty markers (fanout_shared_log.c).
 */
#ifndef IM_FANOUT_H
#define IM_FANOUT_H

#include "im_sync.h"
#include "im_sql.h"

#include "lib/stringinfo.h"

/*
 * The outbox items a fanout batch claimed, kept in a memory context that
 * outlives the batch's transaction: when the batch fails outside any one
 * item, its items are charged (or backed off) afterwards (contract §4).
 */
typedef struct ImFanoutClaim
{
	MemoryContext cxt;
	int64	   *ids;
	int			n;
	int			max;
} ImFanoutClaim;
extern void im_fanout_claim_init(ImFanoutClaim *claim, MemoryContext cxt);
/*
 * Process at most max_items outbox items in the caller's transaction,
 * recording what it claims in *claim.  Appends "user_id:high_watermark" and
 * "c<conv>:<head>" hint entries to *hints (comma separated, may be NULL).
 * Returns items processed.  A conversation with more than 500 active
 * members, or whose head item failed before, gets a batch of its own, so
 * small conversations never wait for a large group's commit and a failing
 * conversation cannot take healthy ones down with it.
 * Must be called inside SPI_connect.
 */
extern int64 im_fanout_batch(int max_items, StringInfo hints, ImFanoutClaim *claim);
/* SQLSTATE classes 08, 40, 53, 57, 58 and 55P03: never charged (§4). */
extern bool im_fanout_error_is_transient(int sqlerrcode);
/*
 * A batch failed outside any one item: back off (transient) or charge an
 * attempt to (otherwise) every item it claimed.  Runs in a transaction
 * after the failed one, inside SPI_connect.
 */
extern void im_fanout_batch_failed(const ImFanoutClaim *claim, ErrorData *edata);
/* Send hints as NOTIFY im_sync_hint, one per <= 7000-byte chunk. */
extern void im_send_hints(StringInfo hints);

/*
 * shared_log delivery (fanout_shared_log.c), called by fanout in the
 * batch's transaction with the members' heads already locked.
 * im_shared_log_deliver fans out a run of consecutive shared_log `message`
 * positions of one conversation (dirty markers instead of inbox events,
 * coalesced per batch) and returns the users whose log head moved.
 * im_shared_log_mode_delivered runs after a `mode` event is delivered
 * (recount unread on the switch back to fanout).
 */
extern void im_shared_log_deliver(int64 conversation_id, int64 *message_ids, int nmessages,
								  StringInfo hints, int64 **users, int *nusers);
extern void im_shared_log_mode_delivered(int64 message_id);

/*
 * The tail of a statement that appends one event per user to the log: a
 * CTE `ins AS (INSERT INTO im.inbox … SELECT …` is closed by this fragment,
 * which skips an event the log already holds (the inbox key) and moves the
 * head of every user it appended to (CTE `hd`).  The caller holds the
 * heads and numbered the event head + 1.
 */
#define IM_INBOX_APPEND_TAIL_SQL \
	"  ON CONFLICT (user_id, source_event_id, delivery_scope) DO NOTHING" \
	"  RETURNING user_id, sync_seq)," \
	" hd AS (" \
	"  UPDATE im.user_head h SET high_watermark = ins.sync_seq FROM ins" \
	"  WHERE h.user_id" EQ "ins.user_id RETURNING h.user_id)"

/*
 * Recipients of a conversation position (contract §1): periods covering its
 * msg_seq; for recall/edit the periods covering the TARGET's msg_seq; for a
 * leave also the period it closes.  Columns: outbox_id, user_id,
 * membership_period_id.  $1 is an outbox_id array.  Local fanout and the
 * transfers to other nodes (transfer_out.c) use this one definition.
 */
#define IM_FANOUT_RECIPIENTS_SQL \
	"SELECT o.outbox_id, p.user_id, p.membership_period_id " \
	"FROM im.outbox o " \
	"JOIN im.event e ON e.message_id" EQ "o.source_event_id " \
	"LEFT JOIN im.event t ON t.message_id" EQ "e.target_message_id " \
	"JOIN im.membership_period p ON p.conversation_id" EQ "e.conversation_id " \
	" AND (" IM_PERIOD_COVERS_SQL("p", "COALESCE(t.msg_seq, e.msg_seq)") \
	"      OR (e.kind" EQ "'leave' AND p.leave_event_id" EQ "e.message_id)) " \
	/* issue 11: a reaction needs the period to cover its own position too */ \
	" AND (e.kind" NE "'reaction' OR " IM_PERIOD_COVERS_SQL("p", "e.msg_seq") ") " \
	"WHERE o.outbox_id" EQ "ANY ($1::pg_catalog.int8[]) AND o.private_user_id IS NULL "

/*
 * issue 15, transfer_out.c: in the fanout (sub)transaction of delivered
 * position items, one transfer record per other node that places some of
 * their recipients.  Nothing on an unsharded node.
 */
extern void im_transfer_out_write(const int64 *outbox_ids, int n);

#endif							/* IM_FANOUT_H */
