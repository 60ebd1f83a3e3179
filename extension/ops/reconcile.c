/*
 * reconcile.c — im.reconcile() and im.repair_fanout() (contract §8, design
 * doc §18.3).
 *
 * reconcile re-derives from the facts (events, membership periods, outbox)
 * what the materialized state (inboxes, heads, unread counts, device ACKs)
 * must be, and reports every difference as a row; a healthy database gives
 * none.  It only reads.  It protects the §2.3 invariants by making their
 * violation visible: fanout delivers exactly the users contract §1 lets see
 * a position, with the period it was made for; heads match their logs;
 * unread equals its recount; no ACK runs ahead of the log.
 *
 * Severities: "critical" means someone may see what they must not (extra
 * deliveries, overlapping periods, ACK beyond the log); "error" means a fact
 * is missing or a materialized value is wrong; "warning" is operational
 * (backlog, stuck sessions) and usually heals by itself.
 *
 * Cost: reconcile is a batch job.  It scans the processed outbox, the
 * periods and the logs; run it off-peak (or per shard in a later version).
 *
 * repair_fanout re-runs missing fanout through the regular idempotent path:
 * it puts the outbox item back to 'pending' (attempts 0), so fanout
 * redelivers with the ORIGINAL idempotency key (user, source_event_id,
 * period) and only the missing rows get inserted.  Recipients are never
 * decided from the current member list: the fanout decides them from the
 * periods again.  What cannot be decided safely — overlapping periods,
 * quarantined users, recipients whose log has been collected past the item
 * (their idempotency record is gone, so a redelivery would duplicate), or a
 * delivery nobody should have — is only reported for manual review (§18.3).
 */
#include "core/im_sync.h"
#include "core/common.h"
#include "core/shard_map.h"
#include "core/shmem.h"
#include "core/im_sql.h"
#include "conversation/conversation.h"
#include "shard/shard.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"

/*
 * Delivery audit of processed outbox items (contract §1, §4).  One row per
 * (item, user, scope) where expectation and inbox differ:
 *   missing       a user the periods let see the item has no inbox event (or,
 *                 for a shared_log 'message' position, no dirty marker whose
 *                 target reaches it);
 *   extra         an inbox event no period (or the private recipient) calls for;
 *   unverifiable  expected but absent, and the user's log has been collected
 *                 past the item: GC'd history is not checked.
 * Quarantined (item, user) pairs are expected nowhere (reported apart).
 * inbox.created_at and outbox.processed_at come from the same fanout
 * transaction, so "processed strictly after the oldest retained event" means
 * the item's event, if delivered, is still in the log.
 * Columns: the Anum_audit_* enum below (outbox_id, conversation_id,
 * msg_seq, source_event_id, user_id, scope, problem, kind, overlap: the user
 * has overlapping periods in the conversation).
 * The expected recipients are derived here on their own, with the period
 * predicate written out rather than fanout's RECIPIENTS_SQL or
 * IM_PERIOD_COVERS_SQL: a checker must not share the code it checks.
 */
#define DELIVERY_AUDIT_SQL \
	"WITH item AS (" \
	"  SELECT o.outbox_id, o.conversation_id, o.msg_seq, o.source_event_id, o.processed_at, " \
	"         o.private_user_id, COALESCE(e.kind, pe.kind) AS kind, " \
	"         (e.kind IN ('message', 'reaction', 'pin') AND e.mode" EQ "'shared_log') IS TRUE AS shared, " \
	"         COALESCE(t.msg_seq, e.msg_seq) AS vis_seq, " \
	"         CASE WHEN e.kind" EQ "'reaction' THEN e.msg_seq END AS own_seq " /* reactions and pins (contract §14) */ \
	"  FROM im.outbox o " \
	"  LEFT JOIN im.event e ON o.private_user_id IS NULL AND e.message_id" EQ "o.source_event_id " \
	"  LEFT JOIN im.event t ON t.message_id" EQ "e.target_message_id " \
	"  LEFT JOIN im.private_event pe ON o.private_user_id IS NOT NULL " \
	"       AND pe.private_event_id" EQ "o.source_event_id " \
	"  WHERE o.state" EQ "'done'), " \
	"exp AS (" \
	"  SELECT i.outbox_id, p.user_id, p.membership_period_id AS scope " \
	"  FROM item i JOIN im.membership_period p ON p.conversation_id" EQ "i.conversation_id " \
	"   AND p.join_seq" LE "i.vis_seq " \
	"   AND (p.leave_seq IS NULL OR p.leave_seq" GE "i.vis_seq) " \
	"   AND (i.own_seq IS NULL OR p.leave_seq IS NULL OR p.leave_seq" GE "i.own_seq) " \
	"  WHERE i.private_user_id IS NULL " \
	"  UNION " \
	"  SELECT i.outbox_id, p.user_id, p.membership_period_id " \
	"  FROM item i JOIN im.membership_period p ON p.leave_event_id" EQ "i.source_event_id " \
	"  WHERE i.kind" EQ "'leave' " \
	"  UNION " \
	"  SELECT i.outbox_id, i.private_user_id, 0 FROM item i WHERE i.private_user_id IS NOT NULL), " \
	"act AS (" \
	"  SELECT i.outbox_id, b.user_id, b.delivery_scope AS scope " \
	"  FROM item i JOIN im.inbox b ON b.source_event_id" EQ "i.source_event_id), " \
	"gc AS (" \
	"  SELECT h.user_id, (SELECT pg_catalog.min(b.created_at) FROM im.inbox b " \
	"                     WHERE b.user_id" EQ "h.user_id) AS first_at " \
	"  FROM im.user_head h WHERE h.gc_floor" GT "0), " \
	"cmp AS (" \
	"  SELECT COALESCE(x.outbox_id, a.outbox_id) AS outbox_id, COALESCE(x.user_id, a.user_id) AS user_id, " \
	"         COALESCE(x.scope, a.scope) AS scope, x.outbox_id IS NOT NULL AS expected, " \
	"         a.outbox_id IS NOT NULL AS delivered " \
	"  FROM (SELECT * FROM exp WHERE NOT EXISTS (SELECT 1 FROM im.fanout_quarantine q " \
	"        WHERE q.outbox_id" EQ "exp.outbox_id AND q.user_id" EQ "exp.user_id)) x " \
	"  FULL JOIN act a ON a.outbox_id" EQ "x.outbox_id AND a.user_id" EQ "x.user_id " \
	"   AND a.scope" EQ "x.scope) " \
	"SELECT i.outbox_id, i.conversation_id, i.msg_seq, i.source_event_id, c.user_id, c.scope, " \
	"  CASE WHEN NOT c.expected THEN 'extra' " \
	"       WHEN NOT i.shared AND g.user_id IS NOT NULL " \
	"            AND NOT COALESCE(i.processed_at" GT "g.first_at, false) THEN 'unverifiable' " \
	"       ELSE 'missing' END AS problem, " \
	"  i.kind, " \
	"  EXISTS (SELECT 1 FROM im.membership_period p1 JOIN im.membership_period p2 " \
	"          ON p2.conversation_id" EQ "p1.conversation_id " \
	"         AND p2.user_id" EQ "p1.user_id " \
	"         AND p2.membership_period_id" GT "p1.membership_period_id " \
	"         AND pg_catalog.int8range(p1.join_seq, p1.leave_seq, '[]')" OP_OVERLAP \
	"             pg_catalog.int8range(p2.join_seq, p2.leave_seq, '[]') " \
	"          WHERE p1.conversation_id" EQ "i.conversation_id " \
	"            AND p1.user_id" EQ "c.user_id) AS overlap " \
	"FROM cmp c JOIN item i ON i.outbox_id" EQ "c.outbox_id " \
	"LEFT JOIN gc g ON g.user_id" EQ "c.user_id " \
	"WHERE NOT (c.expected AND c.delivered) " \
	"  AND NOT (c.expected AND i.shared AND EXISTS (SELECT 1 FROM im.user_conversation uc " \
	"           WHERE uc.user_id" EQ "c.user_id " \
	"             AND uc.conversation_id" EQ "i.conversation_id " \
	"             AND uc.dirty_target_msg_seq" GE "i.msg_seq))"

