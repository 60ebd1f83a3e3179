/*
 * roles.c — roles, mutes, removals and bans in groups (contract §17,
 * design §4.2): im.set_member_role, im.mute_member, im.remove_member,
 * im.unban_member, the owner's successor when the owner leaves, and the
 * mute check every write of a member makes.
 *
 * Where the state lives (extension/doc/decisions.md): a member's role and
 * muted_until are columns of its open membership period, so the period a
 * send already finds under the conversation lock carries them (the direct
 * path reads muted_until from the row its period probe fetched, no extra
 * read); a re-join opens a new period, which starts as a plain member.
 * Bans outlive the period and are rows of im.conversation_ban.
 *
 * Invariants protected here:
 *   - a role change, a mute and a removal are positions at the next msg_seq,
 *     appended under the conversation row lock together with the period
 *     update they stand for, so they are ordered with every send by the
 *     single writer alone (a send after a mute in that order is refused,
 *     one before it is not);
 *   - a group with active members has one owner among them: a handover
 *     changes both periods in one `role` position, an owner's leave names
 *     the successor in the `role` position right after it, and the first
 *     to join a group everyone had left becomes its owner likewise;
 *   - the check order of contract §17: arguments 22023, unknown
 *     conversation P0002 (a direct one 22023), idempotent replay (the
 *     original, or IS409), the actor muted or not in good standing IS403,
 *     the actor's role or active period 42501, the target's active period
 *     P0002, then what the actor's role allows over the target's (42501);
 *   - a mute ends by itself: every check compares muted_until with the
 *     transaction's now(), nothing has to fire.
 */
#include "core/im_sync.h"
#include "core/audit.h"
#include "core/common.h"
#include "core/locks.h"
#include "core/shmem.h"
#include "core/standing.h"
#include "core/version_check.h"
#include "core/im_sql.h"
#include "conversation/conversation.h"

#include "catalog/pg_type.h"
#include "lib/stringinfo.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#define IM_MAX_CLIENT_MSG_ID 128

/* The roles of a group's members, in rank order. */
typedef enum MemberRole
{
	ROLE_NONE,					/* no active period */
	ROLE_MEMBER,
	ROLE_ADMIN,
	ROLE_OWNER
} MemberRole;

static MemberRole
role_from_text(const char *s)
{
	if (s == NULL || strcmp(s, "member") == 0)
		return ROLE_MEMBER;
	if (strcmp(s, "admin") == 0)
		return ROLE_ADMIN;
	if (strcmp(s, "owner") == 0)
		return ROLE_OWNER;
	return ROLE_NONE;
}

/* IS403 "member muted" (contract §17). */
static void
raise_muted(int64 user_id, int64 conversation_id)
{
	ereport(ERROR,
			(errcode(ERRCODE_IM_FORBIDDEN),
			 errmsg("member muted"),
			 errdetail("User " INT64_FORMAT " is muted in conversation " INT64_FORMAT
					   " and cannot write there until the mute ends.",
					   user_id, conversation_id)));
}

void
im_roles_check_muted(TimestampTz muted_until, bool isnull, int64 user_id, int64 conversation_id)
{
	if (!isnull && muted_until > GetCurrentTransactionStartTimestamp())
		raise_muted(user_id, conversation_id);
}

void
im_roles_require_not_muted(int64 conversation_id, int64 user_id)
{
	static SPIPlanPtr plan;
	Datum		args[2];

	if (!IM_CATALOG_HAS_ROLES())
		return;
	im_prepare(&plan,
			   "SELECT 1 FROM im.membership_period WHERE conversation_id" EQ "$1 "
			   "AND user_id" EQ "$2 AND leave_seq IS NULL "
			   "AND muted_until" GT "pg_catalog.now()",
			   2, INT8OID, INT8OID);
	args[0] = Int64GetDatum(conversation_id);
	args[1] = Int64GetDatum(user_id);
	if (im_exec(plan, args, NULL, 0) > 0)
		raise_muted(user_id, conversation_id);
}

/* One request of set_member_role, mute_member or remove_member. */
typedef struct ModRequest
{
	const char *kind;			/* role | mute | remove: the digest's kind */
	int64		actor_id;
	int64		conversation_id;
	int64		user_id;
	char	   *client_msg_id;
	char		detail[64];		/* the request's own argument, for the digest */
	bytea	   *digest;
	ImConversation conv;
	MemberRole	actor_role;
	MemberRole	target_role;
	int64		target_period_id;
	int64		actor_period_id;
	int64		message_id;
	int64		msg_seq;
	bool		created;
} ModRequest;

