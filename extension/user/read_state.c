/*
 * read_state.c — the user's read cursor (report_read), deletions for oneself
 * (delete_for_me), the private events that carry both to the user's other
 * devices, message_status, and clear_dirty, the version CAS on a
 * shared_log dirty marker (contract §7, design §13, §12.4, §0.1, §10.3);
 * user side.
 *
 * Invariants protected:
 *   - the read cursor is per user and only moves forward, clamped to what
 *     fanout has placed in the user's state; it clears only the positions it
 *     covers, so a message fanned out while the report runs stays unread
 *     (§13.3): unread_count is recounted from facts with the new cursor,
 *     under the user's head lock, which every fanout of this user also holds;
 *   - reading never moves a device ACK (§13.2, §2.3): other devices learn
 *     the cursor from a read_cursor private event in their log, which only
 *     fanout writes (one writer of sync_seq);
 *   - lock order (contract §4): the user head, then the user's state row.
 */
#include "core/im_sync.h"
#include "core/common.h"
#include "core/locks.h"
#include "core/shard_map.h"
#include "core/shmem.h"
#include "core/im_sql.h"
#include "core/standing.h"
#include "user/user.h"

#include "catalog/pg_type.h"
#include "utils/array.h"
#include "utils/builtins.h"

/*
 * The private event and its outbox item; its id carries the bucket of
 * id_key (see im_enqueue_private_event and the hand-off below).  The
 * request's trace id (NULL: none) is kept on the outbox item only: fanout
 * reads it there, and the private event row is read by nothing that logs.
 */
#define PRIVATE_EVENT_SQL(ob_cols, ob_vals) \
	"WITH pe AS (" \
	"  INSERT INTO im.private_event (private_event_id, user_id, conversation_id, kind, read_msg_seq, message_id) " \
	"  VALUES ($6, $7, $2, $3, $4, $5) RETURNING private_event_id, user_id, conversation_id) " \
	"INSERT INTO im.outbox (conversation_id, msg_seq, source_event_id, private_user_id" ob_cols ") " \
	"SELECT pe.conversation_id, NULL, pe.private_event_id, pe.user_id" ob_vals " FROM pe " \
	"RETURNING source_event_id"

static int64
enqueue_private_event_keyed(int64 user_id, int64 conversation_id, const char *kind,
							int64 read_msg_seq, int64 message_id, int64 id_key,
							const char *trace_id)
{
	static SPIPlanPtr plan;
	static SPIPlanPtr traced_plan;
	SPIPlanPtr	p;
	Datum		args[8];
	char		nulls[8] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};

	/*
	 * One statement: the event and its outbox item cannot come apart.
	 * The id ($6) carries the bucket of id_key (shard_map.h) —
	 * the user's, or for a deletion handed off to the user's node the
	 * conversation's — a bucket this node owns, so it never equals a copied
	 * event's id (those carry other nodes' buckets) in the outbox's
	 * source_event_id key.  A trace id comes only through the signatures
	 * of a catalog with the outbox column (else the older statement).
	 */
	if (trace_id != NULL)
	{
		p = im_prepare(&traced_plan, PRIVATE_EVENT_SQL(", trace_id", ", $8"),
					   8, INT8OID, INT8OID, TEXTOID, INT8OID, INT8OID, INT8OID, INT8OID, TEXTOID);
		args[7] = CStringGetTextDatum(trace_id);
	}
	else
		p = im_prepare(&plan, PRIVATE_EVENT_SQL("", ""),
					   7, INT8OID, INT8OID, TEXTOID, INT8OID, INT8OID, INT8OID, INT8OID);
	args[0] = Int64GetDatum(id_key);
	args[1] = Int64GetDatum(conversation_id);
	args[2] = CStringGetTextDatum(kind);
	args[3] = Int64GetDatum(read_msg_seq);
	args[4] = Int64GetDatum(message_id);
	args[5] = Int64GetDatum(im_shard_next_placed_id("event_id_seq", id_key));
	args[6] = Int64GetDatum(user_id);
	if (read_msg_seq == 0)
		nulls[3] = 'n';
	if (message_id == 0)
		nulls[4] = 'n';
	if (im_exec(p, args, nulls, 0) != 1)
		elog(ERROR, "im_sync: private event was not recorded");
	im_wake_fanout_at_commit();
	return im_get_int64(0, 1, NULL);
}

int64
im_enqueue_private_event(int64 user_id, int64 conversation_id,
						 const char *kind, int64 read_msg_seq, int64 message_id,
						 const char *trace_id)
{
	return enqueue_private_event_keyed(user_id, conversation_id, kind, read_msg_seq,
									   message_id, user_id, trace_id);
}

