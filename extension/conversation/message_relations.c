/*
 * message_relations.c — reactions, pins and reply targets (contract §14, design
 * §12.5): im.react, im.pin_message, the checks of a reply target and the
 * pin list change a recall makes.
 *
 * Each call appends one conversation position through append.c (kinds
 * `reaction` and `pin`), so it travels the single-writer path of every
 * position: outbox, fanout (both modes), sync, snapshots, history.  Its
 * body is full state, never a delta:
 *   - reaction: the caller's whole set for the target after the call,
 *     {"user_id":…,"reactions":[…]}; the previous set is the body of the
 *     caller's latest reaction position for that target;
 *   - pin: the conversation's whole list after the call,
 *     {"pinned":[message_id,…]}, most recent first; the previous list is
 *     the body of the conversation's latest pin position.
 * So replaying positions in msg_seq order converges, whatever arrived twice
 * or late.  Both previous states are read under the conversation row lock,
 * which orders every react, pin and recall of the conversation: two devices
 * of one user reacting at once get two positions, the later one's set
 * built on the earlier one's.
 *
 * Invariants protected here:
 *   - check order and SQLSTATEs of contract §14: unknown target or one of
 *     another conversation P0002; no active period covering the target
 *     42501; control-event target, bad key, 21st key, 51st pin 22023;
 *     recalled target IS409; idempotency (same client_msg_id namespace and
 *     digest as messages, request_key.c) before all of them;
 *   - a recalled message is in no pin list after the recall's transaction.
 */
#include "core/im_sync.h"
#include "core/common.h"
#include "core/standing.h"
#include "core/locks.h"
#include "core/shmem.h"
#include "core/version_check.h"
#include "core/im_sql.h"
#include "conversation/conversation.h"

#include "catalog/pg_type.h"
#include "storage/proc.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/jsonb.h"

#define IM_MAX_CLIENT_MSG_ID 128

bool
im_kind_uses_marker(const char *kind)
{
	return strcmp(kind, "message") == 0 || strcmp(kind, "reaction") == 0 ||
		strcmp(kind, "pin") == 0;
}

bool
im_relation_catalog(void)
{
	return IM_CATALOG_HAS_RELATIONS();
}

/*
 * What the target checks found; recalled is raised last (IS409).  The
 * previous state comes with them, read by the same statement under the
 * conversation lock (one statement less held under the lock): for a
 * reaction the caller's set for the target, for a pin the conversation's
 * list (texts, in order).
 */
typedef struct RelationTarget
{
	int64		msg_seq;
	bool		recalled;
	char	  **previous;
	int			nprevious;
} RelationTarget;

static int	array_from_body(Datum d, bool isnull, const char *field, char ***out);

/*
 * Checks 1-3 of contract §14 for a target of `what` (react, pin, reply):
 * P0002, then 42501, then 22023 for a control event.  The caller raises the
 * key checks and then IS409 (require_not_recalled), in that order.
 */
