/*
 * conversation.c — the single-writer conversation operations other than
 * send: create/direct/join/leave, the shared_log mode switch, and
 * conversation_list/members (conversation side).
 *
 * Membership is a set of periods [join_seq, leave_seq] per (conversation,
 * user); every join and leave is a position appended by the conversation's
 * single writer (im_append_event under the row lock), so a leave that races a
 * send is decided by that order alone (contract §2).  Periods of one user
 * never overlap (EXCLUDE constraint) and at most one is open (unique index);
 * this file only ever opens a period when none is open and closes it at the
 * head before the leave event.
 * Lock order: conversation row, then user heads, then user conversation
 * states (contract §4).
 */
#include "core/im_sync.h"
#include "core/common.h"
#include "core/locks.h"
#include "core/shard_map.h"
#include "core/im_sql.h"
#include "core/version_check.h"
#include "core/standing.h"
#include "conversation/conversation.h"

#include "catalog/pg_type.h"
#include "common/int.h"
#include "utils/array.h"
#include "utils/builtins.h"

/*
 * Members from the array plus the creator: no NULLs, ids > 0, sorted and
 * deduplicated.  Returns the count; *out is palloc'd.
 */
static int
collect_members(FunctionCallInfo fcinfo, int64 creator, int64 **out)
{
	ArrayType  *arr;
	Datum	   *elems;
	bool	   *enulls;
	int			nelems;
	int64	   *ids;
	int			n = 0;

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("members must not be NULL"),
				 errhint("Pass an empty array when only the creator is a member.")));
	arr = PG_GETARG_ARRAYTYPE_P(1);
	if (ARR_NDIM(arr) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("members must be a one-dimensional array")));
	deconstruct_array(arr, INT8OID, 8, true, TYPALIGN_DOUBLE, &elems, &enulls, &nelems);
	ids = palloc(sizeof(int64) * (nelems + 1));
	for (int i = 0; i < nelems; i++)
	{
		if (enulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("members must not contain NULL")));
		ids[n] = DatumGetInt64(elems[i]);
		im_check_user_id(ids[n], "every element of members");
		n++;
	}
	if (creator != 0)
		ids[n++] = creator;
	n = im_sort_unique_int64(ids, n);
	*out = ids;
	return n;
}

/*
 * A new period id: it carries its conversation's bucket on a sharded node,
 * so the copies of periods from several conversation nodes never share an
 * id on a user node (shard_map.h).
 */
static int64
placed_period_id(int64 conversation_id)
{
	return im_shard_next_placed_id("membership_period_id_seq", conversation_id);
}

/* user_conversation rows exist from the first period on (fanout only UPDATEs
 * them, so it never takes a key-share lock on the conversation row).  The
 * caller holds the users' heads. */
static void
ensure_user_conversations(int64 conversation_id, Datum user_array)
{
	static SPIPlanPtr plan;
	Datum		args[2];

	/* only the users whose heads this node holds (shard_map.c) */

	im_prepare(&plan,
			   "INSERT INTO im.user_conversation (user_id, conversation_id) "
			   "SELECT u, $1 FROM pg_catalog.unnest($2::pg_catalog.int8[]) u "
			   "WHERE EXISTS (SELECT 1 FROM im.user_head h WHERE h.user_id" EQ "u) ORDER BY u "
			   "ON CONFLICT (user_id, conversation_id) DO NOTHING",
			   2, INT8OID, INT8ARRAYOID);
	args[0] = Int64GetDatum(conversation_id);
	args[1] = user_array;
	im_exec(plan, args, NULL, 0);
}

/*
 * Create a conversation with its `create` event at msg_seq 1 and one period
 * per initial member starting there.  For kind 'direct' this is a
 * get-or-create on the (lo, hi) pair: a concurrent creator of the same pair
 * waits on the unique index and then finds the committed row.
 * Must be called inside SPI.
 */
