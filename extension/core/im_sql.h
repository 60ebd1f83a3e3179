/*
 * im_sql.h — SQL fragments shared by the extension's statements.
 *
 * Operators are schema-qualified in every statement: the workers run with
 * a default search_path, and an operator found through a search_path could
 * be a user's overload.  These macros spell them once.  Each is a string
 * literal with spaces around it, so it concatenates into a statement:
 * "WHERE a" EQ "$1".
 */
#ifndef IM_SQL_H
#define IM_SQL_H

#include "core/version_check.h"	/* IM_SHAPE_CHOOSE */

#define EQ " OPERATOR(pg_catalog.=) "
#define NE " OPERATOR(pg_catalog.<>) "
#define LT " OPERATOR(pg_catalog.<) "
#define LE " OPERATOR(pg_catalog.<=) "
#define GT " OPERATOR(pg_catalog.>) "
#define GE " OPERATOR(pg_catalog.>=) "
#define PLUS " OPERATOR(pg_catalog.+) "
#define MINUS " OPERATOR(pg_catalog.-) "
#define OP_TIMES " OPERATOR(pg_catalog.*) "
#define OP_MOD " OPERATOR(pg_catalog.%) "
#define OP_CONCAT " OPERATOR(pg_catalog.||) "
#define OP_OVERLAP " OPERATOR(pg_catalog.&&) "
#define OP_GET_TEXT " OPERATOR(pg_catalog.->>) "

/*
 * Membership period `p` (an alias of im.membership_period) covers position
 * `seq` (an SQL expression): join_seq <= seq <= leave_seq, an open period
 * having no end (contract §1).  Reconcile (reconcile.c) spells it out on
 * purpose: a checker must not share the code it checks.
 */
#define IM_PERIOD_COVERS_SQL(p, seq) \
	"(" p ".join_seq" LE seq " AND (" p ".leave_seq IS NULL OR " p ".leave_seq" GE seq "))"

/*
 * SQL predicate of contract §1: position e (an im.event row aliased `e`) is
 * not deleted for the user `user` (an SQL expression), neither the message
 * itself nor, for a recall or edit, its target (an edit would bring the
 * deleted text back).  The read paths (history, sync, message_status) use it.
 */
#define IM_NOT_DELETED_FOR_ME_SQL(user) \
	"NOT EXISTS (SELECT 1 FROM im.deleted_for_me d " \
	"         WHERE d.user_id" EQ user " " \
	"           AND (d.message_id" EQ "e.message_id " \
	"                OR d.message_id" EQ "e.target_message_id))"

/*
 * Page size in bytes (im_sync.max_page_bytes): the JSON text of a jsonb
 * array of n elements is "[" e1 ", " e2 … "]", i.e. the sum over its
 * elements of (octet_length(element text) + 2).  A window sum of
 * IM_PAGE_BYTES_SQL(x) over the rows in page order, compared with the
 * setting, ends a page before the element that would push it over.
 */
#define IM_PAGE_BYTES_SQL(x) \
	"(pg_catalog.octet_length((" x ")::pg_catalog.text)" PLUS "2)"

/*
 * The columns of a conversation position's contract §11 object, for an
 * im.event row aliased `e`, in a statement of catalog shape S
 * (core/version_check.h): the im.event columns whose keys have the same
 * name (IM_EVENT_COLUMN_KEYS, in order), then the relation columns
 * (IM_EVENT_RELATION_COLS_SQL): a message's reply_to_message_id, a pin's
 * target (kept in pin_message_id, its target_message_id key), NULLs on a
 * catalog without them, and taken_down (false on a catalog without it).  The one C builder of these objects
 * (user/event_json.c) reads them; sync pages and fetch_messages both
 * select them with IM_EVENT_COLUMNS_SQL.  X(column) is applied to each
 * name of IM_EVENT_COLUMN_KEYS, SEP between.
 */
#define IM_EVENT_COLUMN_KEYS(X, SEP) \
	X(kind) SEP X(conversation_id) SEP X(msg_seq) SEP X(message_id) SEP \
	X(sender_id) SEP X(content_type) SEP X(body) SEP X(target_message_id) SEP \
	X(recalled) SEP X(created_at)

#define IM_EVENT_RELATION_COLS_SQL(S) \
	IM_SHAPE_CHOOSE(S, "e.reply_to_message_id, e.pin_message_id", \
					"NULL::pg_catalog.int8, NULL::pg_catalog.int8") ", " \
	IM_TAKEDOWN_CHOOSE(S, "e.taken_down", "false")

#define IM_EVENT_COLUMN_SQL(column) "e." #column
#define IM_EVENT_COLUMNS_SQL(S) \
	IM_EVENT_COLUMN_KEYS(IM_EVENT_COLUMN_SQL, ", ") ", " IM_EVENT_RELATION_COLS_SQL(S)

/*
 * The retry backoff of contract §4, after `n` earlier failures of the same
 * kind (an SQL expression): a transient failure (never an attempt) waits
 * 1 s, 2 s, 4 s, … capped at 1 min; a charged attempt 10 s × 2^n capped at
 * 320 s.  Fanout's outbox items (fanout.c) and inbound transfers
 * (transfer_in.c) retry by the same rule.
 */
