/*
 * transfer_out.c — the conversation node's half of a transfer:
 * in the fanout transaction, one im.transfer_out row per (outbox item,
 * other node placing some of its recipients), with what that node needs to
 * deliver it through its own local fanout: the conversation row, the event
 * and the events it depends on (recall/edit target and the target's edits),
 * the ids of the recipients' membership periods, and the rows of the
 * periods this item opens or closes (with their join/leave events).
 *
 * Invariants protected here:
 *   - an item is marked done iff its local deliveries and its transfer rows
 *     commit together (called in the item's subtransaction), so nothing is
 *     lost between the two sides; the row stays until the destination's
 *     "applied" record comes back (transfer_ack.c);
 *   - only a conversation this node owns is transferred from: a copy's
 *     periods are those of the copy node's own users, so a destination never
 *     forwards anything;
 *   - a mode switch goes to every node holding an ex-member's state too,
 *     so its unread recount happens there as on one node;
 *   - the payload is the state at fanout time, read under the batch's locks;
 *     one conversation's items are fanned out in msg_seq order, so its
 *     transfers commit (and replicate) in msg_seq order.
 */
#include "core/im_sync.h"
#include "core/common.h"
#include "core/shard_map.h"
#include "core/im_sql.h"
#include "shard/shard.h"

#include "catalog/pg_type.h"
#include "utils/guc.h"

/*
 * A row as jsonb without its NULL columns (the destination's
 * jsonb_populate_record reads NULL for a missing key).  Only the row's own
 * keys: jsonb_strip_nulls would also strip the nulls inside a message body
 * (a body changed on its way to another node, test_body_roundtrip through
 * the router; regress 95_shard_recall_retry).
 */
#define IM_ROW_WITHOUT_NULLS_SQL(row) \
	"(SELECT pg_catalog.jsonb_object_agg(kv.key, kv.value)" \
	" FROM pg_catalog.jsonb_each(pg_catalog.to_jsonb(" row ")) kv" \
	" WHERE pg_catalog.jsonb_typeof(kv.value)" NE "'null')"

/*
 * The periods whose rows a transfer carries: those its item opens or closes
 * (the only two moments a period changes; that item reaches the member, its
 * period covering it), and any whose join item is a dead letter here (its
 * transfer never left, so the row must travel with the later ones).
 */
#define IM_CARRIED_PERIOD_SQL(p, o) \
	"(" o ".source_event_id IN (" p ".join_event_id, " p ".leave_event_id)" \
	" OR EXISTS (SELECT 1 FROM im.outbox jo WHERE jo.source_event_id" EQ p ".join_event_id" \
	"            AND jo.state" EQ "'dead'))"