/* An active member's period: id, role, whether muted now.  False: none. */
static bool
active_period(int64 conversation_id, int64 user_id, int64 *period_id, MemberRole *role, bool *muted)
{
	static SPIPlanPtr plan;
	Datum		args[2];

	im_prepare(&plan,
			   "SELECT membership_period_id, role, COALESCE(muted_until" GT "pg_catalog.now(), false) "
			   "FROM im.membership_period WHERE conversation_id" EQ "$1 "
			   "AND user_id" EQ "$2 AND leave_seq IS NULL",
			   2, INT8OID, INT8OID);
	args[0] = Int64GetDatum(conversation_id);
	args[1] = Int64GetDatum(user_id);
	if (im_exec(plan, args, NULL, 0) == 0)
		return false;
	*period_id = im_get_int64(0, 1, NULL);
	*role = role_from_text(im_get_text(0, 2));
	*muted = im_get_bool(0, 3, NULL);
	return true;
}

static void
require_catalog(void)
{
	if (!IM_CATALOG_HAS_ROLES())
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("roles need the im_sync catalog of this library"),
				 errhint("Run ALTER EXTENSION im_sync UPDATE.")));
}

/* The group (else 22023) of a locked conversation. */
static void
require_group(const ImConversation *conv)
{
	if (strcmp(conv->kind, "group") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("direct conversation " INT64_FORMAT " has no roles", conv->conversation_id),
				 errdetail("Roles, mutes, removals and bans exist in group conversations only.")));
}

/*
 * The actor's checks in contract §17's order after the lock: muted or not
 * in good standing IS403, no active period 42501, a role below `least`
 * 42501.
 */
static void
check_actor(int64 conversation_id, int64 actor_id, MemberRole least, const char *what,
			int64 *period_id, MemberRole *role)
{
	bool		muted = false;
	bool		found;

	im_user_check_standing(actor_id);	/* a suspended actor: IS403 before any role check */
	found = active_period(conversation_id, actor_id, period_id, role, &muted);
	if (found && muted)
		raise_muted(actor_id, conversation_id);
	if (!found)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("user " INT64_FORMAT " is not a member of conversation " INT64_FORMAT,
						actor_id, conversation_id)));
	if (*role < least)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("user " INT64_FORMAT " may not %s in conversation " INT64_FORMAT,
						actor_id, what, conversation_id),
				 errdetail("Only the owner%s may %s.", least == ROLE_OWNER ? "" : " and admins", what)));
}

/*
 * The prologue of set_member_role, mute_member and remove_member: lock,
 * replay, the actor's checks, the target's period.  False: the answer is
 * the original's (a replay).  Inside SPI from here on.
 */
static bool
begin_moderation(FunctionCallInfo fcinfo, ModRequest *rq, MemberRole least, const char *what)
{
	bool		muted;

	im_srf_begin(fcinfo);
	im_spi_connect();
	require_catalog();
	im_lock_conversation(rq->conversation_id, &rq->conv);
	require_group(&rq->conv);
	if (im_request_lookup(rq->kind, rq->actor_id, rq->conversation_id, rq->client_msg_id,
						  rq->user_id, rq->detail, "", &rq->digest,
						  &rq->message_id, &rq->msg_seq))
	{
		im_counter_add(IM_COUNTER_IDEMPOTENT_RETRIES, 1);
		return false;
	}
	check_actor(rq->conversation_id, rq->actor_id, least, what, &rq->actor_period_id, &rq->actor_role);
	if (!active_period(rq->conversation_id, rq->user_id, &rq->target_period_id,
					   &rq->target_role, &muted))
		ereport(ERROR,
				(errcode(ERRCODE_NO_DATA_FOUND),
				 errmsg("user " INT64_FORMAT " is not a member of conversation " INT64_FORMAT,
						rq->user_id, rq->conversation_id)));
	return true;
}

/* Admins act on members only; the owner on anyone (contract §17). */
static void
require_outranks(const ModRequest *rq, const char *what)
{
	if (rq->actor_role != ROLE_OWNER && rq->target_role != ROLE_MEMBER)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("user " INT64_FORMAT " may not %s user " INT64_FORMAT " in conversation " INT64_FORMAT,
						rq->actor_id, what, rq->user_id, rq->conversation_id),
				 errdetail("Admins may %s members only; the owner may %s anyone.", what, what)));
}