#define IM_TRANSIENT_BACKOFF_SQL(n) \
	"pg_catalog.make_interval(secs => LEAST(60, pg_catalog.power(2, LEAST(" n ", 6))))"
#define IM_CHARGED_BACKOFF_SQL(n) \
	"pg_catalog.make_interval(secs => 10" OP_TIMES "pg_catalog.power(2, LEAST(" n ", 5)))"

/*
 * Whether the reliable event of a conversation position (an im.event row
 * whose creation time is `created`) is processed on THIS node, given its
 * outbox item's state `state` (NULL when the node holds no item): done, or
 * no item although the position is older than the collection cutoff
 * (maintenance.c collects done items only, and only once processed before
 * the cutoff, so an item missing after it was never processed here).  On a
 * sharded node a copy's event can arrive as a dependency of a later
 * transfer (the target of a recall or edit) before its own transfer is
 * applied — quarantined, dead, or not yet arrived: it has no item, and
 * counting it as processed counted it in unread twice, once by a recount
 * and once when its own item is fanned out (extension/doc/sharding.md,
 * "Unread on a copy").  Unread (IM_UNREAD_RECOUNT_SQL) and fanout's recall
 * decrement (fanout.c) judge by this one predicate.
 */
#define IM_OUTBOX_COLLECTED_BEFORE_SQL \
	"COALESCE((SELECT m.at FROM im.maintenance_state m" \
	"          WHERE m.name" EQ "'outbox_collected_before'), '-infinity'::pg_catalog.timestamptz)"
#define IM_ITEM_PROCESSED_SQL(state, created) \
	"COALESCE(" state EQ "'done', " created LT IM_OUTBOX_COLLECTED_BEFORE_SQL ", false)"
/* The same for the event whose message_id is `event_id`, its item looked up. */
#define IM_EVENT_PROCESSED_SQL(event_id, created) \
	IM_ITEM_PROCESSED_SQL("(SELECT o.state FROM im.outbox o WHERE o.source_event_id" EQ event_id ")", created)

/*
 * The kinds whose position tombstones its target (a recall, a moderator's
 * takedown: contract §3, §17): unread drops the target when one is
 * processed, as `kind" EQ IM_TOMBSTONE_KINDS_SQL`.
 */
#define IM_TOMBSTONE_KINDS_SQL "ANY ('{recall,takedown}'::pg_catalog.text[])"

/*
 * Unread recount of contract §3 for fanout conversations: $1 user_id,
 * $2 conversation_id, $3 read_msg_seq.  Counts `message` positions from
 * other senders whose outbox item is processed (IM_ITEM_PROCESSED_SQL),
 * visible to the user by a membership period, not recalled or taken down by
 * a processed recall or takedown, not deleted for the user, above the read
 * cursor.  Fanout keeps
 * unread_count equal to this by increments; report_read/delete_for_me/
 * reconcile use it directly.
 */
#define IM_UNREAD_RECOUNT_SQL \
	"SELECT pg_catalog.count(*) FROM im.event e " \
	"WHERE e.conversation_id" EQ "$2 AND e.kind" EQ "'message' " \
	"  AND e.msg_seq" GT "$3 " \
	"  AND e.sender_id" NE "$1 " \
	"  AND " IM_EVENT_PROCESSED_SQL("e.message_id", "e.created_at") " " \
	"  AND EXISTS (SELECT 1 FROM im.membership_period p WHERE p.conversation_id" EQ "e.conversation_id " \
	"              AND p.user_id" EQ "$1 AND " IM_PERIOD_COVERS_SQL("p", "e.msg_seq") ") " \
	"  AND NOT EXISTS (SELECT 1 FROM im.event r WHERE r.target_message_id" EQ "e.message_id " \
	"              AND r.kind" EQ IM_TOMBSTONE_KINDS_SQL " " \
	"              AND " IM_EVENT_PROCESSED_SQL("r.message_id", "r.created_at") ") " \
	"  AND NOT EXISTS (SELECT 1 FROM im.deleted_for_me d WHERE d.user_id" EQ "$1 " \
	"              AND d.message_id" EQ "e.message_id)"

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
	/* a reaction needs the period to cover its own position too */ \
	" AND (e.kind" NE "'reaction' OR " IM_PERIOD_COVERS_SQL("p", "e.msg_seq") ") " \
	"WHERE o.outbox_id" EQ "ANY ($1::pg_catalog.int8[]) AND o.private_user_id IS NULL "

/*
 * Whether a legal hold (contract §18) covers what user `user_id` sent in
 * conversation `conversation_id` (SQL expressions): then retention, erasure
 * and evidence expiry keep it.  The one seam the legal-hold tables fill;
 * until they exist no hold covers anything.
 */
#define IM_LEGAL_HOLD_COVERS_SQL(conversation_id, user_id) "false"

#endif							/* IM_SQL_H */
