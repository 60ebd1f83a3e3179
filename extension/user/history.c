/*
 * history.c — fetch_messages: paging through a conversation's positions
 * (contract §6), also the read path of shared_log conversations (§10.3).
 *
 * Invariant protected (§2.3, §10.4, §17.2): a user only ever reads the
 * positions contract §1 lets it see — closed intervals over all of its
 * membership periods, recalls and edits by their target's coverage, the
 * leaver's own leave event, nothing it deleted for itself.  The rule is
 * decided from im.membership_period alone, never from the current member
 * list, so it is the same rule fanout and snapshots apply.
 */
#include "core/im_sync.h"
#include "core/common.h"
#include "core/locks.h"
#include "core/im_sql.h"
#include "core/standing.h"
#include "conversation/conversation.h"
#include "user/user.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"

/*
 * The positions of conversation $2 in ($3, $4] that user $1 may see
 * (contract §1), as (message_id, msg_seq), found through index ranges
 * bounded by the user's own periods, never by a scan up to the head — a
 * former member whose period ended long ago reads what its periods hold,
 * however long the conversation grew since:
 *   in_period  — positions inside a period, in msg_seq order, at most a page
 *                plus one per period (the (conversation_id, msg_seq) index);
 *                a recall or edit among them counts only when its target
 *                lies inside one of the periods;
 *   retargeted — recalls and edits, wherever they are, of messages inside a
 *                closed period, found from those messages through
 *                event_target_idx (an open period runs to the head, so
 *                in_period already holds every recall or edit after it);
 *   own_leave  — the leave events that closed the user's periods.
 * Lookups by id go through "= ANY (ARRAY(subquery))", which the planner
 * answers with index probes for the ids found, never a join that scans
 * the whole event table or target index.
 * The branches may overlap (a recall inside a period of a target inside
 * one); UNION keeps each position once.  Nothing the user deleted for
 * itself, nor a recall or edit of it (IM_NOT_DELETED_FOR_ME_SQL).  The
 * rule is decided from im.membership_period alone, never from the current
 * member list, so it is the rule fanout and snapshots apply; a reconcile
 * check compares them.
 */
#define HISTORY_VISIBLE_POSITIONS_SQL \
	"per AS (" \
	"  SELECT p.join_seq, p.leave_seq, p.leave_event_id FROM im.membership_period p " \
	"  WHERE p.conversation_id" EQ "$2 AND p.user_id" EQ "$1), " \
	"visible AS (" \
	"  SELECT x.message_id, x.msg_seq FROM per p CROSS JOIN LATERAL (" \
	"    SELECT e.message_id, e.msg_seq FROM im.event e " \
	"    LEFT JOIN im.event t ON t.message_id" EQ "e.target_message_id " \
	"    WHERE e.conversation_id" EQ "$2 " \
	"      AND e.msg_seq" GT "GREATEST($3, p.join_seq" MINUS "1) " \
	"      AND e.msg_seq" LE "LEAST($4, COALESCE(p.leave_seq, $4)) " \
	"      AND (e.target_message_id IS NULL OR EXISTS (SELECT 1 FROM per q " \
	"            WHERE " IM_PERIOD_COVERS_SQL("q", "t.msg_seq") ")) " \
	/* a reaction needs its own period to cover its target too */ \
	"      AND (e.kind" NE "'reaction' OR " IM_PERIOD_COVERS_SQL("p", "t.msg_seq") ") " \
	"      AND " IM_NOT_DELETED_FOR_ME_SQL("$1") \
	"    ORDER BY e.msg_seq LIMIT $5" PLUS "1) x " \
	"  UNION " \
	"  SELECT e.message_id, e.msg_seq FROM im.event e " \
	"  WHERE e.target_message_id" EQ "ANY (ARRAY(" \
	"          SELECT t.message_id FROM per p JOIN im.event t " \
	"            ON t.conversation_id" EQ "$2 " \
	"           AND t.msg_seq" GE "p.join_seq " \
	"           AND t.msg_seq" LE "p.leave_seq " \
	"          WHERE p.leave_seq IS NOT NULL AND t.kind" EQ "'message')) " \
	"    AND e.kind" NE "'reaction' " /* never after the period */ \
	"    AND e.msg_seq" GT "$3 AND e.msg_seq" LE "$4 " \
	"    AND " IM_NOT_DELETED_FOR_ME_SQL("$1") \
	"  UNION " \
	"  SELECT e.message_id, e.msg_seq FROM im.event e " \
	"  WHERE e.message_id" EQ "ANY (ARRAY(" \
	"          SELECT p.leave_event_id FROM per p WHERE p.leave_event_id IS NOT NULL)) " \
	"    AND e.msg_seq" GT "$3 AND e.msg_seq" LE "$4 " \
	"    AND " IM_NOT_DELETED_FOR_ME_SQL("$1") ")"

/* Result columns of the page statement: a position's §11 columns, then
 * what the reader sees of its reactions (conversation.h). */
enum
{
	Anum_history_event = 1,		/* the IM_EVENT_COLUMNS_SQL columns */
	Anum_history_reaction_counts = Anum_history_event + IM_EVENT_COLUMNS,
	Anum_history_my_reactions
};

/* The page statement of fetch_messages, for a catalog of shape S
 * (core/version_check.h). */