static int64
create_conversation(const char *kind, int64 *members, int n, int64 owner)
{
	static SPIPlanPtr ins_direct;
	static SPIPlanPtr get_direct;
	static SPIPlanPtr ins_group;
	static SPIPlanPtr ins_periods;
	Datum		args[4];
	int64		conversation_id;
	ImConversation conv;
	ImNewEvent	ev;
	StringInfoData body;
	int64		message_id;
	int64		msg_seq;
	Datum		arr;
	int64	   *period_ids;
	int64		pair_key;
	bool		direct = strcmp(kind, "direct") == 0;

	if (direct)
	{
		/*
		 * the pair's bucket is (lo + hi) % 64, so both members'
		 * calls resolve to one node and one id; $3 is the id factor
		 */
		im_shard_require_conversation(members[0] + members[1]);
		if (pg_add_s64_overflow(members[0], members[1], &pair_key))
			ereport(ERROR,
					(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
					 errmsg("bigint out of range")));
		im_prepare(&ins_direct,
				   "INSERT INTO im.conversation (conversation_id, kind, direct_user_lo, direct_user_hi) "
				   "VALUES ($3, 'direct', $1, $2) "
				   "ON CONFLICT (direct_user_lo, direct_user_hi) DO NOTHING "
				   "RETURNING conversation_id",
				   3, INT8OID, INT8OID, INT8OID);
		args[0] = Int64GetDatum(members[0]);
		args[1] = Int64GetDatum(members[1]);
		/* a get-or-create that finds the pair uses up the id, as nextval did */
		args[2] = Int64GetDatum(im_shard_next_placed_id("conversation_id_seq", pair_key));
		if (im_exec(ins_direct, args, NULL, 0) == 0)
		{
			im_prepare(&get_direct,
					   "SELECT conversation_id FROM im.conversation "
					   "WHERE direct_user_lo" EQ "$1 "
					   "AND direct_user_hi" EQ "$2",
					   2, INT8OID, INT8OID);
			if (im_exec(get_direct, args, NULL, 0) != 1)
				elog(ERROR, "im_sync: direct conversation of " INT64_FORMAT " and " INT64_FORMAT " vanished",
					 members[0], members[1]);
			return im_get_int64(0, 1, NULL);
		}
		conversation_id = im_get_int64(0, 1, NULL);
	}
	else
	{
		/* a group gets the node's buckets round robin (shard_map.h) */
		int64		v = im_shard_nextval("conversation_id_seq");

		conversation_id = im_shard_placed_id(v, im_shard_round_robin_bucket(v));
		im_prepare(&ins_group,
				   "INSERT INTO im.conversation (conversation_id, kind) VALUES ($1, 'group')",
				   1, INT8OID);
		args[0] = Int64GetDatum(conversation_id);
		im_exec(ins_group, args, NULL, 0);
	}

	im_lock_conversation(conversation_id, &conv);

	initStringInfo(&body);
	appendStringInfoChar(&body, '[');
	for (int i = 0; i < n; i++)
		appendStringInfo(&body, "%s" INT64_FORMAT, i ? ", " : "", members[i]);
	appendStringInfoChar(&body, ']');

	memset(&ev, 0, sizeof(ev));
	ev.kind = "create";
	ev.body = im_jsonb_from_cstring(body.data);
	if (!im_append_event(&conv, &ev, &message_id, &msg_seq) || msg_seq != 1)
		elog(ERROR, "im_sync: create event of conversation " INT64_FORMAT " is not msg_seq 1",
			 conversation_id);

	arr = im_int8_array(members, n);
	/* members is sorted: the period ids ascend with the user ids */
	period_ids = palloc(sizeof(int64) * Max(n, 1));
	for (int i = 0; i < n; i++)
		period_ids[i] = placed_period_id(conversation_id);
	im_prepare(&ins_periods,
			   "INSERT INTO im.membership_period (membership_period_id, conversation_id, user_id, join_seq, join_event_id) "
			   "SELECT p.id, $1, p.u, 1, $3 "
			   "FROM ROWS FROM (pg_catalog.unnest($2::pg_catalog.int8[]), pg_catalog.unnest($4::pg_catalog.int8[])) p(u, id) "
			   "ORDER BY p.u",
			   4, INT8OID, INT8ARRAYOID, INT8OID, INT8ARRAYOID);
	args[0] = Int64GetDatum(conversation_id);
	args[1] = arr;
	args[2] = Int64GetDatum(message_id);
	args[3] = im_int8_array(period_ids, n);
	im_exec(ins_periods, args, NULL, 0);

	/* a group's creator is its owner, else its first member (contract §17) */
	if (!direct)
		im_roles_set_owner(conversation_id, owner != 0 ? owner : members[0]);

	im_lock_user_heads(members, n);
	ensure_user_conversations(conversation_id, arr);
	return conversation_id;
}

