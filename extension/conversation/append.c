/*
 * append.c — the single-writer append of a conversation position, used by
 * send/recall/edit, membership events and mode switches (conversation side).
 *
 * Invariants protected here (design §2.3, contract §1/§3):
 *   - msg_seq is gap-free and unique per conversation: every position is
 *     assigned as head + 1 while the caller holds the conversation row lock,
 *     and the event, the new head and its outbox item are written in one
 *     statement (a member's message: the head by the statement that takes
 *     the lock, event and outbox item by the direct inserts of
 *     direct_append.c, in the same transaction);
 *   - a position suppressed by its idempotency key writes nothing (no gap;
 *     a taken position is given back);
 *   - every position gets its outbox item, and the fanout workers are woken
 *     at commit (never by NOTIFY, which would serialize every send);
 *   - a member's message (im_append_member_message, direct_append.c) is
 *     checked against the sender's open period on a snapshot taken after
 *     the conversation row lock is held, so a concurrent leave is either
 *     before it (seen, the send is refused) or after it (inside the period).
 */
#include "core/im_sync.h"
#include "core/common.h"
#include "core/locks.h"
#include "core/shard_map.h"
#include "core/shmem.h"
#include "core/im_sql.h"
#include "conversation/conversation.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"

Datum
im_jsonb_from_cstring(const char *json)
{
	return DirectFunctionCall1(jsonb_in, CStringGetDatum(json));
}

/* Result columns of the append statement. */
enum
{
	Anum_append_message_id = 1,
	Anum_append_msg_seq,
	Anum_append_heads_moved,
	Anum_append_outbox_items
};

/*
 * After the event CTE `ins` of conversation $1: move the head to its
 * position and queue its outbox item, both only if `ins` wrote a row (the
 * append statements of both paths end with it).
 */
#define APPEND_OUTBOX_SQL(ob_cols, ob_vals) \
	" ob AS (" \
	"  INSERT INTO im.outbox (conversation_id, msg_seq, source_event_id" ob_cols ")" \
	"  SELECT $1, ins.msg_seq, ins.message_id" ob_vals " FROM ins RETURNING 1)"
#define APPEND_HEAD_OUTBOX_SQL(ob_cols, ob_vals) \
	" head AS (" \
	"  UPDATE im.conversation c SET head_msg_seq = ins.msg_seq FROM ins" \
	"  WHERE c.conversation_id" EQ "$1 RETURNING 1)," \
	APPEND_OUTBOX_SQL(ob_cols, ob_vals)

/*
 * Parameters $1..$8, the same in both append statements: conversation,
 * position, kind, sender, client_msg_id, digest, content_type, body.
 */
static void
set_event_args(const ImConversation *conv, const ImNewEvent *ev, Datum *args, char *nulls)
{
	args[0] = Int64GetDatum(conv->conversation_id);
	args[1] = Int64GetDatum(conv->head_msg_seq + 1);
	args[2] = CStringGetTextDatum(ev->kind);
	args[3] = Int64GetDatum(ev->sender_id);
	if (ev->sender_id == 0)
		nulls[3] = 'n';
	args[4] = ev->client_msg_id ? CStringGetTextDatum(ev->client_msg_id) : (Datum) 0;
	if (ev->client_msg_id == NULL)
		nulls[4] = 'n';
	args[5] = PointerGetDatum(ev->request_digest);
	if (ev->request_digest == NULL)
		nulls[5] = 'n';
	args[6] = ev->content_type ? CStringGetTextDatum(ev->content_type) : (Datum) 0;
	if (ev->content_type == NULL)
		nulls[6] = 'n';
	args[7] = ev->body;
	if (ev->body == (Datum) 0)
		nulls[7] = 'n';
}

/*
 * The position at conv's head + 1 was written: its head and outbox counts
 * (result columns) must be one each; the caller's copy of the head moves and
 * the workers are woken at commit.
 */
static void
append_written(ImConversation *conv, int heads_moved_col, int outbox_items_col)
{
	if (im_get_int64(0, heads_moved_col, NULL) != 1 ||
		im_get_int64(0, outbox_items_col, NULL) != 1)
		elog(ERROR, "im_sync: append to conversation " INT64_FORMAT " did not write head and outbox",
			 conv->conversation_id);
	conv->head_msg_seq++;
	im_wake_fanout_at_commit();
}

/*
 * The append statement; extra_cols/extra_vals: the reply and pin target
 * (and trace id) columns of the event, ob_cols/ob_vals: the outbox item's
 * trace id; id: the parameter holding the new message_id, which carries its
 * conversation's bucket (im_shard_next_placed_id, shard_map.h).
 */
#define APPEND_SQL(extra_cols, extra_vals, id, ob_cols, ob_vals) \
	"WITH ins AS (" \
	"  INSERT INTO im.event (message_id, conversation_id, msg_seq, kind, sender_id, client_msg_id," \
	"                        request_digest, content_type, body, target_message_id," \
	"                        subject_user_id, mode" extra_cols ")" \
	"  VALUES (" id ", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11" extra_vals ")" \
	"  ON CONFLICT (sender_id, client_msg_id) WHERE request_digest IS NOT NULL DO NOTHING" \
	"  RETURNING message_id, msg_seq)," \
	APPEND_HEAD_OUTBOX_SQL(ob_cols, ob_vals) \
	"SELECT ins.message_id, ins.msg_seq, (SELECT pg_catalog.count(*) FROM head)," \
	"       (SELECT pg_catalog.count(*) FROM ob) FROM ins"