#define HISTORY_PAGE_SQL(S) \
	"WITH " HISTORY_VISIBLE_POSITIONS_SQL ", " \
	"top AS (SELECT v.message_id, v.msg_seq FROM visible v " \
	"        ORDER BY v.msg_seq LIMIT $5" PLUS "1), " \
	IM_MESSAGE_REACTIONS_CTE_SQL " "	/* reactions (conversation.h) */ \
	"SELECT " IM_EVENT_COLUMNS_SQL(S) ", " IM_MESSAGE_REACTIONS_COLS_SQL " " \
	"FROM im.event e" IM_MESSAGE_REACTIONS_JOIN_SQL \
	"WHERE e.message_id" EQ "ANY (ARRAY(SELECT top.message_id FROM top)) " \
	"ORDER BY e.msg_seq"

PG_FUNCTION_INFO_V1(im_fetch_messages);
/*
 * fetch_messages(user_id, conversation_id, after_seq, page_limit, up_to_seq)
 * returns one row: the visible positions in (after_seq, up_to_seq] in
 * msg_seq order (at most page_limit of them) as contract §11 objects,
 * next_after_seq (the last returned msg_seq, or after_seq when none) and
 * has_more (more visible positions remain in the range).  Read-only.
 */
Datum
im_fetch_messages(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr page_plans[IM_SHAPES];
	SPIPlanPtr	plan;
	int64		user_id = im_arg_user_id(fcinfo, 0, "user_id");
	int64		conversation_id = im_arg_id(fcinfo, 1, "conversation_id");
	int64		after_seq;
	int32		page_limit = im_arg_int32(fcinfo, 3, "page_limit", 1, 1000);
	int64		up_to_seq;
	ImConversation conv;
	Datum		args[5];
	Datum		values[3];
	bool		nulls[3] = {false, false, false};
	uint64		nrows;
	ImEventPage page;
	int64		last;
	bool		reaction_keys;

	if (PG_ARGISNULL(2) || PG_GETARG_INT64(2) < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("after_seq must be a non-negative msg_seq"),
				 errhint("Use 0 to read from the beginning.")));
	after_seq = PG_GETARG_INT64(2);
	if (!PG_ARGISNULL(4) && PG_GETARG_INT64(4) < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("up_to_seq must be a non-negative msg_seq or NULL")));

	im_srf_begin(fcinfo);
	im_spi_connect();
	im_user_check_standing(user_id);	/* IS403 for a suspended account (contract §17) */

	im_require_conversation(conversation_id, &conv);
	up_to_seq = PG_ARGISNULL(4) ? conv.head_msg_seq : Min(PG_GETARG_INT64(4), conv.head_msg_seq);

	im_require_ever_member(user_id, conversation_id,
						   "Only positions inside one of the user's membership periods can be read.");

	/*
	 * One page plus one row, in msg_seq order: the extra row only tells
	 * has_more.  Positions the user may not see are skipped inside the
	 * range, so a page never ends early on an invisible stretch.
	 */
	reaction_keys = im_relation_catalog();
	plan = IM_PREPARE_SHAPED(page_plans, HISTORY_PAGE_SQL,
							 5, INT8OID, INT8OID, INT8OID, INT8OID, INT8OID);
	args[0] = Int64GetDatum(user_id);
	args[1] = Int64GetDatum(conversation_id);
	args[2] = Int64GetDatum(after_seq);
	args[3] = Int64GetDatum(up_to_seq);
	args[4] = Int64GetDatum((int64) page_limit);
	nrows = im_exec(plan, args, NULL, 0);

	/*
	 * The page ends after page_limit positions, or before the position that
	 * would push its JSON text over im_sync.max_page_bytes (always at least
	 * one position), with has_more true and next_after_seq its last
	 * position, so the next page starts right after it: nothing skipped,
	 * nothing repeated.  The objects are the sync pages' (event_json.c),
	 * without sync_seq and with a message's reactions.
	 */
	im_event_page_begin(&page);
	last = after_seq;
	for (uint64 row = 0; row < nrows && row < (uint64) page_limit; row++)
	{
		ImEventRow	ev;
		ImEventJson ej;
		bool		isnull;

		if (!im_event_row_read(row, Anum_history_event, &ev))
			elog(ERROR, "im_sync: fetch_messages page row without an event");
		if (reaction_keys && strcmp(ev.kind, "message") == 0)
		{
			ev.reactions = DatumGetJsonbP(SPI_getbinval(SPI_tuptable->vals[row], SPI_tuptable->tupdesc,
														Anum_history_reaction_counts, &isnull));
			ev.my_reactions = DatumGetJsonbP(SPI_getbinval(SPI_tuptable->vals[row], SPI_tuptable->tupdesc,
														   Anum_history_my_reactions, &isnull));
		}
		im_event_json_make(&page, &ev, &ej);
		if (page.n > 0 && im_event_page_bytes_with(&page, ej.text_bytes) > (int64) im_max_page_bytes)
			break;
		im_event_page_add_event(&page, &ej);
		last = ev.msg_seq;
	}

	values[0] = JsonbPGetDatum(im_event_page_finish(&page));
	values[1] = Int64GetDatum(last);
	values[2] = BoolGetDatum((uint64) page.n < nrows);
	/* the tuplestore copies the row, so SPI memory may go after */
	im_srf_row(fcinfo, values, nulls);

	SPI_finish();
	return (Datum) 0;
}
