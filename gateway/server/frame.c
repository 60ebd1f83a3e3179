/*
 * frame.c — decoding of client frames into (statement, parameters), hint and
 * device-event payload parsing.  No libwebsockets, no libpq: the fuzzer
 * (fuzz_frame.c) links this file alone.
 *
 * Invariant (contract §10): user and device always come from the session;
 * a frame that names another user or device is FORBIDDEN; values reach SQL
 * only as parameters of the static statements below.
 */
#include "server/frame.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const im_op_info im_ops[IM_OP_COUNT] = {
	[IM_OP_HELLO] = {"hello", "welcome", IM_REPLY_NONE},
	[IM_OP_PING] = {"ping", "pong", IM_REPLY_NONE},
	[IM_OP_SYNC] = {"sync", "sync_result", IM_REPLY_ROW},
	[IM_OP_ACK] = {"ack", "ack_result", IM_REPLY_ROW},
	[IM_OP_SEND] = {"send", "send_result", IM_REPLY_ROW},
	[IM_OP_RECALL] = {"recall", "recall_result", IM_REPLY_ROW},
	[IM_OP_EDIT] = {"edit", "edit_result", IM_REPLY_ROW},
	[IM_OP_READ] = {"read", "read_result", IM_REPLY_ROW},
	[IM_OP_FETCH_MESSAGES] = {"fetch_messages", "fetch_messages_result", IM_REPLY_ROW},
	[IM_OP_CONVERSATIONS] = {"conversations", "conversations_result", IM_REPLY_ROWS},
	[IM_OP_CLEAR_DIRTY] = {"clear_dirty", "clear_dirty_result", IM_REPLY_ROW},
	[IM_OP_DELETE_FOR_ME] = {"delete_for_me", "delete_for_me_result", IM_REPLY_ROW},
	[IM_OP_SNAPSHOT_BEGIN] = {"snapshot_begin", "snapshot_begin_result", IM_REPLY_ROW},
	[IM_OP_SNAPSHOT_FETCH] = {"snapshot_fetch", "snapshot_fetch_result", IM_REPLY_ROW},
	[IM_OP_SNAPSHOT_ACK] = {"snapshot_ack", "snapshot_ack_result", IM_REPLY_ROW},
	[IM_OP_REACT] = {"react", "react_result", IM_REPLY_ROW},
	[IM_OP_PIN] = {"pin", "pin_result", IM_REPLY_ROW},
	[IM_OP_MESSAGE_STATUS] = {"message_status", "message_status_result", IM_REPLY_ROWS},
	[IM_OP_RECENT_CONVERSATIONS] = {"recent_conversations", "recent_conversations_result", IM_REPLY_ROWS},
	[IM_OP_PIN_CONVERSATION] = {"pin_conversation", "pin_conversation_result", IM_REPLY_ROW},
	[IM_OP_SET_READ_RECEIPTS] = {"set_read_receipts", "set_read_receipts_result", IM_REPLY_ROW},
	[IM_OP_SET_ROLE] = {"set_role", "set_role_result", IM_REPLY_ROW},
	[IM_OP_MUTE_MEMBER] = {"mute_member", "mute_member_result", IM_REPLY_ROW},
	[IM_OP_REMOVE_MEMBER] = {"remove_member", "remove_member_result", IM_REPLY_ROW},
};

typedef enum
{
	F_END = 0,
	F_USER,						/* session user (never from the frame) */
	F_DEVICE,					/* session device */
	F_INT,						/* JSON integer -> bigint/int text */
	F_TEXT,						/* JSON string */
	F_BOOL,						/* JSON true/false -> boolean text */
	F_OBJECT					/* JSON object: the frame's own text, the
								 * statement extracts the field from it */
} field_kind;

typedef struct
{
	field_kind	kind;
	const char *name;
	int			required;
	int			has_default;	/* non-NULL SQL default: omit when absent */
} field_spec;

typedef struct
{
	field_spec	fields[IM_MAX_PARAMS];
	/*
	 * sql_all: every field passed.  sql_default: the one field with a
	 * non-NULL default left out (the SQL default applies).  Named notation
	 * for what follows it keeps the remaining parameters in place.
	 */
	const char *sql_all;
	const char *sql_default;
	/*
	 * When set, the last field is optional and passed only when
	 * the frame has it (send's reply_to_message_id), with these statements;
	 * a frame without it runs sql_all/sql_default, which a pre-1.3 catalog
	 * understands.  The defaulted field is then the one before it.
	 */
	const char *sql_all_trailing;
	const char *sql_default_trailing;
} op_stmt;