/*
 * The checks of §18.3 that are one set-based query each.  Every query takes
 * $1 = im_sync.reconcile_outbox_age and $2 = im_sync.token_ttl in seconds
 * (most ignore them) and returns
 * (check_name, severity, conversation_id, user_id, detail) in a stable order.
 */
typedef struct ReconcileCheck
{
	const char *name;			/* for the plan cache and comments only */
	const char *sql;
} ReconcileCheck;

/* "is not a JSON array" (NULL body included) */
#define IS_DISTINCT_FROM_ARRAY_SQL " IS DISTINCT FROM 'array' "

static const ReconcileCheck checks[] = {
	/*
	 * Every accepted position has its reliable event (§3.2, §6.1).  Done
	 * items processed before the retention cutoff were collected
	 * (maintenance.c); their events were written in the same statement, so
	 * an event created after the cutoff must still have its item.
	 */
	{"message_without_outbox",
	 "SELECT 'message_without_outbox', 'error', e.conversation_id, e.sender_id, "
	 "  pg_catalog.jsonb_build_object('message_id', e.message_id, 'msg_seq', e.msg_seq, 'kind', e.kind) "
	 "FROM im.event e WHERE NOT EXISTS (SELECT 1 FROM im.outbox o "
	 "  WHERE o.source_event_id" EQ "e.message_id) "
	 "  AND e.created_at" GE "COALESCE((SELECT m.at FROM im.maintenance_state m "
	 "      WHERE m.name" EQ "'outbox_collected_before'), '-infinity') "
	 "ORDER BY e.conversation_id, e.msg_seq"},
	/*
	 * An outbox item is a position's (msg_seq set) or a private event's
	 * (its user set, no msg_seq).  No CHECK says so (one was planned at
	 * every send's outbox insert, under the conversation lock): the three
	 * statements that write the outbox give each item its shape.
	 */
	{"outbox_item_malformed",
	 "SELECT 'outbox_item_malformed', 'error', o.conversation_id, o.private_user_id, "
	 "  pg_catalog.jsonb_build_object('outbox_id', o.outbox_id, 'msg_seq', o.msg_seq, "
	 "    'source_event_id', o.source_event_id) "
	 "FROM im.outbox o WHERE (o.msg_seq IS NULL)" NE "(o.private_user_id IS NOT NULL) "
	 "ORDER BY o.conversation_id, o.outbox_id"},
	/*
	 * Every event belongs to a conversation.  No foreign key says so since
	 * 1.2 (its check cost every send a query): append.c writes an event only
	 * under its conversation's row lock, and conversations are never deleted.
	 */
	{"event_without_conversation",
	 "SELECT 'event_without_conversation', 'critical', e.conversation_id, e.sender_id, "
	 "  pg_catalog.jsonb_build_object('message_id', e.message_id, 'msg_seq', e.msg_seq, 'kind', e.kind) "
	 "FROM im.event e WHERE NOT EXISTS (SELECT 1 FROM im.conversation c "
	 "  WHERE c.conversation_id" EQ "e.conversation_id) "
	 "ORDER BY e.conversation_id, e.msg_seq"},
	/*
	 * contract §14: every reaction position carries its sender's
	 * whole set for the target, built on that sender's previous position for
	 * it: at most one key differs, the keys are distinct, 1..32 characters,
	 * at most 20; the target is a message of the conversation; a recalled
	 * target's reactions are all tombstones.  fetch_messages counts from the
	 * latest set per (user, target), so these sets are what the counts are.
	 */
	{"reaction_set",
	 "SELECT 'reaction_set_mismatch', 'error', r.conversation_id, r.sender_id, "
	 "  pg_catalog.jsonb_build_object('message_id', r.message_id, 'msg_seq', r.msg_seq, "
	 "    'target_message_id', r.target_message_id, 'body', r.body, 'previous', r.prev) "
	 "FROM (SELECT e.message_id, e.conversation_id, e.msg_seq, e.sender_id, e.target_message_id, "
	 "        e.body, t.kind AS t_kind, t.conversation_id AS t_conv, t.recalled AS t_recalled, "
	 "        pg_catalog.lag(e.body) OVER (PARTITION BY e.target_message_id, e.sender_id "
	 "                                     ORDER BY e.msg_seq) AS prev "
	 "      FROM im.event e JOIN im.event t ON t.message_id" EQ "e.target_message_id "
	 "      WHERE e.kind" EQ "'reaction') r "
	 "WHERE CASE WHEN r.t_recalled THEN r.body IS NOT NULL "
	 "  ELSE r.body IS NULL OR r.t_kind" NE "'message' OR r.t_conv" NE "r.conversation_id "
	 "    OR pg_catalog.jsonb_typeof(r.body" " OPERATOR(pg_catalog.->) " "'reactions')" NE "'array' "
	 "    OR (r.body" OP_GET_TEXT "'user_id')" NE "r.sender_id::pg_catalog.text "
	 "    OR (SELECT pg_catalog.count(*)" NE "pg_catalog.count(DISTINCT k.k) OR pg_catalog.count(*)" GT "20 "
	 "          OR COALESCE(pg_catalog.bool_or(pg_catalog.char_length(k.k) NOT BETWEEN 1 AND 32), false) "
	 "        FROM pg_catalog.jsonb_array_elements_text(r.body" " OPERATOR(pg_catalog.->) " "'reactions') k(k)) "
	 "    OR (SELECT pg_catalog.count(*) FROM ("
	 "          (SELECT k FROM pg_catalog.jsonb_array_elements_text(r.body" " OPERATOR(pg_catalog.->) " "'reactions') k "
	 "           EXCEPT SELECT k FROM pg_catalog.jsonb_array_elements_text("
	 "             COALESCE(r.prev" " OPERATOR(pg_catalog.->) " "'reactions', '[]')) k) "
	 "          UNION ALL "
	 "          (SELECT k FROM pg_catalog.jsonb_array_elements_text("
	 "             COALESCE(r.prev" " OPERATOR(pg_catalog.->) " "'reactions', '[]')) k "
	 "           EXCEPT SELECT k FROM pg_catalog.jsonb_array_elements_text(r.body" " OPERATOR(pg_catalog.->) " "'reactions') k)"
	 "        ) d)" GT "1 END "
	 "ORDER BY r.conversation_id, r.msg_seq"},
	/*
	 * every pin position carries the whole list, built on the
	 * conversation's previous pin position: at most one id differs, ids are
	 * distinct messages of the conversation, at most 50; the latest list
	 * holds no recalled message (a recall appends the list without it).
	 */
	{"pin_list",
	 "SELECT 'pin_list_mismatch', 'error', p.conversation_id, p.sender_id, "
	 "  pg_catalog.jsonb_build_object('message_id', p.message_id, 'msg_seq', p.msg_seq, "
	 "    'pinned', p.body, 'previous', p.prev) "
	 "FROM (SELECT e.*, pg_catalog.lag(e.body) OVER w AS prev, "
	 "        pg_catalog.row_number() OVER (PARTITION BY e.conversation_id ORDER BY e.msg_seq DESC) AS newest "
	 "      FROM im.event e WHERE e.kind" EQ "'pin' "
	 "      WINDOW w AS (PARTITION BY e.conversation_id ORDER BY e.msg_seq)) p "
	 "WHERE pg_catalog.jsonb_typeof(p.body" " OPERATOR(pg_catalog.->) " "'pinned')" IS_DISTINCT_FROM_ARRAY_SQL
	 "   OR (SELECT pg_catalog.count(*)" NE "pg_catalog.count(DISTINCT x.id) OR pg_catalog.count(*)" GT "50 "
	 "         OR pg_catalog.count(*)" NE "pg_catalog.count(m.message_id) "
	 "         OR (p.newest" EQ "1 AND COALESCE(pg_catalog.bool_or(m.recalled), false)) "
	 "       FROM pg_catalog.jsonb_array_elements_text(p.body" " OPERATOR(pg_catalog.->) " "'pinned') x(id) "
	 "       LEFT JOIN im.event m ON m.message_id" EQ "x.id::pg_catalog.int8 "
	 "            AND m.conversation_id" EQ "p.conversation_id AND m.kind" EQ "'message') "
	 "   OR (SELECT pg_catalog.count(*) FROM ("
	 "         (SELECT k FROM pg_catalog.jsonb_array_elements_text(p.body" " OPERATOR(pg_catalog.->) " "'pinned') k "
	 "          EXCEPT SELECT k FROM pg_catalog.jsonb_array_elements_text("
	 "            COALESCE(p.prev" " OPERATOR(pg_catalog.->) " "'pinned', '[]')) k) "
	 "         UNION ALL "
	 "         (SELECT k FROM pg_catalog.jsonb_array_elements_text("
	 "            COALESCE(p.prev" " OPERATOR(pg_catalog.->) " "'pinned', '[]')) k "
	 "          EXCEPT SELECT k FROM pg_catalog.jsonb_array_elements_text(p.body" " OPERATOR(pg_catalog.->) " "'pinned') k)"
	 "       ) d)" GT "1 "
	 "ORDER BY p.conversation_id, p.msg_seq"},
	/*
	 * a reply's and a pin's target (columns without a foreign key,
	 * checked by the functions under the conversation lock) is an earlier
	 * message of the same conversation; the same holds
	 * for the target of a recall, edit or reaction (target_message_id lost
	 * its foreign key: send.c and message_relations.c check it under the lock, and
	 * events are never deleted).  One event has at most one of the three.
	 */
	{"relation_target",
	 "SELECT 'relation_target_mismatch', 'error', e.conversation_id, e.sender_id, "
	 "  pg_catalog.jsonb_build_object('message_id', e.message_id, 'msg_seq', e.msg_seq, 'kind', e.kind, "
	 "    'target', COALESCE(e.target_message_id, e.reply_to_message_id, e.pin_message_id)) "
	 "FROM im.event e LEFT JOIN im.event t "
	 "  ON t.message_id" EQ "COALESCE(e.target_message_id, e.reply_to_message_id, e.pin_message_id) "
	 "WHERE (e.target_message_id IS NOT NULL OR e.reply_to_message_id IS NOT NULL "
	 "       OR e.pin_message_id IS NOT NULL) "
	 "  AND (t.message_id IS NULL OR t.kind" NE "'message' OR t.conversation_id" NE "e.conversation_id "
	 "       OR t.msg_seq" GE "e.msg_seq) "
	 "ORDER BY e.conversation_id, e.msg_seq"},
	/* Stored but not propagating: the outbox is stuck or the workers are down. */
	{"outbox_pending_too_old",
	 "SELECT 'outbox_pending_too_old', 'warning', o.conversation_id, o.private_user_id, "
	 "  pg_catalog.jsonb_build_object('outbox_id', o.outbox_id, 'msg_seq', o.msg_seq, "
	 "    'attempts', o.attempts, 'age_seconds', "
	 "    pg_catalog.floor(EXTRACT(epoch FROM pg_catalog.now()" MINUS "o.created_at))::bigint) "
	 /* an item that failed says why and when it runs next (e.g. a transient outage backing off) */
	 " " OP_CONCAT "CASE WHEN o.last_error IS NULL THEN '{}'::pg_catalog.jsonb "
	 "    ELSE pg_catalog.jsonb_build_object('last_error', o.last_error, "
	 "      'transient_failures', o.transient_failures, 'next_attempt_at', o.next_attempt_at) END "
	 "FROM im.outbox o WHERE o.state" EQ "'pending' "
	 "  AND o.created_at" LT "(pg_catalog.now()" MINUS
	 "      pg_catalog.make_interval(secs => $1)) "
	 "ORDER BY o.conversation_id, o.outbox_id"},
	/* Fanout hit exactly the periods covering each position (§18.3 line 3). */
	{"fanout_delivery",
	 "SELECT CASE d.problem WHEN 'extra' THEN 'fanout_extra' ELSE 'fanout_missing' END, "
	 "  CASE d.problem WHEN 'extra' THEN 'critical' ELSE 'error' END, "
	 "  d.conversation_id, d.user_id, "
	 "  pg_catalog.jsonb_build_object('outbox_id', d.outbox_id, 'msg_seq', d.msg_seq, "
	 "    'source_event_id', d.source_event_id, 'delivery_scope', d.scope, 'kind', d.kind) "
	 "FROM (" DELIVERY_AUDIT_SQL ") d WHERE d.problem" NE "'unverifiable' "
	 "ORDER BY d.conversation_id, d.user_id, d.outbox_id, d.scope"},
	/* An item covered by two periods of one user: kept, not delivered. */
	{"fanout_quarantined",
	 "SELECT 'fanout_quarantined', 'critical', o.conversation_id, q.user_id, "
	 "  pg_catalog.jsonb_build_object('outbox_id', q.outbox_id, 'msg_seq', o.msg_seq, "
	 "    'source_event_id', o.source_event_id, 'periods', pg_catalog.to_jsonb(q.periods)) "
	 "FROM im.fanout_quarantine q JOIN im.outbox o ON o.outbox_id" EQ "q.outbox_id "
	 "ORDER BY o.conversation_id, q.user_id, q.outbox_id"},
	/* Failed fanout_max_attempts times; the conversation moved on without it. */
	{"dead_letter",
	 "SELECT 'dead_letter', 'error', o.conversation_id, o.private_user_id, "
	 "  pg_catalog.jsonb_build_object('outbox_id', o.outbox_id, 'msg_seq', o.msg_seq, "
	 "    'source_event_id', o.source_event_id, 'attempts', o.attempts, 'last_error', o.last_error) "
	 "FROM im.outbox o WHERE o.state" EQ "'dead' "
	 "ORDER BY o.conversation_id, o.outbox_id"},
	/* The exclusion constraint should make this impossible; check anyway. */
	{"overlapping_periods",
	 "SELECT 'overlapping_periods', 'critical', p1.conversation_id, p1.user_id, "
	 "  pg_catalog.jsonb_build_object('periods', pg_catalog.jsonb_build_array("
	 "    pg_catalog.jsonb_build_object('membership_period_id', p1.membership_period_id, "
	 "      'join_seq', p1.join_seq, 'leave_seq', p1.leave_seq), "
	 "    pg_catalog.jsonb_build_object('membership_period_id', p2.membership_period_id, "
	 "      'join_seq', p2.join_seq, 'leave_seq', p2.leave_seq))) "
	 "FROM im.membership_period p1 JOIN im.membership_period p2 "
	 "  ON p2.conversation_id" EQ "p1.conversation_id "
	 " AND p2.user_id" EQ "p1.user_id "
	 " AND p2.membership_period_id" GT "p1.membership_period_id "
	 " AND pg_catalog.int8range(p1.join_seq, p1.leave_seq, '[]')" OP_OVERLAP
	 "     pg_catalog.int8range(p2.join_seq, p2.leave_seq, '[]') "
	 "ORDER BY p1.conversation_id, p1.user_id, p1.membership_period_id, p2.membership_period_id"},
	/* A user event must point at an existing fact (message + msg_seq). */
	{"inbox_missing_source",
	 "SELECT 'inbox_missing_source', 'error', b.conversation_id, b.user_id, "
	 "  pg_catalog.jsonb_build_object('sync_seq', b.sync_seq, 'source_event_id', b.source_event_id, "
	 "    'msg_seq', b.msg_seq, 'kind', b.kind) "
	 "FROM im.inbox b "
	 "LEFT JOIN im.event e ON b.msg_seq IS NOT NULL AND e.message_id" EQ "b.source_event_id "
	 "LEFT JOIN im.private_event pe ON b.msg_seq IS NULL AND pe.private_event_id" EQ "b.source_event_id "
	 "WHERE CASE WHEN b.msg_seq IS NOT NULL "
	 "  THEN e.message_id IS NULL OR e.conversation_id" NE "b.conversation_id "
	 "       OR e.msg_seq" NE "b.msg_seq "
	 "  ELSE b.kind" NE "'conversation_dirty' AND pe.private_event_id IS NULL END "
	 "ORDER BY b.conversation_id, b.user_id, b.sync_seq"},
	/* §18.3: a device ACK never exceeds the user's committed log. */
	{"ack_beyond_watermark",
	 "SELECT 'ack_beyond_watermark', 'critical', NULL::bigint, d.user_id, "
	 "  pg_catalog.jsonb_build_object('device_id', d.device_id, 'acked_sync_seq', d.acked_sync_seq, "
	 "    'high_watermark', COALESCE(h.high_watermark, 0)) "
	 "FROM im.device d LEFT JOIN im.user_head h ON h.user_id" EQ "d.user_id "
	 "WHERE d.acked_sync_seq" GT "COALESCE(h.high_watermark, 0) "
	 "ORDER BY d.user_id, d.device_id"},
	/* The single writer's counter equals the facts, and msg_seq is gap-free. */
	{"conversation_head",
	 "SELECT 'conversation_head_mismatch', 'error', c.conversation_id, NULL::bigint, "
	 "  pg_catalog.jsonb_build_object('head_msg_seq', c.head_msg_seq, 'max_msg_seq', s.max_seq, "
	 "    'positions', s.n) "
	 "FROM im.conversation c, LATERAL (SELECT COALESCE(pg_catalog.max(e.msg_seq), 0) AS max_seq, "
	 "    pg_catalog.count(*) AS n FROM im.event e "
	 "    WHERE e.conversation_id" EQ "c.conversation_id) s "
	 "WHERE c.head_msg_seq" NE "s.max_seq OR s.n" NE "s.max_seq "
	 "ORDER BY c.conversation_id"},
	/* sync_seq is gap-free per user: the log holds exactly (gc_floor, high_watermark]. */
	{"sync_seq_gap",
	 "SELECT 'sync_seq_gap', 'error', NULL::bigint, h.user_id, "
	 "  pg_catalog.jsonb_build_object('gc_floor', h.gc_floor, 'high_watermark', h.high_watermark, "
	 "    'retained_events', s.n, 'max_sync_seq', s.max_seq) "
	 "FROM im.user_head h, LATERAL (SELECT pg_catalog.count(*) AS n, "
	 "    COALESCE(pg_catalog.max(b.sync_seq), 0) AS max_seq FROM im.inbox b "
	 "    WHERE b.user_id" EQ "h.user_id "
	 "      AND b.sync_seq" GT "h.gc_floor) s "
	 "WHERE s.n" NE "(h.high_watermark" MINUS "h.gc_floor) "
	 "   OR s.max_seq" GT "h.high_watermark "
	 "ORDER BY h.user_id"},
	/*
	 * A session still ACTIVE after its lease and the last batch token it
	 * could have issued ran out: maintenance ends those (maintenance.c), so
	 * one left means maintenance is not running.
	 */
	{"recovery_session_stuck",
	 "SELECT 'recovery_session_stuck', 'warning', NULL::bigint, r.user_id, "
	 "  pg_catalog.jsonb_build_object('recovery_session_id', r.recovery_session_id, "
	 "    'device_id', r.device_id, 'sync_generation', r.sync_generation) "
	 "FROM im.recovery_session r WHERE r.state" EQ "'ACTIVE' "
	 "  AND r.expires_at" LT "(pg_catalog.now()" MINUS
	 "      pg_catalog.make_interval(secs => $2)) "
	 "ORDER BY r.user_id, r.recovery_session_id"},
	/*
	 * A snapshot past its expiry that was never installed: maintenance
	 * abandons those, so one left means maintenance is not running.
	 */
	{"snapshot_stuck",
	 "SELECT 'snapshot_stuck', 'warning', NULL::bigint, s.user_id, "
	 "  pg_catalog.jsonb_build_object('snapshot_id', s.snapshot_id, 'device_id', s.device_id, "
	 "    'state', s.state, 'sync_generation', s.sync_generation) "
	 "FROM im.snapshot s WHERE s.state" EQ "ANY ('{READY,BUILDING}'::text[]) "
	 "  AND s.installed_at IS NULL AND s.expires_at" LT "pg_catalog.now() "
	 "ORDER BY s.user_id, s.snapshot_id"},
};

