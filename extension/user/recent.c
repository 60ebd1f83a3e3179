/*
 * recent.c — a user's conversations by recency and the user's conversation
 * pins (contract §20): im.recent_conversations and im.pin_conversation.
 *
 * Invariants protected here:
 *   - a page is one backward range scan of user_conversation_recent_idx
 *     (user_id, conversation_pinned_at, last_activity_at, -conversation_id)
 *     from the cursor on, never a sort of all the user's conversations: the
 *     sort key has no NULLs ('-infinity' stands for "not pinned" and "no
 *     message"), so the keyset condition is one row comparison the index
 *     answers;
 *   - the cursor is exactly the last row's key: a conversation whose key
 *     does not change while a client pages is on exactly one page;
 *   - a pin changes the user's state row under the user's head lock (lock
 *     order of contract §4) together with its conversation_pin private
 *     event; a pin that changes nothing writes nothing;
 *   - at most IM_MAX_PINNED pinned conversations per user, at every
 *     isolation level: the count is taken under the head lock and in the
 *     latest snapshot (pinned_count).
 */
#include "core/im_sync.h"
#include "core/common.h"
#include "core/locks.h"
#include "core/shard_map.h"
#include "core/shmem.h"
#include "core/im_sql.h"
#include "core/version_check.h"
#include "conversation/conversation.h"
#include "core/standing.h"
#include "user/user.h"

#include "catalog/pg_type.h"
#include "utils/snapmgr.h"
#include "common/base64.h"
#include "port/pg_bswap.h"
#include "utils/builtins.h"

/* Pinned conversations a user may have at once (22023 beyond). */
#define IM_MAX_PINNED 100

/* The raw key of a row: pinned_at, last_activity_at, conversation_id. */
#define IM_CURSOR_BYTES 24

/* Result columns of the page statement after the 15 output columns (the
 * 15th, next_cursor, is made here). */
enum
{
	Anum_recent_pinned_at = 16,
	Anum_recent_activity_at,
	Anum_recent_conversation_id
};

#define RECENT_COLUMNS 15

static char *
encode_cursor(int64 pinned_at, int64 activity_at, int64 conversation_id)
{
	uint64		raw[3];
	char	   *out;
	int			len;

	raw[0] = pg_hton64((uint64) pinned_at);
	raw[1] = pg_hton64((uint64) activity_at);
	raw[2] = pg_hton64((uint64) conversation_id);
	out = palloc(pg_b64_enc_len(IM_CURSOR_BYTES) + 1);
	len = pg_b64_encode((const char *) raw, IM_CURSOR_BYTES, out, pg_b64_enc_len(IM_CURSOR_BYTES));
	if (len < 0)
		elog(ERROR, "im_sync: could not encode a cursor");
	out[len] = '\0';
	return out;
}

/* a key bound: '-infinity' or a finite timestamp */
static bool
timestamp_bound_valid(int64 t)
{
	return t == DT_NOBEGIN || IS_VALID_TIMESTAMP(t);
}

static void
decode_cursor(const char *text, int64 *pinned_at, int64 *activity_at, int64 *conversation_id)
{
	uint64		raw[4];
	int			tlen = (int) strlen(text);
	int			len = -1;

	if (tlen > 0 && tlen <= 64)
		len = pg_b64_decode(text, tlen, (char *) raw, sizeof(raw));
	if (len == IM_CURSOR_BYTES)
	{
		*pinned_at = (int64) pg_ntoh64(raw[0]);
		*activity_at = (int64) pg_ntoh64(raw[1]);
		*conversation_id = (int64) pg_ntoh64(raw[2]);
		if (timestamp_bound_valid(*pinned_at) && timestamp_bound_valid(*activity_at)
			&& *conversation_id >= 1)
			return;
	}
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("after_cursor is not a cursor of recent_conversations"),
			 errdetail("Pass the next_cursor of a previous page unchanged, or NULL for the first page.")));
}

/*
 * The page statement; role_cols: my_role and muted_until (contract §17),
 * constants on a catalog without roles.
 */