/*
 * Append the request's position (kind, body; removal: a leave), keyed in
 * the actor's client_msg_id namespace.  A concurrent duplicate key answers
 * with the original.  True when written.
 */
static bool
append_moderation(ModRequest *rq, const char *kind, const char *body)
{
	ImNewEvent	ev;

	memset(&ev, 0, sizeof(ev));
	ev.kind = kind;
	ev.sender_id = rq->actor_id;
	ev.client_msg_id = rq->client_msg_id;
	ev.request_digest = rq->digest;
	ev.body = im_jsonb_from_cstring(body);
	ev.subject_user_id = rq->user_id;
	if (im_append_event(&rq->conv, &ev, &rq->message_id, &rq->msg_seq))
	{
		rq->created = true;
		return true;
	}
	if (!im_request_existing(rq->actor_id, rq->client_msg_id, rq->digest,
							 &rq->message_id, &rq->msg_seq))
		elog(ERROR, "im_sync: idempotency key conflict but no row for client_msg_id \"%s\"",
			 rq->client_msg_id);
	im_counter_add(IM_COUNTER_IDEMPOTENT_RETRIES, 1);
	return false;
}

/* One audit row of a moderation action (conventions: extension/doc/security.md). */
static void
audit_action(const char *action, int64 actor_id, int64 user_id, int64 conversation_id,
			 int64 message_id, const char *extra)
{
	StringInfoData d;

	initStringInfo(&d);
	appendStringInfo(&d, "{\"moderator\": \"" INT64_FORMAT "\", \"conversation_id\": " INT64_FORMAT,
					 actor_id, conversation_id);
	if (message_id != 0)
		appendStringInfo(&d, ", \"message_id\": " INT64_FORMAT, message_id);
	if (extra != NULL)
		appendStringInfo(&d, ", %s", extra);
	appendStringInfoChar(&d, '}');
	im_audit_device(action, user_id, NULL, d.data);
}

static void
set_period_role(int64 period_id, const char *role)
{
	static SPIPlanPtr plan;
	Datum		args[2];

	im_prepare(&plan,
			   "UPDATE im.membership_period SET role = $2 WHERE membership_period_id" EQ "$1",
			   2, INT8OID, TEXTOID);
	args[0] = Int64GetDatum(period_id);
	args[1] = CStringGetTextDatum(role);
	if (im_exec(plan, args, NULL, 0) != 1)
		elog(ERROR, "im_sync: period " INT64_FORMAT " vanished under the conversation lock", period_id);
}

/* The (message_id, msg_seq, created) row; leaves SPI. */
static Datum
answer(FunctionCallInfo fcinfo, ModRequest *rq)
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

/* Arguments every request names: actor, conversation, target, key. */
static void
common_args(FunctionCallInfo fcinfo, ModRequest *rq, const char *kind, int key_argno)
{
	memset(rq, 0, sizeof(*rq));
	rq->kind = kind;
	rq->actor_id = im_arg_user_id(fcinfo, 0, "actor_id");
	rq->conversation_id = im_arg_id(fcinfo, 1, "conversation_id");
	rq->user_id = im_arg_user_id(fcinfo, 2, "user_id");
	rq->client_msg_id = im_arg_text(fcinfo, key_argno, "client_msg_id", IM_MAX_CLIENT_MSG_ID);
	if (rq->actor_id == rq->user_id)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("actor_id and user_id must differ"),
				 errdetail("A member acts on another member; the owner hands over ownership by making another member owner, and a member leaves with leave_conversation.")));
}

/*
 * im.set_member_role(actor_id, conversation_id, user_id, role, client_msg_id)
 * The owner sets admin or member, or makes another member owner: one `role`
 * position names both changes, the previous owner becoming an admin.
 */
PG_FUNCTION_INFO_V1(im_set_member_role);
Datum
im_set_member_role(PG_FUNCTION_ARGS)
{
	ModRequest	rq;
	char	   *role;
	char		body[256];

	common_args(fcinfo, &rq, "role", 4);
	role = im_arg_text(fcinfo, 3, "role", 16);
	if (role_from_text(role) == ROLE_NONE)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("role must be 'owner', 'admin' or 'member', got \"%s\"", role)));
	strlcpy(rq.detail, role, sizeof(rq.detail));
	if (!begin_moderation(fcinfo, &rq, ROLE_OWNER, "set roles"))
		return answer(fcinfo, &rq);

	if (strcmp(role, "owner") == 0)
		snprintf(body, sizeof(body),
				 "{\"user_id\": " INT64_FORMAT ", \"role\": \"owner\", \"previous_owner\": " INT64_FORMAT
				 ", \"previous_owner_role\": \"admin\"}", rq.user_id, rq.actor_id);
	else
		snprintf(body, sizeof(body), "{\"user_id\": " INT64_FORMAT ", \"role\": \"%s\"}",
				 rq.user_id, role);
	if (append_moderation(&rq, "role", body))
	{
		set_period_role(rq.target_period_id, role);
		if (strcmp(role, "owner") == 0)
			set_period_role(rq.actor_period_id, "admin");
		snprintf(body, sizeof(body), "\"role\": \"%s\"", role);
		audit_action("set_role", rq.actor_id, rq.user_id, rq.conversation_id, rq.message_id, body);
	}
	return answer(fcinfo, &rq);
}

