/*
 * fanout_shared_log.c — fanout of large groups in shared_log mode
 * (contract §2, §4, §7; design §10.3); the fanout bridge.
 *
 * In `shared_log` mode a `message` position writes no per-member inbox
 * event.  Each member has a level-triggered dirty marker in
 * im.user_conversation: dirty_target_msg_seq only grows and dirty_version
 * bumps whenever it grows; a `conversation_dirty` inbox event is written
 * only when a marker goes clean -> dirty.  Members read the positions
 * themselves through im.fetch_messages inside their periods, and clear the
 * marker with a version CAS (im.clear_dirty, read_state.c) that fails if a
 * newer message raced it.  Control events are always delivered as inbox
 * events.  The switch itself is a single-writer conversation operation
 * (conversation.c).
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
#include "core/im_sync.h"
#include "core/common.h"
#include "core/im_sql.h"
#include "core/version_check.h"
#include "fanout/fanout.h"

#include "catalog/pg_type.h"

/*
 * Fan out a run of consecutive shared_log `message` positions (and, issue
 * 11, `reaction` and `pin` positions, which raise no unread bound) of one
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
	static SPIPlanPtr plans[2];
	SPIPlanPtr	plan;
	Datum		args[2];
	uint64		n;

	/* recency (contract §20) only on a catalog that has the column */
#define SHARED_LOG_DELIVERY_SQL(recency) \
			   "WITH m AS (" \
			   "  SELECT p.user_id, pg_catalog.max(e.msg_seq) AS target," \
			   "    (pg_catalog.array_agg(p.membership_period_id ORDER BY e.msg_seq DESC))[1] AS period," \
			   "    (pg_catalog.array_agg(e.message_id ORDER BY e.msg_seq DESC))[1] AS message_id," \
			   /* the unread bound's m counts messages only (contract §3) */ \
			   "    pg_catalog.max(e.msg_seq) FILTER (WHERE e.kind" EQ "'message') AS m," \
			   /* recency: the last message under the new target (contract §20) */ \
			   "    pg_catalog.max(e.created_at) FILTER (WHERE e.kind" EQ "'message') AS act" \
			   "  FROM im.event e JOIN im.membership_period p" \
			   "    ON p.conversation_id" EQ "e.conversation_id" \
			   "   AND " IM_PERIOD_COVERS_SQL("p", "e.msg_seq") \
			   /* a reaction also needs the period to cover its target */ \
			   "  LEFT JOIN im.event t ON t.message_id" EQ "e.target_message_id" \
			   "  WHERE (e.kind" NE "'reaction' OR " IM_PERIOD_COVERS_SQL("p", "t.msg_seq") ") AND e.message_id" EQ "ANY ($2::pg_catalog.int8[]) AND e.conversation_id" EQ "$1" \
			   "  GROUP BY p.user_id)," \
			   " upd AS (" \
			   "  UPDATE im.user_conversation u SET" \
			   "    dirty_target_msg_seq = m.target," \
			   "    dirty_version = u.dirty_version" PLUS "1," \
			   "    dirty = true," \
			   "    last_msg_seq = pg_catalog.int8larger(u.last_msg_seq, m.target)," \
			   "    unread_count = CASE WHEN m.m IS NULL THEN u.unread_count"	/* reactions and pins (contract §14) */ \
			   "                   ELSE pg_catalog.int8larger(0, m.m" MINUS "u.read_msg_seq) END," \
			   recency \
			   "    version = u.version" PLUS "1" \
			   "  FROM m, im.user_conversation o" \
			   "  WHERE u.user_id" EQ "m.user_id AND u.conversation_id" EQ "$1" \
			   "    AND o.user_id" EQ "u.user_id AND o.conversation_id" EQ "u.conversation_id" \
			   "    AND m.target" GT "o.dirty_target_msg_seq" \
			   "  RETURNING u.user_id, u.dirty_target_msg_seq, u.dirty_version, o.dirty AS was_dirty," \
			   "            m.period, m.message_id)," \
			   " ins AS (" \
			   "  INSERT INTO im.inbox (user_id, sync_seq, source_event_id, delivery_scope," \
			   "                        conversation_id, msg_seq, kind, payload)" \
			   "  SELECT upd.user_id, h.high_watermark" PLUS "1, upd.message_id, upd.period, $1, NULL," \
			   "         'conversation_dirty'," \
			   "         pg_catalog.jsonb_build_object('dirty_target_msg_seq', upd.dirty_target_msg_seq," \
			   "                                       'dirty_version', upd.dirty_version)" \
			   "  FROM upd JOIN im.user_head h ON h.user_id" EQ "upd.user_id" \
			   "  WHERE NOT upd.was_dirty" \
			   IM_INBOX_APPEND_TAIL_SQL \
			   "SELECT ins.user_id, (SELECT pg_catalog.count(*) FROM hd)," \
			   "       (SELECT pg_catalog.max(e.msg_seq) FROM im.event e" \
			   "         WHERE e.message_id" EQ "ANY ($2::pg_catalog.int8[]))" \
			   "FROM ins " \
			   "UNION ALL " \
			   "SELECT NULL, 0, (SELECT pg_catalog.max(e.msg_seq) FROM im.event e" \
			   "                  WHERE e.message_id" EQ "ANY ($2::pg_catalog.int8[]))"
	if (IM_CATALOG_HAS_RECENCY())
		plan = im_prepare(&plans[1], SHARED_LOG_DELIVERY_SQL("    last_activity_at = GREATEST(u.last_activity_at, m.act),"),
				   2, INT8OID, INT8ARRAYOID);
	else
		plan = im_prepare(&plans[0], SHARED_LOG_DELIVERY_SQL(""), 2, INT8OID, INT8ARRAYOID);
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