#define NUM_CHECKS lengthof(checks)

/*
 * Unread counts of fanout conversations must equal IM_UNREAD_RECOUNT_SQL
 * (contract §3, §13.1).  shared_log conversations keep an upper bound and
 * are skipped.  One recount per state row: reconcile is a batch job.
 */
static void
check_unread(FunctionCallInfo fcinfo)
{
	static SPIPlanPtr rows_plan;
	static SPIPlanPtr recount_plan;
	uint64		n;
	int64	   *uid;
	int64	   *cid;
	int64	   *readseq;
	int64	   *stored;

	im_prepare(&rows_plan,
			   "SELECT uc.user_id, uc.conversation_id, uc.read_msg_seq, uc.unread_count "
			   "FROM im.user_conversation uc JOIN im.conversation c "
			   "  ON c.conversation_id" EQ "uc.conversation_id "
			   "WHERE c.mode" EQ "'fanout' "
			   "ORDER BY uc.conversation_id, uc.user_id", 0);
	im_prepare(&recount_plan, IM_UNREAD_RECOUNT_SQL, 3, INT8OID, INT8OID, INT8OID);

	n = im_exec(rows_plan, NULL, NULL, 0);
	if (n == 0)
		return;
	/* Copy out: the recount below replaces SPI_tuptable. */
	uid = palloc(sizeof(int64) * n);
	cid = palloc(sizeof(int64) * n);
	readseq = palloc(sizeof(int64) * n);
	stored = palloc(sizeof(int64) * n);
	for (uint64 r = 0; r < n; r++)
	{
		uid[r] = im_get_int64(r, 1, NULL);
		cid[r] = im_get_int64(r, 2, NULL);
		readseq[r] = im_get_int64(r, 3, NULL);
		stored[r] = im_get_int64(r, 4, NULL);
	}
	for (uint64 r = 0; r < n; r++)
	{
		Datum		args[3];
		int64		recount;

		args[0] = Int64GetDatum(uid[r]);
		args[1] = Int64GetDatum(cid[r]);
		args[2] = Int64GetDatum(readseq[r]);
		im_exec(recount_plan, args, NULL, 1);
		recount = im_get_int64(0, 1, NULL);
		if (recount != stored[r])
		{
			Datum		values[5];
			bool		nulls[5] = {false, false, false, false, false};
			char		detail[160];

			snprintf(detail, sizeof(detail),
					 "{\"unread_count\": " INT64_FORMAT ", \"recount\": " INT64_FORMAT
					 ", \"read_msg_seq\": " INT64_FORMAT "}",
					 stored[r], recount, readseq[r]);
			values[0] = CStringGetTextDatum("unread_mismatch");
			values[1] = CStringGetTextDatum("error");
			values[2] = Int64GetDatum(cid[r]);
			values[3] = Int64GetDatum(uid[r]);
			values[4] = DirectFunctionCall1(jsonb_in, CStringGetDatum(detail));
			im_srf_row(fcinfo, values, nulls);
		}
	}
}

