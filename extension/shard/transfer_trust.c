/*
 * transfer_trust.c — what a node believes of a row another node sent it.
 *
 * A replicated im.transfer_out or im.transfer_ack row names its source,
 * destination and acker itself, and the node that wrote it controls every
 * column (and its own triggers and publications).  So the arrival triggers
 * (transfer_in.c, transfer_ack.c) ask this file first, and the apply asks it
 * about the payload:
 *
 *   - who delivered the row: in a logical replication worker the node its
 *     subscription replicates from, read from the subscription's name
 *     im_<node>_to_<self> (test/harness/shards.sh, extension/doc/sharding.md); a row
 *     inserted by a session is no other node's, except for a superuser who
 *     set session_replication_role = replica to play an apply worker (the
 *     regress and isolation tests, one database playing both nodes);
 *   - a transfer is taken in only when it is addressed to this node, comes
 *     from the delivering node, which is not this node, and this node's map
 *     places the conversation's bucket on that node (so never a conversation
 *     this node owns); a carried receipt instead when its sender is placed
 *     on this node (it comes from the readers' node); an ack only when it acknowledges a transfer of this
 *     node and names the delivering node as its acker;
 *   - a payload carries rows of its transfer's conversation only: the
 *     conversation row, events and periods with that conversation id and
 *     its bucket in their ids, none of them overwriting a row this node
 *     holds for another conversation.
 *
 * A refused arrival in an apply worker is dropped with a WARNING and a row
 * in im.transfer_refused (reconcile: transfer_refused) — an error there
 * would stop the subscription for good, and the row is not lost: its source
 * keeps a transfer until acknowledged.  A refused local insert is an error.
 * A payload that fails its check fails the apply: the transfer is
 * quarantined like any poison transfer.
 */
#include "core/im_sync.h"
#include "core/common.h"
#include "core/shard_map.h"
#include "core/version_check.h"
#include "core/im_sql.h"
#include "shard/shard.h"

#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "replication/worker_internal.h"
#include "utils/builtins.h"