/* IM_UNREAD_RECOUNT_SQL for one user and conversation at read cursor `read`. */
static int64
unread_recount(int64 user_id, int64 conversation_id, int64 read)
{
	static SPIPlanPtr plan;
	Datum		args[3];

	im_prepare(&plan, IM_UNREAD_RECOUNT_SQL, 3, INT8OID, INT8OID, INT8OID);
	args[0] = Int64GetDatum(user_id);
	args[1] = Int64GetDatum(conversation_id);
	args[2] = Int64GetDatum(read);
	im_exec(plan, args, NULL, 1);
	return im_get_int64(0, 1, NULL);
}

PG_FUNCTION_INFO_V1(im_report_read);
/*
 * report_read(user_id, conversation_id, read_to_seq) moves the user's read
 * cursor forward to read_to_seq, clamped to the user's last visible position
 * (contract §3: last_msg_seq, or in shared_log mode the dirty target); a
 * lower value changes nothing.  Returns the cursor and unread count now.
 */
Datum
im_report_read(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr state_plan;
	static SPIPlanPtr update_plan;
	int64		user_id = im_arg_user_id(fcinfo, 0, "user_id");
	int64		conversation_id = im_arg_id(fcinfo, 1, "conversation_id");
	int64		read_to_seq;
	ImConversation conv;
	Datum		args[4];
	Datum		values[2];
	bool		nulls[2] = {false, false};
	int64		read_msg_seq = 0;
	int64		unread_count = 0;
	char	   *trace_id;

	if (PG_ARGISNULL(2) || PG_GETARG_INT64(2) < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("read_to_seq must be a non-negative msg_seq")));
	read_to_seq = PG_GETARG_INT64(2);
	trace_id = im_arg_trace_id(fcinfo, 3);

	im_srf_begin(fcinfo);
	im_spi_connect();
	im_user_check_standing(user_id);	/* IS403 for a suspended account (contract §17) */

	im_require_conversation(conversation_id, &conv);
	im_require_ever_member(user_id, conversation_id,
						   "Only a conversation the user has or had a membership period in can be read.");

	/* Lock order: the user head first, so no fanout of this user runs now. */
	im_lock_user_heads(&user_id, 1);
	im_prepare(&state_plan,
			   "SELECT last_msg_seq, read_msg_seq, unread_count, dirty_target_msg_seq "
			   "FROM im.user_conversation "
			   "WHERE user_id" EQ "$1 "
			   "AND conversation_id" EQ "$2 FOR UPDATE",
			   2, INT8OID, INT8OID);
	args[0] = Int64GetDatum(user_id);
	args[1] = Int64GetDatum(conversation_id);

	/* No state row yet: fanout placed nothing, so nothing can be covered. */
	if (im_exec(state_plan, args, NULL, 1) == 1)
	{
		bool		shared_log = strcmp(conv.mode, "shared_log") == 0;
		int64		last = im_get_int64(0, 1, NULL);
		int64		target = im_get_int64(0, 4, NULL);
		int64		limit = shared_log ? Max(last, target) : last;
		int64		wanted = Min(read_to_seq, limit);

		read_msg_seq = im_get_int64(0, 2, NULL);
		unread_count = im_get_int64(0, 3, NULL);

		if (wanted > read_msg_seq)
		{
			/* the cursor moves: one queued row for the receipts (receipt.c) */
			im_receipt_note(user_id, conversation_id, read_msg_seq, wanted);
			read_msg_seq = wanted;
			/*
			 * Recount with the new cursor rather than zeroing: a message
			 * above it stays unread (§13.3).  Exact in both modes: in
			 * shared_log mode the marker write later raises it to the upper
			 * bound of contract §3, which is never below the true count.
			 */
			unread_count = unread_recount(user_id, conversation_id, read_msg_seq);

			im_prepare(&update_plan,
					   "UPDATE im.user_conversation "
					   "SET read_msg_seq = $3, unread_count = $4, "
					   "    version = version" PLUS "1 "
					   "WHERE user_id" EQ "$1 "
					   "AND conversation_id" EQ "$2",
					   4, INT8OID, INT8OID, INT8OID, INT8OID);
			args[2] = Int64GetDatum(read_msg_seq);
			args[3] = Int64GetDatum(unread_count);
			im_exec(update_plan, args, NULL, 0);

			im_enqueue_private_event(user_id, conversation_id, "read_cursor",
									 read_msg_seq, 0, trace_id);
		}
	}

	values[0] = Int64GetDatum(read_msg_seq);
	values[1] = Int64GetDatum(unread_count);
	im_srf_row(fcinfo, values, nulls);
	SPI_finish();
	return (Datum) 0;
}

/*
 * Record that user_id deleted message_id of conversation_id for itself, in
 * the caller's transaction: the deleted_for_me row, the unread recount of
 * the user's state here (if it has one), and — when local_event — the
 * delete_for_me private event for the user's devices.  The caller checked
 * that the user may delete it.  False when it was recorded before (nothing
 * changes: idempotent).
 */