#define U {F_USER, NULL, 0, 0}
#define D {F_DEVICE, NULL, 0, 0}

static const op_stmt stmts[IM_OP_COUNT] = {
	[IM_OP_SYNC] = {
		{U, D, {F_INT, "sync_generation", 0, 0}, {F_INT, "local_applied_sync_seq", 0, 0},
		{F_TEXT, "cursor", 0, 0}, {F_INT, "limit", 0, 1}},
		"SELECT * FROM im.sync_changes($1::bigint, $2::text, $3::int, $4::bigint, page_cursor => $5::text, page_limit => $6::int)",
		"SELECT * FROM im.sync_changes($1::bigint, $2::text, $3::int, $4::bigint, page_cursor => $5::text)"
	},
	[IM_OP_ACK] = {
		{U, D, {F_TEXT, "batch_token", 1, 0}, {F_INT, "acked_sync_seq", 1, 0}},
		"SELECT * FROM im.ack_sync($1::bigint, $2::text, $3::text, $4::bigint)", NULL
	},
	[IM_OP_SEND] = {
		{U, {F_INT, "conversation_id", 1, 0}, {F_TEXT, "client_msg_id", 1, 0},
		{F_OBJECT, "body", 1, 0}, {F_TEXT, "content_type", 0, 1},
		{F_INT, "reply_to_message_id", 0, 0}},	/* optional: a reply */
		"SELECT * FROM im.send_message($1::bigint, $2::bigint, $3::text, ($4::jsonb) OPERATOR(pg_catalog.->) 'body', $5::text, "
		"trace_id => $6::text)",
		"SELECT * FROM im.send_message($1::bigint, $2::bigint, $3::text, ($4::jsonb) OPERATOR(pg_catalog.->) 'body', "
		"trace_id => $5::text)",
		"SELECT * FROM im.send_message($1::bigint, $2::bigint, $3::text, ($4::jsonb) OPERATOR(pg_catalog.->) 'body', $5::text, $6::bigint, "
		"trace_id => $7::text)",
		"SELECT * FROM im.send_message($1::bigint, $2::bigint, $3::text, ($4::jsonb) OPERATOR(pg_catalog.->) 'body', "
		"reply_to_message_id => $5::bigint, trace_id => $6::text)"
	},
	[IM_OP_RECALL] = {
		{U, {F_INT, "conversation_id", 1, 0}, {F_TEXT, "client_msg_id", 1, 0},
		{F_INT, "target_message_id", 1, 0}},
		"SELECT * FROM im.recall_message($1::bigint, $2::bigint, $3::text, $4::bigint, trace_id => $5::text)", NULL
	},
	[IM_OP_EDIT] = {
		{U, {F_INT, "conversation_id", 1, 0}, {F_TEXT, "client_msg_id", 1, 0},
		{F_INT, "target_message_id", 1, 0}, {F_OBJECT, "body", 1, 0}},
		"SELECT * FROM im.edit_message($1::bigint, $2::bigint, $3::text, $4::bigint, ($5::jsonb) OPERATOR(pg_catalog.->) 'body', trace_id => $6::text)", NULL
	},
	[IM_OP_READ] = {
		{U, {F_INT, "conversation_id", 1, 0}, {F_INT, "read_to_seq", 1, 0}},
		"SELECT * FROM im.report_read($1::bigint, $2::bigint, $3::bigint, trace_id => $4::text)", NULL
	},
	[IM_OP_FETCH_MESSAGES] = {
		{U, {F_INT, "conversation_id", 1, 0}, {F_INT, "after_seq", 1, 0},
		{F_INT, "up_to_seq", 0, 0}, {F_INT, "limit", 0, 1}},
		"SELECT * FROM im.fetch_messages($1::bigint, $2::bigint, $3::bigint, up_to_seq => $4::bigint, page_limit => $5::int)",
		"SELECT * FROM im.fetch_messages($1::bigint, $2::bigint, $3::bigint, up_to_seq => $4::bigint)"
	},
	[IM_OP_CONVERSATIONS] = {
		{U, {F_INT, "after_conversation_id", 0, 0}, {F_INT, "limit", 0, 1}},
		"SELECT * FROM im.conversation_list($1::bigint, after_conversation_id => $2::bigint, page_limit => $3::int)",
		"SELECT * FROM im.conversation_list($1::bigint, after_conversation_id => $2::bigint)"
	},
	[IM_OP_CLEAR_DIRTY] = {
		{U, {F_INT, "conversation_id", 1, 0}, {F_INT, "observed_version", 1, 0},
		{F_INT, "saved_last_msg_seq", 1, 0}},
		"SELECT * FROM im.clear_dirty($1::bigint, $2::bigint, $3::bigint, $4::bigint, trace_id => $5::text)", NULL
	},
	[IM_OP_DELETE_FOR_ME] = {
		{U, {F_INT, "conversation_id", 1, 0}, {F_INT, "message_id", 1, 0}},
		"SELECT im.delete_for_me($1::bigint, $2::bigint, $3::bigint, trace_id => $4::text) AS deleted", NULL
	},
	[IM_OP_SNAPSHOT_BEGIN] = {
		{U, D},
		"SELECT * FROM im.begin_snapshot($1::bigint, $2::text)", NULL
	},
	[IM_OP_SNAPSHOT_FETCH] = {
		{U, D, {F_TEXT, "snapshot_token", 1, 0}, {F_INT, "page", 1, 0}},
		"SELECT * FROM im.fetch_snapshot($1::bigint, $2::text, $3::text, $4::int)", NULL
	},
	[IM_OP_SNAPSHOT_ACK] = {
		{U, D, {F_TEXT, "snapshot_token", 1, 0}, {F_TEXT, "manifest_digest", 1, 0}},
		"SELECT * FROM im.ack_snapshot($1::bigint, $2::text, $3::text, $4::text)", NULL
	},
	/* reactions and pins (contract §14) */
	[IM_OP_REACT] = {
		{U, {F_INT, "conversation_id", 1, 0}, {F_INT, "target_message_id", 1, 0},
		{F_TEXT, "reaction", 1, 0}, {F_BOOL, "present", 1, 0}, {F_TEXT, "client_msg_id", 1, 0}},
		"SELECT * FROM im.react($1::bigint, $2::bigint, $3::bigint, $4::text, $5::boolean, $6::text, trace_id => $7::text)", NULL
	},
	[IM_OP_PIN] = {
		{U, {F_INT, "conversation_id", 1, 0}, {F_INT, "target_message_id", 1, 0},
		{F_BOOL, "pinned", 1, 0}, {F_TEXT, "client_msg_id", 1, 0}},
		"SELECT * FROM im.pin_message($1::bigint, $2::bigint, $3::bigint, $4::boolean, $5::text, trace_id => $6::text)", NULL
	},
	/* contract §16: the facts for the sender, never device ids */
	[IM_OP_MESSAGE_STATUS] = {
		{U, {F_INT, "message_id", 1, 0}},
		"SELECT * FROM im.message_facts($1::bigint, $2::bigint)", NULL
	},
	/* contract §20: recency pages (the reply adds next_cursor) and conversation pins */
	[IM_OP_RECENT_CONVERSATIONS] = {
		{U, {F_TEXT, "after_cursor", 0, 0}, {F_INT, "limit", 0, 1}},
		"SELECT * FROM im.recent_conversations($1::bigint, after_cursor => $2::text, page_limit => $3::int)",
		"SELECT * FROM im.recent_conversations($1::bigint, after_cursor => $2::text)"
	},
	[IM_OP_PIN_CONVERSATION] = {
		{U, {F_INT, "conversation_id", 1, 0}, {F_BOOL, "pinned", 1, 0}},
		"SELECT * FROM im.pin_conversation($1::bigint, $2::bigint, $3::boolean, trace_id => $4::text)", NULL
	},
	/* contract §20: read receipts on or off, for the session's user only */
	[IM_OP_SET_READ_RECEIPTS] = {
		{U, {F_BOOL, "enabled", 1, 0}},
		"SELECT * FROM im.set_read_receipts($1::bigint, $2::boolean, trace_id => $3::text)", NULL
	},
	/*
	 * contract §17: the actor is the session's user; the member acted on is
	 * target_user_id (a frame's user_id may only name the session's user).
	 * mute_member without muted_until (or null) unmutes.
	 */
	[IM_OP_SET_ROLE] = {
		{U, {F_INT, "conversation_id", 1, 0}, {F_INT, "target_user_id", 1, 0},
		{F_TEXT, "role", 1, 0}, {F_TEXT, "client_msg_id", 1, 0}},
		"SELECT * FROM im.set_member_role($1::bigint, $2::bigint, $3::bigint, $4::text, $5::text)", NULL
	},
	[IM_OP_MUTE_MEMBER] = {
		{U, {F_INT, "conversation_id", 1, 0}, {F_INT, "target_user_id", 1, 0},
		{F_TEXT, "muted_until", 0, 0}, {F_TEXT, "client_msg_id", 1, 0}},
		"SELECT * FROM im.mute_member($1::bigint, $2::bigint, $3::bigint, $4::timestamptz, $5::text)", NULL
	},
	[IM_OP_REMOVE_MEMBER] = {
		{U, {F_INT, "conversation_id", 1, 0}, {F_INT, "target_user_id", 1, 0},
		{F_BOOL, "ban", 1, 0}, {F_TEXT, "client_msg_id", 1, 0}},
		"SELECT * FROM im.remove_member($1::bigint, $2::bigint, $3::bigint, $4::boolean, $5::text)", NULL
	},
};