/* a node name as im.shard_config allows it */
static bool
valid_node_name(const char *s, size_t len)
{
	if (len < 1 || len > 41 || s[0] < 'a' || s[0] > 'z')
		return false;
	for (size_t i = 1; i < len; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
			return false;
	return true;
}

ImArrival
im_transfer_arrival(const char *self, const char **from, const char **why)
{
	*from = NULL;
	*why = NULL;
	/*
	 * Inside a logical replication worker only the replicated row itself
	 * fires at trigger depth 1; a row our own arrival code inserts (deeper)
	 * is this node's own.
	 */
	if (MySubscription != NULL && DatumGetInt32(DirectFunctionCall1(pg_trigger_depth, (Datum) 0)) <= 1)
	{
		const char *sub = MySubscription->name;
		size_t		len = strlen(sub);
		size_t		tail = self ? strlen(self) + 4 : 0;

		if (self == NULL)
			*why = psprintf("subscription \"%s\" delivers to a node without a shard map", sub);
		else if (len > 3 + tail && strncmp(sub, "im_", 3) == 0 &&
				 strncmp(sub + len - tail, "_to_", 4) == 0 &&
				 strcmp(sub + len - tail + 4, self) == 0 &&
				 valid_node_name(sub + 3, len - 3 - tail))
			*from = pnstrdup(sub + 3, len - 3 - tail);
		else
			*why = psprintf("subscription \"%s\" is not named im_<source node>_to_%s, so it names no node",
							sub, self);
		return IM_ARRIVAL_SUBSCRIPTION;
	}
	if (SessionReplicationRole == SESSION_REPLICATION_ROLE_REPLICA && superuser_arg(GetOuterUserId()))
		return IM_ARRIVAL_PLAYED;
	return IM_ARRIVAL_LOCAL;
}

ImRowFate
im_transfer_row_fate(const char *self, const char *writer, const char *addressee,
					 ImArrival *via, const char **from, const char **reason)
{
	const char *why;

	*via = im_transfer_arrival(self, from, &why);
	if (*via != IM_ARRIVAL_SUBSCRIPTION && self != NULL && writer != NULL && strcmp(writer, self) == 0 &&
		addressee != NULL && strcmp(addressee, self) != 0)
		return IM_ROW_OWN;
	if (*via == IM_ARRIVAL_LOCAL && (self == NULL || addressee == NULL || strcmp(addressee, self) != 0))
		return IM_ROW_FOREIGN_LOCAL;
	if (*via == IM_ARRIVAL_LOCAL)
		*reason = "inserted by a session, not by a subscription's apply worker";
	else
	{
		if (*via == IM_ARRIVAL_PLAYED)
			*from = writer;		/* the claimed sender is believed */
		*reason = why;
	}
	return *reason ? IM_ROW_REFUSED : IM_ROW_CHECK;
}

/*
 * What every inbound transfer must show, a carried receipt too: this node
 * has a map, the transfer is addressed here, it names another node as its
 * source, and that node is the one that delivered it.
 */
static const char *
addressing_refusal(const char *self, const char *from, const char *source, const char *dest)
{
	if (self == NULL)
		return "this node has no shard map";
	if (dest == NULL || strcmp(dest, self) != 0)
		return psprintf("addressed to node \"%s\", not to this node", dest ? dest : "(null)");
	if (source == NULL || strcmp(source, self) == 0)
		return "it claims to come from this node itself";
	if (from == NULL || strcmp(source, from) != 0)
		return psprintf("it claims source \"%s\" but node \"%s\" delivered it", source, from ? from : "?");
	return NULL;
}

const char *
im_transfer_refusal(const char *self, const char *from, const char *source, const char *dest,
					int64 conversation_id)
{
	const char *owner;
	const char *refused = addressing_refusal(self, from, source, dest);

	if (refused != NULL)
		return refused;
	owner = im_shard_node_of_bucket(im_shard_bucket(conversation_id));
	if (owner == NULL || strcmp(owner, source) != 0)
		return psprintf("this node's map places conversation " INT64_FORMAT " (bucket %d) on node \"%s\", not on \"%s\"",
						conversation_id, im_shard_bucket(conversation_id), owner ? owner : "?", source);
	return NULL;
}

/*
 * A carried receipt (user/receipt.c) comes from a reader's node, not from
 * the conversation's: believed from its delivering node when addressed
 * here, for a sender this node's map places here; what it reports is
 * checked when it is applied (the reader placed on the source, the
 * conversation their pair; a group part is the source's own).
 */
const char *
im_receipt_transfer_refusal(const char *self, const char *from, const char *source, const char *dest,
							int64 sender_id)
{
	const char *owner;
	const char *refused = addressing_refusal(self, from, source, dest);

	if (refused != NULL)
		return refused;
	if (sender_id <= 0)
		return "a receipt that names no sender";
	owner = im_shard_node_of_bucket(im_shard_bucket(sender_id));
	if (owner == NULL || strcmp(owner, self) != 0)
		return psprintf("a receipt for sender " INT64_FORMAT ", whom this node's map places on node \"%s\"",
						sender_id, owner ? owner : "?");
	return NULL;
}

const char *
im_ack_refusal(const char *self, const char *from, const char *source, const char *applied_by)
{
	if (self == NULL)
		return "this node has no shard map";
	if (source == NULL || strcmp(source, self) != 0)
		return psprintf("it acknowledges a transfer of node \"%s\", not of this node", source ? source : "(null)");
	if (applied_by == NULL || strcmp(applied_by, self) == 0)
		return "it claims this node itself applied the transfer";
	if (from == NULL || strcmp(applied_by, from) != 0)
		return psprintf("it claims acker \"%s\" but node \"%s\" delivered it", applied_by, from ? from : "?");
	return NULL;
}

void
im_transfer_refuse(ImArrival via, const char *kind, const char *from, const char *source,
				   const char *dest, const char *applied_by, int64 transfer_id,
				   bool has_conversation, int64 conversation_id, const char *reason,
				   const char *trace_id)
{
	static SPIPlanPtr plan;
	Datum		args[9];
	char		nulls[9] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};
	const char *sub = MySubscription ? MySubscription->name : NULL;

	if (via != IM_ARRIVAL_SUBSCRIPTION)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("im_sync: refused %s %s " INT64_FORMAT " from \"%s\": %s",
						via == IM_ARRIVAL_LOCAL ? "a locally inserted" : "a played",
						kind, transfer_id, source ? source : "?", reason),
				 errhint(via == IM_ARRIVAL_LOCAL ?
						 "Transfers and acks of other nodes arrive only through their subscription im_<node>_to_<this node>." :
						 "The row fails the checks an arriving row must pass.")));
	ereport(WARNING,
			(errmsg("im_sync: refused %s " INT64_FORMAT " (source \"%s\", dest \"%s\", acker \"%s\") delivered by subscription \"%s\": %s; %s",
					kind, transfer_id, source ? source : "?", dest ? dest : "-", applied_by ? applied_by : "-",
					sub ? sub : "?", reason, im_log_trace("transfer", trace_id)),
			 errhint("Nothing of it was applied; reconcile lists it as transfer_refused.")));
	if (!im_catalog_at_least(1, 9))
		return;
	im_spi_connect();
	im_prepare(&plan,
			   "INSERT INTO im.transfer_refused (kind, subscription, delivered_by, source_node, dest_node,"
			   "                                 applied_by, transfer_id, conversation_id, reason)"
			   " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
			   9, TEXTOID, TEXTOID, TEXTOID, TEXTOID, TEXTOID, TEXTOID, INT8OID, INT8OID, TEXTOID);
	args[0] = CStringGetTextDatum(kind);
