/*
 * transfer_in.c — the destination's half of a transfer.
 *
 * Arrival: the subscription's apply worker inserts the replicated
 * im.transfer_out row; the ENABLE ALWAYS BEFORE INSERT trigger
 * (im.transfer_out_arrive) records it in im.transfer_in under its exact key
 * (source node, transfer id) — a pair already recorded only counts a
 * duplicate — and returns NULL, so the replicated row itself is never
 * stored and no unique key of a replicated table is ever hit by the apply
 * worker (a conflict there would stop the subscription in a retry loop).
 * Nothing else runs inside the apply worker.
 *
 * Apply (im.shard_apply_transfers, the workers, im.run_fanout): the node's
 * own code turns pending rows into local copies — the conversation row,
 * the events, the recipients' periods — plus an outbox item, and the SAME
 * local fanout delivers it with the same idempotency key (user, source
 * event, period), in msg_seq order, with heads, states, unread, markers,
 * hints and push jobs as for a local conversation.  Then the "applied"
 * record goes back (im.transfer_ack).
 *
 * Invariants protected here:
 *   - a redelivered transfer (replication restarted from an older
 *     position, a re-created subscription) changes nothing: exact-key
 *     filter at arrival, upserts and ON CONFLICT DO NOTHING on the outbox
 *     item when applied again;
 *   - one applier at a time (an advisory lock), pending rows in
 *     (conversation, msg_seq) order, so a conversation's outbox items appear
 *     in msg_seq order, as on its own node;
 *   - a poison transfer (its apply fails) is quarantined with its error in
 *     its own subtransaction and acknowledged (the destination holds it and
 *     its payload, reconcile reports it); other conversations flow;
 *   - the single-node order of a failing item, per conversation: a
 *     quarantined transfer is retried with fanout's backoff and holds the
 *     later transfers of its conversation on this node until it applies, or
 *     until it is dead after im_sync.fanout_max_attempts charged attempts
 *     (shard.h); so a recall or edit never reaches the log before its target
 *     unless the target is dead.  Older catalogs: extension/doc/upgrades.md,
 *     "Catalog history kept in code".
 */
#include "core/im_sync.h"
#include "core/common.h"
#include "core/shard_map.h"
#include "core/shmem.h"
#include "core/version_check.h"
#include "core/im_sql.h"
#include "user/user.h"
#include "shard/shard.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/numeric.h"
#include "storage/proc.h"
#include "utils/resowner.h"

/* advisory lock class of the one applier ("IMTI") */
#define IM_TRANSFER_APPLY_LOCK_CLASS 0x494d5449

/* The replicated row's column of im.transfer_out by name (no attnum assumptions). */
static Datum
row_value(TriggerData *td, const char *name, bool *isnull)
{
	TupleDesc	desc = td->tg_relation->rd_att;
	int			attno = SPI_fnumber(desc, name);

	if (attno <= 0)
		elog(ERROR, "im_sync: im.transfer_out has no column %s", name);
	return SPI_getbinval(td->tg_trigtuple, desc, attno, isnull);
}

static char *
row_text(TriggerData *td, const char *name)
{
	bool		isnull;
	Datum		d = row_value(td, name, &isnull);

	return isnull ? NULL : TextDatumGetCString(d);
}

/*
 * A transfer new to im.transfer_in but sent before its source's pruning
 * horizon (maintenance.c pruned the exact records of that age) is judged,
 * not applied blindly: this node's outbox item of its event (of a deletion
 * handed off: its deleted_for_me row; a carried receipt is always taken
 * for a replay, since every later receipt of its source supersedes it) is
 * the record that it was applied (a
 * duplicate: settled as applied, counted, acked again); without one it is
 * quarantined with the reason, so a replay of old WAL is never applied
 * twice and a very late new transfer is never dropped unseen
 * (im.shard_retry_quarantined applies it).  Its own statement, after
 * the insert: a prune that deleted the old record committed before the
 * insert returned, so its horizon is visible here.  args: the arrival's.
 */
static bool
judged_beyond_horizon(Datum *args)
{
	static SPIPlanPtr plan;
	Datum		jargs[4] = {args[0], args[1], args[4], args[5]};

	im_prepare(&plan,
			   "UPDATE im.transfer_in t SET"
			   "  state = CASE WHEN x.held THEN 'applied' ELSE 'quarantined' END,"
			   "  duplicates = CASE WHEN x.held THEN 1 ELSE 0 END,"
			   "  applied_at = pg_catalog.now(),"
			   "  payload = CASE WHEN x.held THEN NULL ELSE t.payload END,"
			   "  last_error = CASE WHEN x.held THEN NULL ELSE"
			   "   '55000: sent before the pruning horizon of its source and this node holds no outbox item"
			   " of its event: a new transfer delivered very late (retry it with im.shard_retry_quarantined)"
			   " or a replay of one applied and pruned long ago (delete it)' END "
			   "FROM (SELECT ($4 OPERATOR(pg_catalog.?) 'receipt')"
			   /*
			    * a carried receipt is superseded by every later one of its
			    * source (cumulative, or replacing its part): one sent before
			    * the horizon is a replay, dropped as a duplicate
			    */
			   "   OR EXISTS (SELECT 1 FROM im.outbox o WHERE o.source_event_id" EQ "$3)"
			   /* a handed-off deletion: this node's record of it */
			   "   OR EXISTS (SELECT 1 FROM im.deleted_for_me d"
			   "     WHERE d.user_id" EQ "($4->'deletion'->>'user_id')::pg_catalog.int8"
			   "       AND d.message_id" EQ "($4->'deletion'->>'message_id')::pg_catalog.int8) AS held) x "
			   "WHERE t.source_node" EQ "$1 AND t.transfer_id" EQ "$2"
			   "  AND t.sent_at" LE "(SELECT m.at FROM im.maintenance_state m"
			   "                    WHERE m.name" EQ "('transfer_in_pruned_before:'" OP_CONCAT "$1))",
			   4, TEXTOID, INT8OID, INT8OID, JSONBOID);
	return im_exec(plan, jargs, NULL, 0) == 1;
}

/*
 * The trace id of a transfer's own position: the "trace_id" of the event
 * of its payload whose message_id is the transfer's source_event_id, NULL
 * when there is none (a deletion's transfer, an older source).  Read from
 * the jsonb in C, without SPI, and never failing on a malformed payload:
 * it only feeds log lines (im_log_trace shows a value of another form as
 * "(invalid)").
 */
