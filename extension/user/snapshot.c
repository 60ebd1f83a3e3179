/*
 * snapshot.c — begin_snapshot, fetch_snapshot, ack_snapshot (contract §6,
 * design §7.5): a device without a trusted cursor installs a frozen view of
 * its user's state at S = base_sync_seq and then syncs incrementally from
 * S + 1.
 *
 * Invariants protected:
 *   - the cut is consistent (§7.5, §19.1 快照切面): the manifest is the
 *     user's view after applying every event <= S and nothing later.  S and
 *     every item are read from one MVCC snapshot (the cut), and a fanout
 *     writes a user's inbox events, high watermark and conversation states
 *     and marks its outbox items done in one transaction, so the cut holds
 *     either all of a fanout or none of it: S is exactly the last event of
 *     the log the items describe.  No lock on the user's head is held, so
 *     fanout into the user goes on while the manifest is built ; what it commits meanwhile gets sync_seq > S and is not in
 *     the manifest;
 *   - generation fence (§2.3): begin_snapshot bumps sync_generation, so every
 *     older batch token, cursor or snapshot token stops working; only a
 *     device still RESETTING in the token's generation becomes ACTIVE at S;
 *   - snapshots are immutable once READY: pages and digests never change,
 *     so a client can re-download a page and the digests still prove it.
 */
#include "core/im_sync.h"
#include "core/common.h"
#include "core/locks.h"
#include "core/im_sql.h"
#include "core/version_check.h"
#include "conversation/conversation.h"
#include "core/standing.h"
#include "user/user.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

/* Items per manifest page. */
#define IM_SNAPSHOT_PAGE_ITEMS 100

/* lower-case hex SHA-256 of the UTF-8 text of x, as SQL */
#define SHA256_HEX(x) \
	"pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(" x ", 'UTF8')), 'hex')"

/*
 * The manifest items of user $1 at the cut, one row per conversation in
 * conversation_id order: (item with its digest, its JSON text length).
 * Run with the cut's snapshot (see the file header).
 *
 * "Delivered to the user's log as of S": a fanout transaction that
 * delivered to this user is either in the cut — its outbox item reads
 * 'done' here — or not, and then its item reads 'pending' and its events
 * are above S.  A missing outbox item means processed and collected when
 * the event is older than the collection cutoff (IM_ITEM_PROCESSED_SQL:
 * items are written with their event; on a copy an event that came only as
 * a dependency of a later transfer has none and was not delivered here,
 * on several nodes).  Deciding from the outbox rather than
 * from inbox rows keeps the rule true after GC of the log.  A position
 * counts for the user by contract §1 (periods; recall and edit by their
 * target; the leaver's own leave).
 *
 * Per item (contract §6): periods whose join event is delivered, with
 * leave_seq only when the leave event is delivered; last_msg_seq the highest
 * delivered visible position; mode the one carried by the latest delivered
 * position the user saw at its own msg_seq; recalled_message_ids the targets
 * of delivered recalls, taken_down_message_ids those of delivered takedowns
 * (contract §17).  read_msg_seq, unread_count, the dirty marker and the
 * row version are the user_conversation row in the cut: the read state may
 * be ahead of the log (contract §6), the rest changes only together with
 * the log, in the fanout transaction.
 */
/*
 * contract §14: an item's `pinned`, the body list of the latest
 * pin position in `ctl` (delivered to the user, visible at its own
 * position) of conversation c (agg's pin_message_id), [] when none.
 */
#define SNAPSHOT_PINNED_SQL \
	"pg_catalog.jsonb_build_object('pinned', COALESCE((" \
	"  SELECT pe.body" " OPERATOR(pg_catalog.->) " "'pinned' FROM im.event pe " \
	"  WHERE pe.message_id" EQ "a.pin_message_id), '[]'::pg_catalog.jsonb))"

/* contract §20: an item's conversation_pinned, on a catalog that has pins */
#define SNAPSHOT_CONVERSATION_PINNED_SQL \
	OP_CONCAT "pg_catalog.jsonb_build_object('conversation_pinned', " \
	"  COALESCE(uc.conversation_pinned_at" GT "'-infinity'::pg_catalog.timestamptz, false)) "