#define OPT_TEXT(i, s) do { if (s) args[i] = CStringGetTextDatum(s); else nulls[i] = 'n'; } while (0)
	OPT_TEXT(1, sub);
	OPT_TEXT(2, from);
	OPT_TEXT(3, source);
	OPT_TEXT(4, dest);
	OPT_TEXT(5, applied_by);
#undef OPT_TEXT
	args[6] = Int64GetDatum(transfer_id);
	args[7] = Int64GetDatum(conversation_id);
	nulls[7] = has_conversation ? ' ' : 'n';
	args[8] = CStringGetTextDatum(reason);
	im_exec(plan, args, nulls, 0);
	SPI_finish();
}

/*
 * The first row of the payload that is not its transfer's conversation's,
 * described; no row when all are.  $1 payload, $2 conversation, $3 source
 * event.  Ids carry their conversation's bucket (shard_map.h), so a row
 * with another bucket could take an id this node or another owner gives
 * out later.
 */
#define IM_PAYLOAD_FOREIGN_ROW_SQL \
	"WITH ev AS (SELECT x.message_id, x.conversation_id, x.target_message_id" \
	"            FROM pg_catalog.jsonb_array_elements(COALESCE($1->'events', '[]'::pg_catalog.jsonb)) j," \
	"                 pg_catalog.jsonb_populate_record(NULL::im.event, j.value" MINUS "'request_digest') x)," \
	" pe AS (SELECT x.membership_period_id, x.conversation_id FROM pg_catalog.jsonb_populate_recordset(" \
	"          NULL::im.membership_period, COALESCE($1->'periods', '[]'::pg_catalog.jsonb)) x) " \
	"SELECT w FROM (" \
	" SELECT 1, 'a conversation row of conversation '" OP_CONCAT "COALESCE($1->'conversation'->>'conversation_id', '(none)')" \
	"  WHERE ($1->'conversation'->>'conversation_id')::pg_catalog.int8 IS DISTINCT FROM $2" \
	" UNION ALL SELECT 2, 'event '" OP_CONCAT "COALESCE(ev.message_id::pg_catalog.text, '(none)')" OP_CONCAT \
	"  ' of conversation '" OP_CONCAT "COALESCE(ev.conversation_id::pg_catalog.text, '(none)') FROM ev" \
	"  WHERE ev.conversation_id IS DISTINCT FROM $2 OR ev.message_id IS NULL" \
	"     OR (ev.message_id" OP_MOD CppAsString2(IM_SHARD_BUCKETS) ")" NE "($2" OP_MOD CppAsString2(IM_SHARD_BUCKETS) ")" \
	" UNION ALL SELECT 3, 'event '" OP_CONCAT "e.message_id::pg_catalog.text" OP_CONCAT \
	"  ', which this node holds for conversation '" OP_CONCAT "e.conversation_id::pg_catalog.text" \
	"  FROM im.event e WHERE e.conversation_id" NE "$2 AND (e.message_id IN (SELECT ev.message_id FROM ev)" \
	"     OR e.message_id IN (SELECT ev.target_message_id FROM ev) OR e.message_id" EQ "$3)" \
	" UNION ALL SELECT 4, 'membership period '" OP_CONCAT "COALESCE(pe.membership_period_id::pg_catalog.text, '(none)')" \
	"  " OP_CONCAT "' of conversation '" OP_CONCAT "COALESCE(pe.conversation_id::pg_catalog.text, '(none)') FROM pe" \
	"  WHERE pe.conversation_id IS DISTINCT FROM $2 OR pe.membership_period_id IS NULL" \
	"     OR (pe.membership_period_id" OP_MOD CppAsString2(IM_SHARD_BUCKETS) ")" NE "($2" OP_MOD CppAsString2(IM_SHARD_BUCKETS) ")" \
	" UNION ALL SELECT 5, 'membership period '" OP_CONCAT "p.membership_period_id::pg_catalog.text" OP_CONCAT \
	"  ', which this node holds for conversation '" OP_CONCAT "p.conversation_id::pg_catalog.text" \
	"  FROM im.membership_period p WHERE p.conversation_id" NE "$2" \
	"   AND p.membership_period_id IN (SELECT pe.membership_period_id FROM pe)" \
	") z(o, w) ORDER BY o LIMIT 1"

void
im_transfer_check_payload(Datum payload, int64 conversation_id, int64 source_event_id)
{
	static SPIPlanPtr plan;
	Datum		args[3];

	im_prepare(&plan, IM_PAYLOAD_FOREIGN_ROW_SQL, 3, JSONBOID, INT8OID, INT8OID);
	args[0] = payload;
	args[1] = Int64GetDatum(conversation_id);
	args[2] = Int64GetDatum(source_event_id);
	if (im_exec(plan, args, NULL, 1) == 1)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("transfer for conversation " INT64_FORMAT " carries %s", conversation_id,
						im_get_text(0, 1)),
				 errhint("A transfer's payload may hold rows of its own conversation only; nothing of it was applied.")));
}