static char *
payload_trace_id(Datum payload, int64 source_event_id)
{
	Jsonb	   *jb = DatumGetJsonbP(payload);
	JsonbValue *events;
	Datum		want = NumericGetDatum(int64_to_numeric(source_event_id));

	if (!JB_ROOT_IS_OBJECT(jb) ||
		(events = getKeyJsonValueFromContainer(&jb->root, "events", 6, NULL)) == NULL ||
		events->type != jbvBinary || !JsonContainerIsArray(events->val.binary.data))
		return NULL;
	for (uint32 i = 0; i < JsonContainerSize(events->val.binary.data); i++)
	{
		JsonbValue *ev = getIthJsonbValueFromContainer(events->val.binary.data, i);
		JsonbValue *id;
		JsonbValue *trace;

		if (ev == NULL || ev->type != jbvBinary || !JsonContainerIsObject(ev->val.binary.data))
			continue;
		id = getKeyJsonValueFromContainer(ev->val.binary.data, "message_id", 10, NULL);
		if (id == NULL || id->type != jbvNumeric ||
			DatumGetInt32(DirectFunctionCall2(numeric_cmp, NumericGetDatum(id->val.numeric), want)) != 0)
			continue;
		trace = getKeyJsonValueFromContainer(ev->val.binary.data, "trace_id", 8, NULL);
		if (trace == NULL || trace->type != jbvString)
			return NULL;
		return pnstrdup(trace->val.string.val, Min(trace->val.string.len, IM_MAX_TRACE_ID + 1));
	}
	return NULL;
}

/* payload_trace_id of an arriving row */
static char *
row_trace_id(TriggerData *td)
{
	bool		payload_null;
	bool		id_null;
	Datum		payload = row_value(td, "payload", &payload_null);
	Datum		id = row_value(td, "source_event_id", &id_null);

	if (payload_null || id_null)
		return NULL;
	return payload_trace_id(payload, DatumGetInt64(id));
}

/* the payload has this top-level key ('deletion', 'receipt') */
static bool
payload_has_key(Datum payload, const char *name)
{
	Jsonb	   *j = DatumGetJsonbP(payload);
	JsonbValue	key;

	if (!JB_ROOT_IS_OBJECT(j))
		return false;
	key.type = jbvString;
	key.val.string.val = (char *) name;
	key.val.string.len = strlen(name);
	return findJsonbValueFromContainer(&j->root, JB_FOBJECT, &key) != NULL;
}

/*
 * A deletion for oneself handed off by the conversation's node (its payload
 * has 'deletion'; read_state.c applies it) rather than a position.
 */
static bool
payload_is_deletion(Datum payload)
{
	return payload_has_key(payload, "deletion");
}

/*
 * Whether a copy's events include a role or mute position: only then does
 * its apply touch the copies of periods (the role and mute of contract §17),
 * so a plain message's transfer runs no statement for them.
 */
static bool
payload_has_standing_events(Datum payload)
{
	Jsonb	   *j = DatumGetJsonbP(payload);
	JsonbValue *events;
	int			n;

	if (!JB_ROOT_IS_OBJECT(j) ||
		(events = getKeyJsonValueFromContainer(&j->root, "events", 6, NULL)) == NULL ||
		events->type != jbvBinary || !JsonContainerIsArray(events->val.binary.data))
		return false;
	n = JsonContainerSize(events->val.binary.data);
	for (int i = 0; i < n; i++)
	{
		JsonbValue *e = getIthJsonbValueFromContainer(events->val.binary.data, i);
		JsonbValue *kind;

		if (e == NULL || e->type != jbvBinary || !JsonContainerIsObject(e->val.binary.data))
			continue;
		kind = getKeyJsonValueFromContainer(e->val.binary.data, "kind", 4, NULL);
		if (kind != NULL && kind->type == jbvString && kind->val.string.len == 4 &&
			(memcmp(kind->val.string.val, "role", 4) == 0 || memcmp(kind->val.string.val, "mute", 4) == 0))
			return true;
	}
	return false;
}

/*
 * A receipt carried from a reader's node to the sender's (its payload has
 * 'receipt'; receipt.c applies it): its source is the reader's node, not
 * the conversation's.  *sender: the receipt's sender_id (0 when it names
 * none a number can read), read without SPI and never failing.
 */
static bool
payload_is_receipt(Datum payload, int64 *sender)
{
	Jsonb	   *j = DatumGetJsonbP(payload);
	JsonbValue *r;
	JsonbValue *id;

	*sender = 0;
	if (!JB_ROOT_IS_OBJECT(j) ||
		(r = getKeyJsonValueFromContainer(&j->root, "receipt", 7, NULL)) == NULL)
		return false;
	if (r->type == jbvBinary && JsonContainerIsObject(r->val.binary.data) &&
		(id = getKeyJsonValueFromContainer(r->val.binary.data, "sender_id", 9, NULL)) != NULL &&
		id->type == jbvNumeric)
	{
		char	   *txt = DatumGetCString(DirectFunctionCall1(numeric_out,
															  NumericGetDatum(id->val.numeric)));
		char	   *end;
		long long	v;

		errno = 0;
		v = strtoll(txt, &end, 10);
		if (errno == 0 && *end == '\0' && end != txt)
			*sender = (int64) v;
	}
	return true;
}

/*
 * What to do with a row inserted into im.transfer_out (trust between
 * nodes, transfer_trust.c): store it — only this node's own fanout writing
 * to another node, never a replicated row —, record it as an arrival — it
 * came through the subscription of its source, which is not this node and
 * owns the conversation's bucket in this node's map, and it is addressed
 * to this node —, or drop it (refused: logged and listed by reconcile; an
 * error for a session's insert).
 */
typedef enum
{
	ARRIVAL_STORE,
	ARRIVAL_RECORD,
	ARRIVAL_DROP
} ArrivalAction;

static ArrivalAction
arrival_action(TriggerData *td, const char *self, const char *dest)
{
	char	   *source = row_text(td, "source_node");
	ImArrival	via;
	const char *from;
	const char *reason;
	bool		isnull;
	int64		transfer_id = DatumGetInt64(row_value(td, "transfer_id", &isnull));
	int64		conversation_id = DatumGetInt64(row_value(td, "conversation_id", &isnull));

	switch (im_transfer_row_fate(self, source, dest, &via, &from, &reason))
	{
		case IM_ROW_OWN:
			return ARRIVAL_STORE;
		case IM_ROW_FOREIGN_LOCAL:
			ereport(WARNING,
					(errmsg("im_sync: dropped a transfer from \"%s\" to \"%s\" inserted at node \"%s\"",
							source ? source : "?", dest ? dest : "?", self ? self : "(not sharded)")));
			return ARRIVAL_DROP;
		case IM_ROW_CHECK:
			{
				Datum		payload = row_value(td, "payload", &isnull);
				int64		sender;

				if (!isnull && payload_is_receipt(payload, &sender))
					reason = im_receipt_transfer_refusal(self, from, source, dest, sender);
				else
					reason = im_transfer_refusal(self, from, source, dest, conversation_id);
			}
			if (reason == NULL)
				return ARRIVAL_RECORD;
			break;
		case IM_ROW_REFUSED:
			break;
	}
	im_transfer_refuse(via, "transfer", from, source, dest, NULL, transfer_id, true, conversation_id, reason,
					   row_trace_id(td));
	return ARRIVAL_DROP;
}