/*
 * contract §17: an item's taken_down_message_ids, the targets of delivered
 * takedowns, on a catalog that has them
 */
#define SNAPSHOT_TAKEN_DOWN_SQL \
	OP_CONCAT "pg_catalog.jsonb_build_object('taken_down_message_ids', " \
	"  COALESCE(a.taken_down, '[]'::pg_catalog.jsonb))"

/* contract §17: an item's my_role and muted_until, on a catalog with roles */
#define SNAPSHOT_ROLE_SQL \
	OP_CONCAT "pg_catalog.jsonb_build_object('my_role', " \
	IM_MY_ROLE_SQL("k.kind", "$1", "c.conversation_id") ", 'muted_until', " \
	IM_MY_MUTED_UNTIL_SQL("$1", "c.conversation_id") ") "

/*
 * The rule of the cut for one position e (with its target t, LEFT JOINed):
 * delivered to the user $1 as of the cut and visible to them (contract §1:
 * periods; recall, edit and takedown by their target; the leaver's own
 * leave; a reaction needs one period covering its target and itself), its
 * outbox item processed here (a copy's dependency has none: not
 * delivered), not held in the user's quarantine.  `per` is the user's
 * periods.
 */
#define SNAPSHOT_DELIVERED_SQL \
	"(EXISTS (SELECT 1 FROM per p " \
	"            WHERE p.conversation_id" EQ "e.conversation_id " \
	"              AND " IM_PERIOD_COVERS_SQL("p", "COALESCE(t.msg_seq, e.msg_seq)") ") " \
	"         OR (e.kind" EQ "'leave' AND EXISTS (SELECT 1 FROM per p " \
	"            WHERE p.leave_event_id" EQ "e.message_id))) " \
	"    AND (e.kind" NE "'reaction' OR EXISTS (SELECT 1 FROM per p " \
	"            WHERE p.conversation_id" EQ "e.conversation_id " \
	"              AND " IM_PERIOD_COVERS_SQL("p", "t.msg_seq") \
	"              AND " IM_PERIOD_COVERS_SQL("p", "e.msg_seq") ")) " \
	"    AND " IM_EVENT_PROCESSED_SQL("e.message_id", "e.created_at") " " \
	"    AND NOT EXISTS (SELECT 1 FROM im.outbox o " \
	"            JOIN im.fanout_quarantine q ON q.outbox_id" EQ "o.outbox_id AND q.user_id" EQ "$1 " \
	"            WHERE o.source_event_id" EQ "e.message_id)"

/* the mode a position carries: a switch's new mode, else the mode it was sent in */
#define SNAPSHOT_MODE_OF_SQL \
	"CASE WHEN e.kind" EQ "'mode' THEN e.body" OP_GET_TEXT "'mode' ELSE e.mode END"

/*
 * The items' statement reads only what an item names: the control
 * positions (creates, joins and leaves for the periods, recalls, takedowns,
 * pins),
 * and per conversation its latest delivered position and the latest one
 * the user saw at its own msg_seq, each found from the top of the
 * conversation's (conversation_id, msg_seq) index.  A conversation's
 * messages are never all read: the cost follows the conversations and
 * their control positions, not the history.
 */
