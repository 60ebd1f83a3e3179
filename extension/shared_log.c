/*
 * shared_log.c — large groups (contract §2, §4, §7; design §10.3).
 *
 * In `shared_log` mode a `message` position writes no per-member inbox
 * event.  Each member has a level-triggered dirty marker in
 * im.user_conversation: dirty_target_msg_seq only grows and dirty_version
 * bumps whenever it grows; a `conversation_dirty` inbox event is written
 * only when a marker goes clean -> dirty.  Members read the positions
 * themselves through im.fetch_messages inside their periods, and clear the
 * marker with a version CAS (clear_dirty) that fails if a newer message
 * raced it.  Control events are always delivered as inbox events.
 *
 * Invariants protected here:
 *   - a switch in either direction loses and doubles nothing: each position
 *     is fanned out in the mode recorded on it (im.event.mode, written by the
 *     single writer), and a mode event is the first position of its mode;
 *   - markers never move backwards and a stale clear never clears a newer
 *     target (CAS on dirty_version under the user's head lock);
 *   - after a switch back to `fanout`, unread_count equals the contract §3
 *     recount again (recomputed when the mode event is fanned out).
 */
#include "im_sync.h"

#include "catalog/pg_type.h"
#include "utils/array.h"
#include "utils/builtins.h"

#define EQ " OPERATOR(pg_catalog.=) "
#define LE " OPERATOR(pg_catalog.<=) "
#define GE " OPERATOR(pg_catalog.>=) "
#define GT " OPERATOR(pg_catalog.>) "
#define PLUS " OPERATOR(pg_catalog.+) "
#define MINUS " OPERATOR(pg_catalog.-) "

/*
 * Switch the mode of a conversation whose row the caller has locked (the
 * single writer): update the row and append the `mode` event, which carries
 * the new mode so it is the first position fanned out in that mode.
 * Returns false when the mode is already in force (no event).
 */
bool
im_switch_mode_locked(ImConversation *conv, const char *mode)
{
	static SPIPlanPtr upd;
	ImNewEvent	ev;
	Datum		args[2];
	char		body[64];
	int64		message_id;
	int64		msg_seq;

	if (strcmp(conv->mode, mode) == 0)
		return false;
	im_prepare(&upd,
			   "UPDATE im.conversation SET mode = $2 WHERE conversation_id" EQ "$1",
			   2, INT8OID, TEXTOID);
	args[0] = Int64GetDatum(conv->conversation_id);
	args[1] = CStringGetTextDatum(mode);
	im_exec(upd, args, NULL, 0);
	strlcpy(conv->mode, mode, sizeof(conv->mode));

	memset(&ev, 0, sizeof(ev));
	ev.kind = "mode";
	snprintf(body, sizeof(body), "{\"mode\": \"%s\"}", mode);
	ev.body = im_jsonb_from_cstring(body);
	if (!im_append_event(conv, &ev, &message_id, &msg_seq))
		elog(ERROR, "im_sync: mode event was not appended");
	conv->head_msg_seq = msg_seq;
	return true;
}

/*
 * Called by join (under the conversation lock): im_sync.shared_log_min_members
 * switches a fanout group to shared_log when its active members reach it.
 * Nothing switches back automatically.
 */
void
im_shared_log_maybe_switch_on_join(ImConversation *conv)
{
	static SPIPlanPtr count;
	Datum		args[1];

	if (im_shared_log_min_members <= 0 || strcmp(conv->kind, "group") != 0 ||
		strcmp(conv->mode, "fanout") != 0)
		return;
	im_prepare(&count,
			   "SELECT pg_catalog.count(*) FROM im.membership_period "
			   "WHERE conversation_id" EQ "$1 AND leave_seq IS NULL",
			   1, INT8OID);
	args[0] = Int64GetDatum(conv->conversation_id);
	im_exec(count, args, NULL, 0);
	if (im_get_int64(0, 1, NULL) >= im_shared_log_min_members)
		im_switch_mode_locked(conv, "shared_log");
}

