/*
 * send.c — send/recall/edit, in the order a request is followed: validate
 * (arguments, body), the idempotency key (request_key.c), lock and append
 * (the fast path of direct_append.c, else append.c after the checks under
 * the conversation lock), answer.
 *
 * Invariants protected here (design §2.3, contract §1/§3):
 *   - one (sender_id, client_msg_id) never makes two events: the unique
 *     index plus ON CONFLICT DO NOTHING finds an earlier or concurrent
 *     one (even in another conversation), and the idempotency lookup
 *     (request_key.c) then returns the original or raises IS409;
 *   - a recalled message never shows its body again: the recall clears the
 *     target's body and the bodies of every edit of it in the same
 *     transaction.
 * No NOTIFY is ever sent from here (it would take a cluster-wide lock
 * through commit); workers are woken with a latch at commit.
 */
#include "core/im_sync.h"
#include "core/common.h"
#include "core/standing.h"
#include "core/locks.h"
#include "core/shmem.h"
#include "core/im_sql.h"
#include "core/version_check.h"
#include "conversation/conversation.h"

#include <math.h>

#include "catalog/pg_type.h"
#include "common/shortest_dec.h"
#include "mb/pg_wchar.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/numeric.h"

#define IM_MAX_CLIENT_MSG_ID 128
#define IM_MAX_CONTENT_TYPE 64

/* ---- request checks and digest ---------------------------------------- */

typedef struct SendRequest
{
	const char *kind;			/* message | recall | edit */
	int64		sender_id;
	int64		conversation_id;
	char	   *client_msg_id;
	int64		target_message_id;	/* 0 for message */
	int64		reply_to_message_id;	/* 0 when not a reply */
	char	   *content_type;	/* NULL for recall/edit */
	Datum		body;			/* jsonb, 0 for recall */
	char	   *body_text;		/* canonical jsonb text */
	bytea	   *digest;
	char	   *trace_id;		/* contract §21; NULL: none */
} SendRequest;

/*
 * The body number rule (contract §3, I-JSON / RFC 7493 §2.2): every number
 * of a body, at any depth, has |value| <= 2^53-1 and equals, as a decimal,
 * the shortest decimal form of its nearest IEEE-754 double.  Then every JSON
 * parser (JavaScript, jansson, the gateway) reads exactly the value stored,
 * so one member's body can never make a reply unreadable for the others.
 */
static bool
is_ijson_number(Numeric num)
{
	static Numeric max_abs = NULL;
	Datum		value = NumericGetDatum(num);
	char	   *text;
	char		shortest[DOUBLE_SHORTEST_DECIMAL_LEN];
	double		d;
	Datum		back;

	if (max_abs == NULL)
	{
		MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);

		max_abs = int64_to_numeric(IM_MAX_SAFE_INTEGER);
		MemoryContextSwitchTo(old);
	}
	if (DatumGetInt32(DirectFunctionCall2(numeric_cmp,
										  DirectFunctionCall1(numeric_abs, value),
										  NumericGetDatum(max_abs))) > 0)
		return false;

	/* nearest double (an underflow gives 0 or a denormal, never an error) */
	text = DatumGetCString(DirectFunctionCall1(numeric_out, value));
	d = strtod(text, NULL);
	if (!isfinite(d))
		return false;
	double_to_shortest_decimal_buf(d, shortest);
	back = DirectFunctionCall3(numeric_in, CStringGetDatum(shortest),
							   ObjectIdGetDatum(InvalidOid), Int32GetDatum(-1));
	return DatumGetInt32(DirectFunctionCall2(numeric_cmp, value, back)) == 0;
}