PG_FUNCTION_INFO_V1(im_transfer_out_arrive);
Datum
im_transfer_out_arrive(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr plan;
	TriggerData *td = (TriggerData *) fcinfo->context;
	const char *self;
	char	   *dest;
	Datum		args[7];
	char		nulls[7] = {' ', ' ', ' ', ' ', ' ', ' ', ' '};
	bool		isnull;

	if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_BEFORE(td->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(td->tg_event) || !TRIGGER_FIRED_BY_INSERT(td->tg_event))
		elog(ERROR, "im_sync: im.transfer_out_arrive is a BEFORE INSERT row trigger");
	self = im_shard_self_name();
	dest = row_text(td, "dest_node");
	switch (arrival_action(td, self, dest))
	{
		case ARRIVAL_STORE:
			return PointerGetDatum(td->tg_trigtuple);
		case ARRIVAL_DROP:
			return PointerGetDatum(NULL);
		case ARRIVAL_RECORD:
			break;
	}

	im_spi_connect();
	/*
	 * A duplicate only counts; if it was settled already, its applied record
	 * goes back once more (deleted and inserted again: only inserts are
	 * published), so a source that sends a transfer again — its row was
	 * re-inserted, or its ack got lost with a slot — also sees it acked.
	 */
	im_prepare(&plan,
			   "INSERT INTO im.transfer_in (source_node, transfer_id, conversation_id, msg_seq,"
			   "                            source_event_id, payload, sent_at)"
			   "VALUES ($1, $2, $3, $4, $5, $6, $7) "
			   "ON CONFLICT (source_node, transfer_id) DO UPDATE"
			   "  SET duplicates = im.transfer_in.duplicates" PLUS "1 "
			   "RETURNING state, duplicates",
			   7, TEXTOID, INT8OID, INT8OID, INT8OID, INT8OID, JSONBOID, TIMESTAMPTZOID);
	args[0] = CStringGetTextDatum(row_text(td, "source_node"));
	args[1] = row_value(td, "transfer_id", &isnull);
	args[2] = row_value(td, "conversation_id", &isnull);
	args[3] = row_value(td, "msg_seq", &isnull);
	args[4] = row_value(td, "source_event_id", &isnull);
	args[5] = row_value(td, "payload", &isnull);
	args[6] = row_value(td, "created_at", &isnull);
	im_exec(plan, args, nulls, 0);
	if (strcmp(im_get_text(0, 1), "pending") != 0 ||
		(im_get_int64(0, 2, NULL) == 0 && judged_beyond_horizon(args)))
	{
		static SPIPlanPtr forget;
		static SPIPlanPtr again;

		im_prepare(&forget,
				   "DELETE FROM im.transfer_ack WHERE source_node" EQ "$1 AND transfer_id" EQ "$2",
				   2, TEXTOID, INT8OID);
		im_prepare(&again,
				   "INSERT INTO im.transfer_ack (source_node, transfer_id, applied_by)"
				   " VALUES ($1, $2, im.shard_self())",
				   2, TEXTOID, INT8OID);
		im_exec(forget, args, NULL, 0);
		if (im_catalog_at_least(1, 7))
		{
			/*
			 * written by the next apply pass, like every applied record
			 * (im_transfer_ack_release): one path, one rule
			 */
			static SPIPlanPtr due;

			im_prepare(&due,
					   "UPDATE im.transfer_in SET applied_at = NULL"
					   " WHERE source_node" EQ "$1 AND transfer_id" EQ "$2 AND state" NE "'pending'",
					   2, TEXTOID, INT8OID);
			im_exec(due, args, NULL, 0);
		}
		else
			im_exec(again, args, NULL, 0);
	}
	SPI_finish();
	im_wake_fanout_at_commit();
	return PointerGetDatum(NULL);
}

/*
 * Apply one transfer's payload from node source: copies (upserts that only
 * move forward), the recipients' heads and states, the outbox item; or a
 * deletion or a carried receipt.  $1 is the payload,
 * $2 the conversation, $3 the msg_seq, $4 the source event.
 */