static bool
record_deletion(int64 user_id, int64 conversation_id, int64 message_id, bool local_event,
				const char *trace_id)
{
	static SPIPlanPtr insert_plan;
	static SPIPlanPtr recount_plan;
	static SPIPlanPtr cursor_plan;
	Datum		args[3];

	im_lock_user_heads(&user_id, 1);

	im_prepare(&insert_plan,
			   "INSERT INTO im.deleted_for_me (user_id, message_id) VALUES ($1, $2) "
			   "ON CONFLICT (user_id, message_id) DO NOTHING",
			   2, INT8OID, INT8OID);
	args[0] = Int64GetDatum(user_id);
	args[1] = Int64GetDatum(message_id);
	if (im_exec(insert_plan, args, NULL, 0) == 0)
		return false;

	/*
	 * The deleted message stops counting as unread (contract §3).  Exact in
	 * both modes (in shared_log mode a stale upper bound could otherwise
	 * stay above the bound of a marker that has not moved since).  The
	 * recount sees the row inserted above.
	 */
	im_prepare(&recount_plan,
			   "UPDATE im.user_conversation uc "
			   "SET unread_count = (" IM_UNREAD_RECOUNT_SQL "), "
			   "    version = uc.version" PLUS "1 "
			   "WHERE uc.user_id" EQ "$1 "
			   "AND uc.conversation_id" EQ "$2 "
			   "AND uc.read_msg_seq" EQ "$3",
			   3, INT8OID, INT8OID, INT8OID);
	/* The cursor cannot move meanwhile: we hold the user head. */
	im_prepare(&cursor_plan,
			   "SELECT read_msg_seq FROM im.user_conversation "
			   "WHERE user_id" EQ "$1 "
			   "AND conversation_id" EQ "$2 FOR UPDATE",
			   2, INT8OID, INT8OID);
	args[1] = Int64GetDatum(conversation_id);
	if (im_exec(cursor_plan, args, NULL, 1) == 1)
	{
		args[2] = Int64GetDatum(im_get_int64(0, 1, NULL));
		im_exec(recount_plan, args, NULL, 0);
	}

	if (local_event)
		im_enqueue_private_event(user_id, conversation_id, "delete_for_me", 0, message_id,
								 trace_id);
	return true;
}

/*
 * The hand-off of a deletion to the node of a user placed elsewhere (issue
 * 15): a delete_for_me private event of this conversation's node with its
 * outbox item, written with the deletion, so the deletion and its hand-off
 * commit together.  Its fanout writes the transfer to the user's node
 * (transfer_out.c, im_transfer_out_write_deletion) after the conversation's
 * pending positions, and that node records the deletion when it applies it
 * (im_transfer_apply_deletion).  Its id carries the conversation's bucket
 * (this node's), never the remote user's.  With only_if_missing, nothing
 * when a hand-off of this deletion is already recorded here (once
 * retention collected it, a repeated call hands it off again: the user's
 * node then changes nothing).
 */
static void
hand_off_deletion(int64 user_id, int64 conversation_id, int64 message_id, bool only_if_missing,
				  const char *trace_id)
{
	if (only_if_missing)
	{
		static SPIPlanPtr plan;
		Datum		args[2];

		im_prepare(&plan,
				   "SELECT 1 FROM im.private_event "
				   "WHERE user_id" EQ "$1 AND message_id" EQ "$2 AND kind" EQ "'delete_for_me'",
				   2, INT8OID, INT8OID);
		args[0] = Int64GetDatum(user_id);
		args[1] = Int64GetDatum(message_id);
		if (im_exec(plan, args, NULL, 1) == 1)
			return;
	}
	(void) enqueue_private_event_keyed(user_id, conversation_id, "delete_for_me", 0,
									   message_id, conversation_id, trace_id);
}

PG_FUNCTION_INFO_V1(im_delete_for_me);
/*
 * delete_for_me(user_id, conversation_id, message_id): hides a message the
 * user can see from that user only (§12.4: not a recall).  True when
 * recorded now, false when it was already deleted; P0002 for a message the
 * user cannot see.  Unread is recounted so the deleted message stops
 * counting, and the user's devices learn it from a delete_for_me event.
 *
 * Sharded, on the conversation's node of a user placed
 * elsewhere: the deletion is recorded here (fetch_messages) and handed off
 * to the user's node in the same transaction (hand_off_deletion), so one
 * call on this node is the whole operation — either both sides get it, in
 * order with the message, or neither.  A deletion recorded here without a
 * hand-off (by an older version, whose second call to the user's node
 * failed) gets one when it is deleted again (still false: it was deleted
 * here before; the user's node records it if it lacks it).
 */