#define SNAPSHOT_ITEMS_SQL(conversation_pinned, taken_down) \
	"WITH per AS (" \
	"  SELECT p.* FROM im.membership_period p WHERE p.user_id" EQ "$1), " \
	"ctl AS (" \
	"  SELECT e.conversation_id, e.message_id, e.msg_seq, e.kind, e.target_message_id " \
	"  FROM im.event e " \
	"  LEFT JOIN im.event t ON t.message_id" EQ "e.target_message_id " \
	"  WHERE e.conversation_id IN (SELECT conversation_id FROM per) " \
	"    AND e.kind IN ('create', 'join', 'leave', 'recall', 'pin', 'takedown') " \
	"    AND " SNAPSHOT_DELIVERED_SQL "), " \
	"conv AS (" \
	"  SELECT p.conversation_id, " \
	"         pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(" \
	"           'membership_period_id', p.membership_period_id, 'join_seq', p.join_seq, " \
	"           'leave_seq', CASE WHEN p.leave_event_id IN (SELECT message_id FROM ctl) " \
	"                             THEN p.leave_seq END) ORDER BY p.join_seq) AS periods " \
	"  FROM per p WHERE p.join_event_id IN (SELECT message_id FROM ctl) " \
	"  GROUP BY p.conversation_id), " \
	"agg AS (" \
	"  SELECT x.conversation_id, " \
	"         pg_catalog.jsonb_agg(DISTINCT x.target_message_id) FILTER (WHERE x.kind" EQ "'recall') AS recalled, " \
	"         pg_catalog.jsonb_agg(DISTINCT x.target_message_id) FILTER (WHERE x.kind" EQ "'takedown') AS taken_down, " \
	"         (pg_catalog.array_agg(x.message_id ORDER BY x.msg_seq DESC) " \
	"            FILTER (WHERE x.kind" EQ "'pin'))[1] AS pin_message_id " \
	"  FROM ctl x GROUP BY x.conversation_id), " \
	"top AS (" \
	"  SELECT c.conversation_id, " \
	"    (SELECT e.msg_seq FROM im.event e " \
	"       LEFT JOIN im.event t ON t.message_id" EQ "e.target_message_id " \
	"      WHERE e.conversation_id" EQ "c.conversation_id AND " SNAPSHOT_DELIVERED_SQL \
	"      ORDER BY e.msg_seq DESC LIMIT 1) AS last_msg_seq, " \
	"    (SELECT " SNAPSHOT_MODE_OF_SQL " FROM im.event e " \
	"       LEFT JOIN im.event t ON t.message_id" EQ "e.target_message_id " \
	"      WHERE e.conversation_id" EQ "c.conversation_id " \
	"        AND e.kind NOT IN ('recall', 'edit', 'takedown') AND " SNAPSHOT_MODE_OF_SQL " IS NOT NULL " \
	"        AND EXISTS (SELECT 1 FROM per p WHERE p.conversation_id" EQ "e.conversation_id " \
	"              AND " IM_PERIOD_COVERS_SQL("p", "e.msg_seq") ") " \
	"        AND " SNAPSHOT_DELIVERED_SQL \
	"      ORDER BY e.msg_seq DESC LIMIT 1) AS mode " \
	"  FROM conv c), " \
	/* built once per conversation: the digest and the page size read it again */ \
	"item AS MATERIALIZED (" \
	"  SELECT c.conversation_id, pg_catalog.jsonb_build_object(" \
	"    'conversation_id', c.conversation_id, 'kind', k.kind, " \
	"    'mode', COALESCE(l.mode, k.mode), " \
	"    'version', COALESCE(uc.version, 0), 'periods', c.periods, " \
	"    'last_msg_seq', COALESCE(l.last_msg_seq, 0), " \
	"    'read_msg_seq', COALESCE(uc.read_msg_seq, 0), 'unread_count', COALESCE(uc.unread_count, 0), " \
	"    'dirty_target_msg_seq', COALESCE(uc.dirty_target_msg_seq, 0), " \
	"    'dirty_version', COALESCE(uc.dirty_version, 0), " \
	"    'recalled_message_ids', COALESCE(a.recalled, '[]'::pg_catalog.jsonb))" \
	"    " taken_down " " \
	/* the latest pin position visible at or before the cut */ \
	"    " OP_CONCAT SNAPSHOT_PINNED_SQL " " conversation_pinned " AS body " \
	"  FROM conv c JOIN im.conversation k ON k.conversation_id" EQ "c.conversation_id " \
	"  JOIN top l ON l.conversation_id" EQ "c.conversation_id " \
	"  LEFT JOIN agg a ON a.conversation_id" EQ "c.conversation_id " \
	"  LEFT JOIN im.user_conversation uc ON uc.user_id" EQ "$1 " \
	"       AND uc.conversation_id" EQ "c.conversation_id), " \
