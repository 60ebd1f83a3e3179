/*
 * reaction_view.h — what a reader sees of a message's reactions (contract
 * §14): the SQL that history.c (fetch_messages) adds to message objects.
 */
#ifndef IM_REACTION_VIEW_H
#define IM_REACTION_VIEW_H

#include "im_sql.h"

#define OP_GET_JSON " OPERATOR(pg_catalog.->) "

/*
 * For an im.event row `e` (any kind; only a message gets keys) read by user
 * $1 in conversation $2 up to position $4: `reactions` ({"👍":2,…}, {} when
 * none) and `my_reactions` (the reader's keys, [] when none).  Per reacting
 * user, the latest reaction position the reader may see counts: one of the
 * reader's periods covers both the target and that position (contract §14),
 * so a member who left sees nothing made after it left.  A recalled target's
 * reactions are tombstones (body NULL, send.c), so it shows none.  The
 * reactions of one target are found through event_reaction_idx, in
 * (sender, msg_seq) order.
 */
#define IM_MESSAGE_REACTIONS_SQL \
	"(CASE WHEN e.kind" EQ "'message' THEN (" \
	"  WITH latest AS (" \
	"    SELECT DISTINCT ON (r.sender_id) r.sender_id, r.body" OP_GET_JSON "'reactions' AS keys " \
	"    FROM im.event r " \
	"    WHERE r.target_message_id" EQ "e.message_id AND r.kind" EQ "'reaction' " \
	"      AND r.msg_seq" LE "$4 " \
	"      AND EXISTS (SELECT 1 FROM im.membership_period rp " \
	"            WHERE rp.conversation_id" EQ "$2 AND rp.user_id" EQ "$1 " \
	"              AND rp.join_seq" LE "e.msg_seq " \
	"              AND (rp.leave_seq IS NULL OR rp.leave_seq" GE "r.msg_seq)) " \
	"    ORDER BY r.sender_id, r.msg_seq DESC) " \
	"  SELECT pg_catalog.jsonb_build_object(" \
	"    'reactions', COALESCE((SELECT pg_catalog.jsonb_object_agg(c.k, c.n) FROM (" \
	"        SELECT k.k, pg_catalog.count(*) AS n FROM latest l " \
	"        CROSS JOIN LATERAL pg_catalog.jsonb_array_elements_text(l.keys) AS k(k) " \
	"        WHERE l.keys IS NOT NULL GROUP BY k.k) c), '{}'::pg_catalog.jsonb), " \
	"    'my_reactions', COALESCE((SELECT l.keys FROM latest l WHERE l.sender_id" EQ "$1), " \
	"                             '[]'::pg_catalog.jsonb))) " \
	" ELSE '{}'::pg_catalog.jsonb END)"

#endif							/* IM_REACTION_VIEW_H */