static void
apply_payload(const char *source, Datum payload, int64 conversation_id, int64 msg_seq, int64 source_event_id)
{
	static SPIPlanPtr plan;
	static SPIPlanPtr users;
	Datum		args[4];
	uint64		n;

	int64		receipt_sender;

	/*
	 * A carried receipt writes no copy (it may name a conversation this
	 * node owns): receipt.c checks and applies it.
	 */
	if (payload_is_receipt(payload, &receipt_sender))
	{
		im_receipt_apply_carried(source, payload, conversation_id);
		return;
	}
	/*
	 * The map must agree: a copy never overwrites a conversation this node
	 * owns, and only users placed here get heads (shard_map.c); otherwise
	 * the transfer is quarantined with IS421.
	 */
	if (im_shard_owns_bucket(im_shard_bucket(conversation_id)))
		ereport(ERROR,
				(errcode(ERRCODE_IM_WRONG_NODE),
				 errmsg("transfer for conversation " INT64_FORMAT " reached the node that owns it",
						conversation_id)));
	/* and every row of the payload is that conversation's (transfer_trust.c) */
	im_transfer_check_payload(payload, conversation_id, source_event_id);
	if (payload_is_deletion(payload))
	{
		im_transfer_apply_deletion(payload, conversation_id);
		return;
	}
	im_prepare(&users,
			   "SELECT DISTINCT x.user_id FROM"
			   " pg_catalog.jsonb_populate_recordset(NULL::im.membership_period, $1->'periods') x",
			   1, JSONBOID);
	args[0] = payload;
	n = im_exec(users, args, NULL, 0);
	for (uint64 i = 0; i < n; i++)
		im_shard_require_user(im_get_int64(i, 1, NULL));

	im_prepare(&plan,
			   "WITH conv AS ("
			   "  INSERT INTO im.conversation"
			   "  SELECT * FROM pg_catalog.jsonb_populate_record(NULL::im.conversation, $1->'conversation')"
			   "  ON CONFLICT (conversation_id) DO UPDATE SET mode = EXCLUDED.mode,"
			   "    head_msg_seq = GREATEST(im.conversation.head_msg_seq, EXCLUDED.head_msg_seq)"
			   "  RETURNING 1) "
			   "SELECT (SELECT pg_catalog.count(*) FROM conv)",
			   4, JSONBOID, INT8OID, INT8OID, INT8OID);
	args[0] = payload;
	args[1] = Int64GetDatum(conversation_id);
	args[2] = Int64GetDatum(msg_seq);
	args[3] = Int64GetDatum(source_event_id);
	im_exec(plan, args, NULL, 0);

	{
		/*
		 * Events before periods (a period names its join event).  A copy
		 * carries no request digest: only events with one hold the sender's
		 * idempotency key (sender, client_msg_id), so a sender reusing a
		 * client_msg_id in conversations on other nodes (contract §15) never
		 * collides here, and this node's own retries and IS409 never see a
		 * copy (an older catalog: upgrades.md, "Catalog history kept in code").
		 */
		static SPIPlanPtr events;
		static SPIPlanPtr events_takedown;
		static SPIPlanPtr periods;
		static SPIPlanPtr states;
		static SPIPlanPtr outbox;
		static SPIPlanPtr outbox_traced;

		/*
		 * A recalled copy is a tombstone (contract §12.4): an older payload
		 * (a quarantined transfer retried after the recall's arrived) never
		 * brings the body back (sql/95_shard_recall_retry).  A takedown's
		 * tombstone is a recalled one that is also taken_down (contract
		 * §17), copied with it on a catalog that has the column; a payload
		 * without the key (a node before takedowns) is not taken down.
		 */
#define EVENTS_SQL(td_set, td_old, td_new) \
				   "INSERT INTO im.event" \
				   " SELECT x.* FROM pg_catalog.jsonb_array_elements($1->'events') j," \
				   "   pg_catalog.jsonb_populate_record(NULL::im.event," \
				   "     '{\"taken_down\": false}'::pg_catalog.jsonb" OP_CONCAT "(j.value" MINUS "'request_digest')) x" \
				   " ORDER BY x.msg_seq " \
				   "ON CONFLICT (message_id) DO UPDATE SET body = EXCLUDED.body," \
				   "  content_type = EXCLUDED.content_type, recalled = EXCLUDED.recalled" td_set \
				   /* shconc (bytes): an unchanged copy is not rewritten (no WAL) */ \
				   "  WHERE (im.event.body, im.event.content_type, im.event.recalled" td_old ")" \
				   "    IS DISTINCT FROM (EXCLUDED.body, EXCLUDED.content_type, EXCLUDED.recalled" td_new ")" \
				   "    AND NOT im.event.recalled"

		if (IM_CATALOG_HAS_TAKEDOWN())
			im_prepare(&events_takedown,
					   EVENTS_SQL(", taken_down = EXCLUDED.taken_down", ", im.event.taken_down",
								  ", EXCLUDED.taken_down"),
					   1, JSONBOID);
		else
			im_prepare(&events, EVENTS_SQL("", "", ""), 1, JSONBOID);
#undef EVENTS_SQL
		im_exec(IM_CATALOG_HAS_TAKEDOWN() ? events_takedown : events, args, NULL, 0);
		im_prepare(&periods,
				   "INSERT INTO im.membership_period"
				   " SELECT x.* FROM pg_catalog.jsonb_populate_recordset(NULL::im.membership_period,"
				   "   $1->'periods') x ORDER BY x.membership_period_id "
				   "ON CONFLICT (membership_period_id) DO UPDATE"
				   "  SET leave_seq = COALESCE(im.membership_period.leave_seq, EXCLUDED.leave_seq),"
				   "      leave_event_id = COALESCE(im.membership_period.leave_event_id, EXCLUDED.leave_event_id)"
				   /* period ids carry their conversation's bucket: the same id is the same period */
				   "  WHERE im.membership_period.conversation_id" EQ "EXCLUDED.conversation_id"
				   "    AND im.membership_period.user_id" EQ "EXCLUDED.user_id"
				   /* shconc (bytes): only a leave changes a period (no WAL otherwise) */
				   "    AND im.membership_period.leave_seq IS NULL AND EXCLUDED.leave_seq IS NOT NULL",
				   1, JSONBOID);
		im_exec(periods, args, NULL, 0);
		if (IM_CATALOG_HAS_ROLES() && payload_has_standing_events(payload))
		{
			/*
			 * A role or mute position changes the role and mute of this
			 * node's copy of the member's open period (contract §17), so the
			 * user node's recent_conversations and snapshot items say what
			 * the conversation's node says; transfers of a conversation
			 * arrive in msg_seq order, and the newest position in the
			 * payload wins.
			 */
			static SPIPlanPtr standing;

			im_prepare(&standing,
					   "WITH ev AS ("
					   "  SELECT x.conversation_id, x.msg_seq, x.kind, x.body"
					   "  FROM pg_catalog.jsonb_populate_recordset(NULL::im.event, $1->'events') x"
					   "  WHERE x.kind IN ('role', 'mute')), "
					   "ch AS ("
					   "  SELECT conversation_id, msg_seq, kind, (body" OP_GET_TEXT "'user_id')::pg_catalog.int8 AS user_id,"
					   "         body" OP_GET_TEXT "'role' AS role, body" " OPERATOR(pg_catalog.->) " "'muted_until' AS muted_until FROM ev"
					   "  UNION ALL"
					   /* an ownership handover names the previous owner's new role */
					   "  SELECT conversation_id, msg_seq, kind, (body" OP_GET_TEXT "'previous_owner')::pg_catalog.int8,"
					   "         body" OP_GET_TEXT "'previous_owner_role', NULL FROM ev"
					   "  WHERE kind" EQ "'role' AND body" OP_GET_TEXT "'previous_owner_role' IS NOT NULL), "
					   "r AS (SELECT DISTINCT ON (conversation_id, user_id) * FROM ch WHERE kind" EQ "'role'"
					   "      ORDER BY conversation_id, user_id, msg_seq DESC), "
					   "m AS (SELECT DISTINCT ON (conversation_id, user_id) * FROM ch WHERE kind" EQ "'mute'"
					   "      ORDER BY conversation_id, user_id, msg_seq DESC), "
					   "b AS (SELECT COALESCE(r.conversation_id, m.conversation_id) AS conversation_id,"
					   "             COALESCE(r.user_id, m.user_id) AS user_id,"
					   "             r.msg_seq AS role_seq, r.role, m.msg_seq AS mute_seq, m.muted_until"
					   "      FROM r FULL JOIN m ON m.conversation_id" EQ "r.conversation_id AND m.user_id" EQ "r.user_id) "
					   "UPDATE im.membership_period p SET"
					   "  role = CASE WHEN b.role_seq" GE "p.join_seq THEN b.role ELSE p.role END,"
					   "  muted_until = CASE WHEN b.mute_seq" GE "p.join_seq"
					   "                     THEN (b.muted_until" " OPERATOR(pg_catalog.#>>) " "'{}')::pg_catalog.timestamptz"
					   "                     ELSE p.muted_until END "
					   "FROM b WHERE p.conversation_id" EQ "b.conversation_id AND p.user_id" EQ "b.user_id"
					   "  AND p.leave_seq IS NULL",
					   1, JSONBOID);
			im_exec(standing, args, NULL, 0);
		}
		{
			/*
			 * shconc (bytes): a transfer carries the rows of the
			 * periods its item opens or closes and names the others by id
			 * ('period_ids'; absent from older payloads).  Every named
			 * period must be here by now (its join's transfer was applied
			 * before, in msg_seq order); one that is not makes this transfer
			 * a visible quarantine, never a delivery that silently misses
			 * its recipient.
			 */
			static SPIPlanPtr missing;

			im_prepare(&missing,
					   "SELECT pg_catalog.string_agg(i.id::pg_catalog.text, ', ' ORDER BY i.id) FROM"
					   " (SELECT j::pg_catalog.int8 AS id FROM pg_catalog.jsonb_array_elements_text("
					   "    COALESCE($1->'period_ids', '[]'::pg_catalog.jsonb)) j) i"
					   " WHERE NOT EXISTS (SELECT 1 FROM im.membership_period p"
					   "   WHERE p.membership_period_id" EQ "i.id AND p.conversation_id" EQ "$2)",
					   2, JSONBOID, INT8OID);
			im_exec(missing, args, NULL, 1);
			if (im_get_text(0, 1) != NULL)
				ereport(ERROR,
						(errcode(ERRCODE_FOREIGN_KEY_VIOLATION),
						 errmsg("transfer for conversation " INT64_FORMAT " msg_seq " INT64_FORMAT
								" names membership periods this node never received: %s",
								conversation_id, msg_seq, im_get_text(0, 1)),
						 errhint("The transfer of their join is quarantined or not applied: retry it first.")));
		}
		/*
		 * The recipients' heads and conversation states exist from their
		 * first period on, as on a conversation's own node; inserted, never
		 * updated here (fanout moves them under the heads' locks).
		 */
		im_prepare(&states,
				   "WITH u AS (SELECT x.user_id FROM"
				   "   pg_catalog.jsonb_populate_recordset(NULL::im.membership_period, $1->'periods') x"
				   /* shconc (bytes): and the users of the periods named by id */
				   "   UNION SELECT p.user_id FROM im.membership_period p"
				   "   WHERE p.conversation_id" EQ "$2 AND p.membership_period_id IN"
				   "    (SELECT j::pg_catalog.int8 FROM pg_catalog.jsonb_array_elements_text("
				   "       COALESCE($1->'period_ids', '[]'::pg_catalog.jsonb)) j)),"
				   " h AS (INSERT INTO im.user_head (user_id) SELECT u.user_id FROM u ORDER BY 1"
				   "   ON CONFLICT (user_id) DO NOTHING RETURNING 1) "
				   "INSERT INTO im.user_conversation (user_id, conversation_id)"
				   " SELECT u.user_id, $2 FROM u ORDER BY 1 "
				   "ON CONFLICT (user_id, conversation_id) DO NOTHING",
				   2, JSONBOID, INT8OID);
		im_exec(states, args, NULL, 0);
		/* the item keeps its event's trace id (the copy's), for the workers' log lines */
		if (im_catalog_at_least(1, 10))
			im_exec(im_prepare(&outbox_traced,
							   "INSERT INTO im.outbox (conversation_id, msg_seq, source_event_id, trace_id)"
							   " VALUES ($1, $2, $3, (SELECT e.trace_id FROM im.event e"
							   "                      WHERE e.message_id" EQ "$3)) "
							   "ON CONFLICT (source_event_id) DO NOTHING",
							   3, INT8OID, INT8OID, INT8OID),
					args + 1, NULL, 0);
		else
			im_exec(im_prepare(&outbox,
							   "INSERT INTO im.outbox (conversation_id, msg_seq, source_event_id) VALUES ($1, $2, $3) "
							   "ON CONFLICT (source_event_id) DO NOTHING",
							   3, INT8OID, INT8OID, INT8OID),
					args + 1, NULL, 0);
	}
}