"numbered AS MATERIALIZED (" \
	"  SELECT i.conversation_id, " \
	"         i.body" OP_CONCAT "pg_catalog.jsonb_build_object('digest', " SHA256_HEX("i.body::pg_catalog.text") ") AS item " \
	"  FROM item i) " \
	"SELECT n.item, " IM_PAGE_BYTES_SQL("n.item") " FROM numbered n ORDER BY n.conversation_id"

/*
 * Pages of snapshot $1 from the items $2 and their page numbers $3 (in
 * manifest order); each page's digest is over its items' JSON text.
 */
#define SNAPSHOT_PAGES_SQL \
	"INSERT INTO im.snapshot_page (snapshot_id, page_no, items, page_digest) " \
	"SELECT $1, g.page_no, g.items, " SHA256_HEX("g.items::pg_catalog.text") " " \
	"FROM (SELECT u.page_no, pg_catalog.jsonb_agg(u.item ORDER BY u.ord) AS items " \
	"      FROM ROWS FROM (pg_catalog.unnest($2::pg_catalog.jsonb[]), " \
	"                      pg_catalog.unnest($3::pg_catalog.int4[])) " \
	"           WITH ORDINALITY AS u(item, page_no, ord) " \
	"      GROUP BY u.page_no) g"

/* SPI on a kept read-only plan, reading exactly the snapshot `cut`. */
static uint64
exec_in_cut(SPIPlanPtr plan, Datum *args, Snapshot cut, long count)
{
	int			rc = SPI_execute_snapshot(plan, args, NULL, cut, InvalidSnapshot,
										  true, false, count);

	if (rc < 0)
		elog(ERROR, "im_sync: SPI_execute_snapshot failed: %s", SPI_result_code_string(rc));
	return SPI_processed;
}

/*
 * The items' statement with JIT off, as a function's SET clause would do
 * (the setting comes back when it returns, or on an error).  Its cost
 * estimate counts every subquery against every position of the user's
 * conversations, far above jit_above_cost, while it reads only the control
 * positions and the top of each conversation: compiling it took thirty
 * times longer than running it (RESULTS.md, a new device's first screen).
 */