/*
 * im.reconcile(): every §18.3 check, in a fixed order; no rows when healthy.
 */
PG_FUNCTION_INFO_V1(im_reconcile);
Datum
im_reconcile(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr plans[NUM_CHECKS];
	Datum		args[2];

	im_srf_begin(fcinfo);
	args[0] = Int32GetDatum(im_reconcile_outbox_age_s);
	args[1] = Int32GetDatum(im_token_ttl_s);

	im_spi_connect();
	for (int i = 0; i < (int) NUM_CHECKS; i++)
	{
		/* a pre-1.3 catalog has no reply or pin target columns */
		if (strcmp(checks[i].name, "relation_target") == 0 && !im_relation_catalog())
			continue;
		im_prepare(&plans[i], checks[i].sql, 2, INT4OID, INT4OID);
		im_exec(plans[i], args, NULL, 0);
		/* a sharded node reports its own facts and users only */
		im_shard_reconcile_rows_from_spi(fcinfo);
		/* The unread recount goes after the delivery checks it depends on. */
		if (strcmp(checks[i].name, "conversation_head") == 0)
			check_unread(fcinfo);
	}
	im_shard_reconcile(fcinfo);	/* transfers, slots, placement */
	SPI_finish();
	PG_RETURN_NULL();
}

/* ---- repair ----------------------------------------------------------- */