/* im.create_conversation(kind, members, creator DEFAULT NULL) -> conversation_id */
PG_FUNCTION_INFO_V1(im_create_conversation);
Datum
im_create_conversation(PG_FUNCTION_ARGS)
{
	char	   *kind = im_arg_text(fcinfo, 0, "kind", 16);
	int64		creator = PG_ARGISNULL(2) ? 0 : im_arg_user_id(fcinfo, 2, "creator");
	int64	   *members;
	int			n;
	int64		conversation_id;

	if (strcmp(kind, "direct") != 0 && strcmp(kind, "group") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("kind must be 'direct' or 'group', got \"%s\"", kind)));
	n = collect_members(fcinfo, creator, &members);
	if (strcmp(kind, "direct") == 0 && n != 2)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a direct conversation needs exactly two distinct members, got %d", n),
				 errdetail("The creator, when given, counts as a member.")));
	if (n == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a conversation needs at least one member")));

	im_spi_connect();
	conversation_id = create_conversation(kind, members, n, creator);
	SPI_finish();
	PG_RETURN_INT64(conversation_id);
}

/* im.direct_conversation(user_a, user_b) -> conversation_id (get-or-create) */
PG_FUNCTION_INFO_V1(im_direct_conversation);
Datum
im_direct_conversation(PG_FUNCTION_ARGS)
{
	int64		a = im_arg_user_id(fcinfo, 0, "user_a");
	int64		b = im_arg_user_id(fcinfo, 1, "user_b");
	int64		members[2];
	int64		conversation_id;

	if (a == b)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a direct conversation needs two distinct users, got " INT64_FORMAT " twice", a)));
	members[0] = Min(a, b);
	members[1] = Max(a, b);
	im_spi_connect();
	conversation_id = create_conversation("direct", members, 2, 0);
	SPI_finish();
	PG_RETURN_INT64(conversation_id);
}

static void
reject_direct(ImConversation *conv, const char *what)
{
	if (strcmp(conv->kind, "direct") == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("cannot %s direct conversation " INT64_FORMAT, what, conv->conversation_id),
				 errdetail("Direct conversations have exactly their two members for good.")));
}

/* The open period of (conversation, user), if any, and whether the user
 * owns the group.  Caller holds the conversation lock, so the answer stays
 * true until commit. */
static bool
open_period(int64 conversation_id, int64 user_id, int64 *period_id, int64 *join_seq,
			bool *owner)
{
	static SPIPlanPtr plans[2];
	Datum		args[2];
	bool		roles = IM_CATALOG_HAS_ROLES();

	im_prepare(&plans[roles],
			   roles ?
			   "SELECT membership_period_id, join_seq, role" EQ "'owner' FROM im.membership_period "
			   "WHERE conversation_id" EQ "$1 AND user_id" EQ "$2 "
			   "AND leave_seq IS NULL" :
			   "SELECT membership_period_id, join_seq, false FROM im.membership_period "
			   "WHERE conversation_id" EQ "$1 AND user_id" EQ "$2 "
			   "AND leave_seq IS NULL",
			   2, INT8OID, INT8OID);
	args[0] = Int64GetDatum(conversation_id);
	args[1] = Int64GetDatum(user_id);
	if (im_exec(plans[roles], args, NULL, 0) == 0)
		return false;
	*period_id = im_get_int64(0, 1, NULL);
	*join_seq = im_get_int64(0, 2, NULL);
	*owner = im_get_bool(0, 3, NULL);
	return true;
}