static void
items_without_jit(SPIPlanPtr plan, Datum *args, Snapshot cut)
{
	int			nest = NewGUCNestLevel();

	(void) set_config_option("jit", "off", PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	exec_in_cut(plan, args, cut, 0);
	AtEOXact_GUC(true, nest);
}

/*
 * Store the items of the last SPI result (item, JSON text length) as the
 * pages of snapshot_id: a page ends at IM_SNAPSHOT_PAGE_ITEMS items, or
 * before the item that would push its JSON text over
 * im_sync.max_page_bytes (a page always holds at least one item), so no
 * fetch_snapshot reply grows with the number or size of conversations.
 * Returns the number of items.
 */
static uint64
store_pages(int64 snapshot_id)
{
	static SPIPlanPtr pages_plan;
	uint64		n = SPI_processed;
	SPITupleTable *tuptable = SPI_tuptable;
	Datum	   *items;
	Datum	   *page_nos;
	int32		page = 0;
	int32		in_page = 0;
	int64		bytes = 0;
	Datum		args[3];

	if (n == 0)
		return 0;
	items = palloc(sizeof(Datum) * n);
	page_nos = palloc(sizeof(Datum) * n);
	for (uint64 i = 0; i < n; i++)
	{
		bool		isnull;
		int64		size;

		items[i] = SPI_getbinval(tuptable->vals[i], tuptable->tupdesc, 1, &isnull);
		size = DatumGetInt64(SPI_getbinval(tuptable->vals[i], tuptable->tupdesc, 2, &isnull));
		if (in_page > 0 && (in_page >= IM_SNAPSHOT_PAGE_ITEMS || bytes + size > im_max_page_bytes))
		{
			page++;
			in_page = 0;
			bytes = 0;
		}
		page_nos[i] = Int32GetDatum(page);
		in_page++;
		bytes += size;
	}
	im_prepare(&pages_plan, SNAPSHOT_PAGES_SQL, 3, INT8OID, JSONBARRAYOID, INT4ARRAYOID);
	args[0] = Int64GetDatum(snapshot_id);
	args[1] = PointerGetDatum(construct_array(items, (int) n, JSONBOID, -1, false, TYPALIGN_INT));
	args[2] = PointerGetDatum(construct_array(page_nos, (int) n, INT4OID, 4, true, TYPALIGN_INT));
	im_exec(pages_plan, args, NULL, 0);
	return n;
}

/* Result row of a refused token-bearing call: status plus NULLs. */
static void
status_row(FunctionCallInfo fcinfo, int ncols, const char *status,
		   int extra_col, Datum extra)
{
	Datum		values[8];
	bool		nulls[8];

	Assert(ncols <= 8);
	for (int i = 0; i < ncols; i++)
	{
		values[i] = (Datum) 0;
		nulls[i] = true;
	}
	values[0] = CStringGetTextDatum(status);
	nulls[0] = false;
	if (extra_col > 0)
	{
		values[extra_col] = extra;
		nulls[extra_col] = false;
	}
	im_srf_row(fcinfo, values, nulls);
}

PG_FUNCTION_INFO_V1(im_begin_snapshot);
/*
 * begin_snapshot(user_id, device_id): in the caller's transaction, bump the
 * device's generation, make it RESETTING, fix S = the user's high watermark
 * and store the immutable manifest of the user's view at S.  Statuses READY
 * and DEVICE_REVOKED.  Any other device state may begin a snapshot.
 */
Datum
im_begin_snapshot(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr head_plan;
	static SPIPlanPtr snap_plan;
	static SPIPlanPtr items_plans[3];
	SPIPlanPtr	items_plan;
	static SPIPlanPtr empty_plan;
	static SPIPlanPtr seal_plan;
	int64		user_id = im_arg_user_id(fcinfo, 0, "user_id");
	char	   *device_id = im_arg_device_id(fcinfo, 1);
	ImDevice	dev;
	ImTokenClaims claims;
	Snapshot	cut;
	int64		base;
	int32		generation;
	int64		snapshot_id;
	int32		page_count;
	char	   *manifest_digest;
	char	   *token;
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	TimestampTz expires_at = now + (TimestampTz) im_snapshot_ttl_s * USECS_PER_SEC;
	Datum		args[6];
	Datum		values[7];
	bool		nulls[7] = {false, false, false, false, false, false, false};

	im_srf_begin(fcinfo);
	im_spi_connect();
	im_user_check_standing(user_id);	/* IS403 for a suspended account (contract §17) */

	/* The device row lock orders this with every other call of the device. */
	im_lock_device(user_id, device_id, &dev);
	if (strcmp(dev.state, "REVOKED") == 0)
	{
		status_row(fcinfo, 7, "DEVICE_REVOKED", 2, Int32GetDatum(dev.sync_generation));
		SPI_finish();
		return (Datum) 0;
	}

	/*
	 * The cut: one MVCC snapshot from which S and every manifest item are
	 * read (see the file header for why it is exact).  Taking it locks
	 * nothing, so building the manifest, however long the user's history,
	 * never holds up fanout into this user.  A gc_inbox meanwhile cannot see
	 * this snapshot's lease before we commit; it can only collect what the
	 * retention window lets go, and a device whose S was collected gets
	 * RESET_REQUIRED at its first sync (sync.c rule 6), never a gap.
	 */
	cut = RegisterSnapshot(GetTransactionSnapshot());
	im_prepare(&head_plan,
			   "SELECT high_watermark FROM im.user_head WHERE user_id" EQ "$1",
			   1, INT8OID);
	args[0] = Int64GetDatum(user_id);
	base = exec_in_cut(head_plan, args, cut, 1) == 1 ? im_get_int64(0, 1, NULL) : 0;

	/*
	 * Bumping the generation kills every older token of this device.  A
	 * recovery session of an older generation can never complete now, and
	 * older snapshots of the device can never be installed: end them so
	 * their leases stop holding the GC fence.
	 */
	im_device_bump_generation(&dev, "RESETTING");
	im_device_note_issued(&dev, base);
	im_device_end_leases(user_id, device_id);
	generation = dev.sync_generation;
	args[1] = CStringGetTextDatum(device_id);

	/* BUILDING until every page is written, then sealed READY (§7.5). */
	im_prepare(&snap_plan,
			   "INSERT INTO im.snapshot (user_id, device_id, sync_generation, base_sync_seq, "
			   "  page_count, manifest_digest, state, expires_at) "
			   "VALUES ($1, $2, $3, $4, 0, '', 'BUILDING', $5) RETURNING snapshot_id",
			   5, INT8OID, TEXTOID, INT4OID, INT8OID, TIMESTAMPTZOID);
	args[2] = Int32GetDatum(generation);
	args[3] = Int64GetDatum(base);
	args[4] = TimestampTzGetDatum(expires_at);
	if (im_exec(snap_plan, args, NULL, 0) != 1)
		elog(ERROR, "im_sync: snapshot row not created");
	snapshot_id = im_get_int64(0, 1, NULL);

	if (IM_CATALOG_HAS_TAKEDOWN())
		items_plan = im_prepare(&items_plans[2],
								SNAPSHOT_ITEMS_SQL(SNAPSHOT_CONVERSATION_PINNED_SQL SNAPSHOT_ROLE_SQL,
												   SNAPSHOT_TAKEN_DOWN_SQL),
								1, INT8OID);
	else if (IM_CATALOG_HAS_RECENCY())
		items_plan = im_prepare(&items_plans[1], SNAPSHOT_ITEMS_SQL(SNAPSHOT_CONVERSATION_PINNED_SQL, ""), 1, INT8OID);
	else
		items_plan = im_prepare(&items_plans[0], SNAPSHOT_ITEMS_SQL("", ""), 1, INT8OID);
	args[0] = Int64GetDatum(user_id);
	args[1] = Int64GetDatum(snapshot_id);
	items_without_jit(items_plan, args, cut);
	UnregisterSnapshot(cut);
	if (store_pages(snapshot_id) == 0)
	{
		/* No conversation yet: one empty page, so every manifest has one. */
		im_prepare(&empty_plan,
				   "INSERT INTO im.snapshot_page (snapshot_id, page_no, items, page_digest) "
				   "VALUES ($1, 0, '[]'::pg_catalog.jsonb, " SHA256_HEX("'[]'::pg_catalog.jsonb::pg_catalog.text") ")",
				   1, INT8OID);
		im_exec(empty_plan, &args[1], NULL, 0);
	}

	im_prepare(&seal_plan,
			   "UPDATE im.snapshot s SET state = 'READY', page_count = g.n, manifest_digest = g.d "
			   "FROM (SELECT pg_catalog.count(*)::pg_catalog.int4 AS n, "
			   "        " SHA256_HEX("pg_catalog.string_agg(page_digest, '' ORDER BY page_no)") " AS d "
			   "      FROM im.snapshot_page WHERE snapshot_id" EQ "$1) g "
			   "WHERE s.snapshot_id" EQ "$1 "
			   "RETURNING s.page_count, s.manifest_digest",
			   1, INT8OID);
	if (im_exec(seal_plan, &args[1], NULL, 0) != 1)
		elog(ERROR, "im_sync: snapshot %lld not sealed", (long long) snapshot_id);
	page_count = im_get_int32(0, 1, NULL);
	manifest_digest = im_get_text(0, 2);

	memset(&claims, 0, sizeof(claims));
	claims.purpose = IM_TOKEN_SNAPSHOT;
	claims.user_id = user_id;
	strlcpy(claims.device_id, device_id, sizeof(claims.device_id));
	claims.registration = dev.registration;
	claims.sync_generation = generation;
	claims.watermark = base;
	claims.snapshot_id = snapshot_id;
	claims.issued_at = now;
	claims.expires_at = expires_at;
	token = im_token_sign(&claims);

	values[0] = CStringGetTextDatum("READY");
	values[1] = Int64GetDatum(snapshot_id);
	values[2] = Int32GetDatum(generation);
	values[3] = Int64GetDatum(base);
	values[4] = CStringGetTextDatum(token);
	values[5] = Int32GetDatum(page_count);
	values[6] = CStringGetTextDatum(manifest_digest);
	im_srf_row(fcinfo, values, nulls);
	SPI_finish();
	return (Datum) 0;
}

/*
 * The common checks of contract §5 (im_token_check) for a snapshot token
 * presented by (user_id, device_id).  Locks the device row (P0002 if never
 * registered).  Returns NULL when the token may be used, else the status.
 * A token issued to an earlier registration of the device was revoked with
 * it (contract §5), so it reads DEVICE_REVOKED.
 */
static const char *
check_snapshot_token(int64 user_id, const char *device_id, const char *token,
					 ImDevice *dev, ImTokenClaims *claims)
{
	im_lock_device(user_id, device_id, dev);
	return im_token_check(token, IM_TOKEN_SNAPSHOT, user_id, dev,
						  IM_EARLIER_REGISTRATION_REVOKED, claims);
}

static char *
arg_token(FunctionCallInfo fcinfo, int argno)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("snapshot_token must not be NULL"),
				 errhint("Pass the snapshot_token returned by begin_snapshot.")));
	return TextDatumGetCString(PG_GETARG_DATUM(argno));
}