static RelationTarget
check_target(int64 conversation_id, int64 user_id, int64 target_message_id,
			 const char *what)
{
	static SPIPlanPtr plan;
	Datum		args[4];
	RelationTarget t;
	char	   *kind;
	Datum		d;
	bool		isnull;

	im_prepare(&plan,
			   "SELECT e.kind, e.msg_seq, e.recalled, "
			   "       EXISTS (SELECT 1 FROM im.membership_period a "
			   "               WHERE a.conversation_id" EQ "$2 AND a.user_id" EQ "$3 "
			   "                 AND a.leave_seq IS NULL), "
			   "       EXISTS (SELECT 1 FROM im.membership_period p "
			   "               WHERE p.conversation_id" EQ "$2 AND p.user_id" EQ "$3 "
			   "                 AND " IM_PERIOD_COVERS_SQL("p", "e.msg_seq") "), "
			   "       CASE $4 WHEN 'reaction' THEN (SELECT r.body FROM im.event r "
			   "           WHERE r.target_message_id" EQ "$1 AND r.sender_id" EQ "$3 "
			   "             AND r.kind" EQ "'reaction' ORDER BY r.msg_seq DESC LIMIT 1) "
			   "         WHEN 'pin' THEN (SELECT l.body FROM im.event l "
			   "           WHERE l.conversation_id" EQ "$2 AND l.kind" EQ "'pin' "
			   "           ORDER BY l.msg_seq DESC LIMIT 1) END "
			   "FROM im.event e WHERE e.message_id" EQ "$1 AND e.conversation_id" EQ "$2",
			   4, INT8OID, INT8OID, INT8OID, TEXTOID);
	args[0] = Int64GetDatum(target_message_id);
	args[1] = Int64GetDatum(conversation_id);
	args[2] = Int64GetDatum(user_id);
	args[3] = CStringGetTextDatum(what);
	if (im_exec(plan, args, NULL, 1) != 1)
		ereport(ERROR,
				(errcode(ERRCODE_NO_DATA_FOUND),
				 errmsg("message " INT64_FORMAT " does not exist in conversation " INT64_FORMAT,
						target_message_id, conversation_id),
				 errdetail("A %s must target a message of the same conversation.", what)));
	kind = im_get_text(0, 1);
	t.msg_seq = im_get_int64(0, 2, NULL);
	t.recalled = im_get_bool(0, 3, NULL);
	d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 6, &isnull);
	t.nprevious = array_from_body(d, isnull, strcmp(what, "pin") == 0 ? "pinned" : "reactions",
								  &t.previous);
	if (!im_get_bool(0, 4, NULL))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("user " INT64_FORMAT " is not a member of conversation " INT64_FORMAT,
						user_id, conversation_id),
				 errdetail("Only users with an active membership period can react, pin or reply.")));
	if (!im_get_bool(0, 5, NULL))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("message " INT64_FORMAT " is not visible to user " INT64_FORMAT,
						target_message_id, user_id),
				 errdetail("A %s must target a message inside one of the user's membership periods.", what)));
	if (strcmp(kind, "message") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("position " INT64_FORMAT " is a %s event, not a message", target_message_id, kind),
				 errdetail("A %s must target a message, never a control event, reaction or pin.", what)));
	return t;
}

static void
require_not_recalled(int64 target_message_id, const RelationTarget *t, const char *what)
{
	if (t->recalled)
		ereport(ERROR,
				(errcode(ERRCODE_IM_CONFLICT),
				 errmsg("message " INT64_FORMAT " is recalled", target_message_id),
				 errdetail("A recalled message takes no %s.", what)));
}

void
im_relation_check_reply(int64 conversation_id, int64 user_id, int64 target_message_id)
{
	RelationTarget t = check_target(conversation_id, user_id, target_message_id, "reply");

	require_not_recalled(target_message_id, &t, "replies");
}

/* ---- reading the previous state (under the conversation lock) ---------- */

/*
 * The texts of a jsonb array field of a position's body (NULL body: none).
 * Returns the count, texts in *out.
 */
static int
array_from_body(Datum d, bool isnull, const char *field, char ***out)
{
	Jsonb	   *jb;
	JsonbValue	key;
	JsonbValue *arr;
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;
	int			n = 0;
	int			max;

	*out = NULL;
	if (isnull)
		return 0;
	jb = DatumGetJsonbP(d);
	key.type = jbvString;
	key.val.string.val = (char *) field;
	key.val.string.len = strlen(field);
	arr = findJsonbValueFromContainer(&jb->root, JB_FOBJECT, &key);
	if (arr == NULL || arr->type != jbvBinary)
		return 0;
	max = JsonContainerSize(arr->val.binary.data) + 1;
	*out = palloc(sizeof(char *) * max);
	it = JsonbIteratorInit(arr->val.binary.data);
	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		if (tok != WJB_ELEM)
			continue;
		if (v.type == jbvString)
			(*out)[n++] = pnstrdup(v.val.string.val, v.val.string.len);
		else if (v.type == jbvNumeric)
			(*out)[n++] = DatumGetCString(DirectFunctionCall1(numeric_out,
															  NumericGetDatum(v.val.numeric)));
	}
	return n;
}

