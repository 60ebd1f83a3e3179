/*
 * shard_reconcile.c — the node-side reconcile checks of a sharded node,
 * appended to im.reconcile().  The router's reconcile is the
 * union over nodes plus the cross-node checks (it reads
 * im.message_audience / im.shard_received_positions for those).
 *
 * Two parts:
 *   - which rows of the single-node checks belong to this node: facts of a
 *     conversation (heads, reactions, pins, targets, outbox) are checked on
 *     its own node only (a copy holds only what its users see), deliveries
 *     only for users placed here (the others get theirs on their node);
 *   - the transfer checks: quarantined inbound transfers, transfers unacked
 *     or unapplied past im_sync.reconcile_outbox_age, replication slots that
 *     lost (or are about to lose) WAL, disabled subscriptions, user heads of
 *     users placed elsewhere, replicated rows refused at arrival.
 * Nothing here runs on an unsharded node.
 */
#include "core/im_sync.h"
#include "core/common.h"
#include "core/shard_map.h"
#include "core/version_check.h"
#include "core/im_sql.h"
#include "shard/shard.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/builtins.h"

/* single-node checks about a conversation's own facts (see reconcile.c) */
static const char *const conversation_checks[] = {
	"message_without_outbox", "event_without_conversation", "reaction_set_mismatch",
	"pin_list_mismatch", "relation_target_mismatch", "conversation_head_mismatch",
	"outbox_pending_too_old", "dead_letter", "overlapping_periods", NULL
};

static bool
is_conversation_check(const char *name)
{
	for (int i = 0; conversation_checks[i]; i++)
		if (strcmp(conversation_checks[i], name) == 0)
			return true;
	return false;
}

void
im_shard_reconcile_rows_from_spi(FunctionCallInfo fcinfo)
{
	Datum		values[5];
	bool		nulls[5];
	bool		sharded = im_shard_configured();

	for (uint64 r = 0; r < SPI_processed; r++)
	{
		for (int c = 0; c < 5; c++)
			values[c] = SPI_getbinval(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, c + 1, &nulls[c]);
		if (sharded)
		{
			char	   *name = TextDatumGetCString(values[0]);

			if (is_conversation_check(name) && !nulls[2] &&
				!im_shard_owns_bucket(im_shard_bucket(DatumGetInt64(values[2]))))
				continue;		/* a copy: its own node checks the facts */
			if (strcmp(name, "fanout_missing") == 0 && !nulls[3] &&
				!im_shard_owns_bucket(im_shard_bucket(DatumGetInt64(values[3]))))
				continue;		/* delivered on the user's node (transfers) */
		}
		im_srf_row(fcinfo, values, nulls);
	}
}