#define RECENT_ROLE_COLS \
	IM_MY_ROLE_SQL("c.kind", "$1", "uc.conversation_id") ", " \
	IM_MY_MUTED_UNTIL_SQL("$1", "uc.conversation_id")
#define RECENT_NO_ROLE_COLS \
	"CASE WHEN c.kind" EQ "'direct' THEN NULL ELSE 'member' END, NULL::pg_catalog.timestamptz"
#define RECENT_SQL(role_cols) \
	"SELECT c.conversation_id, c.kind, c.mode, uc.last_msg_seq, uc.read_msg_seq, " \
	"       uc.unread_count, uc.dirty_target_msg_seq, uc.dirty_version, c.head_msg_seq, " \
	"       NULLIF(uc.last_activity_at, '-infinity'::pg_catalog.timestamptz), " \
	"       uc.conversation_pinned_at" GT "'-infinity'::pg_catalog.timestamptz, " \
	"       m.gone, " \
	role_cols ", NULL::pg_catalog.text, " \
	"       uc.conversation_pinned_at, uc.last_activity_at, uc.conversation_id " \
	"FROM im.user_conversation uc " \
	"JOIN im.conversation c ON c.conversation_id" EQ "uc.conversation_id " \
	/* \
	 * per row, not a (hashed) subplan over all the user's periods: \
	 * NULL for no period (not listed), true when none is open (left) \
	 */ \
	"CROSS JOIN LATERAL (SELECT pg_catalog.bool_and(p.leave_seq IS NOT NULL) AS gone " \
	"                    FROM im.membership_period p " \
	"                    WHERE p.user_id" EQ "$1 AND p.conversation_id" EQ "uc.conversation_id) m " \
	"WHERE uc.user_id" EQ "$1 " \
	"  AND (uc.conversation_pinned_at, uc.last_activity_at, (" MINUS "uc.conversation_id))" \
	LT "($2, $3, $4) " \
	"  AND m.gone IS NOT NULL " \
	"ORDER BY uc.conversation_pinned_at DESC, uc.last_activity_at DESC, " \
	"         (" MINUS "uc.conversation_id) DESC " \
	"LIMIT $5"

PG_FUNCTION_INFO_V1(im_recent_conversations);
/*
 * recent_conversations(user_id, page_limit DEFAULT 50, after_cursor DEFAULT
 * NULL): every conversation the user has or had a period in, pinned ones
 * first (latest pin first), then by last_activity_at newest first, ties by
 * conversation_id ascending.  Each row's next_cursor is its own key (the
 * page after it); on the last page the last row's is NULL.  my_role is
 * the role of the open period in a group (NULL in direct conversations and
 * once left), muted_until the mute in force now (contract §17).
 */