/*
 * fetch_snapshot(user_id, device_id, snapshot_token, page_no): one stored
 * page of the manifest.  Read-only; a failed check never returns data.
 */
IM_SENSITIVE_FUNCTION(im_fetch_snapshot)
{
	static SPIPlanPtr page_plan;
	int64		user_id = im_arg_user_id(fcinfo, 0, "user_id");
	char	   *device_id = im_arg_device_id(fcinfo, 1);
	char	   *token = arg_token(fcinfo, 2);
	int32		page_no;
	ImDevice	dev;
	ImTokenClaims claims;
	const char *refused;
	int32		page_count;
	Datum		args[2];
	Datum		values[5];
	bool		nulls[5] = {false, false, false, false, false};
	bool		isnull;

	if (PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("page_no must not be NULL")));
	page_no = PG_GETARG_INT32(3);

	im_srf_begin(fcinfo);
	im_spi_connect();
	im_user_check_standing(user_id);	/* IS403 for a suspended account (contract §17) */

	refused = check_snapshot_token(user_id, device_id, token, &dev, &claims);
	if (refused != NULL)
	{
		status_row(fcinfo, 5, refused, 0, (Datum) 0);
		SPI_finish();
		return (Datum) 0;
	}

	im_prepare(&page_plan,
			   "SELECT s.page_count, p.items, p.page_digest FROM im.snapshot s "
			   "LEFT JOIN im.snapshot_page p ON p.snapshot_id" EQ "s.snapshot_id "
			   "     AND p.page_no" EQ "$2 "
			   "WHERE s.snapshot_id" EQ "$1",
			   2, INT8OID, INT4OID);
	args[0] = Int64GetDatum(claims.snapshot_id);
	args[1] = Int32GetDatum(page_no);
	if (im_exec(page_plan, args, NULL, 1) != 1)
	{
		/* collected by retention (maintenance): nothing to serve any more */
		status_row(fcinfo, 5, "EXPIRED", 0, (Datum) 0);
		SPI_finish();
		return (Datum) 0;
	}
	page_count = im_get_int32(0, 1, NULL);
	if (page_no < 0 || page_no >= page_count)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("page_no %d is outside the snapshot's pages 0 to %d", page_no, page_count - 1)));

	values[0] = CStringGetTextDatum("OK");
	values[1] = Int32GetDatum(page_no);
	values[2] = Int32GetDatum(page_count);
	values[3] = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull);
	values[4] = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 3, &nulls[4]);
	nulls[3] = isnull;
	if (isnull || nulls[4])
		elog(ERROR, "im_sync: page %d of snapshot " INT64_FORMAT " is missing",
			 page_no, claims.snapshot_id);
	im_srf_row(fcinfo, values, nulls);
	SPI_finish();
	return (Datum) 0;
}