Datum
im_delete_for_me(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr visible_plan;
	int64		user_id = im_arg_user_id(fcinfo, 0, "user_id");
	int64		conversation_id = im_arg_id(fcinfo, 1, "conversation_id");
	int64		message_id = im_arg_id(fcinfo, 2, "message_id");
	char	   *trace_id = im_arg_trace_id(fcinfo, 3);
	ImConversation conv;
	Datum		args[3];
	bool		user_here;
	bool		done;

	im_spi_connect();
	im_user_check_standing(user_id);	/* IS403 for a suspended account (contract §17) */

	im_require_conversation(conversation_id, &conv);

	/* A `message` of this conversation inside one of the user's periods. */
	im_prepare(&visible_plan,
			   "SELECT 1 FROM im.event e JOIN im.membership_period p "
			   "  ON p.conversation_id" EQ "e.conversation_id "
			   " AND p.user_id" EQ "$1 "
			   " AND " IM_PERIOD_COVERS_SQL("p", "e.msg_seq") " "
			   "WHERE e.message_id" EQ "$3 "
			   "  AND e.conversation_id" EQ "$2 "
			   "  AND e.kind" EQ "'message'",
			   3, INT8OID, INT8OID, INT8OID);
	args[0] = Int64GetDatum(user_id);
	args[1] = Int64GetDatum(conversation_id);
	args[2] = Int64GetDatum(message_id);
	if (im_exec(visible_plan, args, NULL, 1) != 1)
		ereport(ERROR,
				(errcode(ERRCODE_NO_DATA_FOUND),
				 errmsg("message " INT64_FORMAT " of conversation " INT64_FORMAT
						" is not visible to user " INT64_FORMAT,
						message_id, conversation_id, user_id),
				 errdetail("Only a message inside one of the user's membership periods can be deleted for the user.")));

	user_here = im_shard_owns_bucket(im_shard_bucket(user_id));
	done = record_deletion(user_id, conversation_id, message_id, user_here, trace_id);
	if (!user_here && im_shard_owns_bucket(im_shard_bucket(conversation_id)))
		hand_off_deletion(user_id, conversation_id, message_id, !done, trace_id);
	SPI_finish();
	PG_RETURN_BOOL(done);
}

/*
 * Apply a deletion handed off by a conversation's node (transfer_in.c,
 * for a transfer whose payload has a 'deletion'): {user_id, message_id},
 * with the conversation row and the message's event.  The copies are
 * inserted only if missing (a position transfer keeps them current; this
 * one may arrive before the message's own transfer when that is held on
 * the conversation's node), so the deleted_for_me row has its event; the
 * deletion is then recorded as the user's own call would (recount, private
 * event).  Idempotent: a deletion recorded before changes nothing.  The
 * caller checked that this node does not own the conversation; here: the
 * user is placed here and every row is of the transfer's conversation.
 */
void
im_transfer_apply_deletion(Datum payload, int64 conversation_id)
{
	static SPIPlanPtr what_plan;
	static SPIPlanPtr conv_plan;
	static SPIPlanPtr event_plan;
	Datum		args[1];
	bool		isnull;
	int64		user_id;
	int64		message_id;

	/*
	 * Every row of the payload is its conversation's already
	 * (im_transfer_check_payload ran first); here: exactly one event, the
	 * deleted message itself.
	 */
	im_prepare(&what_plan,
			   "SELECT (d->>'user_id')::pg_catalog.int8, (d->>'message_id')::pg_catalog.int8,"
			   "  pg_catalog.jsonb_array_length($1->'events')" EQ "1"
			   "  AND ($1->'events'->0->>'message_id')::pg_catalog.int8" EQ "(d->>'message_id')::pg_catalog.int8"
			   "  AND $1->'events'->0->>'kind'" EQ "'message'"
			   " FROM (SELECT $1->'deletion' AS d) x",
			   1, JSONBOID);
	args[0] = payload;
	im_exec(what_plan, args, NULL, 1);
	user_id = im_get_int64(0, 1, &isnull);
	if (isnull)
		user_id = 0;
	message_id = im_get_int64(0, 2, &isnull);
	if (isnull)
		message_id = 0;
	if (user_id <= 0 || message_id <= 0 || !im_get_bool(0, 3, &isnull) || isnull)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("deletion transfer for conversation " INT64_FORMAT " is malformed", conversation_id),
				 errdetail("It must name one user, one message event of its own conversation, and that conversation's row.")));
	im_shard_require_user(user_id);

	im_prepare(&conv_plan,
			   "INSERT INTO im.conversation"
			   " SELECT * FROM pg_catalog.jsonb_populate_record(NULL::im.conversation, $1->'conversation')"
			   " ON CONFLICT (conversation_id) DO NOTHING",
			   1, JSONBOID);
	im_exec(conv_plan, args, NULL, 0);
	im_prepare(&event_plan,
			   "INSERT INTO im.event"
			   " SELECT * FROM pg_catalog.jsonb_populate_record(NULL::im.event,"
			   "   ($1->'events'->0)" MINUS "'request_digest')"
			   " ON CONFLICT (message_id) DO NOTHING",
			   1, JSONBOID);
	im_exec(event_plan, args, NULL, 0);

	(void) record_deletion(user_id, conversation_id, message_id, true, NULL);
}