bool
im_append_event(ImConversation *conv, const ImNewEvent *ev,
				int64 *message_id, int64 *msg_seq)
{
	static SPIPlanPtr plan;
	static SPIPlanPtr relation_plan;
	static SPIPlanPtr traced_plan;
	SPIPlanPtr	p;
	Datum		args[15];
	char		nulls[15];
	int			id_arg;

	/*
	 * One statement: if the event insert is suppressed by the idempotency
	 * key, the head and outbox CTEs see no row and change nothing, so a
	 * suppressed append leaves no gap.  A reply or pin also writes its
	 * target column, a traced request the trace id of event and outbox item
	 * (a trace id comes only through the signatures of a catalog with the
	 * column); every other append keeps the statement a pre-1.3 catalog
	 * understands (the library may run on one until ALTER EXTENSION UPDATE).
	 */
	if (ev->trace_id != NULL)
	{
		p = im_prepare(&traced_plan,
					   APPEND_SQL(", reply_to_message_id, pin_message_id, trace_id", ", $12, $13, $15",
								  "$14", ", trace_id", ", $15"),
					   15, INT8OID, INT8OID, TEXTOID, INT8OID, TEXTOID, BYTEAOID, TEXTOID,
					   JSONBOID, INT8OID, INT8OID, TEXTOID, INT8OID, INT8OID, INT8OID, TEXTOID);
		id_arg = 13;
	}
	else if (ev->reply_to_message_id != 0 || ev->pin_message_id != 0)
	{
		p = im_prepare(&relation_plan,
					   APPEND_SQL(", reply_to_message_id, pin_message_id", ", $12, $13", "$14", "", ""),
					   14, INT8OID, INT8OID, TEXTOID, INT8OID, TEXTOID, BYTEAOID, TEXTOID,
					   JSONBOID, INT8OID, INT8OID, TEXTOID, INT8OID, INT8OID, INT8OID);
		id_arg = 13;
	}
	else
	{
		p = im_prepare(&plan, APPEND_SQL("", "", "$12", "", ""),
					   12, INT8OID, INT8OID, TEXTOID, INT8OID, TEXTOID, BYTEAOID, TEXTOID,
					   JSONBOID, INT8OID, INT8OID, TEXTOID, INT8OID);
		id_arg = 11;
	}

	memset(nulls, ' ', sizeof(nulls));
	set_event_args(conv, ev, args, nulls);
	args[8] = Int64GetDatum(ev->target_message_id);
	if (ev->target_message_id == 0)
		nulls[8] = 'n';
	args[9] = Int64GetDatum(ev->subject_user_id);
	if (ev->subject_user_id == 0)
		nulls[9] = 'n';
	args[10] = CStringGetTextDatum(conv->mode);
	/* contract §14: reply and pin targets, NULL when 0 */
	args[11] = Int64GetDatum(ev->reply_to_message_id);
	nulls[11] = ev->reply_to_message_id == 0 ? 'n' : ' ';
	args[12] = Int64GetDatum(ev->pin_message_id);
	nulls[12] = ev->pin_message_id == 0 ? 'n' : ' ';
	/* a suppressed append uses up its id, as nextval in the statement did */
	args[id_arg] = Int64GetDatum(im_shard_next_placed_id("event_id_seq", conv->conversation_id));
	nulls[id_arg] = ' ';
	if (ev->trace_id != NULL)
		args[14] = CStringGetTextDatum(ev->trace_id);

	if (im_exec(p, args, nulls, 0) == 0)
		return false;
	*message_id = im_get_int64(0, Anum_append_message_id, NULL);
	*msg_seq = im_get_int64(0, Anum_append_msg_seq, NULL);
	Assert(*msg_seq == conv->head_msg_seq + 1);
	append_written(conv, Anum_append_heads_moved, Anum_append_outbox_items);
	return true;
}

/*
 * The fast path's lock: the conversation row is locked by the
 * write of its next position itself, so the lock window starts with the
 * write instead of a row-lock record followed by a second update of the
 * row.  An UPDATE that waited for the previous writer re-reads the newest
 * row (READ COMMITTED), so the position is the newest head + 1: msg_seq stays
 * gap-free under the single writer.  conv->head_msg_seq is the head before
 * the taken position (the position is conv->head_msg_seq + 1), as after
 * im_try_lock_conversation.  False, nothing locked, for an unknown
 * conversation; IS421 on a node that does not own it.
 */
bool
im_take_next_position(int64 conversation_id, ImConversation *conv)
{
	static SPIPlanPtr plan;

	if (!im_lock_conversation_with(&plan,
								   "UPDATE im.conversation SET head_msg_seq = head_msg_seq + 1 "
								   "WHERE conversation_id" EQ "$1 RETURNING kind, mode, head_msg_seq",
								   conversation_id, conv))
		return false;
	conv->head_msg_seq--;		/* the row shows the taken position */
	return true;
}

/*
 * Undo of im_take_next_position when nothing was written at the position
 * (a retry, a non-member): the head returns to conv->head_msg_seq, so no
 * gap is left; the row stays locked by this transaction.
 */
void
im_give_back_position(const ImConversation *conv)
{
	static SPIPlanPtr plan;
	Datum		args[2];

	im_prepare(&plan,
			   "UPDATE im.conversation SET head_msg_seq = $2 "
			   "WHERE conversation_id" EQ "$1 AND head_msg_seq" EQ "$2 + 1",
			   2, INT8OID, INT8OID);
	args[0] = Int64GetDatum(conv->conversation_id);
	args[1] = Int64GetDatum(conv->head_msg_seq);
	if (im_exec(plan, args, NULL, 0) != 1)
		elog(ERROR, "im_sync: head of conversation " INT64_FORMAT " moved under its row lock",
			 conv->conversation_id);
}