/*
 * im.mute_member(actor_id, conversation_id, user_id, muted_until, client_msg_id)
 * NULL or a time not in the future unmutes.  The `mute` position carries
 * the mute in force after it ({"user_id", "muted_until"}, null: none).
 */
PG_FUNCTION_INFO_V1(im_mute_member);
Datum
im_mute_member(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr plan;
	ModRequest	rq;
	TimestampTz until = 0;
	bool		unmute;
	Datum		args[2];
	char		nulls[2] = {' ', ' '};
	char		body[256];
	char	   *shown;

	common_args(fcinfo, &rq, "mute", 4);
	unmute = PG_ARGISNULL(3);
	if (!unmute)
	{
		until = PG_GETARG_TIMESTAMPTZ(3);
		if (TIMESTAMP_NOT_FINITE(until) && until < 0)
			unmute = true;
	}
	/* the digest names the instant, whatever the session's TimeZone */
	if (unmute)
		strlcpy(rq.detail, "none", sizeof(rq.detail));
	else
		snprintf(rq.detail, sizeof(rq.detail), INT64_FORMAT, (int64) until);
	if (!begin_moderation(fcinfo, &rq, ROLE_ADMIN, "mute members"))
		return answer(fcinfo, &rq);
	require_outranks(&rq, "mute");

	if (!unmute && until <= GetCurrentTransactionStartTimestamp())
		unmute = true;
	/* the body's time as PostgreSQL prints timestamptz in JSON (to_jsonb) */
	shown = "null";
	if (!unmute)
	{
		static SPIPlanPtr fmt;
		Datum		a[1];

		im_prepare(&fmt, "SELECT pg_catalog.to_jsonb($1)::pg_catalog.text", 1, TIMESTAMPTZOID);
		a[0] = TimestampTzGetDatum(until);
		im_exec(fmt, a, NULL, 0);
		shown = im_get_text(0, 1);
	}
	snprintf(body, sizeof(body), "{\"user_id\": " INT64_FORMAT ", \"muted_until\": %s}",
			 rq.user_id, shown);
	if (append_moderation(&rq, "mute", body))
	{
		im_prepare(&plan,
				   "UPDATE im.membership_period SET muted_until = $2 WHERE membership_period_id" EQ "$1",
				   2, INT8OID, TIMESTAMPTZOID);
		args[0] = Int64GetDatum(rq.target_period_id);
		args[1] = TimestampTzGetDatum(until);
		if (unmute)
			nulls[1] = 'n';
		im_exec(plan, args, nulls, 0);
		snprintf(body, sizeof(body), "\"muted_until\": %s", shown);
		audit_action("mute", rq.actor_id, rq.user_id, rq.conversation_id, rq.message_id, body);
	}
	return answer(fcinfo, &rq);
}

/*
 * im.remove_member(actor_id, conversation_id, user_id, ban, client_msg_id)
 * A leave position with {"user_id", "removed_by", "banned"}: the period
 * closes at the last position before it, exactly as for a leave, and a ban
 * keeps the user out until unban_member.
 */