/* 22023 for the first number of the body that breaks the rule above. */
static void
check_body_numbers(Jsonb *jb)
{
	JsonbIterator *it = JsonbIteratorInit(&jb->root);
	JsonbValue	v;
	JsonbIteratorToken tok;

	while ((tok = JsonbIteratorNext(&it, &v, false)) != WJB_DONE)
	{
		char	   *shown;

		if ((tok != WJB_VALUE && tok != WJB_ELEM) || v.type != jbvNumeric ||
			is_ijson_number(v.val.numeric))
			continue;
		/* 1e-400 prints as 400 digits: show long ones in scientific form */
		shown = DatumGetCString(DirectFunctionCall1(numeric_out, NumericGetDatum(v.val.numeric)));
		if (strlen(shown) > 40)
			shown = numeric_out_sci(v.val.numeric, 6);
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("body number %s is not an I-JSON number", shown),
				 errdetail("Every number in a body must lie within -(2^53-1) .. 2^53-1 and be exactly "
						   "the shortest decimal form of an IEEE-754 double (I-JSON, RFC 7493), "
						   "so that every JSON parser reads the same value."),
				 errhint("Send large or very precise numbers as strings.")));
	}
}

/*
 * A JSON object of at most im_sync.max_body_bytes (as jsonb::text, which is
 * canonical, so a retry with other whitespace or key order is the same body).
 */
static void
check_body(FunctionCallInfo fcinfo, int argno, SendRequest *req)
{
	Jsonb	   *jb;
	size_t		len;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("body must not be NULL")));
	jb = PG_GETARG_JSONB_P(argno);
	if (!JB_ROOT_IS_OBJECT(jb) || JB_ROOT_IS_SCALAR(jb))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("body must be a JSON object"),
				 errdetail("The body of a message is one JSON object, e.g. {\"text\": \"hi\"}.")));
	check_body_numbers(jb);
	req->body = PointerGetDatum(jb);
	req->body_text = JsonbToCString(NULL, &jb->root, VARSIZE(jb));
	len = strlen(req->body_text);
	if (len > (size_t) im_max_body_bytes)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("body is %zu bytes, more than im_sync.max_body_bytes (%d)",
						len, im_max_body_bytes)));
}

/*
 * The sender's active period (else 42501) and no mute in force (else
 * IS403, contract §17), in one read under the conversation lock.
 */
static void
require_active_member(int64 conversation_id, int64 user_id)
{
	static SPIPlanPtr plans[2];
	bool		roles = IM_CATALOG_HAS_ROLES();
	Datum		args[2];
	bool		isnull;
	TimestampTz until;

	im_prepare(&plans[roles],
			   roles ?
			   "SELECT muted_until FROM im.membership_period WHERE conversation_id" EQ "$1 "
			   "AND user_id" EQ "$2 AND leave_seq IS NULL" :
			   "SELECT NULL::pg_catalog.timestamptz FROM im.membership_period WHERE conversation_id" EQ "$1 "
			   "AND user_id" EQ "$2 AND leave_seq IS NULL",
			   2, INT8OID, INT8OID);
	args[0] = Int64GetDatum(conversation_id);
	args[1] = Int64GetDatum(user_id);
	if (im_exec(plans[roles], args, NULL, 0) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("user " INT64_FORMAT " is not a member of conversation " INT64_FORMAT,
						user_id, conversation_id),
				 errdetail("Only users with an active membership period can send, recall or edit.")));
	until = DatumGetTimestampTz(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	im_roles_check_muted(until, isnull, user_id, conversation_id);
}

/*
 * The target of a recall or edit: a `message` of the same conversation
 * (else P0002), sent by the caller (else 42501), neither taken down nor
 * recalled (else IS409).
 * Read under the conversation lock, so a concurrent recall is ordered.
 */