void
im_transfer_out_write(const int64 *outbox_ids, int n)
{
	static SPIPlanPtr plan;
	Datum		args[2];

	if (n == 0 || !im_shard_configured())
		return;
	/* a run is one conversation's: its owner decides for all items */
	{
		static SPIPlanPtr conv_plan;

		im_prepare(&conv_plan,
				   "SELECT conversation_id FROM im.outbox WHERE outbox_id" EQ "$1",
				   1, INT8OID);
		args[0] = Int64GetDatum(outbox_ids[0]);
		if (im_exec(conv_plan, args, NULL, 1) != 1 ||
			!im_shard_owns_bucket(im_shard_bucket(im_get_int64(0, 1, NULL))))
			return;
	}
	/*
	 * cfg says LIMIT 1 (one row at most): never analyzed, a bare scan of
	 * im.shard_config is estimated at ~800 rows, which multiplied this plan's
	 * cost past jit_optimize_above_cost (the router's slow steps);
	 * JIT is also off for the statement (below).
	 */
	im_prepare(&plan,
			   "WITH cfg AS (SELECT self_name, bucket_nodes FROM im.shard_config LIMIT 1),"
			   " r AS (" IM_FANOUT_RECIPIENTS_SQL
			   /*
			    * A mode switch also reaches every ex-member's node: a switch
			    * back to fanout recounts the unread of everyone with state
			    * there (fanout_shared_log.c), and without it a later transfer
			    * flipped the copy's mode with no recount (unread_mismatch).
			    */
			   "  UNION SELECT o.outbox_id, p.user_id, p.membership_period_id FROM im.outbox o"
			   "  JOIN im.event e ON e.message_id" EQ "o.source_event_id AND e.kind" EQ "'mode'"
			   "  JOIN im.membership_period p ON p.conversation_id" EQ "e.conversation_id"
			   "  WHERE o.outbox_id" EQ "ANY ($1::pg_catalog.int8[]) AND o.private_user_id IS NULL),"
			   " d AS ("
			   "  SELECT r.outbox_id, cfg.bucket_nodes[(r.user_id" OP_MOD "64)" PLUS "1] AS node,"
			   "         pg_catalog.array_agg(DISTINCT r.membership_period_id) AS periods"
			   "  FROM r, cfg WHERE cfg.bucket_nodes[(r.user_id" OP_MOD "64)" PLUS "1]" NE "cfg.self_name"
			   "  GROUP BY 1, 2),"
			   " dep AS ("
			   /* the event, its target and the target's edits (a recall changed them) */
			   "  SELECT d.outbox_id, d.node, x.message_id FROM d"
			   "  JOIN im.outbox o ON o.outbox_id" EQ "d.outbox_id"
			   "  JOIN im.event e ON e.message_id" EQ "o.source_event_id"
			   "  JOIN im.event x ON x.message_id" EQ "e.message_id OR x.message_id" EQ "e.target_message_id"
			   "    OR (e.target_message_id IS NOT NULL AND x.target_message_id" EQ "e.target_message_id)"
			   "  UNION"
			   /* the join and leave events the carried periods refer to */
			   "  SELECT d.outbox_id, d.node, pe.ev FROM d"
			   "  JOIN im.outbox o ON o.outbox_id" EQ "d.outbox_id"
			   "  JOIN im.membership_period p ON p.membership_period_id" EQ "ANY (d.periods)"
			   "   AND " IM_CARRIED_PERIOD_SQL("p", "o")
			   "  CROSS JOIN LATERAL (VALUES (p.join_event_id), (p.leave_event_id)) pe(ev)"
			   "  WHERE pe.ev IS NOT NULL)"
			   "INSERT INTO im.transfer_out (transfer_id, source_node, dest_node, outbox_id, conversation_id,"
			   "                             msg_seq, source_event_id, payload)"
			   "SELECT $2 OPERATOR(pg_catalog.|) pg_catalog.nextval('im.transfer_id_seq'::pg_catalog.regclass),"
			   "  cfg.self_name, d.node, o.outbox_id, o.conversation_id, o.msg_seq, o.source_event_id,"
			   "  pg_catalog.jsonb_build_object("
			   "   'conversation', (SELECT " IM_ROW_WITHOUT_NULLS_SQL("c") " FROM im.conversation c"
			   "                    WHERE c.conversation_id" EQ "o.conversation_id),"
			   /*
			    * Period rows only as IM_CARRIED_PERIOD_SQL says; every
			    * transfer names all its recipients' periods by id, and the
			    * destination refuses one whose periods it never received
			    * (quarantine, never a silent miss).  Re-sending every
			    * recipient's period and join event with each item was most of
			    * a transfer's bytes.
			    */
			   "   'periods', COALESCE((SELECT pg_catalog.jsonb_agg(" IM_ROW_WITHOUT_NULLS_SQL("p") ")"
			   "               FROM im.membership_period p WHERE p.membership_period_id" EQ "ANY (d.periods)"
			   "                 AND " IM_CARRIED_PERIOD_SQL("p", "o") "),"
			   "               '[]'::pg_catalog.jsonb),"
			   "   'period_ids', pg_catalog.to_jsonb(d.periods),"
			   /* a copy never takes a send (IS421): the request digest stays home */
			   "   'events', (SELECT pg_catalog.jsonb_agg(" IM_ROW_WITHOUT_NULLS_SQL("x")
			   "                                      OPERATOR(pg_catalog.-) 'request_digest'::pg_catalog.text"
			   "                                      ORDER BY x.msg_seq)"
			   "              FROM im.event x WHERE x.message_id IN"
			   "              (SELECT dep.message_id FROM dep WHERE dep.outbox_id" EQ "d.outbox_id"
			   "               AND dep.node" EQ "d.node)))"
			   "FROM d JOIN im.outbox o ON o.outbox_id" EQ "d.outbox_id, cfg "
			   "ORDER BY o.msg_seq, d.node",
			   2, INT8ARRAYOID, INT8OID);
	args[0] = im_int8_array(outbox_ids, n);
	args[1] = Int64GetDatum(im_shard_transfer_id_base());
	{
		/*
		 * No JIT for this statement: its estimate grows with tables that are
		 * rarely analyzed on a fresh node (CTEs over jsonb aggregates), and
		 * once past jit_above_cost every fanout batch with remote recipients
		 * paid 0.3–1.5 s of compilation for a few rows.  Restored at the end
		 * of the statement, or by the (sub)transaction's abort on error.
		 */
		int			nest = NewGUCNestLevel();

		(void) set_config_option("jit", "off", PGC_USERSET, PGC_S_SESSION,
								 GUC_ACTION_SAVE, true, 0, false);
		im_exec(plan, args, NULL, 0);
		AtEOXact_GUC(true, nest);
	}
}