void
im_close_period(int64 period_id, int64 leave_seq, int64 leave_event_id)
{
	static SPIPlanPtr plan;
	Datum		args[3];

	im_prepare(&plan,
			   "UPDATE im.membership_period SET leave_seq = $2, leave_event_id = $3 "
			   "WHERE membership_period_id" EQ "$1",
			   3, INT8OID, INT8OID, INT8OID);
	args[0] = Int64GetDatum(period_id);
	args[1] = Int64GetDatum(leave_seq);
	args[2] = Int64GetDatum(leave_event_id);
	if (im_exec(plan, args, NULL, 0) != 1)
		elog(ERROR, "im_sync: period " INT64_FORMAT " vanished under the conversation lock", period_id);
}

/* Append the `join` or `leave` system event of user_id (caller holds the
 * conversation lock). */
static void
append_membership_event(ImConversation *conv, const char *kind, int64 user_id,
						int64 *message_id, int64 *msg_seq)
{
	ImNewEvent	ev;
	char		body[64];

	memset(&ev, 0, sizeof(ev));
	ev.kind = kind;
	snprintf(body, sizeof(body), "{\"user_id\": " INT64_FORMAT "}", user_id);
	ev.body = im_jsonb_from_cstring(body);
	ev.subject_user_id = user_id;
	if (!im_append_event(conv, &ev, message_id, msg_seq))
		elog(ERROR, "im_sync: %s event was not appended", kind);
}

/* ---- shared_log mode switch (contract §2; fanout_shared_log.c delivers) */

/*
 * Switch the mode of a conversation whose row the caller has locked (the
 * single writer): update the row and append the `mode` event, which carries
 * the new mode so it is the first position fanned out in that mode.
 * Returns false when the mode is already in force (no event).
 */
static bool
switch_mode_locked(ImConversation *conv, const char *mode)
{
	static SPIPlanPtr upd;
	ImNewEvent	ev;
	Datum		args[2];
	char		body[64];
	int64		message_id;
	int64		msg_seq;

	if (strcmp(conv->mode, mode) == 0)
		return false;
	im_prepare(&upd,
			   "UPDATE im.conversation SET mode = $2 WHERE conversation_id" EQ "$1",
			   2, INT8OID, TEXTOID);
	args[0] = Int64GetDatum(conv->conversation_id);
	args[1] = CStringGetTextDatum(mode);
	im_exec(upd, args, NULL, 0);
	strlcpy(conv->mode, mode, sizeof(conv->mode));

	memset(&ev, 0, sizeof(ev));
	ev.kind = "mode";
	snprintf(body, sizeof(body), "{\"mode\": \"%s\"}", mode);
	ev.body = im_jsonb_from_cstring(body);
	if (!im_append_event(conv, &ev, &message_id, &msg_seq))
		elog(ERROR, "im_sync: mode event was not appended");
	conv->head_msg_seq = msg_seq;
	return true;
}

/*
 * Called by join (under the conversation lock): im_sync.shared_log_min_members
 * switches a fanout group to shared_log when its active members reach it.
 * Nothing switches back automatically.
 */
static void
maybe_switch_to_shared_log_on_join(ImConversation *conv)
{
	static SPIPlanPtr count;
	Datum		args[1];

	if (im_shared_log_min_members <= 0 || strcmp(conv->kind, "group") != 0 ||
		strcmp(conv->mode, "fanout") != 0)
		return;
	im_prepare(&count,
			   "SELECT pg_catalog.count(*) FROM im.membership_period "
			   "WHERE conversation_id" EQ "$1 AND leave_seq IS NULL",
			   1, INT8OID);
	args[0] = Int64GetDatum(conv->conversation_id);
	im_exec(count, args, NULL, 0);
	if (im_get_int64(0, 1, NULL) >= im_shared_log_min_members)
		switch_mode_locked(conv, "shared_log");
}

/* im.set_conversation_mode(conversation_id, mode) -> the mode now in force */
PG_FUNCTION_INFO_V1(im_set_conversation_mode);
Datum
im_set_conversation_mode(PG_FUNCTION_ARGS)
{
	int64		conversation_id = im_arg_id(fcinfo, 0, "conversation_id");
	char	   *mode = im_arg_text(fcinfo, 1, "mode", 16);
	ImConversation conv;

	if (strcmp(mode, "fanout") != 0 && strcmp(mode, "shared_log") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("mode must be 'fanout' or 'shared_log', got \"%s\"", mode)));
	im_spi_connect();
	im_lock_conversation(conversation_id, &conv);
	if (strcmp(conv.kind, "group") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("cannot change the mode of direct conversation " INT64_FORMAT, conversation_id),
				 errdetail("Only group conversations can use shared_log mode.")));
	switch_mode_locked(&conv, mode);
	SPI_finish();
	PG_RETURN_TEXT_P(cstring_to_text(mode));
}