/* im.set_conversation_mode(conversation_id, mode) -> the mode now in force */
PG_FUNCTION_INFO_V1(im_set_conversation_mode);
Datum
im_set_conversation_mode(PG_FUNCTION_ARGS)
{
	int64		conversation_id = im_arg_id(fcinfo, 0, "conversation_id");
	char	   *mode = im_arg_text(fcinfo, 1, "mode", 16);
	ImConversation conv;

	if (strcmp(mode, "fanout") != 0 && strcmp(mode, "shared_log") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("mode must be 'fanout' or 'shared_log', got \"%s\"", mode)));
	im_spi_connect();
	im_lock_conversation(conversation_id, &conv);
	if (strcmp(conv.kind, "group") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("cannot change the mode of direct conversation " INT64_FORMAT, conversation_id),
				 errdetail("Only group conversations can use shared_log mode.")));
	im_switch_mode_locked(&conv, mode);
	SPI_finish();
	PG_RETURN_TEXT_P(cstring_to_text(mode));
}

/*
 * Fan out a run of consecutive shared_log `message` positions of one
 * conversation (one fanout batch's worth, coalesced): every member whose
 * period covers one of them gets its marker raised once, to the highest
 * position it may see, with one version bump; a marker that was clean
 * becomes dirty with one `conversation_dirty` inbox event (key: user, the
 * highest message, its period — so redelivery writes nothing twice).
 * Heads of every covered member are already locked by the batch.
 * Returns the users whose log head moved (palloc'd) in *users / *nusers,
 * and appends "c<conversation>:<position>" to hints.
 */
void
im_shared_log_deliver(int64 conversation_id, int64 *message_ids, int nmessages,
					  StringInfo hints, int64 **users, int *nusers)
{
	static SPIPlanPtr plan;
	Datum		args[2];
	uint64		n;

	im_prepare(&plan,
			   "WITH m AS ("
			   "  SELECT p.user_id, pg_catalog.max(e.msg_seq) AS target,"
			   "    (pg_catalog.array_agg(p.membership_period_id ORDER BY e.msg_seq DESC))[1] AS period,"
			   "    (pg_catalog.array_agg(e.message_id ORDER BY e.msg_seq DESC))[1] AS message_id"
			   "  FROM im.event e JOIN im.membership_period p"
			   "    ON p.conversation_id" EQ "e.conversation_id AND p.join_seq" LE "e.msg_seq"
			   "   AND (p.leave_seq IS NULL OR p.leave_seq" GE "e.msg_seq)"
			   "  WHERE e.message_id" EQ "ANY ($2::pg_catalog.int8[]) AND e.conversation_id" EQ "$1"
			   "  GROUP BY p.user_id),"
			   " upd AS ("
			   "  UPDATE im.user_conversation u SET"
			   "    dirty_target_msg_seq = m.target,"
			   "    dirty_version = u.dirty_version" PLUS "1,"
			   "    dirty = true,"
			   "    last_msg_seq = pg_catalog.int8larger(u.last_msg_seq, m.target),"
			   "    unread_count = pg_catalog.int8larger(0, m.target" MINUS "u.read_msg_seq),"
			   "    version = u.version" PLUS "1"
			   "  FROM m, im.user_conversation o"
			   "  WHERE u.user_id" EQ "m.user_id AND u.conversation_id" EQ "$1"
			   "    AND o.user_id" EQ "u.user_id AND o.conversation_id" EQ "u.conversation_id"
			   "    AND m.target" GT "o.dirty_target_msg_seq"
			   "  RETURNING u.user_id, u.dirty_target_msg_seq, u.dirty_version, o.dirty AS was_dirty,"
			   "            m.period, m.message_id),"
			   " ins AS ("
			   "  INSERT INTO im.inbox (user_id, sync_seq, source_event_id, delivery_scope,"
			   "                        conversation_id, msg_seq, kind, payload)"
			   "  SELECT upd.user_id, h.high_watermark" PLUS "1, upd.message_id, upd.period, $1, NULL,"
			   "         'conversation_dirty',"
			   "         pg_catalog.jsonb_build_object('dirty_target_msg_seq', upd.dirty_target_msg_seq,"
			   "                                       'dirty_version', upd.dirty_version)"
			   "  FROM upd JOIN im.user_head h ON h.user_id" EQ "upd.user_id"
			   "  WHERE NOT upd.was_dirty"
			   "  ON CONFLICT (user_id, source_event_id, delivery_scope) DO NOTHING"
			   "  RETURNING user_id, sync_seq),"
			   " hd AS ("
			   "  UPDATE im.user_head h SET high_watermark = ins.sync_seq FROM ins"
			   "  WHERE h.user_id" EQ "ins.user_id RETURNING h.user_id)"
			   "SELECT ins.user_id, (SELECT pg_catalog.count(*) FROM hd),"
			   "       (SELECT pg_catalog.max(e.msg_seq) FROM im.event e"
			   "         WHERE e.message_id" EQ "ANY ($2::pg_catalog.int8[]))"
			   "FROM ins "
			   "UNION ALL "
			   "SELECT NULL, 0, (SELECT pg_catalog.max(e.msg_seq) FROM im.event e"
			   "                  WHERE e.message_id" EQ "ANY ($2::pg_catalog.int8[]))",
			   2, INT8OID, INT8ARRAYOID);
	args[0] = Int64GetDatum(conversation_id);
	args[1] = im_int8_array(message_ids, nmessages);
	n = im_exec(plan, args, NULL, 0);

	/* the last row is the position reached; the others are moved heads */
	*users = palloc(sizeof(int64) * Max(n, 1));
	*nusers = 0;
	for (uint64 i = 0; i + 1 < n; i++)
		(*users)[(*nusers)++] = im_get_int64(i, 1, NULL);
	if (hints != NULL)
	{
		if (hints->len > 0)
			appendStringInfoChar(hints, ',');
		appendStringInfo(hints, "c" INT64_FORMAT ":" INT64_FORMAT,
						 conversation_id, im_get_int64(n - 1, 3, NULL));
	}
}