/*
 * ack_snapshot(user_id, device_id, snapshot_token, manifest_digest): the
 * client installed every page and proves it with the manifest digest.  Only
 * a device still RESETTING in the token's generation becomes ACTIVE with
 * ACK = S; a repeat after success answers OK with the current ACK.  Every
 * status reports the device's current ACK.
 */
IM_SENSITIVE_FUNCTION(im_ack_snapshot)
{
	static SPIPlanPtr digest_plan;
	static SPIPlanPtr install_plan;
	static SPIPlanPtr mark_plan;
	int64		user_id = im_arg_user_id(fcinfo, 0, "user_id");
	char	   *device_id = im_arg_device_id(fcinfo, 1);
	char	   *token = arg_token(fcinfo, 2);
	char	   *digest;
	char	   *stored;
	ImDevice	dev;
	ImTokenClaims claims;
	const char *refused;
	int64		acked;
	Datum		args[3];

	if (PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("manifest_digest must not be NULL")));
	digest = TextDatumGetCString(PG_GETARG_DATUM(3));

	im_srf_begin(fcinfo);
	im_spi_connect();
	im_user_check_standing(user_id);	/* IS403 for a suspended account (contract §17) */

	refused = check_snapshot_token(user_id, device_id, token, &dev, &claims);
	acked = dev.acked_sync_seq;
	if (refused == NULL)
	{
		im_prepare(&digest_plan,
				   "SELECT manifest_digest FROM im.snapshot "
				   "WHERE snapshot_id" EQ "$1",
				   1, INT8OID);
		args[0] = Int64GetDatum(claims.snapshot_id);
		if (im_exec(digest_plan, args, NULL, 1) != 1)
		{
			/*
			 * Collected by retention.  ACTIVE in the token's generation means
			 * this snapshot was installed (only its ACK activates without a
			 * bump): a repeat after success.  Otherwise it can no longer be
			 * proven.
			 */
			if (strcmp(dev.state, "ACTIVE") != 0)
				refused = "EXPIRED";
		}
		else
		{
			stored = im_get_text(0, 1);
			if (strcmp(stored, digest) != 0)
				refused = "DIGEST_MISMATCH";
		}
	}
	if (refused == NULL && strcmp(dev.state, "RESETTING") == 0)
	{
		/* Same generation (checked above) and still RESETTING: install. */
		im_prepare(&install_plan,
				   "UPDATE im.device SET state = 'ACTIVE', acked_sync_seq = $3, "
				   "  issued_sync_seq = GREATEST(issued_sync_seq, $3), "
				   "  acked_at = pg_catalog.now(), last_seen_at = pg_catalog.now() "
				   "WHERE user_id" EQ "$1 AND device_id" EQ "$2 "
				   "RETURNING acked_sync_seq",
				   3, INT8OID, TEXTOID, INT8OID);
		args[0] = Int64GetDatum(user_id);
		args[1] = CStringGetTextDatum(device_id);
		args[2] = Int64GetDatum(claims.watermark);
		if (im_exec(install_plan, args, NULL, 0) != 1)
			elog(ERROR, "im_sync: device row vanished while locked");
		acked = im_get_int64(0, 1, NULL);
		/* the device now holds everything up to the watermark: receipts (receipt.c) */
		im_receipt_note(user_id, 0, 0, acked);

		im_prepare(&mark_plan,
				   "UPDATE im.snapshot SET state = 'INSTALLED', installed_at = pg_catalog.now() "
				   "WHERE snapshot_id" EQ "$1",
				   1, INT8OID);
		args[0] = Int64GetDatum(claims.snapshot_id);
		im_exec(mark_plan, args, NULL, 0);
	}

	status_row(fcinfo, 2, refused != NULL ? refused : "OK", 1, Int64GetDatum(acked));
	SPI_finish();
	return (Datum) 0;
}