Datum
im_recent_conversations(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr plans[2];
	SPIPlanPtr	plan;
	bool		roles;
	int64		user_id = im_arg_user_id(fcinfo, 0, "user_id");
	int32		page_limit = im_arg_int32(fcinfo, 1, "page_limit", 1, 1000);
	int64		pinned_at = DT_NOEND;
	int64		activity_at = DT_NOEND;
	int64		neg_bound = PG_INT64_MAX;	/* -conversation_id of the key */
	Datum		args[5];
	uint64		n;

	/* no cursor: the bound (infinity, infinity, max) is above every key */
	if (!PG_ARGISNULL(2))
	{
		int64		cid;

		decode_cursor(text_to_cstring(PG_GETARG_TEXT_PP(2)), &pinned_at, &activity_at, &cid);
		neg_bound = -cid;
	}

	im_srf_begin(fcinfo);
	im_spi_connect();
	im_user_check_standing(user_id);	/* IS403 for a suspended account (contract §17) */
	/*
	 * The ORDER BY is the index read backwards; the row comparison is its
	 * index condition (user_conversation_recent_idx).  One row more than
	 * the page tells whether another page follows.
	 */
	roles = IM_CATALOG_HAS_ROLES();
	plan = roles ?
		im_prepare(&plans[1], RECENT_SQL(RECENT_ROLE_COLS), 5, INT8OID, TIMESTAMPTZOID, TIMESTAMPTZOID, INT8OID, INT8OID) :
		im_prepare(&plans[0], RECENT_SQL(RECENT_NO_ROLE_COLS), 5, INT8OID, TIMESTAMPTZOID, TIMESTAMPTZOID, INT8OID, INT8OID);
	args[0] = Int64GetDatum(user_id);
	args[1] = TimestampTzGetDatum(pinned_at);
	args[2] = TimestampTzGetDatum(activity_at);
	args[3] = Int64GetDatum(neg_bound);
	args[4] = Int64GetDatum((int64) page_limit + 1);
	n = im_exec(plan, args, NULL, 0);

	for (uint64 i = 0; i < n && i < (uint64) page_limit; i++)
	{
		Datum		values[RECENT_COLUMNS];
		bool		nulls[RECENT_COLUMNS];

		for (int c = 0; c < RECENT_COLUMNS - 1; c++)
			values[c] = im_get_datum_copy(i, c + 1, &nulls[c]);
		if (i + 1 < n)
		{
			values[RECENT_COLUMNS - 1] = CStringGetTextDatum(
				encode_cursor(im_get_int64(i, Anum_recent_pinned_at, NULL),
							  im_get_int64(i, Anum_recent_activity_at, NULL),
							  im_get_int64(i, Anum_recent_conversation_id, NULL)));
			nulls[RECENT_COLUMNS - 1] = false;
		}
		else
			nulls[RECENT_COLUMNS - 1] = true;	/* the last page ends here */
		im_srf_row(fcinfo, values, nulls);
	}
	SPI_finish();
	return (Datum) 0;
}

/*
 * The conversation_pin private event and its outbox item, in one statement
 * (the shape of read_state.c's private events; the id carries the user's
 * bucket, shard_map.h).
 */
static void
enqueue_pin_event(int64 user_id, int64 conversation_id, bool pinned, const char *trace_id)
{
	static SPIPlanPtr plan;
	Datum		args[5];
	char		nulls[5] = {' ', ' ', ' ', ' ', ' '};

	im_prepare(&plan,
			   "WITH pe AS ("
			   "  INSERT INTO im.private_event (private_event_id, user_id, conversation_id, kind,"
			   "                                conversation_pinned)"
			   "  VALUES ($1, $2, $3, 'conversation_pin', $4)"
			   "  RETURNING private_event_id, user_id, conversation_id) "
			   "INSERT INTO im.outbox (conversation_id, msg_seq, source_event_id, private_user_id, trace_id) "
			   "SELECT pe.conversation_id, NULL, pe.private_event_id, pe.user_id, $5 FROM pe "
			   "RETURNING source_event_id",
			   5, INT8OID, INT8OID, INT8OID, BOOLOID, TEXTOID);
	args[0] = Int64GetDatum(im_shard_next_placed_id("event_id_seq", user_id));
	args[1] = Int64GetDatum(user_id);
	args[2] = Int64GetDatum(conversation_id);
	args[3] = BoolGetDatum(pinned);
	if (trace_id != NULL)
		args[4] = CStringGetTextDatum(trace_id);
	else
		nulls[4] = 'n';
	if (im_exec(plan, args, nulls, 0) != 1)
		elog(ERROR, "im_sync: conversation_pin event was not recorded");
	im_wake_fanout_at_commit();
}

/*
 * The user's pinned conversations, counted in the latest snapshot.  Every
 * pin counts under the user's head lock, so once it is held no other pin of
 * the user is in flight and the latest snapshot holds every committed one;
 * a REPEATABLE READ or SERIALIZABLE transaction's own snapshot may predate
 * a pin that committed while this one waited for the lock, and two pins
 * counted that way would pass the limit together (pin_limit_race.spec).
 */
