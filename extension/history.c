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
#include "im_sync.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"

/*
 * SQL predicate "position e is visible to user $1" (contract §1), for an
 * im.event row aliased `e` whose recall/edit target is joined as `t`.
 * Shared with nothing else on purpose: fanout decides recipients in its own
 * set-oriented way; a reconcile check compares the two.
 *
 * A recall or edit of a message the user deleted for itself is hidden too
 * (IM_NOT_DELETED_FOR_ME_SQL, the one rule every read path applies).
 */
#define HISTORY_VISIBLE_SQL \
	"(EXISTS (SELECT 1 FROM im.membership_period p " \
	"         WHERE p.conversation_id OPERATOR(pg_catalog.=) e.conversation_id " \
	"           AND p.user_id OPERATOR(pg_catalog.=) $1 " \
	"           AND p.join_seq OPERATOR(pg_catalog.<=) " \
	"               CASE WHEN e.kind IN ('recall', 'edit') THEN t.msg_seq ELSE e.msg_seq END " \
	"           AND (p.leave_seq IS NULL OR p.leave_seq OPERATOR(pg_catalog.>=) " \
	"               CASE WHEN e.kind IN ('recall', 'edit') THEN t.msg_seq ELSE e.msg_seq END)) " \
	" OR (e.kind OPERATOR(pg_catalog.=) 'leave' AND EXISTS (SELECT 1 FROM im.membership_period p " \
	"         WHERE p.leave_event_id OPERATOR(pg_catalog.=) e.message_id " \
	"           AND p.user_id OPERATOR(pg_catalog.=) $1))) " \
	"AND " IM_NOT_DELETED_FOR_ME_SQL("$1")

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
	static SPIPlanPtr page_plan;
	int64		user_id = im_arg_user_id(fcinfo, 0, "user_id");
	int64		conversation_id = im_arg_id(fcinfo, 1, "conversation_id");
	int64		after_seq;
	int32		page_limit = im_arg_int32(fcinfo, 3, "page_limit", 1, 1000);
	int64		up_to_seq;
	ImConversation conv;
	Datum		args[5];
	Datum		values[3];
	bool		nulls[3] = {false, false, false};
	bool		isnull;

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

	im_require_conversation(conversation_id, &conv);
	up_to_seq = PG_ARGISNULL(4) ? conv.head_msg_seq : Min(PG_GETARG_INT64(4), conv.head_msg_seq);

	im_require_ever_member(user_id, conversation_id,
						   "Only positions inside one of the user's membership periods can be read.");

	/*
	 * One page plus one row: the extra row only tells has_more.  Positions
	 * the user may not see are skipped inside the range, so a page never
	 * ends early on an invisible stretch.
	 */
	im_prepare(&page_plan,
			   "WITH vis AS ("
			   "  SELECT e.*, pg_catalog.row_number() OVER (ORDER BY e.msg_seq) AS rn "
			   "  FROM (SELECT e.* FROM im.event e "
			   "        LEFT JOIN im.event t ON t.message_id OPERATOR(pg_catalog.=) e.target_message_id "
			   "        WHERE e.conversation_id OPERATOR(pg_catalog.=) $2 "
			   "          AND e.msg_seq OPERATOR(pg_catalog.>) $3 "
			   "          AND e.msg_seq OPERATOR(pg_catalog.<=) $4 "
			   "          AND " HISTORY_VISIBLE_SQL
			   "        ORDER BY e.msg_seq LIMIT $5 OPERATOR(pg_catalog.+) 1) e) "
			   "SELECT COALESCE(pg_catalog.jsonb_agg(" IM_EVENT_JSON_SQL
			   "           ORDER BY e.msg_seq) FILTER (WHERE e.rn OPERATOR(pg_catalog.<=) $5), "
			   "         '[]'::pg_catalog.jsonb), "
			   "       COALESCE(pg_catalog.max(e.msg_seq) "
			   "           FILTER (WHERE e.rn OPERATOR(pg_catalog.<=) $5), $3), "
			   "       pg_catalog.count(*) OPERATOR(pg_catalog.>) $5 "
			   "FROM vis e",
			   5, INT8OID, INT8OID, INT8OID, INT8OID, INT8OID);
	args[0] = Int64GetDatum(user_id);
	args[1] = Int64GetDatum(conversation_id);
	args[2] = Int64GetDatum(after_seq);
	args[3] = Int64GetDatum(up_to_seq);
	args[4] = Int64GetDatum((int64) page_limit);
	if (im_exec(page_plan, args, NULL, 1) != 1)
		elog(ERROR, "im_sync: fetch_messages page query returned no row");

	values[0] = im_get_datum_copy(0, 1, &isnull);
	values[1] = Int64GetDatum(im_get_int64(0, 2, NULL));
	values[2] = BoolGetDatum(im_get_bool(0, 3, NULL));
	im_srf_row(fcinfo, values, nulls);

	SPI_finish();
	return (Datum) 0;
}