PG_FUNCTION_INFO_V1(im_remove_member);
Datum
im_remove_member(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr ban_plan;
	ModRequest	rq;
	bool		ban;
	int64		leave_seq;
	Datum		args[4];
	char		body[256];

	common_args(fcinfo, &rq, "remove", 4);
	if (PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ban must not be NULL")));
	ban = PG_GETARG_BOOL(3);
	strlcpy(rq.detail, ban ? "ban" : "no ban", sizeof(rq.detail));
	if (!begin_moderation(fcinfo, &rq, ROLE_ADMIN, "remove members"))
		return answer(fcinfo, &rq);
	require_outranks(&rq, "remove");

	leave_seq = rq.conv.head_msg_seq;
	snprintf(body, sizeof(body),
			 "{\"user_id\": " INT64_FORMAT ", \"removed_by\": " INT64_FORMAT ", \"banned\": %s}",
			 rq.user_id, rq.actor_id, ban ? "true" : "false");
	if (append_moderation(&rq, "leave", body))
	{
		im_close_period(rq.target_period_id, leave_seq, rq.message_id);
		if (ban)
		{
			im_prepare(&ban_plan,
					   "INSERT INTO im.conversation_ban (conversation_id, user_id, banned_by, removal_event_id) "
					   "VALUES ($1, $2, $3, $4) ON CONFLICT (conversation_id, user_id) DO UPDATE "
					   "SET banned_by = EXCLUDED.banned_by, removal_event_id = EXCLUDED.removal_event_id, "
					   "    banned_at = EXCLUDED.banned_at",
					   4, INT8OID, INT8OID, INT8OID, INT8OID);
			args[0] = Int64GetDatum(rq.conversation_id);
			args[1] = Int64GetDatum(rq.user_id);
			args[2] = Int64GetDatum(rq.actor_id);
			args[3] = Int64GetDatum(rq.message_id);
			im_exec(ban_plan, args, NULL, 0);
		}
		audit_action("remove", rq.actor_id, rq.user_id, rq.conversation_id, rq.message_id,
					 ban ? "\"banned\": true" : "\"banned\": false");
	}
	return answer(fcinfo, &rq);
}

/*
 * im.unban_member(actor_id, conversation_id, user_id) -> (unbanned)
 * The owner or an admin lifts a ban; true when there was one.  No position:
 * a ban is not part of what members see, only of who may join.
 */
PG_FUNCTION_INFO_V1(im_unban_member);
Datum
im_unban_member(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr plan;
	int64		actor_id = im_arg_user_id(fcinfo, 0, "actor_id");
	int64		conversation_id = im_arg_id(fcinfo, 1, "conversation_id");
	int64		user_id = im_arg_user_id(fcinfo, 2, "user_id");
	ImConversation conv;
	int64		period_id;
	MemberRole	role;
	bool		unbanned;
	Datum		args[2];
	Datum		values[1];
	bool		nulls[1] = {false};

	im_srf_begin(fcinfo);
	im_spi_connect();
	require_catalog();
	im_lock_conversation(conversation_id, &conv);
	require_group(&conv);
	check_actor(conversation_id, actor_id, ROLE_ADMIN, "unban users", &period_id, &role);
	im_prepare(&plan,
			   "DELETE FROM im.conversation_ban WHERE conversation_id" EQ "$1 AND user_id" EQ "$2",
			   2, INT8OID, INT8OID);
	args[0] = Int64GetDatum(conversation_id);
	args[1] = Int64GetDatum(user_id);
	unbanned = im_exec(plan, args, NULL, 0) > 0;
	if (unbanned)
		audit_action("unban", actor_id, user_id, conversation_id, 0, NULL);
	SPI_finish();
	values[0] = BoolGetDatum(unbanned);
	im_srf_row(fcinfo, values, nulls);
	return (Datum) 0;
}

/*
 * im.shard_member_roles(user_id, conversation_ids) -> (conversation_id,
 * my_role, muted_until): the user's role and mute in force in the listed
 * conversations this node holds, from their periods (what the router's
 * conversation_list takes from each conversation's node).
 */
PG_FUNCTION_INFO_V1(im_shard_member_roles);
Datum
im_shard_member_roles(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr plan;
	int64		user_id = im_arg_user_id(fcinfo, 0, "user_id");
	Datum		args[2];

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("conversation_ids must not be NULL")));
	im_srf_begin(fcinfo);
	im_spi_connect();
	im_prepare(&plan,
			   "SELECT c.conversation_id, "
			   IM_MY_ROLE_SQL("c.kind", "$1", "c.conversation_id") ", "
			   IM_MY_MUTED_UNTIL_SQL("$1", "c.conversation_id") " "
			   "FROM im.conversation c WHERE c.conversation_id" EQ "ANY ($2) "
			   "ORDER BY c.conversation_id",
			   2, INT8OID, INT8ARRAYOID);
	args[0] = Int64GetDatum(user_id);
	args[1] = PG_GETARG_DATUM(1);
	im_exec(plan, args, NULL, 0);
	im_srf_rows_from_spi(fcinfo, 3);
	SPI_finish();
	return (Datum) 0;
}