/* im.join_conversation(conversation_id, user_id)
 *   -> (membership_period_id, join_seq, created) */
PG_FUNCTION_INFO_V1(im_join_conversation);
Datum
im_join_conversation(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr ins_period;
	int64		conversation_id = im_arg_id(fcinfo, 0, "conversation_id");
	int64		user_id = im_arg_user_id(fcinfo, 1, "user_id");
	ImConversation conv;
	int64		period_id;
	int64		join_seq;
	int64		message_id;
	bool		owner;
	bool		created = false;
	Datum		values[3];
	bool		nulls[3] = {false, false, false};
	Datum		args[5];

	im_srf_begin(fcinfo);
	im_spi_connect();
	im_lock_conversation(conversation_id, &conv);
	reject_direct(&conv, "join");

	if (!open_period(conversation_id, user_id, &period_id, &join_seq, &owner))
	{
		im_roles_require_not_banned(conversation_id, user_id);
		append_membership_event(&conv, "join", user_id, &message_id, &join_seq);

		/* The period starts at the join event itself: the joiner sees it. */
		im_prepare(&ins_period,
				   "INSERT INTO im.membership_period (membership_period_id, conversation_id, user_id, join_seq, join_event_id) "
				   "VALUES ($5, $1, $2, $3, $4) RETURNING membership_period_id",
				   5, INT8OID, INT8OID, INT8OID, INT8OID, INT8OID);
		args[0] = Int64GetDatum(conversation_id);
		args[1] = Int64GetDatum(user_id);
		args[2] = Int64GetDatum(join_seq);
		args[3] = Int64GetDatum(message_id);
		args[4] = Int64GetDatum(placed_period_id(conversation_id));
		im_exec(ins_period, args, NULL, 0);
		period_id = im_get_int64(0, 1, NULL);

		/* a group everyone had left: the joiner owns it (contract §17) */
		im_roles_after_join(&conv, user_id, period_id);

		im_lock_user_heads(&user_id, 1);
		ensure_user_conversations(conversation_id, im_int8_array(&user_id, 1));
		created = true;

		/* im_sync.shared_log_min_members: large groups switch on join */
		maybe_switch_to_shared_log_on_join(&conv);
	}
	SPI_finish();

	values[0] = Int64GetDatum(period_id);
	values[1] = Int64GetDatum(join_seq);
	values[2] = BoolGetDatum(created);
	im_srf_row(fcinfo, values, nulls);
	return (Datum) 0;
}

/* im.leave_conversation(conversation_id, user_id) -> (membership_period_id, leave_seq) */
PG_FUNCTION_INFO_V1(im_leave_conversation);
Datum
im_leave_conversation(PG_FUNCTION_ARGS)
{
	int64		conversation_id = im_arg_id(fcinfo, 0, "conversation_id");
	int64		user_id = im_arg_user_id(fcinfo, 1, "user_id");
	ImConversation conv;
	int64		period_id;
	int64		join_seq;
	int64		leave_seq;
	int64		message_id;
	int64		msg_seq;
	bool		owner;
	Datum		values[2];
	bool		nulls[2] = {false, false};

	im_srf_begin(fcinfo);
	im_spi_connect();
	im_lock_conversation(conversation_id, &conv);
	reject_direct(&conv, "leave");
	if (!open_period(conversation_id, user_id, &period_id, &join_seq, &owner))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("user " INT64_FORMAT " is not a member of conversation " INT64_FORMAT,
						user_id, conversation_id)));

	/* The period ends at the last position committed before the leave. */
	leave_seq = conv.head_msg_seq;
	append_membership_event(&conv, "leave", user_id, &message_id, &msg_seq);
	im_close_period(period_id, leave_seq, message_id);
	/* an owner's leave names its successor right after it (contract §17) */
	im_roles_after_leave(&conv, user_id, owner);
	SPI_finish();

	values[0] = Int64GetDatum(period_id);
	values[1] = Int64GetDatum(leave_seq);
	im_srf_row(fcinfo, values, nulls);
	return (Datum) 0;
}