static void
repair_row(FunctionCallInfo fcinfo, const char *action, int64 outbox_id,
		   int64 conversation_id, bool user_null, int64 user_id, Datum detail)
{
	Datum		values[5];
	bool		nulls[5] = {false, false, false, false, false};

	values[0] = CStringGetTextDatum(action);
	values[1] = Int64GetDatum(outbox_id);
	values[2] = Int64GetDatum(conversation_id);
	values[3] = Int64GetDatum(user_id);
	nulls[3] = user_null;
	values[4] = detail;
	im_srf_row(fcinfo, values, nulls);
}

/*
 * im.repair_fanout(retry_dead boolean DEFAULT false, dry_run boolean DEFAULT false)
 *   RETURNS TABLE(action text, outbox_id bigint, conversation_id bigint,
 *                 user_id bigint, detail jsonb)
 *
 * Guarantees: an outbox item is put back to 'pending' only when every
 * difference of its delivery is a missing event of a user whose log still
 * holds the item's time and who has no overlapping periods, and it has no
 * extra delivery; redelivery then goes through the regular fanout with the
 * original idempotency key, so what was delivered stays untouched.
 * Everything else is reported as 'manual_review' and left alone.  Every
 * requeue leaves an im.audit row (who, which item, user, period, before and
 * after).  Dead letters are retried only when asked (retry_dead): the
 * operator fixes the cause first.
 */