/*
 * The users who see message $1 and whether its outbox item reached them
 * (CTEs e, u, s), shared by message_status and message_facts so both
 * report the same facts.
 */
#define MESSAGE_SCOPE_SQL \
	"WITH e AS (" \
	"  SELECT e.*, COALESCE(t.msg_seq, e.msg_seq) AS cover_seq " \
	"  FROM im.event e LEFT JOIN im.event t " \
	"    ON t.message_id" EQ "e.target_message_id " \
	"  WHERE e.message_id" EQ "$1), " \
	"u AS (" \
	"  SELECT DISTINCT p.user_id FROM e JOIN im.membership_period p " \
	"    ON p.conversation_id" EQ "e.conversation_id " \
	"  WHERE (" IM_PERIOD_COVERS_SQL("p", "e.cover_seq") \
	"         OR p.leave_event_id" EQ "e.message_id) " \
	/* a reaction needs the period to cover its own position too */ \
	"    AND (e.kind" NE "'reaction' OR " IM_PERIOD_COVERS_SQL("p", "e.msg_seq") ") " \
	"    AND " IM_NOT_DELETED_FOR_ME_SQL("p.user_id") "), " \
	"s AS (" \
	"  SELECT u.user_id, " \
	"    (NOT EXISTS (SELECT 1 FROM im.outbox o " \
	"                 WHERE o.source_event_id" EQ "$1 " \
	"                   AND o.state" NE "'done') " \
	"     AND NOT EXISTS (SELECT 1 FROM im.outbox o JOIN im.fanout_quarantine q " \
	"                   ON q.outbox_id" EQ "o.outbox_id " \
	"                 WHERE o.source_event_id" EQ "$1 " \
	"                   AND q.user_id" EQ "u.user_id)) AS in_scope " \
	"  FROM u) "

/* a position of shared_log mode has no per-user event (row e) */
#define SHARED_LOG_POSITION_SQL \
	"(e.kind IN ('message', 'reaction', 'pin') "	/* reactions and pins (contract §14) */ \
	" AND e.mode" EQ "'shared_log')"

/* device d's ACK covers the event (rows e, s, d, h; see message_status) */
#define DEVICE_SYNCED_SQL \
	"CASE WHEN " SHARED_LOG_POSITION_SQL " THEN NULL " \
	"     WHEN NOT s.in_scope THEN false " \
	"     ELSE COALESCE(" \
	"       (SELECT pg_catalog.min(i.sync_seq)" LE "d.acked_sync_seq " \
	"        FROM im.inbox i WHERE i.user_id" EQ "s.user_id " \
	"          AND i.source_event_id" EQ "$1), " \
	"       COALESCE(h.gc_floor, 0)" GT "0 " \
	"       AND d.acked_sync_seq" GE "h.gc_floor) END"

/* the user's read cursor covers the position (rows e, uc) */
#define USER_READ_SQL "COALESCE(uc.read_msg_seq" GE "e.msg_seq, false)"

/*
 * The rows of message_status and message_facts from the scope CTEs e and s,
 * one piece for the single node and a user node (the router's
 * shard_message_status / shard_message_facts), so both report the same
 * facts the same way.  e has one row on the conversation's node and none on
 * a user node before the transfer arrived (hence LEFT JOIN; s never depends
 * on it there).
 */
#define SCOPE_USER_STATE_SQL \
	"FROM s LEFT JOIN e ON true " \
	"LEFT JOIN im.user_head h ON h.user_id" EQ "s.user_id " \
	"LEFT JOIN im.user_conversation uc ON uc.user_id" EQ "s.user_id " \
	"      AND uc.conversation_id" EQ "e.conversation_id "

/* message_status: one row per non-revoked device */
#define MESSAGE_STATUS_ROWS_SQL \
	"SELECT s.user_id, d.device_id, true, s.in_scope, " \
	DEVICE_SYNCED_SQL ", " \
	USER_READ_SQL " " \
	SCOPE_USER_STATE_SQL \
	"JOIN im.device d ON d.user_id" EQ "s.user_id " \
	"               AND d.state" NE "'REVOKED' " \
	"ORDER BY s.user_id, d.device_id"

/* message_facts: one row per user; where_sql leaves users out */
#define MESSAGE_FACTS_ROWS_SQL(where_sql) \
	"SELECT s.user_id, true, s.in_scope, " \
	"  (SELECT CASE WHEN " SHARED_LOG_POSITION_SQL " THEN NULL " \
	"          ELSE COALESCE(pg_catalog.bool_or(" DEVICE_SYNCED_SQL "), false) END " \
	"   FROM im.device d WHERE d.user_id" EQ "s.user_id " \
	"                      AND d.state" NE "'REVOKED'), " \
	USER_READ_SQL " " \
	SCOPE_USER_STATE_SQL \
	where_sql \
	"ORDER BY s.user_id"