/*
 * A deletion for oneself handed off to the user's node (read_state.c): one
 * transfer, from this conversation's node, for this conversation, carrying
 * the deletion {user_id, message_id}, the conversation row and the
 * message's event (so the destination holds the event it refers to even
 * when the message's own transfer comes later: held here by a failure, or
 * applied there after a quarantine).  msg_seq is the message's, so on the
 * destination it is applied in the conversation's order: after the
 * message's own transfer when that came first (a smaller transfer id at
 * the same msg_seq; fanout takes a conversation's positions before its
 * private items), behind any quarantined transfer of the conversation.
 */
bool
im_transfer_out_write_deletion(int64 outbox_id)
{
	static SPIPlanPtr plan;
	Datum		args[2];

	if (!im_shard_configured())
		return false;
	im_prepare(&plan,
			   "WITH cfg AS (SELECT self_name, bucket_nodes FROM im.shard_config LIMIT 1) "
			   "INSERT INTO im.transfer_out (transfer_id, source_node, dest_node, outbox_id, conversation_id,"
			   "                             msg_seq, source_event_id, payload)"
			   "SELECT $2 OPERATOR(pg_catalog.|) pg_catalog.nextval('im.transfer_id_seq'::pg_catalog.regclass),"
			   "  cfg.self_name, cfg.bucket_nodes[(pe.user_id" OP_MOD "64)" PLUS "1], o.outbox_id,"
			   "  o.conversation_id, e.msg_seq, o.source_event_id,"
			   "  pg_catalog.jsonb_build_object("
			   "   'conversation', (SELECT " IM_ROW_WITHOUT_NULLS_SQL("c") " FROM im.conversation c"
			   "                    WHERE c.conversation_id" EQ "o.conversation_id),"
			   "   'events', pg_catalog.jsonb_build_array(" IM_ROW_WITHOUT_NULLS_SQL("e")
			   "                                      OPERATOR(pg_catalog.-) 'request_digest'::pg_catalog.text),"
			   "   'deletion', pg_catalog.jsonb_build_object('user_id', pe.user_id, 'message_id', pe.message_id))"
			   "FROM cfg, im.outbox o"
			   " JOIN im.private_event pe ON pe.private_event_id" EQ "o.source_event_id"
			   "  AND pe.kind" EQ "'delete_for_me'"
			   " JOIN im.event e ON e.message_id" EQ "pe.message_id AND e.conversation_id" EQ "o.conversation_id"
			   " WHERE o.outbox_id" EQ "$1"
			   "  AND cfg.bucket_nodes[(o.conversation_id" OP_MOD "64)" PLUS "1]" EQ "cfg.self_name"
			   "  AND cfg.bucket_nodes[(pe.user_id" OP_MOD "64)" PLUS "1]" NE "cfg.self_name",
			   2, INT8OID, INT8OID);
	args[0] = Int64GetDatum(outbox_id);
	args[1] = Int64GetDatum(im_shard_transfer_id_base());
	return im_exec(plan, args, NULL, 0) == 1;
}