/*
 * im.conversation_list(user_id, page_limit DEFAULT 100, after_conversation_id
 * DEFAULT NULL): every conversation the user has or had a period in, by id.
 */
PG_FUNCTION_INFO_V1(im_conversation_list);
/*
 * The page statement; tail: the columns after head_msg_seq (contract §17:
 * head_stale, false on a node, my_role, muted_until; none on an older
 * catalog).
 */
#define CONVERSATION_LIST_SQL(tail) \
	"SELECT c.conversation_id, c.kind, c.mode, uc.last_msg_seq, uc.read_msg_seq, " \
	"       uc.unread_count, uc.dirty_target_msg_seq, uc.dirty_version, c.head_msg_seq" tail " " \
	"FROM im.user_conversation uc " \
	"JOIN im.conversation c ON c.conversation_id" EQ "uc.conversation_id " \
	"WHERE uc.user_id" EQ "$1 " \
	"  AND uc.conversation_id" GT "$2 " \
	"  AND EXISTS (SELECT 1 FROM im.membership_period p " \
	"              WHERE p.user_id" EQ "$1 " \
	"                AND p.conversation_id" EQ "uc.conversation_id) " \
	"ORDER BY uc.conversation_id LIMIT $3"
Datum
im_conversation_list(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr plans[2];
	int64		user_id = im_arg_user_id(fcinfo, 0, "user_id");
	int32		page_limit = im_arg_int32(fcinfo, 1, "page_limit", 1, 1000);
	int64		after = PG_ARGISNULL(2) ? 0 : PG_GETARG_INT64(2);
	bool		roles;
	Datum		args[3];

	im_srf_begin(fcinfo);
	im_spi_connect();
	im_user_check_standing(user_id);	/* IS403 for a suspended account (contract §17) */
	roles = IM_CATALOG_HAS_ROLES();
	im_prepare(&plans[roles],
			   roles ?
			   CONVERSATION_LIST_SQL(", false, "
									 IM_MY_ROLE_SQL("c.kind", "$1", "uc.conversation_id") ", "
									 IM_MY_MUTED_UNTIL_SQL("$1", "uc.conversation_id")) :
			   CONVERSATION_LIST_SQL(""),
			   3, INT8OID, INT8OID, INT4OID);
	args[0] = Int64GetDatum(user_id);
	args[1] = Int64GetDatum(after);
	args[2] = Int32GetDatum(page_limit);
	im_exec(plans[roles], args, NULL, 0);
	im_srf_rows_from_spi(fcinfo, roles ? 12 : 9);
	SPI_finish();
	return (Datum) 0;
}

/*
 * im.conversation_members(conversation_id) -> (user_id, membership_period_id, join_seq)
 * The active members (open periods), for the gateway's CONVERSATION_ADVANCED
 * hints of shared_log groups, so no caller needs table privileges
 * (contract §12).  Unknown conversation: P0002.
 */
PG_FUNCTION_INFO_V1(im_conversation_members);
Datum
im_conversation_members(PG_FUNCTION_ARGS)
{
	int64		conversation_id = im_arg_id(fcinfo, 0, "conversation_id");
	static SPIPlanPtr plan;
	Datum		args[1];

	im_srf_begin(fcinfo);
	im_spi_connect();
	im_require_conversation(conversation_id, NULL);
	args[0] = Int64GetDatum(conversation_id);
	im_prepare(&plan,
			   "SELECT user_id, membership_period_id, join_seq FROM im.membership_period "
			   "WHERE conversation_id" EQ "$1 AND leave_seq IS NULL "
			   "ORDER BY user_id",
			   1, INT8OID);
	im_exec(plan, args, NULL, 0);
	im_srf_rows_from_spi(fcinfo, 3);
	SPI_finish();
	return (Datum) 0;
}