/*
 * Mark applied, or failed with its error; returns the transfer's state
 * now.  A failure is retried by the rule of fanout's outbox items (fanout.c
 * record_failure): a transient one backs off and is never an attempt, any
 * other is charged and the transfer is dead at im_sync.fanout_max_attempts.
 * The applied record is NOT written here: applied_at stays NULL ("settled, record not written yet") and
 * im_transfer_ack_release writes it in a later transaction, once this one
 * is on the synchronous standby (transfer_ack.c: an ack written here was
 * decoded and sent to the source while this commit still waited for the
 * standby, so a failover lost a transfer the source had deleted).  On a 1.6
 * catalog the record goes in this transaction, as before (a failed transfer
 * is acknowledged too: this node holds its payload).
 */
static char *
settle(const char *source, int64 transfer_id, const char *error, bool transient)
{
	static SPIPlanPtr plan;
	static SPIPlanPtr plan16;
	Datum		args[5];
	char		nulls[5] = {' ', ' ', ' ', ' ', ' '};
	bool		retried = im_catalog_at_least(1, 7);

	if (retried)
		im_prepare(&plan,
				   "UPDATE im.transfer_in SET"
				   "  state = CASE WHEN $3::pg_catalog.text IS NULL THEN 'applied'"
				   "               WHEN NOT $4 AND attempts" PLUS "1" GE "$5 THEN 'dead'"
				   "               ELSE 'quarantined' END,"
				   "  last_error = $3, applied_at = NULL,"
				   "  payload = CASE WHEN $3::pg_catalog.text IS NULL THEN NULL ELSE payload END,"
				   "  attempts = CASE WHEN $3::pg_catalog.text IS NULL OR $4 THEN attempts"
				   "                  ELSE attempts" PLUS "1 END,"
				   "  transient_failures = CASE WHEN $3::pg_catalog.text IS NOT NULL AND $4"
				   "                            THEN transient_failures" PLUS "1 ELSE transient_failures END,"
				   "  next_attempt_at = CASE WHEN $3::pg_catalog.text IS NULL THEN NULL"
				   "    WHEN $4 THEN pg_catalog.now()" PLUS IM_TRANSIENT_BACKOFF_SQL("transient_failures")
				   "    WHEN attempts" PLUS "1" GE "$5 THEN NULL"
				   "    ELSE pg_catalog.now()" PLUS IM_CHARGED_BACKOFF_SQL("attempts") " END"
				   " WHERE source_node" EQ "$1 AND transfer_id" EQ "$2 RETURNING state",
				   5, TEXTOID, INT8OID, TEXTOID, BOOLOID, INT4OID);
	else
		im_prepare(&plan16,
				   "WITH s AS ("
				   "  UPDATE im.transfer_in SET"
				   "    state = CASE WHEN $3::pg_catalog.text IS NULL THEN 'applied' ELSE 'quarantined' END,"
				   "    last_error = $3, applied_at = pg_catalog.now(),"
				   "    payload = CASE WHEN $3::pg_catalog.text IS NULL THEN NULL ELSE payload END"
				   "  WHERE source_node" EQ "$1 AND transfer_id" EQ "$2 RETURNING state), "
				   "a AS (INSERT INTO im.transfer_ack (source_node, transfer_id, applied_by)"
				   " SELECT $1, $2, im.shard_self() FROM s "
				   " ON CONFLICT DO NOTHING RETURNING 1) "
				   "SELECT s.state FROM s",
				   3, TEXTOID, INT8OID, TEXTOID);
	args[0] = CStringGetTextDatum(source);
	args[1] = Int64GetDatum(transfer_id);
	if (error)
		args[2] = CStringGetTextDatum(error);
	else
		nulls[2] = 'n';
	args[3] = BoolGetDatum(transient);
	args[4] = Int32GetDatum(im_fanout_max_attempts);
	if (im_exec(retried ? plan : plan16, args, nulls, 0) != 1)
		elog(ERROR, "im_sync: inbound transfer " INT64_FORMAT " from \"%s\" vanished while applied",
			 transfer_id, source);
	return im_get_text(0, 1);
}