static int64
pinned_count(int64 user_id)
{
	static SPIPlanPtr plan;
	Datum		args[1];
	int			rc;

	im_prepare(&plan,
			   "SELECT pg_catalog.count(*) FROM im.user_conversation "
			   "WHERE user_id" EQ "$1 "
			   "  AND conversation_pinned_at" GT "'-infinity'::pg_catalog.timestamptz",
			   1, INT8OID);
	args[0] = Int64GetDatum(user_id);
	rc = SPI_execute_snapshot(plan, args, NULL, GetLatestSnapshot(), InvalidSnapshot, false, false, 0);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "im_sync: counting pinned conversations failed: %s", SPI_result_code_string(rc));
	return im_get_int64(0, 1, NULL);
}

PG_FUNCTION_INFO_V1(im_pin_conversation);
/*
 * pin_conversation(user_id, conversation_id, pin, trace_id DEFAULT NULL):
 * pins (pin true) or unpins the conversation for this user only; returns
 * the pin state now.  42501 for a conversation the user never had a period
 * in (left ones can be pinned: they are listed too); 22023 for a pin beyond
 * IM_MAX_PINNED.  The user's devices learn it from a conversation_pin
 * private event; a call that changes nothing writes none.
 */
Datum
im_pin_conversation(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr state_plan;
	static SPIPlanPtr update_plan;
	int64		user_id = im_arg_user_id(fcinfo, 0, "user_id");
	int64		conversation_id = im_arg_id(fcinfo, 1, "conversation_id");
	bool		pin;
	char	   *trace_id;
	Datum		args[3];
	Datum		values[1];
	bool		nulls[1] = {false};
	bool		pinned;

	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("pin must not be NULL")));
	pin = PG_GETARG_BOOL(2);
	trace_id = im_arg_trace_id(fcinfo, 3);

	im_srf_begin(fcinfo);
	im_spi_connect();
	im_user_check_standing(user_id);	/* IS403 for a suspended account (contract §17) */
	im_require_conversation(conversation_id, NULL);
	im_require_ever_member(user_id, conversation_id,
						   "Only a conversation the user has or had a membership period in can be pinned.");

	/* Lock order: the user head first (contract §4). */
	im_lock_user_heads(&user_id, 1);
	im_prepare(&state_plan,
			   "SELECT conversation_pinned_at" GT "'-infinity'::pg_catalog.timestamptz "
			   "FROM im.user_conversation "
			   "WHERE user_id" EQ "$1 AND conversation_id" EQ "$2 FOR UPDATE",
			   2, INT8OID, INT8OID);
	args[0] = Int64GetDatum(user_id);
	args[1] = Int64GetDatum(conversation_id);
	if (im_exec(state_plan, args, NULL, 1) != 1)
		elog(ERROR, "im_sync: user " INT64_FORMAT " has a period in conversation " INT64_FORMAT
			 " but no conversation state", user_id, conversation_id);
	pinned = im_get_bool(0, 1, NULL);

	if (pinned != pin)
	{
		if (pin)
		{
			if (pinned_count(user_id) >= IM_MAX_PINNED)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("user " INT64_FORMAT " already has %d pinned conversations",
								user_id, IM_MAX_PINNED),
						 errhint("Unpin a conversation first.")));
		}
		/* clock_timestamp: two pins of one transaction keep their order */
		im_prepare(&update_plan,
				   "UPDATE im.user_conversation "
				   "SET conversation_pinned_at = CASE WHEN $3 THEN pg_catalog.clock_timestamp() "
				   "                                  ELSE '-infinity'::pg_catalog.timestamptz END, "
				   "    version = version" PLUS "1 "
				   "WHERE user_id" EQ "$1 AND conversation_id" EQ "$2",
				   3, INT8OID, INT8OID, BOOLOID);
		args[2] = BoolGetDatum(pin);
		im_exec(update_plan, args, NULL, 0);
		enqueue_pin_event(user_id, conversation_id, pin, trace_id);
		pinned = pin;
	}
	SPI_finish();

	values[0] = BoolGetDatum(pinned);
	im_srf_row(fcinfo, values, nulls);
	return (Datum) 0;
}