/*
 * The writes whose statement ends with the trace id (contract §21): one
 * more parameter after the fields, always the last, named trace_id.
 */
static const unsigned char traced[IM_OP_COUNT] = {
	[IM_OP_SEND] = 1, [IM_OP_RECALL] = 1, [IM_OP_EDIT] = 1, [IM_OP_READ] = 1,
	[IM_OP_CLEAR_DIRTY] = 1, [IM_OP_DELETE_FOR_ME] = 1, [IM_OP_REACT] = 1, [IM_OP_PIN] = 1,
	[IM_OP_PIN_CONVERSATION] = 1, [IM_OP_SET_READ_RECEIPTS] = 1,
};

int
im_json_depth(const json_t *v, int cap)
{
	int			max = 0;

	if (!json_is_object(v) && !json_is_array(v))
		return 0;
	if (cap <= 0)
		return 1;				/* already beyond the cap: stop descending */
	if (json_is_object(v))
	{
		const char *k;
		json_t	   *c;

		json_object_foreach((json_t *) v, k, c)
		{
			int			d = im_json_depth(c, cap - 1);

			if (d > max)
				max = d;
			if (max >= cap)
				break;
		}
	}
	else
	{
		size_t		i;
		json_t	   *c;

		json_array_foreach(v, i, c)
		{
			int			d = im_json_depth(c, cap - 1);

			if (d > max)
				max = d;
			if (max >= cap)
				break;
		}
	}
	return max + 1;
}