/*
 * Apply one transfer in its own subtransaction; false when it failed
 * (quarantined or dead).  *quarantined: it failed and is quarantined, so it
 * holds its conversation from now on.
 */
static bool
apply_one(const char *source, int64 transfer_id, Datum payload,
		  int64 conversation_id, int64 msg_seq, int64 source_event_id, bool *quarantined)
{
	MemoryContext cxt = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	volatile bool ok = true;
	volatile bool transient = false;
	char	   *volatile error = NULL;
	char	   *state;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(cxt);
	PG_TRY();
	{
		apply_payload(source, payload, conversation_id, msg_seq, source_event_id);
		ReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(cxt);
		CurrentResourceOwner = owner;
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(cxt);
		CurrentResourceOwner = owner;
		if (edata->sqlerrcode == ERRCODE_QUERY_CANCELED ||
			edata->sqlerrcode == ERRCODE_ADMIN_SHUTDOWN ||
			edata->sqlerrcode == ERRCODE_T_R_DEADLOCK_DETECTED ||
			edata->sqlerrcode == ERRCODE_T_R_SERIALIZATION_FAILURE)
			ReThrowError(edata);
		error = psprintf("%s: %s", unpack_sql_state(edata->sqlerrcode),
						 edata->message ? edata->message : "(no message)");
		transient = im_fanout_error_is_transient(edata->sqlerrcode);
		FreeErrorData(edata);
		ok = false;
	}
	PG_END_TRY();
	state = settle(source, transfer_id, error, transient);
	*quarantined = strcmp(state, "quarantined") == 0;
	if (!ok)
		ereport(WARNING,
				(errmsg("im_sync: transfer " INT64_FORMAT " from node \"%s\" (conversation " INT64_FORMAT
						", msg_seq " INT64_FORMAT ") is %s: %s%s; %s",
						transfer_id, source, conversation_id, msg_seq,
						strcmp(state, "dead") == 0 ? "dead" : "quarantined", error,
						strcmp(state, "dead") == 0 ?
						"; the later transfers of its conversation flow past it" :
						!im_catalog_at_least(1, 7) ? "" :
						transient ? "; transient, not counted as an attempt: backing off" :
						source_event_id == 0 ? "; a carried receipt: will retry, holding nothing" :
						"; will retry, holding the later transfers of its conversation",
						im_log_trace("transfer", payload_trace_id(payload, source_event_id)))));
	return ok;
}

/* the local transaction that last settled or marked transfers (im_transfer_apply) */
static LocalTransactionId settled_in = InvalidLocalTransactionId;

/* A transfer's place in its conversation: (msg_seq, transfer_id) order. */
typedef struct TransferKey
{
	int64		conversation_id;
	int64		msg_seq;
	int64		transfer_id;
} TransferKey;

/* (msg_seq, transfer_id) of a at or before b's, in one conversation */
static bool
key_at_or_before(int64 a_seq, int64 a_id, int64 b_seq, int64 b_id)
{
	return a_seq < b_seq || (a_seq == b_seq && a_id <= b_id);
}

/*
 * A row of IM_TRANSFER_HOLDERS_SQL: a quarantined transfer waiting out its
 * backoff and the latest pending transfer before it (has_pending).
 */
typedef struct TransferHolder
{
	TransferKey key;
	bool		has_pending;
	int64		pending_msg_seq;
	int64		pending_transfer_id;
} TransferHolder;

/*
 * What an apply pass did to one conversation it took transfers of: the
 * last one it applied or tried (last), and whether that one failed and is
 * quarantined (then it is the last: the rest of the conversation waits).
 */
typedef struct PassConversation
{
	TransferKey last;
	bool		quarantined;
} PassConversation;

/*
 * The blockers (IM_TRANSFER_BLOCKERS_OF_SQL) as they are after the pass,
 * from the holders read before it and what the pass did, without reading
 * them again.  Per conversation: a transfer quarantined in this pass (every
 * transfer before it was applied or is dead, so no pending one is before
 * it); otherwise the first holder after the last transfer the pass took
 * with no pending transfer left before it — its latest pending predecessor
 * is none, or one the pass took (every pending transfer up to the last one
 * taken was taken: they are taken in order).  A conversation the pass did
 * not take keeps its blocker.  Both inputs are in (conversation, msg_seq,
 * transfer_id) order; returns the count, blockers in *out.
 */
static int
blockers_after_pass(const TransferHolder *holders, int nholders,
					const PassConversation *pass, int npass, TransferKey **out)
{
	int			n = 0;
	int			h = 0;
	int			c = 0;

	*out = palloc(sizeof(TransferKey) * Max(nholders + npass, 1));
	while (h < nholders || c < npass)
	{
		int64		conv;
		const PassConversation *took = NULL;

		if (c < npass && (h >= nholders || pass[c].last.conversation_id <= holders[h].key.conversation_id))
		{
			took = &pass[c++];
			conv = took->last.conversation_id;
		}
		else
			conv = holders[h].key.conversation_id;
		if (took && took->quarantined)
			(*out)[n++] = took->last;
		else
		{
			for (int i = h; i < nholders && holders[i].key.conversation_id == conv; i++)
			{
				const TransferHolder *q = &holders[i];

				if (took && key_at_or_before(q->key.msg_seq, q->key.transfer_id,
											 took->last.msg_seq, took->last.transfer_id))
					continue;	/* taken by the pass: applied, failed again or dead */
				if (!q->has_pending ||
					(took && key_at_or_before(q->pending_msg_seq, q->pending_transfer_id,
											  took->last.msg_seq, took->last.transfer_id)))
				{
					(*out)[n++] = q->key;
					break;
				}
			}
		}
		while (h < nholders && holders[h].key.conversation_id == conv)
			h++;
	}
	return n;
}