/* The conversation's pin list: its latest pin position's body. */
static int
current_pins(int64 conversation_id, char ***ids)
{
	static SPIPlanPtr plan;
	Datum		args[1];

	bool		isnull = true;
	Datum		d = (Datum) 0;

	im_prepare(&plan,
			   "SELECT e.body FROM im.event e "
			   "WHERE e.conversation_id" EQ "$1 AND e.kind" EQ "'pin' "
			   "ORDER BY e.msg_seq DESC LIMIT 1",
			   1, INT8OID);
	args[0] = Int64GetDatum(conversation_id);
	if (im_exec(plan, args, NULL, 1) == 1)
		d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	return array_from_body(d, isnull, "pinned", ids);
}

static int
find_text(char **v, int n, const char *s)
{
	for (int i = 0; i < n; i++)
		if (strcmp(v[i], s) == 0)
			return i;
	return -1;
}

/* A JSON string literal (escape_json quotes and escapes). */
static void
append_json_string(StringInfo buf, const char *s)
{
	escape_json(buf, s);
}

/* ---- the common request path ----------------------------------------- */

/*
 * One react or pin request, from its arguments to its answer.  The digest
 * stands in for the arguments not in the key (detail: the reaction key,
 * NULL for a pin; body_text: present / pinned).
 */
typedef struct RelationRequest
{
	const char *kind;			/* reaction | pin */
	int64		user_id;
	int64		conversation_id;
	int64		target_message_id;
	const char *client_msg_id;
	const char *detail;
	const char *body_text;
	bytea	   *digest;
	const char *trace_id;		/* contract §21; NULL: none */
	ImConversation conv;		/* locked when begin_relation returns true */
	RelationTarget target;		/* checks 1-3 passed, previous state read */
	int64		message_id;		/* the answer */
	int64		msg_seq;
	bool		created;
} RelationRequest;

/*
 * The prologue every relation request shares: the idempotency key (a retry
 * answers with the original, before any other check), then the
 * conversation lock, then checks 1-3 of the target with the previous state.
 * False: rq's answer is the original's.  Inside SPI from here to
 * end_relation.
 */
static bool
begin_relation(FunctionCallInfo fcinfo, RelationRequest *rq)
{
	im_srf_begin(fcinfo);
	im_spi_connect();
	if (im_request_lookup(rq->kind, rq->user_id, rq->conversation_id, rq->client_msg_id,
						  rq->target_message_id, rq->detail, rq->body_text, &rq->digest,
						  &rq->message_id, &rq->msg_seq))
	{
		im_counter_add(IM_COUNTER_IDEMPOTENT_RETRIES, 1);
		return false;
	}
	im_lock_conversation(rq->conversation_id, &rq->conv);
	im_user_check_standing(rq->user_id);	/* after the replay, before the role checks (contract §17) */
	/* a muted member writes nothing, whatever the target (contract §17) */
	im_roles_require_not_muted(rq->conversation_id, rq->user_id);
	rq->target = check_target(rq->conversation_id, rq->user_id, rq->target_message_id, rq->kind);
	return true;
}

/*
 * Append the position with body and target set by the caller; a
 * concurrent duplicate of the idempotency key (ON CONFLICT in append.c)
 * answers with the original.
 */
static void
append_relation(RelationRequest *rq, ImNewEvent *ev)
{
	ev->kind = rq->kind;
	ev->sender_id = rq->user_id;
	ev->client_msg_id = rq->client_msg_id;
	ev->request_digest = rq->digest;
	ev->trace_id = rq->trace_id;
	if (im_append_event(&rq->conv, ev, &rq->message_id, &rq->msg_seq))
	{
		rq->created = true;
		return;
	}
	if (!im_request_existing(rq->user_id, rq->client_msg_id, rq->digest,
							 &rq->message_id, &rq->msg_seq))
		elog(ERROR, "im_sync: idempotency key conflict but no row for client_msg_id \"%s\"",
			 rq->client_msg_id);
	im_counter_add(IM_COUNTER_IDEMPOTENT_RETRIES, 1);
}

/* Leaves SPI and returns the (message_id, msg_seq, created) row. */
static Datum
end_relation(FunctionCallInfo fcinfo, const RelationRequest *rq)
{
	Datum		values[3];
	bool		nulls[3] = {false, false, false};

	SPI_finish();
	values[0] = Int64GetDatum(rq->message_id);
	values[1] = Int64GetDatum(rq->msg_seq);
	values[2] = BoolGetDatum(rq->created);
	im_srf_row(fcinfo, values, nulls);
	return (Datum) 0;
}