/*
 * The sender of message_id (*no_sender for a system event); P0002 when no
 * such position exists.  message_status and message_facts start here.
 */
static int64
message_sender(int64 message_id, bool *no_sender)
{
	static SPIPlanPtr plan;
	Datum		args[1];

	im_prepare(&plan,
			   "SELECT sender_id FROM im.event WHERE message_id" EQ "$1",
			   1, INT8OID);
	args[0] = Int64GetDatum(message_id);
	if (im_exec(plan, args, NULL, 1) != 1)
		ereport(ERROR,
				(errcode(ERRCODE_NO_DATA_FOUND),
				 errmsg("message " INT64_FORMAT " does not exist", message_id)));
	return im_get_int64(0, 1, no_sender);
}

PG_FUNCTION_INFO_V1(im_message_status);
/*
 * message_status(message_id): the four facts of §0.1, apart, one row per
 * non-revoked device of every user contract §1 lets see the position
 * (sender included; a user who deleted it for itself no longer sees it and
 * is not listed).
 *   accepted      the event row exists, i.e. its transaction committed.
 *   in_sync_scope its outbox item is processed (a missing item counts as
 *                 processed: items are written with the event and only ever
 *                 removed after processing) and not quarantined for the
 *                 user.  Decided from outbox state and visibility, not from
 *                 the inbox row, so it stays true after GC.
 *   device_synced the device ACK covers the user's inbox event for it.  NULL
 *                 for a `message` position in shared_log mode (no per-user
 *                 event).  When the inbox event was collected, true iff the
 *                 device ACK reaches the user's gc_floor: every collected
 *                 sync_seq is <= gc_floor, and GC never passes the ACK of a
 *                 device holding the fence, so only devices that must
 *                 snapshot anyway (NEW, RESETTING, inactive) can read false.
 *   user_read     the user's read cursor covers its msg_seq (§13.2: never
 *                 inferred from a device ACK).
 */
Datum
im_message_status(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr status_plan;
	int64		message_id = im_arg_id(fcinfo, 0, "message_id");
	Datum		args[1];
	bool		no_sender;

	im_srf_begin(fcinfo);
	im_spi_connect();

	(void) message_sender(message_id, &no_sender);
	args[0] = Int64GetDatum(message_id);

	im_prepare(&status_plan, MESSAGE_SCOPE_SQL MESSAGE_STATUS_ROWS_SQL, 1, INT8OID);
	im_exec(status_plan, args, NULL, 0);
	im_srf_rows_from_spi(fcinfo, 6);
	SPI_finish();
	return (Datum) 0;
}

/*
 * the scope of message $1 for the users $2 on THEIR node (CTEs e,
 * s): the copy of the event (none while no transfer brought it), in scope
 * once the local outbox item of the copy is processed and not quarantined
 * for the user — "its outbox item is processed" means "applied on the
 * user's node".  The router takes the audience from the conversation node.
 */
#define SHARD_SCOPE_SQL \
	"WITH e AS (SELECT e.* FROM im.event e WHERE e.message_id" EQ "$1), " \
	"s AS (" \
	"  SELECT w.u AS user_id, " \
	"    (" IM_EVENT_PROCESSED_SQL("$1", "(SELECT e.created_at FROM e)") " " \
	"     AND NOT EXISTS (SELECT 1 FROM im.outbox o JOIN im.fanout_quarantine q " \
	"               ON q.outbox_id" EQ "o.outbox_id " \
	"             WHERE o.source_event_id" EQ "$1 AND q.user_id" EQ "w.u)) AS in_scope " \
	"  FROM pg_catalog.unnest($2::pg_catalog.int8[]) w(u)) "

/* the user_ids argument: user ids placed on this node (22023, IS421) */
static Datum
local_user_ids_arg(FunctionCallInfo fcinfo, int argno)
{
	ArrayType  *arr;
	Datum	   *elems;
	bool	   *nulls;
	int			n;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("user_ids must not be NULL")));
	arr = PG_GETARG_ARRAYTYPE_P(argno);
	deconstruct_array(arr, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE, &elems, &nulls, &n);
	for (int i = 0; i < n; i++)
	{
		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("user_ids must not contain NULL")));
		im_check_user_id(DatumGetInt64(elems[i]), "user_ids");
	}
	for (int i = 0; i < n; i++)
		im_shard_require_user(DatumGetInt64(elems[i]));
	return PointerGetDatum(arr);
}

PG_FUNCTION_INFO_V1(im_shard_message_status);
/*
 * shard_message_status(message_id, user_ids) on a user node:
 * message_status's device rows for those of its users (accepted is true:
 * the router asks only about a message its conversation node has).
 */