/*
 * A transfer held behind a quarantined one of its conversation is
 * acknowledged as a quarantined one is: this node holds it and its payload
 * (pending rows are never pruned), so its source need not keep it, and the
 * source's im.shard_pending() — the router's run_fanout — does not wait for
 * it, as one node's run_fanout does not wait for the items behind a failed
 * one.  Its arrival was committed by the apply worker without waiting for
 * the synchronous standby, so, as for a settled transfer, the record goes
 * in two steps (the failover window, transfer_ack.c): mark_held stamps
 * held_at in this pass, whose commit waits for the standby; the next pass
 * (ack_marked_held, beside im_transfer_ack_release) writes the records of
 * the marks it sees.  Sent once per transfer (an ack pruned by maintenance
 * while the hold lasts goes again; its source drops an ack it has no
 * transfer for).  Runs after this pass's applies with the blockers as they
 * are after them (blockers_after_pass): a transfer that failed in this
 * pass holds its conversation from now on.  Returns the number of
 * transfers marked.
 */
static uint64
mark_held(const TransferKey *blockers, int nblockers)
{
	static SPIPlanPtr plan;
	Datum		args[3];
	int64	   *convs;
	int64	   *seqs;
	int64	   *ids;

	if (nblockers == 0)
		return 0;
	convs = palloc(sizeof(int64) * nblockers);
	seqs = palloc(sizeof(int64) * nblockers);
	ids = palloc(sizeof(int64) * nblockers);
	for (int i = 0; i < nblockers; i++)
	{
		convs[i] = blockers[i].conversation_id;
		seqs[i] = blockers[i].msg_seq;
		ids[i] = blockers[i].transfer_id;
	}
	im_prepare(&plan,
			   "UPDATE im.transfer_in t SET held_at = pg_catalog.now() "
			   "FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3))"
			   "  b(conversation_id, msg_seq, transfer_id) "
			   "WHERE b.conversation_id" EQ "t.conversation_id"
			   " AND (t.msg_seq, t.transfer_id)" GT "(b.msg_seq, b.transfer_id)"
			   " AND t.state" EQ "'pending' AND t.held_at IS NULL",
			   3, INT8ARRAYOID, INT8ARRAYOID, INT8ARRAYOID);
	args[0] = im_int8_array(convs, nblockers);
	args[1] = im_int8_array(seqs, nblockers);
	args[2] = im_int8_array(ids, nblockers);
	return im_exec(plan, args, NULL, 0);
}

static void
ack_marked_held(void)
{
	static SPIPlanPtr plan;

	im_prepare(&plan,
			   "INSERT INTO im.transfer_ack (source_node, transfer_id, applied_by) "
			   "SELECT t.source_node, t.transfer_id, im.shard_self() FROM im.transfer_in t "
			   "WHERE t.state" EQ "'pending' AND t.held_at IS NOT NULL"
			   "  AND NOT EXISTS (SELECT 1 FROM im.transfer_ack a"
			   "  WHERE a.source_node" EQ "t.source_node AND a.transfer_id" EQ "t.transfer_id) "
			   "ORDER BY t.source_node, t.transfer_id "
			   "ON CONFLICT DO NOTHING",
			   0);
	im_exec(plan, NULL, NULL, 0);
}