/* $1 = im_sync.reconcile_outbox_age in seconds; (check, severity, conversation, user, detail) */
static const char *const transfer_checks[] = {
	/*
	 * Quarantined (retried, holding the later transfers of its conversation)
	 * and dead ones (past im_sync.fanout_max_attempts; the later ones flowed
	 * past it; repair: fix the cause, im.shard_retry_quarantined).  The
	 * detail adds attempts, next_attempt_at (absent: no automatic retry) and
	 * how many later transfers a quarantined one holds; read through
	 * to_jsonb so the same text serves an older catalog without them.
	 */
	"SELECT 'transfer_' " OP_CONCAT " t.state, 'error', t.conversation_id, NULL::pg_catalog.int8, "
	"  pg_catalog.jsonb_build_object('source_node', t.source_node, 'transfer_id', t.transfer_id, "
	"    'msg_seq', t.msg_seq, 'source_event_id', t.source_event_id, 'error', t.last_error) "
	"  " OP_CONCAT " pg_catalog.jsonb_strip_nulls(pg_catalog.jsonb_build_object("
	"    'attempts', pg_catalog.to_jsonb(t) -> 'attempts', "
	"    'next_attempt_at', pg_catalog.to_jsonb(t) -> 'next_attempt_at', "
	"    'holds', CASE WHEN t.state" EQ "'quarantined' AND (pg_catalog.to_jsonb(t) ->> 'next_attempt_at') IS NOT NULL "
	"      THEN (SELECT pg_catalog.count(*) FROM im.transfer_in h "
	"            WHERE h.conversation_id" EQ "t.conversation_id AND h.state" EQ "'pending' "
	"              AND (h.msg_seq, h.transfer_id)" GT "(t.msg_seq, t.transfer_id)) END)) "
	"FROM im.transfer_in t WHERE t.state" EQ "ANY ('{quarantined,dead}'::pg_catalog.text[]) "
	"ORDER BY t.source_node, t.transfer_id",

	"SELECT 'transfer_unacked_too_old', 'warning', t.conversation_id, NULL::pg_catalog.int8, "
	"  pg_catalog.jsonb_build_object('dest_node', t.dest_node, 'transfer_id', t.transfer_id, "
	"    'msg_seq', t.msg_seq, 'age_seconds', "
	"    pg_catalog.floor(EXTRACT(epoch FROM pg_catalog.now()" MINUS "t.created_at))::pg_catalog.int8) "
	"FROM im.transfer_out t WHERE t.created_at" LT "(pg_catalog.now()" MINUS "pg_catalog.make_interval(secs => $1)) "
	"ORDER BY t.dest_node, t.transfer_id",

	"SELECT 'transfer_unapplied_too_old', 'warning', t.conversation_id, NULL::pg_catalog.int8, "
	"  pg_catalog.jsonb_build_object('source_node', t.source_node, 'transfer_id', t.transfer_id, "
	"    'msg_seq', t.msg_seq) "
	"FROM im.transfer_in t WHERE t.state" EQ "'pending' "
	"  AND t.received_at" LT "(pg_catalog.now()" MINUS "pg_catalog.make_interval(secs => $1)) "
	"ORDER BY t.source_node, t.transfer_id",

	/*
	 * A slot that lost WAL (max_slot_wal_keep_size) can never deliver the
	 * transfers in that WAL: critical, with the repair path of
	 * extension/doc/sharding.md (the transfer rows are still here, unacked).
	 */
	"SELECT CASE s.wal_status WHEN 'lost' THEN 'replication_slot_lost' ELSE 'replication_slot_at_limit' END, "
	"  CASE s.wal_status WHEN 'lost' THEN 'critical' ELSE 'warning' END, NULL::pg_catalog.int8, NULL::pg_catalog.int8, "
	"  pg_catalog.jsonb_build_object('slot_name', s.slot_name, 'wal_status', s.wal_status, "
	"    'safe_wal_size', s.safe_wal_size) "
	"FROM pg_catalog.pg_replication_slots s "
	"WHERE s.slot_name LIKE 'im\\_%' AND s.wal_status" EQ "ANY ('{lost,unreserved}'::pg_catalog.text[]) "
	"ORDER BY s.slot_name",

	"SELECT 'subscription_disabled', 'warning', NULL::pg_catalog.int8, NULL::pg_catalog.int8, "
	"  pg_catalog.jsonb_build_object('subscription', s.subname) "
	"FROM pg_catalog.pg_subscription s "
	"WHERE s.subdbid" EQ "(SELECT oid FROM pg_catalog.pg_database WHERE datname" EQ "pg_catalog.current_database()) "
	"  AND s.subname LIKE 'im\\_%' AND NOT s.subenabled ORDER BY s.subname",

	"SELECT 'user_head_misplaced', 'critical', NULL::pg_catalog.int8, h.user_id, "
	"  pg_catalog.jsonb_build_object('bucket', h.user_id" OP_MOD "64, 'node', "
	"    c.bucket_nodes[(h.user_id" OP_MOD "64)" PLUS "1]) "
	"FROM im.user_head h, im.shard_config c "
	"WHERE c.bucket_nodes[(h.user_id" OP_MOD "64)" PLUS "1]" NE "c.self_name ORDER BY h.user_id",
};

void
im_shard_reconcile(FunctionCallInfo fcinfo)
{
	static SPIPlanPtr plans[lengthof(transfer_checks)];
	Datum		args[1];

	if (!im_shard_configured())
		return;
	args[0] = Int32GetDatum(im_reconcile_outbox_age_s);
	for (int i = 0; i < (int) lengthof(transfer_checks); i++)
	{
		im_prepare(&plans[i], transfer_checks[i], 1, INT4OID);
		im_exec(plans[i], args, NULL, 0);
		im_srf_rows_from_spi(fcinfo, 5);
	}
	if (im_catalog_at_least(1, 9))
	{
		/*
		 * Replicated rows refused at arrival (transfer_trust.c): a forged or
		 * misaddressed row, or a subscription not named after its source.
		 */
		static SPIPlanPtr refused;

		im_prepare(&refused,
				   "SELECT 'transfer_refused', 'error', r.conversation_id, NULL::pg_catalog.int8, "
				   "  pg_catalog.jsonb_strip_nulls(pg_catalog.jsonb_build_object('kind', r.kind, "
				   "    'subscription', r.subscription, 'delivered_by', r.delivered_by, "
				   "    'source_node', r.source_node, 'dest_node', r.dest_node, 'applied_by', r.applied_by, "
				   "    'transfer_id', r.transfer_id, 'reason', r.reason, 'refused_at', r.refused_at)) "
				   "FROM im.transfer_refused r ORDER BY r.refused_id",
				   0);
		im_exec(refused, NULL, NULL, 0);
		im_srf_rows_from_spi(fcinfo, 5);
	}
}
