/*
 * takedown.c — a moderator's takedown (contract §17): the `takedown`
 * position under the conversation's single writer, the target's tombstone,
 * its body kept apart as evidence (im.takedown_evidence), the audit row; and
 * moderation_evidence, the moderation role's read of that body.
 *
 * Invariants protected here:
 *   - a taken-down message never shows its body to a reader again: the
 *     takedown position, the tombstone of the target and of its edits and
 *     reactions (message_relations.c, as a recall's), the pin list change
 *     and the evidence row are written in one transaction under the
 *     conversation lock, so a recall of the same message is ordered before
 *     it (then the takedown is IS409) or after it (then the recall is IS409);
 *   - one (moderator, client_msg_id) answers one takedown only: the
 *     evidence row is the key (a moderator has no user id, so the key is not
 *     in any user's client_msg_id namespace); a retry gets the original's
 *     ids, another request IS409.  Concurrent uses of one key are
 *     serialized by a transaction advisory lock on the key before any row
 *     lock, so the second sees the first's row;
 *   - the body leaves im.event in the same statement order as a recall's
 *     tombstone; only the extension owner can read the evidence table.
 */
#include "core/im_sync.h"
#include "core/common.h"
#include "core/locks.h"
#include "core/audit.h"
#include "core/im_sql.h"
#include "core/version_check.h"
#include "conversation/conversation.h"

#include "catalog/pg_type.h"
#include "lib/stringinfo.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/jsonb.h"

#define IM_MAX_MODERATOR 128
#define IM_MAX_CLIENT_MSG_ID 128
#define IM_MAX_REASON 1000

/*
 * The library may run on an older catalog until ALTER EXTENSION UPDATE; it
 * has no evidence table or takedown kind there.
 */
static void
require_takedown_catalog(void)
{
	if (!IM_CATALOG_HAS_TAKEDOWN())
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("takedowns need the im_sync 1.12 catalog"),
				 errhint("Run ALTER EXTENSION im_sync UPDATE.")));
}

/*
 * Serializes the requests under one (moderator, client_msg_id), whatever
 * their conversation: taken before the conversation lock, released at the
 * end of the transaction.
 */
static void
lock_key(const char *moderator, const char *client_msg_id)
{
	static SPIPlanPtr plan;
	Datum		args[2];

	im_prepare(&plan,
			   "SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended("
			   "  'im_sync.takedown:'" OP_CONCAT "$1" OP_CONCAT "':'" OP_CONCAT "$2, 0))",
			   2, TEXTOID, TEXTOID);
	args[0] = CStringGetTextDatum(moderator);
	args[1] = CStringGetTextDatum(client_msg_id);
	im_exec(plan, args, NULL, 0);
}

/*
 * The earlier takedown under the key: true with its ids when it is the same
 * request, IS409 when it is another; false when the key is new.
 */
static bool
existing_takedown(const char *moderator, const char *client_msg_id, const bytea *digest,
				  int64 *message_id, int64 *msg_seq)
{
	static SPIPlanPtr plan;
	Datum		args[2];

	im_prepare(&plan,
			   "SELECT e.message_id, e.msg_seq, v.request_digest, v.target_message_id "
			   "FROM im.takedown_evidence v JOIN im.event e ON e.message_id" EQ "v.takedown_message_id "
			   "WHERE v.moderator" EQ "$1 AND v.client_msg_id" EQ "$2",
			   2, TEXTOID, TEXTOID);
	args[0] = CStringGetTextDatum(moderator);
	args[1] = CStringGetTextDatum(client_msg_id);
	if (im_exec(plan, args, NULL, 0) == 0)
		return false;
	*message_id = im_get_int64(0, 1, NULL);
	*msg_seq = im_get_int64(0, 2, NULL);
	if (!im_request_digest_matches(0, 3, digest))
		ereport(ERROR,
				(errcode(ERRCODE_IM_CONFLICT),
				 errmsg("client_msg_id \"%s\" of moderator \"%s\" was already used for a different request",
						client_msg_id, moderator),
				 errdetail("The key was first used for the takedown of message " INT64_FORMAT ".",
						   im_get_int64(0, 4, NULL)),
				 errhint("Use a new client_msg_id for a new takedown; reuse one only to retry the same request.")));
	im_request_retry_durable();
	return true;
}

/*
 * The target under the conversation lock: a `message` of this conversation
 * (else P0002), neither taken down nor recalled (else IS409).  Returns its
 * sender and its body (NULL when it has none), copied out of SPI.
 */