int64
im_transfer_apply(int max_transfers)
{
	static SPIPlanPtr lock;
	static SPIPlanPtr pending;
	static SPIPlanPtr pending16;
	Datum		args[2];
	bool		ordered;		/* im_catalog_at_least(1, 7): retries and holds (shard.h) */
	bool		held = false;
	int64		held_conversation = 0;
	uint64		nrows;
	uint64		n;
	int			col;			/* the due rows' first column */
	int64		applied = 0;
	char	  **sources;
	int64	   *ids,
			   *convs,
			   *seqs,
			   *events;
	Datum	   *payloads;
	TransferHolder *holders;
	int			nholders = 0;
	PassConversation *pass;
	int			npass = 0;
	uint64		marked = 0;

	if (!im_shard_configured())
		return 0;
	im_prepare(&lock, "SELECT pg_catalog.pg_try_advisory_xact_lock($1, 0)", 1, INT4OID);
	args[0] = Int32GetDatum(IM_TRANSFER_APPLY_LOCK_CLASS);
	im_exec(lock, args, NULL, 0);
	if (!im_get_bool(0, 1, NULL))
		return 0;				/* another applier is at it; it applies in order */
	im_transfer_ack_settle_stored();	/* under the same lock: one settler */
	ordered = im_catalog_at_least(1, 7);
	/*
	 * What earlier transactions settled or marked; never in a transaction
	 * that settled some itself (two apply calls in one transaction): its own
	 * settlements are visible to it before they are on the standby.
	 */
	if (ordered && settled_in != MyProc->lxid)
	{
		im_transfer_ack_release();
		ack_marked_held();
	}
	/*
	 * One statement reads the holders once: the due transfers (holder
	 * false) in (conversation, msg_seq, transfer_id) order, then the holders
	 * themselves (holder true) in the same order, kept for mark_held.
	 */
	if (ordered)
		im_prepare(&pending,
				   "WITH h AS MATERIALIZED (" IM_TRANSFER_HOLDERS_SQL "), "
				   "due AS (" IM_TRANSFERS_DUE_OF_SQL("h", "t.source_node, t.transfer_id, t.payload,"
													 " t.conversation_id, t.msg_seq, t.source_event_id")
				   "        ORDER BY t.conversation_id, t.msg_seq, t.transfer_id LIMIT $1) "
				   "SELECT false AS holder, d.source_node, d.transfer_id, d.payload, d.conversation_id,"
				   "       d.msg_seq, d.source_event_id, NULL::pg_catalog.int8, NULL::pg_catalog.int8 "
				   "FROM due d "
				   "UNION ALL "
				   "SELECT true, NULL, h.transfer_id, NULL, h.conversation_id, h.msg_seq, NULL,"
				   "       h.pending_msg_seq, h.pending_transfer_id FROM h "
				   "ORDER BY 1, 5, 6, 3",
				   1, INT4OID);
	else
		im_prepare(&pending16,
				   "SELECT source_node, transfer_id, payload, conversation_id, msg_seq, source_event_id "
				   "FROM im.transfer_in WHERE state" EQ "'pending' "
				   "ORDER BY conversation_id, msg_seq, transfer_id LIMIT $1",
				   1, INT4OID);
	args[0] = Int32GetDatum(max_transfers);
	nrows = im_exec(ordered ? pending : pending16, args, NULL, 0);
	col = ordered ? 2 : 1;
	n = nrows;
	if (ordered)
		for (n = 0; n < nrows && !im_get_bool(n, 1, NULL); n++)
			;
	sources = palloc(sizeof(char *) * Max(n, 1));
	ids = palloc(sizeof(int64) * Max(n, 1));
	convs = palloc(sizeof(int64) * Max(n, 1));
	seqs = palloc(sizeof(int64) * Max(n, 1));
	events = palloc(sizeof(int64) * Max(n, 1));
	payloads = palloc(sizeof(Datum) * Max(n, 1));
	holders = palloc(sizeof(TransferHolder) * Max(nrows - n, 1));
	pass = palloc(sizeof(PassConversation) * Max(n, 1));
	for (uint64 i = 0; i < n; i++)
	{
		bool		isnull;

		sources[i] = im_get_text(i, col);
		ids[i] = im_get_int64(i, col + 1, NULL);
		payloads[i] = im_get_datum_copy(i, col + 2, &isnull);
		convs[i] = im_get_int64(i, col + 3, NULL);
		seqs[i] = im_get_int64(i, col + 4, NULL);
		events[i] = im_get_int64(i, col + 5, NULL);
	}
	for (uint64 i = n; i < nrows; i++)
	{
		TransferHolder *q = &holders[nholders++];
		bool		isnull;

		q->key.transfer_id = im_get_int64(i, 3, NULL);
		q->key.conversation_id = im_get_int64(i, 5, NULL);
		q->key.msg_seq = im_get_int64(i, 6, NULL);
		q->pending_msg_seq = im_get_int64(i, 8, &isnull);
		q->has_pending = !isnull;
		q->pending_transfer_id = im_get_int64(i, 9, NULL);
	}
	for (uint64 i = 0; i < n; i++)
	{
		bool		quarantined;

		/* a failure holds the rest of its conversation (1.7: by its state too) */
		if (held && convs[i] == held_conversation && ordered)
			continue;
		if (apply_one(sources[i], ids[i], payloads[i], convs[i], seqs[i], events[i], &quarantined))
			applied++;
		else if (events[i] != 0)	/* a carried receipt holds nothing (shard.h) */
		{
			held = true;
			held_conversation = convs[i];
		}
		if (events[i] == 0)
		{
			quarantined = false;
			continue;			/* nor is it what the pass took of its conversation */
		}
		if (npass == 0 || pass[npass - 1].last.conversation_id != convs[i])
			npass++;
		pass[npass - 1].last.conversation_id = convs[i];
		pass[npass - 1].last.msg_seq = seqs[i];
		pass[npass - 1].last.transfer_id = ids[i];
		pass[npass - 1].quarantined = quarantined;
	}
	if (ordered)
	{
		TransferKey *blockers;
		int			nblockers = blockers_after_pass(holders, nholders, pass, npass, &blockers);

		marked = mark_held(blockers, nblockers);
	}
	if (marked > 0 || n > 0)
	{
		settled_in = MyProc->lxid;
		/*
		 * This transaction settled or marked transfers: its commit must wait
		 * for the synchronous standby before it becomes visible, since
		 * visibility is what releases their applied records
		 * (im_transfer_ack_release, ack_marked_held).
		 * synchronous_commit off or local would make them visible at once.
		 * The wake-up runs the pass that releases them after the commit.
		 */
		if (synchronous_commit < SYNCHRONOUS_COMMIT_REMOTE_WRITE)
			(void) set_config_option("synchronous_commit", "on", PGC_USERSET, PGC_S_SESSION,
									 GUC_ACTION_LOCAL, true, 0, false);
		im_wake_fanout_at_commit();
	}
	return applied;
}

/* im.shard_apply_transfers(max_transfers DEFAULT 10000) -> transfers applied */
PG_FUNCTION_INFO_V1(im_shard_apply_transfers);
Datum
im_shard_apply_transfers(PG_FUNCTION_ARGS)
{
	int32		max_transfers = im_arg_int32(fcinfo, 0, "max_transfers", 1, PG_INT32_MAX);
	int64		n;

	im_spi_connect();
	n = im_transfer_apply(max_transfers);
	SPI_finish();
	PG_RETURN_INT64(n);
}

/*
 * im.shard_retry_quarantined(source_node, transfer_id) -> true when a
 * quarantined or dead transfer went back to pending (after the cause was
 * repaired), with its attempts cleared: the next apply takes it at once, in
 * (msg_seq) order with what its conversation holds pending.  A dead one's
 * later transfers were applied past it: its outbox item, if it gets one,
 * is fanned out as any late item (periods decide, contract §1), as a
 * repaired dead letter on one node.
 */
PG_FUNCTION_INFO_V1(im_shard_retry_quarantined);
Datum
im_shard_retry_quarantined(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr plan;
	static SPIPlanPtr plan16;
	char	   *source = im_arg_text(fcinfo, 0, "source_node", 41);
	int64		transfer_id = im_arg_id(fcinfo, 1, "transfer_id");
	bool		retried = im_catalog_at_least(1, 7);
	Datum		args[2];
	uint64		n;

	im_spi_connect();
	if (retried)
		im_prepare(&plan,
				   "UPDATE im.transfer_in SET state = 'pending', applied_at = NULL, attempts = 0,"
				   "  transient_failures = 0, next_attempt_at = NULL "
				   "WHERE source_node" EQ "$1 AND transfer_id" EQ "$2"
				   "  AND state" EQ "ANY ('{quarantined,dead}'::pg_catalog.text[])",
				   2, TEXTOID, INT8OID);
	else
		im_prepare(&plan16,
				   "UPDATE im.transfer_in SET state = 'pending', applied_at = NULL "
				   "WHERE source_node" EQ "$1 AND transfer_id" EQ "$2 AND state" EQ "'quarantined'",
				   2, TEXTOID, INT8OID);
	args[0] = CStringGetTextDatum(source);
	args[1] = Int64GetDatum(transfer_id);
	n = im_exec(retried ? plan : plan16, args, NULL, 0);
	SPI_finish();
	if (n == 1)
		im_wake_fanout_at_commit();
	PG_RETURN_BOOL(n == 1);
}