Datum
im_shard_message_status(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr plan;
	int64		message_id = im_arg_id(fcinfo, 0, "message_id");
	Datum		args[2];

	args[1] = local_user_ids_arg(fcinfo, 1);
	im_srf_begin(fcinfo);
	im_spi_connect();
	args[0] = Int64GetDatum(message_id);
	im_prepare(&plan, SHARD_SCOPE_SQL MESSAGE_STATUS_ROWS_SQL, 2, INT8OID, INT8ARRAYOID);
	im_exec(plan, args, NULL, 0);
	im_srf_rows_from_spi(fcinfo, 6);
	SPI_finish();
	return (Datum) 0;
}

PG_FUNCTION_INFO_V1(im_shard_message_facts);
/* shard_message_facts(message_id, user_ids): message_facts' user rows, as above */
Datum
im_shard_message_facts(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr plan;
	int64		message_id = im_arg_id(fcinfo, 0, "message_id");
	Datum		args[2];

	args[1] = local_user_ids_arg(fcinfo, 1);
	im_srf_begin(fcinfo);
	im_spi_connect();
	args[0] = Int64GetDatum(message_id);
	im_prepare(&plan, SHARD_SCOPE_SQL MESSAGE_FACTS_ROWS_SQL(""), 2, INT8OID, INT8ARRAYOID);
	im_exec(plan, args, NULL, 0);
	im_srf_rows_from_spi(fcinfo, 5);
	SPI_finish();
	return (Datum) 0;
}

PG_FUNCTION_INFO_V1(im_message_audience);
/*
 * message_audience(message_id) on the conversation node: the users
 * contract §1 lets see the position (message_status's scope, one row per
 * user, deletions recorded here included), P0002 as message_status.  The
 * router merges it with the users' nodes' device and read facts.
 */
Datum
im_message_audience(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr plan;
	int64		message_id = im_arg_id(fcinfo, 0, "message_id");
	Datum		args[1];
	bool		no_sender;

	im_srf_begin(fcinfo);
	im_spi_connect();
	im_shard_require_conversation(message_id);	/* the id carries its conversation's bucket */
	(void) message_sender(message_id, &no_sender);
	args[0] = Int64GetDatum(message_id);
	im_prepare(&plan,
			   MESSAGE_SCOPE_SQL
			   "SELECT s.user_id, e.conversation_id, e.msg_seq::pg_catalog.int8, true "
			   "FROM s CROSS JOIN e ORDER BY s.user_id",
			   1, INT8OID);
	im_exec(plan, args, NULL, 0);
	im_srf_rows_from_spi(fcinfo, 4);
	SPI_finish();
	return (Datum) 0;
}

PG_FUNCTION_INFO_V1(im_message_facts);
/*
 * message_facts(sender_id, message_id) (contract §16): the four facts of
 * message_status for the sender of the position, one row per recipient
 * user (every user who sees it except the sender), never a device id:
 * any_device_synced is true when at least one non-revoked device of the
 * user has ACKed it (NULL in shared_log mode, false without devices).
 * Anyone but the sender gets 42501, so a client cannot learn who read
 * another person's message.
 */
Datum
im_message_facts(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr facts_plan;
	int64		sender_id = im_arg_user_id(fcinfo, 0, "sender_id");
	int64		message_id = im_arg_id(fcinfo, 1, "message_id");
	Datum		args[2];
	bool		isnull;
	int64		actual_sender;

	im_srf_begin(fcinfo);
	im_spi_connect();
	im_user_check_standing(sender_id);	/* IS403 for a suspended account (contract §17) */

	actual_sender = message_sender(message_id, &isnull);
	if (isnull || actual_sender != sender_id)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("user " INT64_FORMAT " did not send message " INT64_FORMAT,
						sender_id, message_id),
				 errhint("Only the sender of a message may see its facts.")));

	im_prepare(&facts_plan,
			   MESSAGE_SCOPE_SQL MESSAGE_FACTS_ROWS_SQL("WHERE s.user_id" NE "$2 "),
			   2, INT8OID, INT8OID);
	args[0] = Int64GetDatum(message_id);
	args[1] = Int64GetDatum(sender_id);
	im_exec(facts_plan, args, NULL, 0);
	im_srf_rows_from_spi(fcinfo, 5);
	SPI_finish();
	return (Datum) 0;
}

/*
 * im.clear_dirty(user_id, conversation_id, observed_version,
 *                saved_last_msg_seq) -> (cleared, dirty_target_msg_seq, dirty_version)
 * Clears only when the version is unchanged (no newer message raced the
 * client) and the client's saved position reaches the target.  Takes the
 * user's head first, in lock order, like every change to a user's state.
 */