static void
check_target(int64 conversation_id, int64 target_message_id, int64 *sender_id, Datum *body)
{
	static SPIPlanPtr plan;
	Datum		args[1];
	bool		isnull;
	char	   *kind = NULL;

	im_prepare(&plan,
			   "SELECT kind, conversation_id, sender_id, recalled, taken_down, body FROM im.event "
			   "WHERE message_id" EQ "$1",
			   1, INT8OID);
	args[0] = Int64GetDatum(target_message_id);
	if (im_exec(plan, args, NULL, 0) == 1)
		kind = im_get_text(0, 1);
	if (kind == NULL || strcmp(kind, "message") != 0 ||
		im_get_int64(0, 2, NULL) != conversation_id)
		ereport(ERROR,
				(errcode(ERRCODE_NO_DATA_FOUND),
				 errmsg("message " INT64_FORMAT " does not exist in conversation " INT64_FORMAT,
						target_message_id, conversation_id),
				 errdetail("A takedown must target a message of the same conversation.")));
	if (im_get_bool(0, 5, NULL))
		ereport(ERROR,
				(errcode(ERRCODE_IM_CONFLICT),
				 errmsg("message " INT64_FORMAT " is already taken down", target_message_id),
				 errhint("A retry of the same takedown must use its client_msg_id.")));
	if (im_get_bool(0, 4, NULL))
		ereport(ERROR,
				(errcode(ERRCODE_IM_CONFLICT),
				 errmsg("message " INT64_FORMAT " is recalled", target_message_id),
				 errdetail("Its sender recalled it first; its body is gone, so there is nothing to take down.")));
	*sender_id = im_get_int64(0, 3, &isnull);
	*body = im_get_datum_copy(0, 6, &isnull);
	if (isnull)
		*body = (Datum) 0;
}

/* {"reason": reason} (JSON null when none) */
static Datum
reason_body(const char *reason)
{
	StringInfoData b;

	initStringInfo(&b);
	appendStringInfoString(&b, "{\"reason\": ");
	if (reason == NULL)
		appendStringInfoString(&b, "null");
	else
		escape_json(&b, reason);
	appendStringInfoChar(&b, '}');
	return im_jsonb_from_cstring(b.data);
}

static void
keep_evidence(int64 target_message_id, int64 takedown_message_id, int64 conversation_id,
			  int64 sender_id, const char *moderator, const char *client_msg_id,
			  const bytea *digest, Datum body)
{
	static SPIPlanPtr plan;
	Datum		args[8];
	char		nulls[8] = "        ";

	im_prepare(&plan,
			   "INSERT INTO im.takedown_evidence (target_message_id, takedown_message_id, "
			   "  conversation_id, sender_id, moderator, client_msg_id, request_digest, body) "
			   "VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
			   8, INT8OID, INT8OID, INT8OID, INT8OID, TEXTOID, TEXTOID, BYTEAOID, JSONBOID);
	args[0] = Int64GetDatum(target_message_id);
	args[1] = Int64GetDatum(takedown_message_id);
	args[2] = Int64GetDatum(conversation_id);
	args[3] = Int64GetDatum(sender_id);
	args[4] = CStringGetTextDatum(moderator);
	args[5] = CStringGetTextDatum(client_msg_id);
	args[6] = PointerGetDatum(digest);
	args[7] = body;
	if (body == (Datum) 0)
		nulls[7] = 'n';
	im_exec(plan, args, nulls, 0);
}

/*
 * The audit row every moderation action writes (one per action, in its
 * transaction): user_id the target's sender, detail the moderator, the
 * conversation, the target, the takedown position and the reason (absent
 * when none); never the body.
 */
static void
audit_takedown(const char *moderator, int64 sender_id, int64 conversation_id,
			   int64 target_message_id, int64 takedown_message_id, const char *reason)
{
	StringInfoData d;

	initStringInfo(&d);
	appendStringInfoString(&d, "{\"moderator\": ");
	escape_json(&d, moderator);
	appendStringInfo(&d, ", \"conversation_id\": " INT64_FORMAT ", \"message_id\": " INT64_FORMAT
					 ", \"takedown_message_id\": " INT64_FORMAT,
					 conversation_id, target_message_id, takedown_message_id);
	if (reason != NULL)
	{
		appendStringInfoString(&d, ", \"reason\": ");
		escape_json(&d, reason);
	}
	appendStringInfoChar(&d, '}');
	im_audit_moderation("takedown", sender_id, d.data);
}