static char *
xstrdup(const char *s)
{
	char	   *r = strdup(s);

	if (!r)
		abort();
	return r;
}

/* A JSON string is usable as a libpq text parameter or compared with strcmp
 * only if it holds no NUL (frames are decoded with JSON_ALLOW_NUL). */
static int
string_has_nul(const json_t *t)
{
	return strlen(json_string_value(t)) != json_string_length(t);
}

char *
im_int64_text(int64_t v)
{
	char		buf[32];

	snprintf(buf, sizeof(buf), "%" PRId64, v);
	return xstrdup(buf);
}

void
im_request_free(im_request *req)
{
	int			i;

	for (i = 0; i < req->nparams; i++)
		free(req->params[i]);
	req->nparams = 0;
	if (req->id)
		json_decref(req->id);
	req->id = NULL;
}

static im_decode_status
bad(im_request *req, im_decode_status st, const char *fmt, const char *name)
{
	snprintf(req->err, sizeof(req->err), fmt, name ? name : "");
	return st;
}

/*
 * A number jansson cannot hold (an integer past int64, a real past double)
 * is valid JSON with a value out of range: INVALID_ARGUMENT, like 22003
 * (contract §10).  The frame is read once more with integers as reals only
 * to echo its id, when that id is a string or an exactly held integer.
 */