/* Result columns of the delivery audit (DELIVERY_AUDIT_SQL), in order. */
enum
{
	Anum_audit_outbox_id = 1,
	Anum_audit_conversation_id,
	Anum_audit_msg_seq,
	Anum_audit_source_event_id,
	Anum_audit_user_id,
	Anum_audit_scope,
	Anum_audit_problem,
	Anum_audit_kind,
	Anum_audit_overlap
};

/* One difference the delivery audit found (one user of one item). */
typedef struct AuditRow
{
	int64		outbox_id;
	int64		conversation_id;
	int64		msg_seq;
	bool		msg_seq_null;
	int64		source_event_id;
	int64		user_id;
	int64		scope;
	char	   *problem;		/* missing | extra | unverifiable */
	char	   *kind;
	bool		overlap;
} AuditRow;

/*
 * The differences of the delivery audit, the rows of one item adjacent.
 * Collected history (unverifiable) only matters for items that also miss
 * something: it blocks their requeue.  Returns the count, rows palloc'd.
 */
static uint64
read_delivery_audit(AuditRow **rows)
{
	static SPIPlanPtr plan;
	uint64		n;
	uint64		kept = 0;
	AuditRow   *r;
	/* read the map before the audit's results (it may use SPI) */
	bool		sharded = im_shard_configured();

	im_prepare(&plan,
			   "SELECT * FROM (SELECT d.*, pg_catalog.bool_or(d.problem" EQ "'missing') "
			   "    OVER (PARTITION BY d.outbox_id) AS item_missing "
			   "  FROM (" DELIVERY_AUDIT_SQL ") d) z "
			   "WHERE z.problem" NE "'unverifiable' OR z.item_missing "
			   "ORDER BY z.outbox_id, z.user_id, z.scope", 0);
	n = im_exec(plan, NULL, NULL, 0);
	r = palloc0(sizeof(AuditRow) * (n + 1));
	for (uint64 i = 0; i < n; i++)
	{
		AuditRow   *k = &r[kept];

		k->user_id = im_get_int64(i, Anum_audit_user_id, NULL);
		/*
		 * a user placed on another node has no inbox here; it gets
		 * the item by transfer and its own node audits and repairs it (the
		 * same rows reconcile leaves out, shard_reconcile.c).  Counting it
		 * here would requeue every item with remote recipients.
		 */
		if (sharded && !im_shard_owns_bucket(im_shard_bucket(k->user_id)))
			continue;
		k->outbox_id = im_get_int64(i, Anum_audit_outbox_id, NULL);
		k->conversation_id = im_get_int64(i, Anum_audit_conversation_id, NULL);
		k->msg_seq = im_get_int64(i, Anum_audit_msg_seq, &k->msg_seq_null);
		k->source_event_id = im_get_int64(i, Anum_audit_source_event_id, NULL);
		k->scope = im_get_int64(i, Anum_audit_scope, NULL);
		k->problem = im_get_text(i, Anum_audit_problem);
		k->kind = im_get_text(i, Anum_audit_kind);
		k->overlap = im_get_bool(i, Anum_audit_overlap, NULL);
		kept++;
	}
	*rows = r;
	return kept;
}