/* ---- membership hooks (conversation.c, under the conversation lock) -- */

void
im_roles_require_not_banned(int64 conversation_id, int64 user_id)
{
	static SPIPlanPtr plan;
	Datum		args[2];

	if (!IM_CATALOG_HAS_ROLES())
		return;
	im_prepare(&plan,
			   "SELECT 1 FROM im.conversation_ban WHERE conversation_id" EQ "$1 AND user_id" EQ "$2",
			   2, INT8OID, INT8OID);
	args[0] = Int64GetDatum(conversation_id);
	args[1] = Int64GetDatum(user_id);
	if (im_exec(plan, args, NULL, 0) > 0)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("user " INT64_FORMAT " is banned from conversation " INT64_FORMAT,
						user_id, conversation_id),
				 errhint("An owner or admin can lift the ban with unban_member.")));
}

void
im_roles_set_owner(int64 conversation_id, int64 user_id)
{
	static SPIPlanPtr plan;
	Datum		args[2];

	if (!IM_CATALOG_HAS_ROLES())
		return;
	im_prepare(&plan,
			   "UPDATE im.membership_period SET role = 'owner' WHERE conversation_id" EQ "$1 "
			   "AND user_id" EQ "$2 AND leave_seq IS NULL",
			   2, INT8OID, INT8OID);
	args[0] = Int64GetDatum(conversation_id);
	args[1] = Int64GetDatum(user_id);
	im_exec(plan, args, NULL, 0);
}

/* A system `role` position naming user_id owner ({"user_id","role":"owner"[,"previous_owner"]}). */
static void
append_owner_position(ImConversation *conv, int64 user_id, int64 previous_owner)
{
	ImNewEvent	ev;
	char		body[160];
	int64		message_id;
	int64		msg_seq;

	memset(&ev, 0, sizeof(ev));
	ev.kind = "role";
	if (previous_owner != 0)
		snprintf(body, sizeof(body),
				 "{\"user_id\": " INT64_FORMAT ", \"role\": \"owner\", \"previous_owner\": " INT64_FORMAT "}",
				 user_id, previous_owner);
	else
		snprintf(body, sizeof(body), "{\"user_id\": " INT64_FORMAT ", \"role\": \"owner\"}", user_id);
	ev.body = im_jsonb_from_cstring(body);
	ev.subject_user_id = user_id;
	if (!im_append_event(conv, &ev, &message_id, &msg_seq))
		elog(ERROR, "im_sync: role event was not appended");
}

/*
 * user_id just joined at a join position (its period period_id): a group
 * with no owner among its active members (everyone had left) gets the
 * joiner as owner, in a `role` position right after the join.
 */
void
im_roles_after_join(ImConversation *conv, int64 user_id, int64 period_id)
{
	static SPIPlanPtr plan;
	Datum		args[1];

	if (!IM_CATALOG_HAS_ROLES())
		return;
	im_prepare(&plan,
			   "SELECT 1 FROM im.membership_period WHERE conversation_id" EQ "$1 "
			   "AND leave_seq IS NULL AND role" EQ "'owner'",
			   1, INT8OID);
	args[0] = Int64GetDatum(conv->conversation_id);
	if (im_exec(plan, args, NULL, 1) > 0)
		return;
	append_owner_position(conv, user_id, 0);
	set_period_role(period_id, "owner");
}

/*
 * The owner (leaver_id) just left at a leave position: the longest-serving
 * admin, else the longest-serving member (lowest join_seq, then period id)
 * becomes owner in a `role` position right after it.  No one left: none.
 */
void
im_roles_after_leave(ImConversation *conv, int64 leaver_id, bool was_owner)
{
	static SPIPlanPtr plan;
	Datum		args[1];
	int64		successor;
	int64		period_id;

	if (!was_owner || !IM_CATALOG_HAS_ROLES())
		return;
	im_prepare(&plan,
			   "SELECT user_id, membership_period_id FROM im.membership_period "
			   "WHERE conversation_id" EQ "$1 AND leave_seq IS NULL "
			   "ORDER BY (role" EQ "'admin') DESC, join_seq, membership_period_id LIMIT 1",
			   1, INT8OID);
	args[0] = Int64GetDatum(conv->conversation_id);
	if (im_exec(plan, args, NULL, 0) == 0)
		return;
	successor = im_get_int64(0, 1, NULL);
	period_id = im_get_int64(0, 2, NULL);
	append_owner_position(conv, successor, leaver_id);
	set_period_role(period_id, "owner");
}