static bool
arg_bool(FunctionCallInfo fcinfo, int argno, const char *name)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be NULL", name)));
	return PG_GETARG_BOOL(argno);
}

/*
 * The reaction key, checked after the target (contract §14 order): 1..32
 * characters.  NULL when the argument is NULL (then bad_key is set).
 */
static char *
arg_reaction(FunctionCallInfo fcinfo, int argno)
{
	if (PG_ARGISNULL(argno))
		return NULL;
	return text_to_cstring(PG_GETARG_TEXT_PP(argno));
}

static void
check_reaction_key(const char *key)
{
	int			len = key ? pg_mbstrlen(key) : 0;

	if (len < 1 || len > IM_MAX_REACTION_CHARS)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("reaction must be 1 to %d characters long, got %d", IM_MAX_REACTION_CHARS, len),
				 errhint("A reaction key is a short text such as an emoji.")));
}

/*
 * im.react(user_id, conversation_id, target_message_id, reaction, present,
 *          client_msg_id, trace_id DEFAULT NULL) -> (message_id, msg_seq, created)
 */
IM_SENSITIVE_FUNCTION(im_react)
{
	RelationRequest rq = {.kind = "reaction"};
	char	   *key;
	bool		present;

	rq.user_id = im_arg_user_id(fcinfo, 0, "user_id");
	rq.conversation_id = im_arg_id(fcinfo, 1, "conversation_id");
	rq.target_message_id = im_arg_id(fcinfo, 2, "target_message_id");
	key = arg_reaction(fcinfo, 3);
	present = arg_bool(fcinfo, 4, "present");
	rq.client_msg_id = im_arg_text(fcinfo, 5, "client_msg_id", IM_MAX_CLIENT_MSG_ID);
	rq.trace_id = im_arg_trace_id(fcinfo, 6);
	rq.detail = key;
	rq.body_text = present ? "true" : "false";

	if (begin_relation(fcinfo, &rq))
	{
		char	  **keys = rq.target.previous;
		int			nkeys = rq.target.nprevious;
		int			at;
		StringInfoData body;
		ImNewEvent	ev;

		check_reaction_key(key);
		at = find_text(keys, nkeys, key);
		if (present && at < 0 && nkeys >= IM_MAX_REACTION_KEYS)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("user " INT64_FORMAT " already has %d reactions on message " INT64_FORMAT,
							rq.user_id, IM_MAX_REACTION_KEYS, rq.target_message_id),
					 errdetail("A user has at most %d distinct reaction keys per message.",
							   IM_MAX_REACTION_KEYS)));
		require_not_recalled(rq.target_message_id, &rq.target, "reactions");

		/* the whole set after the call: earlier keys in order, a new one last */
		initStringInfo(&body);
		appendStringInfo(&body, "{\"user_id\": " INT64_FORMAT ", \"reactions\": [", rq.user_id);
		{
			bool		first = true;

			for (int i = 0; i < nkeys; i++)
			{
				if (!present && i == at)
					continue;
				if (!first)
					appendStringInfoString(&body, ", ");
				append_json_string(&body, keys[i]);
				first = false;
			}
			if (present && at < 0)
			{
				if (!first)
					appendStringInfoString(&body, ", ");
				append_json_string(&body, key);
			}
		}
		appendStringInfoString(&body, "]}");

		memset(&ev, 0, sizeof(ev));
		ev.body = im_jsonb_from_cstring(body.data);
		ev.target_message_id = rq.target_message_id;
		append_relation(&rq, &ev);
	}
	return end_relation(fcinfo, &rq);
}

/*
 * The pin list as body text: ids (decimal texts) with `add` first when
 * non-NULL and `drop` left out.
 */
static char *
pin_body(char **ids, int n, const char *add, const char *drop)
{
	StringInfoData body;
	bool		first = true;

	initStringInfo(&body);
	appendStringInfoString(&body, "{\"pinned\": [");
	if (add != NULL)
	{
		appendStringInfoString(&body, add);
		first = false;
	}
	for (int i = 0; i < n; i++)
	{
		if ((drop != NULL && strcmp(ids[i], drop) == 0) ||
			(add != NULL && strcmp(ids[i], add) == 0))
			continue;
		if (!first)
			appendStringInfoString(&body, ", ");
		appendStringInfoString(&body, ids[i]);
		first = false;
	}
	appendStringInfoString(&body, "]}");
	return body.data;
}