PG_FUNCTION_INFO_V1(im_takedown_message);
/*
 * im.takedown_message(moderator, conversation_id, target_message_id, reason,
 *                     client_msg_id) -> (message_id, msg_seq, created)
 * Check order (contract §17, as §3): arguments 22023, unknown conversation
 * P0002, replay (the original, created false; another request IS409), the
 * target P0002, already a tombstone IS409.
 */
Datum
im_takedown_message(PG_FUNCTION_ARGS)
{
	char	   *moderator = im_arg_text(fcinfo, 0, "moderator", IM_MAX_MODERATOR);
	int64		conversation_id = im_arg_id(fcinfo, 1, "conversation_id");
	int64		target_message_id = im_arg_id(fcinfo, 2, "target_message_id");
	char	   *reason = PG_ARGISNULL(3) ? NULL : im_arg_text(fcinfo, 3, "reason", IM_MAX_REASON);
	char	   *client_msg_id = im_arg_text(fcinfo, 4, "client_msg_id", IM_MAX_CLIENT_MSG_ID);
	bytea	   *digest;
	ImConversation conv;
	ImNewEvent	ev;
	int64		message_id;
	int64		msg_seq;
	int64		sender_id;
	Datum		body;
	bool		created = false;
	Datum		values[3];
	bool		nulls[3] = {false, false, false};

	/* the moderator and the reason stand in for content_type and body */
	digest = im_request_digest("takedown", conversation_id, target_message_id,
							   moderator, reason, 0);
	im_srf_begin(fcinfo);
	im_spi_connect();
	require_takedown_catalog();

	lock_key(moderator, client_msg_id);
	im_lock_conversation(conversation_id, &conv);
	if (!existing_takedown(moderator, client_msg_id, digest, &message_id, &msg_seq))
	{
		check_target(conversation_id, target_message_id, &sender_id, &body);

		/* a system position's shape: no sender, no user's client_msg_id */
		memset(&ev, 0, sizeof(ev));
		ev.kind = "takedown";
		ev.target_message_id = target_message_id;
		ev.body = reason_body(reason);
		if (!im_append_event(&conv, &ev, &message_id, &msg_seq))
			elog(ERROR, "im_sync: the takedown of " INT64_FORMAT " was not appended", target_message_id);
		im_tombstone_target(target_message_id, true);
		/* a pinned target leaves the pin list at a new position */
		im_relation_recalled(&conv, target_message_id, NULL);
		keep_evidence(target_message_id, message_id, conversation_id, sender_id,
					  moderator, client_msg_id, digest, body);
		audit_takedown(moderator, sender_id, conversation_id, target_message_id, message_id, reason);
		created = true;
	}
	SPI_finish();

	values[0] = Int64GetDatum(message_id);
	values[1] = Int64GetDatum(msg_seq);
	values[2] = BoolGetDatum(created);
	im_srf_row(fcinfo, values, nulls);
	return (Datum) 0;
}

PG_FUNCTION_INFO_V1(im_moderation_evidence);
/*
 * im.moderation_evidence(target_message_id) -> (conversation_id, sender_id,
 * body, taken_down_at, erase_after): the kept body of a taken-down message
 * (NULL once maintenance erased it); erase_after is taken_down_at plus the
 * im_sync.evidence_retention in force.  P0002 for a message never taken
 * down on this node.
 */
Datum
im_moderation_evidence(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr plan;
	int64		target_message_id = im_arg_id(fcinfo, 0, "target_message_id");
	Datum		args[2];

	im_srf_begin(fcinfo);
	im_spi_connect();
	require_takedown_catalog();
	im_prepare(&plan,
			   "SELECT v.conversation_id, v.sender_id, v.body, v.taken_down_at, "
			   "       v.taken_down_at" PLUS "pg_catalog.make_interval(secs => $2) "
			   "FROM im.takedown_evidence v WHERE v.target_message_id" EQ "$1",
			   2, INT8OID, FLOAT8OID);
	args[0] = Int64GetDatum(target_message_id);
	args[1] = Float8GetDatum((double) im_evidence_retention_s);
	if (im_exec(plan, args, NULL, 0) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_NO_DATA_FOUND),
				 errmsg("message " INT64_FORMAT " was not taken down on this node", target_message_id)));
	im_srf_rows_from_spi(fcinfo, 5);
	SPI_finish();
	return (Datum) 0;
}