PG_FUNCTION_INFO_V1(im_clear_dirty);
Datum
im_clear_dirty(PG_FUNCTION_ARGS)
{
	int64		user_id = im_arg_user_id(fcinfo, 0, "user_id");
	int64		conversation_id = im_arg_id(fcinfo, 1, "conversation_id");
	int64		observed_version;
	int64		saved;
	static SPIPlanPtr plan;
	Datum		args[4];
	Datum		values[3];
	bool		nulls[3] = {false, false, false};

	if (PG_ARGISNULL(2) || PG_GETARG_INT64(2) < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("observed_version must be a non-negative number")));
	if (PG_ARGISNULL(3) || PG_GETARG_INT64(3) < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("saved_last_msg_seq must be a non-negative number")));
	observed_version = PG_GETARG_INT64(2);
	saved = PG_GETARG_INT64(3);
	/* checked like every write's; clear_dirty writes no event or item to keep it on */
	(void) im_arg_trace_id(fcinfo, 4);

	im_srf_begin(fcinfo);
	im_spi_connect();
	im_user_check_standing(user_id);	/* IS403 for a suspended account (contract §17) */

	im_require_conversation(conversation_id, NULL);
	im_require_ever_member(user_id, conversation_id,
						   "Only a member or past member of the conversation has a dirty marker to clear.");

	im_lock_user_heads(&user_id, 1);
	im_prepare(&plan,
			   "WITH s AS (SELECT dirty_target_msg_seq, dirty_version FROM im.user_conversation"
			   "           WHERE user_id" EQ "$1 AND conversation_id" EQ "$2 FOR UPDATE),"
			   " c AS (UPDATE im.user_conversation u SET dirty = false, version = u.version" PLUS "1"
			   "       FROM s WHERE u.user_id" EQ "$1 AND u.conversation_id" EQ "$2"
			   "         AND s.dirty_version" EQ "$3 AND $4" GE "s.dirty_target_msg_seq"
			   "       RETURNING 1)"
			   "SELECT EXISTS (SELECT 1 FROM c), s.dirty_target_msg_seq, s.dirty_version FROM s",
			   4, INT8OID, INT8OID, INT8OID, INT8OID);
	args[0] = Int64GetDatum(user_id);
	args[1] = Int64GetDatum(conversation_id);
	args[2] = Int64GetDatum(observed_version);
	args[3] = Int64GetDatum(saved);
	/* every period opens its user's state row (conversation.c) */
	if (im_exec(plan, args, NULL, 0) != 1)
		elog(ERROR, "im_sync: user " INT64_FORMAT " has a period but no state in conversation " INT64_FORMAT,
			 user_id, conversation_id);
	values[0] = BoolGetDatum(im_get_bool(0, 1, NULL));
	values[1] = Int64GetDatum(im_get_int64(0, 2, NULL));
	values[2] = Int64GetDatum(im_get_int64(0, 3, NULL));
	SPI_finish();
	im_srf_row(fcinfo, values, nulls);
	PG_RETURN_NULL();
}

/*
 * The counts of a fanout group receipt (contract §20) for message_id of
 * sender_id, from exactly message_facts' rows (contract §7, the four
 * facts): member_count the rows, delivered_count those with a device that
 * ACKed it, read_count those whose cursor covers it and who report reads
 * (im.receipt_setting).  Called by the receipt producer (receipt.c).
 */
void
im_message_fact_counts(int64 message_id, int64 sender_id, bool here_only, int64 *delivered,
					   int64 *read, int64 *members)
{
	static SPIPlanPtr plan;
	Datum		args[3];

	im_prepare(&plan,
			   MESSAGE_SCOPE_SQL
			   "SELECT pg_catalog.count(*), "
			   "  pg_catalog.count(*) FILTER (WHERE f.synced), "
			   "  pg_catalog.count(*) FILTER (WHERE f.user_read AND NOT EXISTS ("
			   "    SELECT 1 FROM im.receipt_setting rs WHERE rs.user_id" EQ "f.user_id "
			   "    AND NOT rs.read_receipts)) "
			   "FROM (" MESSAGE_FACTS_ROWS_SQL("WHERE s.user_id" NE "$2 AND (NOT $3 OR EXISTS ("
											   "  SELECT 1 FROM im.shard_config sc WHERE sc.bucket_nodes["
											   "  (s.user_id" OP_MOD CppAsString2(IM_SHARD_BUCKETS) ")" PLUS "1]"
											   EQ "sc.self_name)) ") ") "
			   "  f(user_id, accepted, in_scope, synced, user_read)",
			   3, INT8OID, INT8OID, BOOLOID);
	args[0] = Int64GetDatum(message_id);
	args[1] = Int64GetDatum(sender_id);
	args[2] = BoolGetDatum(here_only);
	if (im_exec(plan, args, NULL, 0) != 1)
		elog(ERROR, "im_sync: the receipt counts returned no row");
	*members = im_get_int64(0, 1, NULL);
	*delivered = im_get_int64(0, 2, NULL);
	*read = im_get_int64(0, 3, NULL);
}