/*
 * im.pin_message(user_id, conversation_id, target_message_id, pinned,
 *                client_msg_id, trace_id DEFAULT NULL) -> (message_id, msg_seq, created)
 * Pinning a pinned message keeps the list as it is (its place is its first
 * pin's); unpinning one that is not pinned appends the unchanged list.
 */
IM_SENSITIVE_FUNCTION(im_pin_message)
{
	RelationRequest rq = {.kind = "pin"};
	bool		pinned;

	rq.user_id = im_arg_user_id(fcinfo, 0, "user_id");
	rq.conversation_id = im_arg_id(fcinfo, 1, "conversation_id");
	rq.target_message_id = im_arg_id(fcinfo, 2, "target_message_id");
	pinned = arg_bool(fcinfo, 3, "pinned");
	rq.client_msg_id = im_arg_text(fcinfo, 4, "client_msg_id", IM_MAX_CLIENT_MSG_ID);
	rq.trace_id = im_arg_trace_id(fcinfo, 5);
	rq.body_text = pinned ? "true" : "false";

	if (begin_relation(fcinfo, &rq))
	{
		char	  **ids = rq.target.previous;
		int			nids = rq.target.nprevious;
		char		target[32];
		bool		listed;
		ImNewEvent	ev;

		snprintf(target, sizeof(target), INT64_FORMAT, rq.target_message_id);
		listed = find_text(ids, nids, target) >= 0;
		if (pinned && !listed && nids >= IM_MAX_PINS)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("conversation " INT64_FORMAT " already has %d pinned messages",
							rq.conversation_id, IM_MAX_PINS),
					 errhint("Unpin a message first.")));
		require_not_recalled(rq.target_message_id, &rq.target, "pins");

		memset(&ev, 0, sizeof(ev));
		ev.body = im_jsonb_from_cstring(pinned && !listed ? pin_body(ids, nids, target, NULL)
										: pin_body(ids, nids, NULL, pinned ? NULL : target));
		ev.pin_message_id = rq.target_message_id;
		append_relation(&rq, &ev);
	}
	return end_relation(fcinfo, &rq);
}

void
im_relation_recalled(ImConversation *conv, int64 target_message_id, const char *trace_id)
{
	char	  **ids;
	int			nids = current_pins(conv->conversation_id, &ids);
	char		target[32];
	ImNewEvent	ev;
	int64		message_id;
	int64		msg_seq;

	snprintf(target, sizeof(target), INT64_FORMAT, target_message_id);
	if (find_text(ids, nids, target) < 0)
		return;
	/* a system position: no sender, no client_msg_id, no target */
	memset(&ev, 0, sizeof(ev));
	ev.kind = "pin";
	ev.body = im_jsonb_from_cstring(pin_body(ids, nids, NULL, target));
	ev.trace_id = trace_id;
	if (!im_append_event(conv, &ev, &message_id, &msg_seq))
		elog(ERROR, "im_sync: the pin list change of the recall or takedown of " INT64_FORMAT " was not appended",
			 target_message_id);
}

/*
 * A recalled or taken-down target keeps no reactions (contract §14, §17):
 * the target, its edits and reactions become tombstones in one statement.
 * A recall's statement names no column a catalog before takedowns lacks.
 */
void
im_tombstone_target(int64 target_message_id, bool taken_down)
{
	static SPIPlanPtr recall_plan;
	static SPIPlanPtr takedown_plan;
	Datum		args[1];

#define TOMBSTONE_SQL(set) \
	"UPDATE im.event SET recalled = true, body = NULL" set " " \
	"WHERE message_id" EQ "$1 " \
	"   OR (target_message_id" EQ "$1 AND kind IN ('edit', 'reaction'))"

	args[0] = Int64GetDatum(target_message_id);
	im_exec(taken_down ? im_prepare(&takedown_plan, TOMBSTONE_SQL(", taken_down = true"), 1, INT8OID)
			: im_prepare(&recall_plan, TOMBSTONE_SQL(""), 1, INT8OID),
			args, NULL, 0);
#undef TOMBSTONE_SQL
}