static void
check_target(SendRequest *req)
{
	static SPIPlanPtr plans[2];
	Datum		args[1];
	bool		isnull;
	char	   *kind;
	int64		conv;

#define TARGET_SQL(taken_down) \
	"SELECT kind, conversation_id, sender_id, recalled, " taken_down " FROM im.event " \
	"WHERE message_id" EQ "$1"

	args[0] = Int64GetDatum(req->target_message_id);
	if (im_exec(IM_CATALOG_HAS_TAKEDOWN() ? im_prepare(&plans[1], TARGET_SQL("taken_down"), 1, INT8OID)
				: im_prepare(&plans[0], TARGET_SQL("false"), 1, INT8OID),
				args, NULL, 0) == 1)
	{
		kind = im_get_text(0, 1);
		conv = im_get_int64(0, 2, NULL);
	}
	else
	{
		kind = NULL;
		conv = 0;
	}
	if (kind == NULL || strcmp(kind, "message") != 0 || conv != req->conversation_id)
		ereport(ERROR,
				(errcode(ERRCODE_NO_DATA_FOUND),
				 errmsg("message " INT64_FORMAT " does not exist in conversation " INT64_FORMAT,
						req->target_message_id, req->conversation_id),
				 errdetail("A recall or edit must target a message of the same conversation.")));
	if (im_get_int64(0, 3, &isnull) != req->sender_id || isnull)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("message " INT64_FORMAT " was not sent by user " INT64_FORMAT,
						req->target_message_id, req->sender_id),
				 errdetail("Only the sender of a message can %s it.", req->kind)));
	/* a takedown is a tombstone no recall or edit can undo (contract §17) */
	if (im_get_bool(0, 5, NULL))
		ereport(ERROR,
				(errcode(ERRCODE_IM_CONFLICT),
				 errmsg("message " INT64_FORMAT " was taken down by a moderator", req->target_message_id),
				 errdetail("A taken-down message can be neither recalled nor edited.")));
	if (im_get_bool(0, 4, NULL))
		ereport(ERROR,
				(errcode(ERRCODE_IM_CONFLICT),
				 errmsg("message " INT64_FORMAT " is already recalled", req->target_message_id),
				 errdetail("A recalled message can be neither recalled again nor edited.")));
}

static void
replace_target_body(int64 target_message_id, Datum body)
{
	static SPIPlanPtr plan;
	Datum		args[2];

	im_prepare(&plan,
			   "UPDATE im.event SET body = $2 WHERE message_id" EQ "$1",
			   2, INT8OID, JSONBOID);
	args[0] = Int64GetDatum(target_message_id);
	args[1] = body;
	im_exec(plan, args, NULL, 0);
}

/*
 * The common path of send/recall/edit, after argument checks.  Returns the
 * (message_id, msg_seq, created) row.
 */
static Datum
do_send(FunctionCallInfo fcinfo, SendRequest *req)
{
	ImConversation conv;
	ImNewEvent	ev;
	ImDirectAppend *direct;
	int64		message_id = 0;
	int64		msg_seq = 0;
	bool		created = false;
	Datum		values[3];
	bool		nulls[3] = {false, false, false};

	req->digest = im_request_digest(req->kind, req->conversation_id, req->target_message_id,
									req->content_type, req->body_text, req->reply_to_message_id);
	im_srf_begin(fcinfo);
	im_spi_connect();

	memset(&ev, 0, sizeof(ev));
	ev.kind = req->kind;
	ev.sender_id = req->sender_id;
	ev.client_msg_id = req->client_msg_id;
	ev.request_digest = req->digest;
	ev.content_type = req->content_type;
	ev.body = req->body;
	ev.target_message_id = req->target_message_id;
	ev.reply_to_message_id = req->reply_to_message_id;
	ev.trace_id = req->trace_id;

	/*
	 * A message that is not a reply takes the fast path: lock the
	 * conversation by taking its next position, then check the period and
	 * the key and write (direct_append.c, set up before the lock).  A retry,
	 * a non-member (position given back), an unknown conversation or a
	 * catalog the direct path does not serve wrote nothing and goes through
	 * the general path below, which gives the answer or error the contract
	 * names (the original for a retry, IS409, 42501, P0002), in the same
	 * order.
	 */
	/*
	 * A suspended sender's request must still be answered by a retry's
	 * original (contract §17 order): it skips the fast path, which would
	 * write before the key is looked up.  One atomic read while this node
	 * has no suspension (core/standing.c).
	 */
	if (req->target_message_id == 0 && req->reply_to_message_id == 0 &&
		!im_user_suspended(req->sender_id) &&
		(direct = im_direct_append_begin(req->trace_id != NULL)) != NULL)
	{
		created = im_take_next_position(req->conversation_id, &conv) &&
			im_append_member_message(direct, &conv, &ev, &message_id, &msg_seq);
		im_direct_append_end(direct);
	}
	if (!created && !im_request_existing(req->sender_id, req->client_msg_id, req->digest,
												  &message_id, &msg_seq))
	{
		im_lock_conversation(req->conversation_id, &conv);
		im_user_check_standing(req->sender_id);	/* IS403 before the role checks (contract §17) */
		require_active_member(req->conversation_id, req->sender_id);
		if (req->target_message_id != 0)
			check_target(req);
		if (req->reply_to_message_id != 0)	/* contract §14 checks */
			im_relation_check_reply(req->conversation_id, req->sender_id,
									req->reply_to_message_id);

		if (im_append_event(&conv, &ev, &message_id, &msg_seq))
		{
			created = true;
			if (strcmp(req->kind, "recall") == 0)
			{
				im_tombstone_target(req->target_message_id, false);
				/* a pinned target leaves the pin list at a new position */
				im_relation_recalled(&conv, req->target_message_id, req->trace_id);
			}
			else if (strcmp(req->kind, "edit") == 0)
				replace_target_body(req->target_message_id, req->body);
		}
		else if (!im_request_existing(req->sender_id, req->client_msg_id, req->digest,
												  &message_id, &msg_seq))
		{
			/* the conflicting row must be visible once ON CONFLICT saw it */
			elog(ERROR, "im_sync: idempotency key conflict but no row for client_msg_id \"%s\"",
				 req->client_msg_id);
		}
	}
	SPI_finish();
	if (!created)				/* answered with the original */
		im_counter_add(IM_COUNTER_IDEMPOTENT_RETRIES, 1);

	values[0] = Int64GetDatum(message_id);
	values[1] = Int64GetDatum(msg_seq);
	values[2] = BoolGetDatum(created);
	im_srf_row(fcinfo, values, nulls);
	return (Datum) 0;
}