/*
 * A `mode` event was just delivered.  Unread is only an approximation while
 * a conversation is in shared_log mode (contract §3); switching back to
 * `fanout` makes it exact again: recompute the contract §3 recount for every
 * user with a state row in the conversation — members and past members
 * alike, since a leaver's count may have been approximated too.  The batch
 * locked all their heads (lock_batch_heads).  Switching to shared_log
 * changes nothing until the first marker.
 */
void
im_shared_log_mode_delivered(int64 message_id)
{
	static SPIPlanPtr who;
	static SPIPlanPtr recount;
	static SPIPlanPtr set;
	Datum		args[3];
	uint64		n;
	int64	   *user_ids;
	int64	   *reads;
	int64		conversation_id;

	im_prepare(&who,
			   "SELECT u.user_id, u.read_msg_seq, u.conversation_id FROM im.event e "
			   "JOIN im.user_conversation u ON u.conversation_id" EQ "e.conversation_id "
			   "WHERE e.message_id" EQ "$1 AND e.kind" EQ "'mode' AND e.mode" EQ "'fanout' "
			   "ORDER BY u.user_id",
			   1, INT8OID);
	args[0] = Int64GetDatum(message_id);
	n = im_exec(who, args, NULL, 0);
	if (n == 0)
		return;
	user_ids = palloc(sizeof(int64) * n);
	reads = palloc(sizeof(int64) * n);
	conversation_id = im_get_int64(0, 3, NULL);
	for (uint64 i = 0; i < n; i++)
	{
		user_ids[i] = im_get_int64(i, 1, NULL);
		reads[i] = im_get_int64(i, 2, NULL);
	}
	im_prepare(&recount, IM_UNREAD_RECOUNT_SQL, 3, INT8OID, INT8OID, INT8OID);
	im_prepare(&set,
			   "UPDATE im.user_conversation SET unread_count = $3, version = version" PLUS "1 "
			   "WHERE user_id" EQ "$1 AND conversation_id" EQ "$2",
			   3, INT8OID, INT8OID, INT8OID);
	for (uint64 i = 0; i < n; i++)
	{
		int64		unread;

		args[0] = Int64GetDatum(user_ids[i]);
		args[1] = Int64GetDatum(conversation_id);
		args[2] = Int64GetDatum(reads[i]);
		im_exec(recount, args, NULL, 0);
		unread = im_get_int64(0, 1, NULL);
		args[2] = Int64GetDatum(unread);
		im_exec(set, args, NULL, 0);
	}
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

	im_srf_begin(fcinfo);
	im_spi_connect();

	im_require_conversation(conversation_id, NULL);

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
	if (im_exec(plan, args, NULL, 0) != 1)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("user " INT64_FORMAT " was never a member of conversation " INT64_FORMAT,
						user_id, conversation_id)));
	values[0] = BoolGetDatum(im_get_bool(0, 1, NULL));
	values[1] = Int64GetDatum(im_get_int64(0, 2, NULL));
	values[2] = Int64GetDatum(im_get_int64(0, 3, NULL));
	SPI_finish();
	im_srf_row(fcinfo, values, nulls);
	PG_RETURN_NULL();
}