static im_decode_status
number_out_of_range(const char *buf, size_t len, im_request *req)
{
	json_error_t jerr;
	json_t	   *root = json_loadb(buf, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL |
								  JSON_DECODE_INT_AS_REAL, &jerr);
	json_t	   *id = root && json_is_object(root) ? json_object_get(root, "id") : NULL;

	if (id && json_is_string(id))
		req->id = json_incref(id);
	else if (id && json_is_real(id) &&
			 json_real_value(id) >= -9007199254740991.0 && json_real_value(id) <= 9007199254740991.0 &&
			 json_real_value(id) == (double) (int64_t) json_real_value(id))
		req->id = json_integer((json_int_t) json_real_value(id));
	json_decref(root);
	req->op = IM_OP_COUNT;		/* type unknown: counted as an invalid frame */
	return bad(req, IM_DECODE_INVALID, "a number is out of range%s", NULL);
}

/*
 * The envelope: JSON text, an object, a scalar id (kept in req->id so
 * errors can echo it), nesting, a known type.  Returns the object with
 * req->op set, or NULL with *rc the refusal.
 */
static json_t *
decode_envelope(const char *buf, size_t len, im_request *req, im_decode_status *rc)
{
	json_error_t jerr;
	json_t	   *root;
	json_t	   *t;
	json_t	   *trace;
	const char *type;
	int			op;

	/*
	 * jansson rejects invalid UTF-8; duplicate keys are refused so a frame
	 * cannot mean two things (PostgreSQL, which re-reads the frame text for
	 * bodies, would keep the last one).  \u0000 is let through: in a body it
	 * reaches PostgreSQL, which refuses it (22P05, INVALID_ARGUMENT); string
	 * fields that become text parameters refuse it here.  A raw NUL byte is
	 * not JSON and never reaches json_loadb's caller as a frame.
	 */
	if (memchr(buf, '\0', len) != NULL)
	{
		*rc = bad(req, IM_DECODE_BAD_FRAME, "not JSON%s", NULL);
		return NULL;
	}
	root = json_loadb(buf, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
	if (!root)
	{
		*rc = json_error_code(&jerr) == json_error_numeric_overflow ?
			number_out_of_range(buf, len, req) :
			bad(req, IM_DECODE_BAD_FRAME, "not JSON%s", NULL);
		return NULL;
	}
	*rc = IM_DECODE_BAD_FRAME;
	if (!json_is_object(root))
	{
		bad(req, IM_DECODE_BAD_FRAME, "not a JSON object%s", NULL);
		goto refused;
	}
	t = json_object_get(root, "id");
	if (t && !json_is_null(t))
	{
		/* echo only scalars: a structured id is a bad frame */
		if (json_is_object(t) || json_is_array(t))
		{
			bad(req, IM_DECODE_BAD_FRAME, "id must be a string or a number%s", NULL);
			goto refused;
		}
		req->id = json_incref(t);
	}
	if (im_json_depth(root, IM_MAX_NESTING) > IM_MAX_NESTING)
	{
		bad(req, IM_DECODE_BAD_FRAME, "nesting deeper than 32%s", NULL);
		goto refused;
	}
	/*
	 * The frame's trace id (contract §21), kept when valid even if the frame
	 * is refused below, so its error carries it; absent or null: the caller
	 * makes one.
	 */
	trace = json_object_get(root, "trace_id");
	if (trace && json_is_string(trace) &&
		im_trace_id_ok(json_string_value(trace), json_string_length(trace)))
		memcpy(req->trace_id, json_string_value(trace), json_string_length(trace) + 1);
	t = json_object_get(root, "type");
	if (!t || !json_is_string(t) || string_has_nul(t))
	{
		bad(req, IM_DECODE_BAD_FRAME, "missing or non-string type%s", NULL);
		goto refused;
	}
	type = json_string_value(t);
	for (op = 0; op < IM_OP_COUNT; op++)
		if (strcmp(type, im_ops[op].type) == 0)
			break;
	if (op == IM_OP_COUNT)
	{
		bad(req, IM_DECODE_BAD_FRAME, "unknown type%s", NULL);
		goto refused;
	}
	req->op = (im_op) op;
	/* a bad trace id refuses a frame of a known type (BAD_FRAME comes first) */
	if (trace && !json_is_null(trace) && !req->trace_id[0])
	{
		*rc = bad(req, IM_DECODE_INVALID, "trace_id must be 1-64 of A-Z a-z 0-9 _ -%s", NULL);
		goto refused;
	}
	/* the conversation a request is about, for its log line */
	t = json_object_get(root, "conversation_id");
	if (t && json_is_integer(t))
		req->conversation_id = json_integer_value(t);
	*rc = IM_DECODE_OK;
	return root;

refused:
	json_decref(root);
	return NULL;
}

/* A frame may repeat the session's identity but never name another. */
static im_decode_status
check_identity(json_t *root, int64_t user_id, const char *device_id, im_request *req)
{
	static const char *const user_fields[] = {"user_id", "sender_id"};
	im_decode_status rc = IM_DECODE_OK;
	json_t	   *t;
	int			i;

	for (i = 0; i < 2; i++)
	{
		json_t	   *u = json_object_get(root, user_fields[i]);

		if (u && !json_is_null(u) &&
			(!json_is_integer(u) || json_integer_value(u) != user_id))
			rc = bad(req, IM_DECODE_FORBIDDEN, "frame names another user (%s)", user_fields[i]);
	}
	t = json_object_get(root, "device_id");
	if (t && !json_is_null(t) &&
		(!json_is_string(t) || string_has_nul(t) || !device_id ||
		 strcmp(json_string_value(t), device_id) != 0))
		rc = bad(req, IM_DECODE_FORBIDDEN, "frame names another device%s", NULL);
	return rc;
}

static im_decode_status
decode_hello(json_t *root, im_request *req)
{
	json_t	   *t = json_object_get(root, "token");

	if (!t || !json_is_string(t) || json_string_length(t) == 0 || string_has_nul(t))
		return bad(req, IM_DECODE_BAD_FRAME, "hello needs a string token%s", NULL);
	req->params[0] = xstrdup(json_string_value(t));
	req->nparams = 1;
	/*
	 * One round trip per hello: device_session runs after authenticate
	 * (LATERAL) and, being volatile, sees the epoch it just set.  Admission
	 * limits are checked on the result before the session is welcomed.
	 * The device's presence (offline push) is set online in the same
	 * transaction: it commits with the new epoch or, for a refused hello,
	 * not at all, and a reconnect storm pays one transaction per hello (or
	 * per batch of hellos, db_hello_batch.c) instead of two.
	 */
	req->sql = "SELECT a.user_id, a.device_id, a.connection_epoch, d.state, d.sync_generation, "
		"d.server_acked_sync_seq, d.high_watermark, d.current, d.account_state, "
		"im.set_presence(a.user_id, a.device_id, a.connection_epoch, true, "
		"'" IM_PRESENCE_TTL_TEXT "'::interval) "
		"FROM im.authenticate($1::text) a "
		"CROSS JOIN LATERAL im.device_session(a.user_id, a.device_id, a.connection_epoch) d";
	return IM_DECODE_OK;
}

/* The text parameter (*val) of field f from its JSON value t (not null). */
static im_decode_status
field_param(const field_spec *f, json_t *t, const char *buf, size_t len,
			im_request *req, char **val)
{
	if (f->kind == F_INT)
	{
		if (!json_is_integer(t))
			return bad(req, IM_DECODE_BAD_FRAME, "field %s must be an integer", f->name);
		*val = im_int64_text(json_integer_value(t));
		return IM_DECODE_OK;
	}
	if (f->kind == F_BOOL)
	{
		if (!json_is_boolean(t))
			return bad(req, IM_DECODE_BAD_FRAME, "field %s must be true or false", f->name);
		*val = xstrdup(json_is_true(t) ? "true" : "false");
		return IM_DECODE_OK;
	}
	if (f->kind == F_TEXT)
	{
		if (!json_is_string(t))
			return bad(req, IM_DECODE_BAD_FRAME, "field %s must be a string", f->name);
		if (string_has_nul(t))
			return bad(req, IM_DECODE_INVALID, "field %s must not contain \\u0000", f->name);
		*val = xstrdup(json_string_value(t));
		return IM_DECODE_OK;
	}
	if (!json_is_object(t))
		return bad(req, IM_DECODE_BAD_FRAME, "field %s must be an object", f->name);
	/*
	 * Never re-serialized: jansson would print 0.1 as 0.10000000000000001
	 * and cannot hold integers past int64.  PostgreSQL reads the frame text
	 * itself and the statement takes the field (checked above to be the one
	 * object of that name).
	 */
	*val = malloc(len + 1);
	if (!*val)
		abort();
	memcpy(*val, buf, len);
	(*val)[len] = '\0';
	return IM_DECODE_OK;
}

/*
 * The statement's parameters in field order, and which statement text: the
 * one without the defaulted last field when the frame leaves it out.
 */
static im_decode_status
decode_params(json_t *root, const char *buf, size_t len, int64_t user_id,
			  const char *device_id, im_request *req)
{
	const op_stmt *st = &stmts[req->op];
	im_decode_status rc = IM_DECODE_OK;
	int			use_default = 0;
	int			i;

	for (i = 0; i < IM_MAX_PARAMS && st->fields[i].kind != F_END; i++)
	{
		const field_spec *f = &st->fields[i];
		json_t	   *t = NULL;
		char	   *val = NULL;

		if (f->kind == F_USER)
			val = im_int64_text(user_id);
		else if (f->kind == F_DEVICE)
			val = xstrdup(device_id ? device_id : "");
		else if (!(t = json_object_get(root, f->name)) || json_is_null(t))
		{
			if (f->required)
				rc = bad(req, IM_DECODE_BAD_FRAME, "missing field %s", f->name);
			else if (f->has_default)
				use_default = 1;
		}
		else
			rc = field_param(f, t, buf, len, req, &val);
		req->params[i] = val;
		req->nparams = i + 1;
		if (rc != IM_DECODE_OK)
			return rc;
	}
	if (st->sql_all_trailing)
	{
		/* the optional trailing field, kept only when present */
		char	   *last = req->params[--req->nparams];

		req->params[req->nparams] = NULL;
		if (use_default)
		{
			free(req->params[req->nparams - 1]);
			req->params[req->nparams - 1] = NULL;
			req->nparams--;
		}
		if (last)
		{
			req->params[req->nparams++] = last;
			req->sql = use_default ? st->sql_default_trailing : st->sql_all_trailing;
		}
		else
			req->sql = use_default ? st->sql_default : st->sql_all;
		return IM_DECODE_OK;
	}
	if (use_default)
	{
		/* the defaulted field is always last: drop it */
		free(req->params[req->nparams - 1]);
		req->params[req->nparams - 1] = NULL;
		req->nparams--;
		req->sql = st->sql_default;
	}
	else
		req->sql = st->sql_all;
	return IM_DECODE_OK;
}

im_decode_status
im_decode_frame(const char *buf, size_t len, int64_t user_id,
				const char *device_id, im_request *req)
{
	json_t	   *root;
	im_decode_status rc;

	memset(req, 0, sizeof(*req));
	req->op = IM_OP_COUNT;		/* until its type is known */
	req->trace_param = -1;
	root = decode_envelope(buf, len, req, &rc);
	if (!root)
		return rc;
	if (req->op == IM_OP_HELLO)
		rc = decode_hello(root, req);
	else if ((rc = check_identity(root, user_id, device_id, req)) == IM_DECODE_OK &&
			 req->op != IM_OP_PING)
		rc = decode_params(root, buf, len, user_id, device_id, req);
	if (rc == IM_DECODE_OK && traced[req->op])
	{
		/* the trace id's parameter: the frame's, or filled by im_request_set_trace */
		req->trace_param = req->nparams;
		req->params[req->nparams++] = req->trace_id[0] ? xstrdup(req->trace_id) : NULL;
	}
	json_decref(root);
	return rc;
}

void
im_request_set_trace(im_request *req, const char *generated)
{
	if (req->trace_id[0])
		return;
	snprintf(req->trace_id, sizeof(req->trace_id), "%s", generated);
	if (req->trace_param > 0 && !req->params[req->trace_param])
		req->params[req->trace_param] = xstrdup(req->trace_id);
}

static int
parse_i64(const char *s, size_t n, int64_t *out)
{
	char		buf[24];
	char	   *end;
	long long	v;

	if (n == 0 || n >= sizeof(buf))
		return -1;
	memcpy(buf, s, n);
	buf[n] = '\0';
	if (buf[0] == '-' || buf[0] == '+' || buf[0] == ' ')
		return -1;
	errno = 0;
	v = strtoll(buf, &end, 10);
	if (errno || *end != '\0')
		return -1;
	*out = (int64_t) v;
	return 0;
}

int
im_parse_hint_payload(const char *payload, im_user_hint_cb ucb,
					  im_conv_hint_cb ccb, void *arg)
{
	const char *p = payload;
	int			bad_entries = 0;

	while (*p)
	{
		const char *end = strchr(p, ',');
		const char *colon;
		size_t		n = end ? (size_t) (end - p) : strlen(p);
		int64_t		a,
					b;
		int			conv = (n > 0 && p[0] == 'c');
		const char *s = conv ? p + 1 : p;

		colon = memchr(s, ':', n - (size_t) (s - p));
		if (!colon ||
			parse_i64(s, (size_t) (colon - s), &a) != 0 ||
			parse_i64(colon + 1, n - (size_t) (colon + 1 - p), &b) != 0)
			bad_entries++;
		else if (conv)
			ccb(arg, a, b);
		else
			ucb(arg, a, b);
		if (!end)
			break;
		p = end + 1;
	}
	return bad_entries;
}

int
im_parse_device_event(const char *payload, im_device_event *ev)
{
	const char *c1 = strchr(payload, ':');
	const char *c2;
	const char *c3;

	if (!c1)
		return -1;
	c2 = strchr(c1 + 1, ':');
	if (!c2)
		return -1;
	c3 = strchr(c2 + 1, ':');
	if (!c3)
		return -1;
	if (parse_i64(payload, (size_t) (c1 - payload), &ev->user_id) != 0)
		return -1;
	if (c2 - c1 - 1 <= 0 || c2 - c1 - 1 > 64)
		return -1;
	memcpy(ev->device_id, c1 + 1, (size_t) (c2 - c1 - 1));
	ev->device_id[c2 - c1 - 1] = '\0';
	if (parse_i64(c2 + 1, (size_t) (c3 - c2 - 1), &ev->epoch) != 0)
		return -1;
	if (strcmp(c3 + 1, "REVOKED") == 0)
		ev->revoked = 1;
	else if (strcmp(c3 + 1, "SUPERSEDED") == 0)
		ev->revoked = 0;
	else if (strcmp(c3 + 1, "SUSPENDED") == 0)
		ev->revoked = 2;
	else
		return -1;
	return 0;
}

/*
 * IS403's reasons (contract §17), by the server's message text: the one
 * table every IS403 cause adds its line to.
 */
static const struct
{
	const char *errmsg;
	const char *reason;
}			forbidden_reasons[] = {
	{"member muted", "muted"},
	{"account suspended", "suspended"},
};

const char *
im_api_error_code(const char *ss, const char *errmsg, const char **reason)
{
	*reason = NULL;
	/* 22P05 is \u0000 in a body, 22003 an integer out of its column's range */
	if (!strcmp(ss, "22023") || !strcmp(ss, "22P02") || !strcmp(ss, "22P05") ||
		!strcmp(ss, "22003"))
		return "INVALID_ARGUMENT";
	if (!strcmp(ss, "42501"))
		return "FORBIDDEN";
	if (!strcmp(ss, "IS403"))
	{
		for (size_t i = 0; i < sizeof(forbidden_reasons) / sizeof(forbidden_reasons[0]); i++)
			if (errmsg && !strcmp(errmsg, forbidden_reasons[i].errmsg))
				*reason = forbidden_reasons[i].reason;
		return "FORBIDDEN";
	}
	if (!strcmp(ss, "P0002"))
		return "NOT_FOUND";
	if (!strcmp(ss, "IS409"))
		return "CONFLICT";
	return "INTERNAL";
}

char *
im_error_frame(json_t *id, const char *trace_id, const char *code, const char *message,
			   long retry_after_ms)
{
	return im_error_frame_reason(id, trace_id, code, message, retry_after_ms, NULL);
}

char *
im_error_frame_reason(json_t *id, const char *trace_id, const char *code, const char *message,
					  long retry_after_ms, const char *reason)
{
	json_t	   *o = json_object();
	char	   *s;

	json_object_set_new(o, "type", json_string("error"));
	if (id)
		json_object_set(o, "id", id);
	if (trace_id && trace_id[0])
		json_object_set_new(o, "trace_id", json_string(trace_id));
	json_object_set_new(o, "code", json_string(code));
	/* messages come from our own text or the server's errmsg; never raw
	 * frame bytes, so they are valid UTF-8 */
	json_object_set_new(o, "message", json_string(message ? message : code));
	if (retry_after_ms >= 0)
		json_object_set_new(o, "retry_after_ms", json_integer(retry_after_ms));
	if (reason)
		json_object_set_new(o, "reason", json_string(reason));
	s = json_dumps(o, JSON_COMPACT);
	json_decref(o);
	return s;
}