/* Put one item back to pending if it is still in from_state. */
static bool
requeue_item(int64 outbox_id, const char *from_state)
{
	static SPIPlanPtr plan;
	Datum		a[2];

	im_prepare(&plan,
			   "UPDATE im.outbox SET state = 'pending', attempts = 0, last_error = NULL, "
			   "  next_attempt_at = pg_catalog.now() "
			   "WHERE outbox_id" EQ "$1 AND state" EQ "$2",
			   2, INT8OID, TEXTOID);
	a[0] = Int64GetDatum(outbox_id);
	a[1] = CStringGetTextDatum(from_state);
	return im_exec(plan, a, NULL, 0) == 1;
}

/*
 * The detail of one audited difference, built by SQL (every string is
 * escaped by jsonb): kind, source_event_id, delivery_scope, problem, and
 * msg_seq, reason and the state change only when they apply.
 */
static Datum
repair_detail(const AuditRow *r, const char *reason, bool requeued)
{
	static SPIPlanPtr plan;
	Datum		a[7];
	char		nulls[7] = {' ', ' ', ' ', ' ', ' ', ' ', ' '};
	bool		isnull;

	im_prepare(&plan,
			   "SELECT pg_catalog.jsonb_strip_nulls(pg_catalog.jsonb_build_object("
			   "  'kind', COALESCE($1, ''), 'source_event_id', $2, 'delivery_scope', $3, "
			   "  'problem', $4, 'msg_seq', $5, 'reason', $6, "
			   "  'state_before', CASE WHEN $7 THEN 'done' END, "
			   "  'state_after', CASE WHEN $7 THEN 'pending' END))",
			   7, TEXTOID, INT8OID, INT8OID, TEXTOID, INT8OID, TEXTOID, BOOLOID);
	a[0] = r->kind ? CStringGetTextDatum(r->kind) : (Datum) 0;
	nulls[0] = r->kind ? ' ' : 'n';
	a[1] = Int64GetDatum(r->source_event_id);
	a[2] = Int64GetDatum(r->scope);
	a[3] = CStringGetTextDatum(r->problem);
	a[4] = Int64GetDatum(r->msg_seq);
	nulls[4] = r->msg_seq_null ? 'n' : ' ';
	a[5] = reason ? CStringGetTextDatum(reason) : (Datum) 0;
	nulls[5] = reason ? ' ' : 'n';
	a[6] = BoolGetDatum(requeued);
	im_exec(plan, a, nulls, 1);
	return im_get_datum_copy(0, 1, &isnull);
}

/* The im.audit row of a requeue: which item, user, and the detail. */
static void
audit_requeue(const AuditRow *r, Datum detail)
{
	static SPIPlanPtr plan;
	Datum		a[4];

	im_prepare(&plan,
			   "INSERT INTO im.audit (action, user_id, detail) VALUES ('repair_fanout', $1, "
			   "  pg_catalog.jsonb_build_object('outbox_id', $2, 'conversation_id', $3, 'detail', $4))",
			   4, INT8OID, INT8OID, INT8OID, JSONBOID);
	a[0] = Int64GetDatum(r->user_id);
	a[1] = Int64GetDatum(r->outbox_id);
	a[2] = Int64GetDatum(r->conversation_id);
	a[3] = detail;
	im_exec(plan, a, NULL, 0);
}

/* Why an item that misses a delivery cannot be requeued safely. */
static const char *
manual_review_reason(const AuditRow *r)
{
	if (strcmp(r->problem, "extra") == 0)
		return "unexpected_delivery";
	if (strcmp(r->problem, "unverifiable") == 0)
		return "history_collected";
	if (r->overlap)
		return "overlapping_periods";
	return "other_recipient_not_safe";
}

/*
 * Phase 1: items that miss a delivery.  An item is safe when every one of
 * its rows is a missing event without overlapping periods; a safe item is
 * requeued (unless dry_run), every other is reported for manual review.
 * Returns true when something was requeued.
 */