static void
common_args(FunctionCallInfo fcinfo, SendRequest *req, const char *kind)
{
	memset(req, 0, sizeof(*req));
	req->kind = kind;
	req->sender_id = im_arg_user_id(fcinfo, 0, "sender_id");
	req->conversation_id = im_arg_id(fcinfo, 1, "conversation_id");
	req->client_msg_id = im_arg_text(fcinfo, 2, "client_msg_id", IM_MAX_CLIENT_MSG_ID);
}

/*
 * im.send_message(sender_id, conversation_id, client_msg_id, body,
 *                 content_type DEFAULT 'text', reply_to_message_id DEFAULT NULL,
 *                 trace_id DEFAULT NULL)
 * An older catalog (5 or 6 arguments) may still call this library before
 * ALTER EXTENSION UPDATE: PG_NARGS tells.
 */
IM_SENSITIVE_FUNCTION(im_send_message)
{
	SendRequest req;

	common_args(fcinfo, &req, "message");
	check_body(fcinfo, 3, &req);
	req.content_type = im_arg_text(fcinfo, 4, "content_type", IM_MAX_CONTENT_TYPE);
	if (PG_NARGS() > 5 && !PG_ARGISNULL(5))
		req.reply_to_message_id = im_arg_id(fcinfo, 5, "reply_to_message_id");
	req.trace_id = im_arg_trace_id(fcinfo, 6);
	return do_send(fcinfo, &req);
}

/*
 * im.recall_message(sender_id, conversation_id, client_msg_id, target_message_id,
 *                   trace_id DEFAULT NULL)
 */
IM_SENSITIVE_FUNCTION(im_recall_message)
{
	SendRequest req;

	common_args(fcinfo, &req, "recall");
	req.target_message_id = im_arg_id(fcinfo, 3, "target_message_id");
	req.trace_id = im_arg_trace_id(fcinfo, 4);
	return do_send(fcinfo, &req);
}

/*
 * im.edit_message(sender_id, conversation_id, client_msg_id, target_message_id, body,
 *                 trace_id DEFAULT NULL)
 */
IM_SENSITIVE_FUNCTION(im_edit_message)
{
	SendRequest req;

	common_args(fcinfo, &req, "edit");
	req.target_message_id = im_arg_id(fcinfo, 3, "target_message_id");
	check_body(fcinfo, 4, &req);
	req.trace_id = im_arg_trace_id(fcinfo, 5);
	return do_send(fcinfo, &req);
}
