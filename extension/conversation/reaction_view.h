/*
 * reaction_view.h — what a reader sees of a message's reactions (contract
 * §14): the SQL that history.c (fetch_messages) adds to message objects.
 */
#ifndef IM_REACTION_VIEW_H
#define IM_REACTION_VIEW_H

#include "im_sql.h"

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
 * The keys of a row `e` of the page (only a message gets them):
 * `reactions` ({"👍":2,…}, {} when none) and `my_reactions` (the reader's
 * keys, [] when none).
 */
#define IM_MESSAGE_REACTIONS_SQL \
	"(CASE WHEN e.kind" EQ "'message' THEN pg_catalog.jsonb_build_object(" \
	"   'reactions', COALESCE(rxc.counts, '{}'::pg_catalog.jsonb), " \
	"   'my_reactions', COALESCE(rxm.keys, '[]'::pg_catalog.jsonb)) " \
	" ELSE '{}'::pg_catalog.jsonb END)"

#endif							/* IM_REACTION_VIEW_H */