static bool
requeue_missing(FunctionCallInfo fcinfo, bool dry_run)
{
	AuditRow   *rows;
	uint64		n = read_delivery_audit(&rows);
	bool		requeued_any = false;

	for (uint64 first = 0; first < n;)
	{
		uint64		last = first;
		bool		has_missing = false;
		bool		safe = true;
		bool		done = false;

		while (last + 1 < n && rows[last + 1].outbox_id == rows[first].outbox_id)
			last++;
		for (uint64 r = first; r <= last; r++)
		{
			if (strcmp(rows[r].problem, "missing") == 0)
			{
				has_missing = true;
				if (rows[r].overlap)
					safe = false;
			}
			else
				safe = false;	/* extra or unverifiable */
		}
		if (has_missing && safe && !dry_run)
		{
			done = requeue_item(rows[first].outbox_id, "done");
			requeued_any |= done;
		}
		for (uint64 r = first; has_missing && r <= last; r++)
		{
			const char *action;
			const char *reason = NULL;
			Datum		detail;

			if (!safe)
			{
				action = "manual_review";
				reason = manual_review_reason(&rows[r]);
			}
			else
				action = dry_run ? "would_requeue" : (done ? "requeued" : "skipped_changed");
			detail = repair_detail(&rows[r], reason, done);
			if (done)
			{
				audit_requeue(&rows[r], detail);
				im_counter_add_at_commit(IM_COUNTER_GAPS_REPAIRED_MISSING, 1);
			}
			repair_row(fcinfo, action, rows[r].outbox_id, rows[r].conversation_id,
					   false, rows[r].user_id, detail);
		}
		first = last + 1;
	}
	return requeued_any;
}

/* Phase 2: quarantined pairs (two periods cover the item); a person decides. */
static void
report_quarantine(FunctionCallInfo fcinfo)
{
	static SPIPlanPtr plan;
	uint64		n;

	im_prepare(&plan,
			   "SELECT q.outbox_id, o.conversation_id, q.user_id, "
			   "  pg_catalog.jsonb_build_object('reason', 'quarantined', 'msg_seq', o.msg_seq, "
			   "    'periods', pg_catalog.to_jsonb(q.periods)) "
			   "FROM im.fanout_quarantine q JOIN im.outbox o ON o.outbox_id" EQ "q.outbox_id "
			   "ORDER BY q.outbox_id, q.user_id", 0);
	n = im_exec(plan, NULL, NULL, 0);
	for (uint64 r = 0; r < n; r++)
	{
		bool		isnull;

		repair_row(fcinfo, "manual_review", im_get_int64(r, 1, NULL), im_get_int64(r, 2, NULL),
				   false, im_get_int64(r, 3, NULL), im_get_datum_copy(r, 4, &isnull));
	}
}

/*
 * Phase 3: dead letters, retried through the same fanout only on request
 * (retry_dead: the operator fixed the cause first).  Returns true when
 * something was requeued.
 */
static bool
retry_dead_letters(FunctionCallInfo fcinfo, bool retry_dead, bool dry_run)
{
	static SPIPlanPtr plan;
	uint64		n;
	int64	   *ids;
	int64	   *convs;
	int64	   *users;
	bool	   *users_null;
	Datum	   *details;
	bool		requeued_any = false;

	im_prepare(&plan,
			   "SELECT o.outbox_id, o.conversation_id, o.private_user_id, "
			   "  pg_catalog.jsonb_build_object('reason', 'dead_letter', 'msg_seq', o.msg_seq, "
			   "    'source_event_id', o.source_event_id, 'attempts', o.attempts) "
			   "FROM im.outbox o WHERE o.state" EQ "'dead' ORDER BY o.outbox_id", 0);
	n = im_exec(plan, NULL, NULL, 0);
	if (n == 0)
		return false;
	/* copied first: requeue_item runs statements of its own */
	ids = palloc(sizeof(int64) * n);
	convs = palloc(sizeof(int64) * n);
	users = palloc(sizeof(int64) * n);
	users_null = palloc(sizeof(bool) * n);
	details = palloc(sizeof(Datum) * n);
	for (uint64 r = 0; r < n; r++)
	{
		bool		isnull;

		ids[r] = im_get_int64(r, 1, NULL);
		convs[r] = im_get_int64(r, 2, NULL);
		users[r] = im_get_int64(r, 3, &users_null[r]);
		details[r] = im_get_datum_copy(r, 4, &isnull);
	}
	for (uint64 r = 0; r < n; r++)
	{
		const char *action = "manual_review";

		if (retry_dead && dry_run)
			action = "would_requeue";
		else if (retry_dead)
		{
			if (requeue_item(ids[r], "dead"))
			{
				action = "requeued";
				requeued_any = true;
				im_counter_add_at_commit(IM_COUNTER_GAPS_REPAIRED_DEAD, 1);
			}
			else
				action = "skipped_changed";
		}
		repair_row(fcinfo, action, ids[r], convs[r], users_null[r], users[r], details[r]);
	}
	return requeued_any;
}

PG_FUNCTION_INFO_V1(im_repair_fanout);
Datum
im_repair_fanout(PG_FUNCTION_ARGS)
{
	bool		retry_dead = PG_ARGISNULL(0) ? false : PG_GETARG_BOOL(0);
	bool		dry_run = PG_ARGISNULL(1) ? false : PG_GETARG_BOOL(1);
	bool		requeued_any;

	im_srf_begin(fcinfo);
	im_spi_connect();
	requeued_any = requeue_missing(fcinfo, dry_run);
	report_quarantine(fcinfo);
	requeued_any |= retry_dead_letters(fcinfo, retry_dead, dry_run);
	SPI_finish();
	if (requeued_any)
		im_wake_fanout_at_commit();
	PG_RETURN_NULL();
}
