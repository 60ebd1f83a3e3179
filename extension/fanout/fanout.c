/*
 * fanout.c — outbox -> per-user logs.  The only writer of im.inbox,
 * user_head.high_watermark (sync_seq) and the fanout columns of
 * user_conversation.
 *
 * Invariants protected here (contract §1, §3, §4; design §2.3, §13.1):
 *   - sync_seq is gap-free per user: it is head + 1 under the user's head
 *     lock, and the inbox row, the head and the user's conversation state
 *     change in one statement of one transaction;
 *   - recipients come from membership periods, never the current member list;
 *   - redelivery changes nothing: an event a user's log already holds
 *     (same user_id, source_event_id, delivery_scope) is filtered out before
 *     numbering and counted as a duplicate delivery (im.metrics), so only
 *     new events move heads, states and unread counts; the unique inbox key
 *     still guards the insert (a duplicate raises, never a second event);
 *   - one conversation's items are delivered in msg_seq order, also with
 *     several workers: a per-conversation advisory lock, items in msg_seq
 *     order, and a failing item holds back the later ones until it succeeds
 *     or becomes a dead letter;
 *   - no deadlocks between workers: a batch locks every recipient's head at
 *     once, in user_id order, before delivering anything, and never touches
 *     the conversation row (fanout only UPDATEs user_conversation rows, so no
 *     foreign-key share lock on im.conversation is taken either);
 *   - fanout never stalls or gives up on an outage (contract §4): a
 *     transient failure (record_failure) only backs off, however long it
 *     lasts; a batch failing outside any one item is charged to (or backs
 *     off) every item it held; lock waits end at im_sync.fanout_lock_timeout;
 *     a conversation waiting out a backoff is no candidate, and one whose
 *     head failed before runs in a batch of its own, so healthy
 *     conversations are always served.
 */
#include "core/im_sync.h"
#include "core/common.h"
#include "core/locks.h"
#include "core/shard_map.h"
#include "core/shmem.h"
#include "core/version_check.h"
#include "core/im_sql.h"
#include "conversation/conversation.h"
#include "push/push.h"
#include "user/user.h"
#include "fanout/fanout.h"
#include "shard/shard.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "commands/async.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/resowner.h"

/*
 * Advisory lock class of the per-conversation fanout lock (two-int4 form:
 * class, low 32 bits of conversation_id).  Two conversations whose ids differ
 * by a multiple of 2^32 share a lock; that only makes one of them wait for a
 * later batch, it never reorders anything.
 */
#define IM_FANOUT_LOCK_CLASS 0x494d464f	/* "IMFO" */

/*
 * A conversation with more active members than this is fanned out in a
 * batch of its own: its batch commits late (thousands of rows), and small
 * conversations claimed into the same batch would wait for that commit —
 * direct messages must not queue behind a hot large group.
 */
#define IM_FANOUT_SOLO_MEMBERS 500

/* Largest NOTIFY payload we send (PostgreSQL's limit is 8000 bytes). */
#define IM_HINT_CHUNK 7000

/* Trace ids a line about several items shows at most. */
#define IM_CLAIM_TRACES 8

typedef struct FanoutItem
{
	int64		outbox_id;
	int64		conversation_id;
	int64		msg_seq;		/* 0 for private items */
	int64		source_event_id;
	int64		private_user_id;	/* 0 for conversation positions */
	char		kind[24];		/* a position kind or a private event kind */
	bool		shared_log;		/* event.mode = 'shared_log' */
	char		trace_id[IM_MAX_TRACE_ID + 1];	/* the outbox item's, "" for none */
} FanoutItem;

typedef struct FanoutBatch
{
	FanoutItem *items;
	int			nitems;
	int			maxitems;
	int64	   *users;			/* users whose head moved (may repeat) */
	int			nusers;
	int			maxusers;
} FanoutBatch;

static void
note_user(FanoutBatch *b, int64 user_id)
{
	im_int64_push(&b->users, &b->nusers, &b->maxusers, user_id);
}

void
im_fanout_claim_init(ImFanoutClaim *claim, MemoryContext cxt)
{
	claim->cxt = cxt;
	claim->max = 64;
	claim->ids = MemoryContextAlloc(cxt, sizeof(int64) * claim->max);
	claim->n = 0;
	claim->traces = MemoryContextAlloc(cxt, sizeof(char *) * IM_CLAIM_TRACES);
	claim->ntraces = 0;
}

/*
 * repalloc keeps the array in claim->cxt, which outlives the batch; so do
 * the first IM_CLAIM_TRACES trace ids, for the line about a failed batch.
 */
static void
note_claimed(ImFanoutClaim *claim, int64 outbox_id, const char *trace_id)
{
	im_int64_push(&claim->ids, &claim->n, &claim->max, outbox_id);
	if (trace_id[0] != '\0' && claim->ntraces < IM_CLAIM_TRACES)
		claim->traces[claim->ntraces++] = MemoryContextStrdup(claim->cxt, trace_id);
}

/*
 * The trailing fields of a line about several items: "stage=<stage>" and
 * their trace ids, at most n shown ("trace_ids=a,b,..." when more had one).
 */
static char *
items_trace(const char *stage, char *const *ids, int n, bool more)
{
	StringInfoData buf;

	if (n == 1 && !more)
		return im_log_trace(stage, ids[0]);
	initStringInfo(&buf);
	appendStringInfo(&buf, "stage=%s", stage);
	for (int k = 0; k < n; k++)
		appendStringInfo(&buf, "%s%s", k == 0 ? " trace_ids=" : ",",
						 im_trace_id_valid(ids[k], (int) strlen(ids[k])) ? ids[k] : "(invalid)");
	if (more)
		appendStringInfoString(&buf, ",...");
	return buf.data;
}

/* items_trace for a run of items */
static char *
run_trace(const FanoutItem *items, int count)
{
	char	   *ids[IM_CLAIM_TRACES];
	int			n = 0;
	bool		more = false;

	for (int k = 0; k < count; k++)
	{
		if (items[k].trace_id[0] == '\0')
			continue;
		if (n == IM_CLAIM_TRACES)
		{
			more = true;
			break;
		}
		ids[n++] = (char *) items[k].trace_id;
	}
	return items_trace("fanout", ids, n, more);
}

/* Result columns of a conversation's pending items (claim_items). */
enum
{
	Anum_pending_outbox_id = 1,
	Anum_pending_msg_seq,
	Anum_pending_source_event_id,
	Anum_pending_private_user_id,
	Anum_pending_due,
	Anum_pending_kind,
	Anum_pending_shared_log,
	Anum_pending_trace_id
};

/*
 * Claim due work: for each conversation with due work (oldest first) that
 * no other worker holds, its pending items in msg_seq order (private items
 * after them), locked.  A position item that is not yet due (backing off
 * after a failure) holds back every later position of its conversation, so
 * such a conversation is not even a candidate unless a private item of it
 * is due: conversations waiting out a backoff never take the places of
 * healthy ones (contract §4).
 *
 * A conversation whose head item failed before ("suspect") only ever starts
 * a batch, and ends it, like a large one: a failure outside any one item
 * (a lock wait timing out on one user's head, say) takes its whole batch
 * down, and would otherwise take the same healthy conversations down again
 * each time the backoff ends.
 */
static void
claim_items(FanoutBatch *b, int max_items, bool isolate_large, ImFanoutClaim *claim)
{
	static SPIPlanPtr candidates;
	static SPIPlanPtr trylock;
	static SPIPlanPtr pending_traced;
	static SPIPlanPtr pending_untraced;
	SPIPlanPtr	pending;
	static SPIPlanPtr members;
	Datum		args[2];
	int64	   *convs;
	bool	   *suspects;
	int			nconvs;
	bool		solo = false;

	im_prepare(&candidates,
			   "WITH head AS ("
			   "  SELECT DISTINCT ON (o.conversation_id) o.conversation_id, o.outbox_id, o.next_attempt_at,"
			   "         o.attempts, o.transient_failures"
			   "  FROM im.outbox o WHERE o.state" EQ "'pending' AND o.msg_seq IS NOT NULL"
			   "  ORDER BY o.conversation_id, o.msg_seq),"
			   " ready AS ("
			   "  SELECT h.conversation_id, h.outbox_id, h.attempts, h.transient_failures FROM head h"
			   "  WHERE h.next_attempt_at" LE "pg_catalog.now()"
			   "  UNION ALL"
			   "  SELECT o.conversation_id, o.outbox_id, o.attempts, o.transient_failures FROM im.outbox o"
			   "  WHERE o.state" EQ "'pending' AND o.msg_seq IS NULL AND o.next_attempt_at" LE "pg_catalog.now())"
			   "SELECT r.conversation_id,"
			   "       pg_catalog.bool_or(r.attempts" GT "0 OR r.transient_failures" GT "0)"
			   "FROM ready r GROUP BY r.conversation_id ORDER BY pg_catalog.min(r.outbox_id) LIMIT $1",
			   1, INT4OID);
	args[0] = Int32GetDatum(max_items);
	nconvs = (int) im_exec(candidates, args, NULL, 0);
	convs = palloc(sizeof(int64) * Max(nconvs, 1));
	suspects = palloc(sizeof(bool) * Max(nconvs, 1));
	for (int i = 0; i < nconvs; i++)
	{
		convs[i] = im_get_int64(i, 1, NULL);
		suspects[i] = im_get_bool(i, 2, NULL);
	}

	im_prepare(&trylock,
			   "SELECT pg_catalog.pg_try_advisory_xact_lock($1, $2)",
			   2, INT4OID, INT4OID);
	/*
	 * columns: the Anum_pending_* enum above; an older catalog's outbox has
	 * no trace id (the library may serve one until ALTER EXTENSION UPDATE)
	 */
#define PENDING_SQL(trace) \
			   "SELECT o.outbox_id, o.msg_seq, o.source_event_id, o.private_user_id, " \
			   "       o.next_attempt_at" LE "pg_catalog.now(), " \
			   "       COALESCE(e.kind, pe.kind), e.mode" EQ "'shared_log', " trace " " \
			   "FROM im.outbox o " \
			   "LEFT JOIN im.event e ON o.private_user_id IS NULL AND e.message_id" EQ "o.source_event_id " \
			   "LEFT JOIN im.private_event pe ON o.private_user_id IS NOT NULL " \
			   "     AND pe.private_event_id" EQ "o.source_event_id " \
			   "WHERE o.conversation_id" EQ "$1 AND o.state" EQ "'pending' " \
			   "ORDER BY o.msg_seq NULLS LAST, o.outbox_id LIMIT $2 " \
			   "FOR UPDATE OF o"
	if (im_catalog_at_least(1, 10))
		pending = im_prepare(&pending_traced, PENDING_SQL("o.trace_id"), 2, INT8OID, INT4OID);
	else
		pending = im_prepare(&pending_untraced, PENDING_SQL("NULL::pg_catalog.text"), 2, INT8OID, INT4OID);

	im_prepare(&members,
			   "SELECT pg_catalog.count(*)" GT "$2 FROM ("
			   "  SELECT 1 FROM im.membership_period WHERE conversation_id" EQ "$1"
			   "  AND leave_seq IS NULL LIMIT $2" PLUS "1) m",
			   2, INT8OID, INT4OID);

	for (int c = 0; c < nconvs && b->nitems < max_items && !solo; c++)
	{
		bool		held = false;
		bool		alone;
		uint64		n;

		/* a large (worker) or suspect conversation only ever starts a batch, and ends it */
		alone = suspects[c];
		if (isolate_large && !alone)
		{
			args[0] = Int64GetDatum(convs[c]);
			args[1] = Int32GetDatum(IM_FANOUT_SOLO_MEMBERS);
			im_exec(members, args, NULL, 0);
			alone = im_get_bool(0, 1, NULL);
		}
		if (alone && b->nitems > 0)
			continue;

		args[0] = Int32GetDatum(IM_FANOUT_LOCK_CLASS);
		args[1] = Int32GetDatum((int32) (convs[c] & 0xffffffff));
		im_exec(trylock, args, NULL, 0);
		if (!im_get_bool(0, 1, NULL))
			continue;			/* another worker has this conversation */
		solo = alone;

		args[0] = Int64GetDatum(convs[c]);
		args[1] = Int32GetDatum(max_items - b->nitems);
		n = im_exec(pending, args, NULL, 0);
		for (uint64 i = 0; i < n; i++)
		{
			FanoutItem *it;
			bool		isnull;
			bool		due = im_get_bool(i, Anum_pending_due, NULL);
			int64		private_user_id = im_get_int64(i, Anum_pending_private_user_id, &isnull);
			char	   *kind;

			if (!isnull)
			{
				if (!due)
					continue;
			}
			else if (held || !due)
			{
				held = true;
				continue;
			}
			if (b->nitems == b->maxitems)
			{
				b->maxitems *= 2;
				b->items = repalloc(b->items, sizeof(FanoutItem) * b->maxitems);
			}
			it = &b->items[b->nitems++];
			it->outbox_id = im_get_int64(i, Anum_pending_outbox_id, NULL);
			it->conversation_id = convs[c];
			it->msg_seq = im_get_int64(i, Anum_pending_msg_seq, NULL);
			it->source_event_id = im_get_int64(i, Anum_pending_source_event_id, NULL);
			it->private_user_id = private_user_id;
			/* no source event: fails as an item (deliver_item), never the batch */
			kind = im_get_text(i, Anum_pending_kind);
			strlcpy(it->kind, kind ? kind : "", sizeof(it->kind));
			it->shared_log = im_get_bool(i, Anum_pending_shared_log, NULL);
			kind = im_get_text(i, Anum_pending_trace_id);
			strlcpy(it->trace_id, kind ? kind : "", sizeof(it->trace_id));
			note_claimed(claim, it->outbox_id, it->trace_id);
		}
	}
}

/*
 * Lock the heads of every recipient of the whole batch at once, in user_id
 * order (im_lock_user_heads), so two workers never wait on each other's
 * heads in opposite orders.
 */
static void
lock_batch_heads(FanoutBatch *b)
{
	static SPIPlanPtr plan;
	Datum		args[1];
	int64	   *ids;
	int64	   *users;
	uint64		n;

	if (b->nitems == 0)
		return;
	ids = palloc(sizeof(int64) * b->nitems);
	for (int i = 0; i < b->nitems; i++)
		ids[i] = b->items[i].outbox_id;
	im_prepare(&plan,
			   "SELECT DISTINCT r.user_id FROM (" IM_FANOUT_RECIPIENTS_SQL
			   " UNION ALL SELECT o.outbox_id, o.private_user_id, 0 FROM im.outbox o "
			   " WHERE o.outbox_id" EQ "ANY ($1::pg_catalog.int8[]) AND o.private_user_id IS NOT NULL"
			   /* a switch back to fanout recounts unread of everyone with state */
			   " UNION ALL SELECT o.outbox_id, uc.user_id, 0 FROM im.outbox o"
			   " JOIN im.event e ON e.message_id" EQ "o.source_event_id"
			   " JOIN im.user_conversation uc ON uc.conversation_id" EQ "e.conversation_id"
			   " WHERE o.outbox_id" EQ "ANY ($1::pg_catalog.int8[]) AND e.kind" EQ "'mode'"
			   "   AND e.mode" EQ "'fanout') r "
			   "ORDER BY 1",
			   1, INT8ARRAYOID);
	args[0] = im_int8_array(ids, b->nitems);
	n = im_exec(plan, args, NULL, 0);
	users = palloc(sizeof(int64) * Max(n, 1));
	for (uint64 i = 0; i < n; i++)
		users[i] = im_get_int64(i, 1, NULL);
	im_lock_user_heads(users, (int) n);
}

/*
 * The run's source events that are already in some user's log (an item
 * delivered before and queued again).  One indexed lookup per run, so the
 * per-user redelivery check below runs only for those, never as a scan per
 * recipient: kept plans may have been made when im.inbox was small.
 */
static Datum
seen_sources(FanoutItem *items, int count, int *nseen)
{
	static SPIPlanPtr plan;
	Datum		args[1];
	int64	   *ids = palloc(sizeof(int64) * count);
	uint64		n;
	int64	   *seen;

	for (int k = 0; k < count; k++)
		ids[k] = items[k].source_event_id;
	im_prepare(&plan,
			   "SELECT DISTINCT source_event_id FROM im.inbox "
			   "WHERE source_event_id" EQ "ANY ($1::pg_catalog.int8[])",
			   1, INT8ARRAYOID);
	args[0] = im_int8_array(ids, count);
	n = im_exec(plan, args, NULL, 0);
	seen = palloc(sizeof(int64) * Max(n, 1));
	for (uint64 i = 0; i < n; i++)
		seen[i] = im_get_int64(i, 1, NULL);
	*nseen = (int) n;
	return im_int8_array(seen, (int) n);
}

/*
 * Deliver a run of consecutive position items of one conversation (one item,
 * or several fanned out in `fanout` mode) as inbox events, in one statement:
 * quarantine users covered by 2+ periods, number the remaining new events of
 * each user from its head in msg_seq order, insert them, and move each
 * user's head and conversation state ONCE for the whole run (last visible
 * position, unread per contract §3, version).  Updating a row once per run
 * instead of once per item keeps a batch linear: repeated updates of the
 * same rows inside one transaction grow their version chains and made
 * large batches several times slower.
 *
 * Redelivery is a no-op: events already in a log are filtered out before
 * numbering (the batch holds the conversation's fanout lock and every
 * recipient's head, so nobody else can add them meanwhile).  The unique
 * idempotency key still guards the plain INSERT: a duplicate raises and the
 * run is retried item by item, it never becomes a second event or a gap.
 */

/*
 * The two delivery statements below share their tail.  LOG_APPEND_SQL(src)
 * numbers each user's new events from its head in msg_seq order and inserts
 * them; src is a CTE with user_id, period, message_id, conversation_id,
 * msg_seq, kind, outbox_id.  MOVE_USERS_SQL(dups) moves each user's head and
 * conversation state once, from a CTE per_user (user_id, hw, last, delta),
 * and returns rows of the Anum_delivery_* columns: one per user delivered
 * to, or a single row with a NULL user when nobody was; dups is a query of one row, n: the
 * deliveries left out because the log already held them, q: the users
 * quarantined now.  $2 is the conversation.
 */
#define LOG_APPEND_SQL(src) \
	" num AS (" \
	"  SELECT f.*, h.high_watermark" PLUS \
	"         pg_catalog.row_number() OVER (PARTITION BY f.user_id ORDER BY f.msg_seq) AS sync_seq" \
	"  FROM " src " f JOIN im.user_head h ON h.user_id" EQ "f.user_id)," \
	" ins AS (" \
	"  INSERT INTO im.inbox (user_id, sync_seq, source_event_id, delivery_scope," \
	"                        conversation_id, msg_seq, kind, outbox_id)" \
	"  SELECT user_id, sync_seq, message_id, period, conversation_id, msg_seq, kind, outbox_id" \
	"  FROM num),"
#define MOVE_USERS_SQL(dups, recency) \
	" hd AS (" \
	"  UPDATE im.user_head h SET high_watermark = p.hw FROM per_user p" \
	"  WHERE h.user_id" EQ "p.user_id)," \
	" uc AS (" \
	"  UPDATE im.user_conversation u SET" \
	"    last_msg_seq = pg_catalog.int8larger(u.last_msg_seq, p.last)," \
	"    unread_count = u.unread_count" PLUS "p.delta," \
	recency \
	"    version = u.version" PLUS "1" \
	"  FROM per_user p" \
	"  WHERE u.user_id" EQ "p.user_id AND u.conversation_id" EQ "$2" \
	"  RETURNING 1)" \
	/* data-modifying CTEs run whether read or not */ \
	"SELECT p.user_id, (SELECT pg_catalog.count(*) FROM uc), p.doubled, d.n, d.q" \
	"  FROM (" dups ") d LEFT JOIN per_user p ON true"

/*
 * The recency column of a catalog that has it (contract §20): created_at of
 * the run's last message, per_user.act (NULL for a run without one, which
 * leaves the column, and so the indexed key, unchanged: that update stays
 * HOT).  An older catalog (the library before ALTER EXTENSION UPDATE)
 * gets the statements without it.
 */
#define RECENCY_SET_SQL "    last_activity_at = GREATEST(u.last_activity_at, p.act),"
#define NO_RECENCY_SQL ""

/* Result columns of the delivery statements (MOVE_USERS_SQL). */
enum
{
	Anum_delivery_user_id = 1,
	Anum_delivery_states_updated,
	Anum_delivery_doubled,
	Anum_delivery_duplicates,
	Anum_delivery_quarantined
};

/*
 * Whether message `e` (an im.event alias) is recalled (or taken down) by a
 * recall (or takedown) whose item was processed here BEFORE this run (an item of the run still reads
 * 'pending'): then the recount (IM_UNREAD_RECOUNT_SQL) no longer counts it,
 * and delivering it late — a dead letter or dead transfer retried after its
 * recall, a transfer that arrived after the recall's — must not add it to
 * unread either.  The recalled flag first: no probe for the usual message.
 */
#define RECALL_PROCESSED_SQL(e) \
	"(" e ".recalled AND EXISTS (SELECT 1 FROM im.event rc" \
	"   LEFT JOIN im.outbox rco ON rco.source_event_id" EQ "rc.message_id" \
	"   WHERE rc.target_message_id" EQ e ".message_id AND rc.kind" EQ IM_TOMBSTONE_KINDS_SQL \
	"     AND " IM_ITEM_PROCESSED_SQL("rco.state", "rc.created_at") "))"

/*
 * The common case of a run, kept lean: several plain `message` items of a
 * fanout conversation that no log holds yet and nobody deleted for
 * themselves.  The same effects as the general statement below, without
 * the quarantine grouping, the redelivery check, recall targets and
 * deletion joins (a stripped statement measured about 1.6x the general
 * one).  A user covered twice by periods (possible only if the exclusion
 * constraint was bypassed) raises, and the run is retried item by item
 * through the general statement, which quarantines.
 */
static bool
lean_run_possible(FanoutItem *items, int count, int nseen)
{
	static SPIPlanPtr deleted;
	Datum		args[1];
	int64	   *ids;

	if (count < 2 || nseen > 0)
		return false;
	for (int k = 0; k < count; k++)
		if (strcmp(items[k].kind, "message") != 0)
			return false;
	ids = palloc(sizeof(int64) * count);
	for (int k = 0; k < count; k++)
		ids[k] = items[k].source_event_id;
	im_prepare(&deleted,
			   "SELECT EXISTS (SELECT 1 FROM im.deleted_for_me "
			   "WHERE message_id" EQ "ANY ($1::pg_catalog.int8[]))",
			   1, INT8ARRAYOID);
	args[0] = im_int8_array(ids, count);
	im_exec(deleted, args, NULL, 0);
	return !im_get_bool(0, 1, NULL);
}

#define LEAN_RUN_SQL(recency) \
					  "WITH r AS (" \
					  "  SELECT o.outbox_id, e.message_id, e.conversation_id, e.msg_seq, e.kind, e.sender_id," \
					  "         e.created_at, p.user_id, p.membership_period_id AS period," \
					  "         " RECALL_PROCESSED_SQL("e") " AS recall_done" \
					  "  FROM im.outbox o JOIN im.event e ON e.message_id" EQ "o.source_event_id" \
					  "  JOIN im.membership_period p ON p.conversation_id" EQ "$2" \
					  "   AND " IM_PERIOD_COVERS_SQL("p", "e.msg_seq") \
					  "  WHERE o.outbox_id" EQ "ANY ($1::pg_catalog.int8[]))," \
					  LOG_APPEND_SQL("r") \
					  " per_user AS (" \
					  "  SELECT num.user_id, pg_catalog.max(num.sync_seq) AS hw, pg_catalog.max(num.msg_seq) AS last," \
					  "         pg_catalog.count(*)" MINUS "pg_catalog.count(DISTINCT num.outbox_id) AS doubled," \
					  "         pg_catalog.count(*) FILTER (WHERE num.sender_id" NE "num.user_id" \
					  "                                AND num.msg_seq" GT "u.read_msg_seq" \
					  "                                AND NOT num.recall_done) AS delta," \
					  "         pg_catalog.max(num.created_at) AS act"	/* messages only (lean_run_possible) */ \
					  "  FROM num LEFT JOIN im.user_conversation u" \
					  "    ON u.user_id" EQ "num.user_id AND u.conversation_id" EQ "$2" \
					  "  GROUP BY num.user_id)," \
					  /* no log holds any of the run's events (lean_run_possible) */ \
					  MOVE_USERS_SQL("SELECT 0::pg_catalog.int8 AS n, 0::pg_catalog.int8 AS q", recency)

static SPIPlanPtr
lean_run_plan(void)
{
	static SPIPlanPtr plans[2];

	if (IM_CATALOG_HAS_RECENCY())
		return im_prepare(&plans[1], LEAN_RUN_SQL(RECENCY_SET_SQL), 2, INT8ARRAYOID, INT8OID);
	return im_prepare(&plans[0], LEAN_RUN_SQL(NO_RECENCY_SQL), 2, INT8ARRAYOID, INT8OID);
}

/*
 * The general statement: any position kinds, quarantine of users covered by
 * two periods, redelivery ($3: sources already in some log), recall
 * targets and deletions for the unread rule.
 */
#define GENERAL_RUN_SQL(recency) \
					  "WITH it AS (" \
					  "  SELECT o.outbox_id, e.message_id, e.conversation_id, e.msg_seq, e.kind, e.sender_id," \
					  "         e.target_message_id, e.mode, e.created_at, t.sender_id AS t_sender, t.msg_seq AS t_seq," \
					  "         " RECALL_PROCESSED_SQL("e") " AS recall_done," \
					  /* \
					   * the recalled target counted until now iff its item is \
					   * processed here (or in this run; IM_ITEM_PROCESSED_SQL: a \
					   * copy's target that came only as a dependency was never \
					   * counted); in either mode, so a shared_log upper bound stays \
					   * an upper bound and a fanout count stays exact \
					   */ \
					  "         (" IM_ITEM_PROCESSED_SQL("tob.state", "t.created_at") \
					  "          OR tob.outbox_id" EQ "ANY ($1::pg_catalog.int8[])) AS t_done," \
					  /* redelivery: only an item already in some log needs the per-user check */ \
					  "         e.message_id" EQ "ANY ($3::pg_catalog.int8[]) AS seen" \
					  "  FROM im.outbox o JOIN im.event e ON e.message_id" EQ "o.source_event_id" \
					  "  LEFT JOIN im.event t ON t.message_id" EQ "e.target_message_id" \
					  "  LEFT JOIN im.outbox tob ON tob.source_event_id" EQ "e.target_message_id" \
					  "  WHERE o.outbox_id" EQ "ANY ($1::pg_catalog.int8[]))," \
					  " g AS (" \
					  "  SELECT r.outbox_id, r.user_id," \
					  "         pg_catalog.array_agg(r.membership_period_id ORDER BY r.membership_period_id) AS periods" \
					  "  FROM (" IM_FANOUT_RECIPIENTS_SQL ") r GROUP BY r.outbox_id, r.user_id)," \
					  " quar AS (" \
					  "  INSERT INTO im.fanout_quarantine (outbox_id, user_id, periods)" \
					  "  SELECT g.outbox_id, g.user_id, g.periods FROM g WHERE pg_catalog.cardinality(g.periods)" GT "1" \
					  "  ON CONFLICT (outbox_id, user_id) DO NOTHING RETURNING 1)," \
					  " cand AS (" \
					  "  SELECT g.user_id, g.periods[1] AS period, it.*," \
					  "         (it.seen AND EXISTS (SELECT 1 FROM im.inbox i WHERE i.user_id" EQ "g.user_id" \
					  "          AND i.source_event_id" EQ "it.message_id AND i.delivery_scope" EQ "g.periods[1])) AS held" \
					  "  FROM g JOIN it ON it.outbox_id" EQ "g.outbox_id" \
					  "  WHERE pg_catalog.cardinality(g.periods)" EQ "1)," \
					  " fresh AS (SELECT * FROM cand WHERE NOT cand.held)," \
					  LOG_APPEND_SQL("fresh") \
					  " per_user AS (" \
					  "  SELECT num.user_id, pg_catalog.max(num.sync_seq) AS hw, pg_catalog.max(num.msg_seq) AS last, 0 AS doubled," \
					  "    pg_catalog.sum(CASE" \
					  "      WHEN num.kind" EQ "'message' AND num.sender_id" NE "u.user_id" \
					  "       AND num.msg_seq" GT "u.read_msg_seq AND dm.user_id IS NULL" \
					  "       AND NOT num.recall_done" \
					  "      THEN 1" \
					  "      WHEN num.kind" EQ IM_TOMBSTONE_KINDS_SQL " AND num.t_done" \
					  "       AND num.t_sender" NE "u.user_id AND num.t_seq" GT "u.read_msg_seq" \
					  "       AND dt.user_id IS NULL" \
					  "      THEN -1 ELSE 0 END) AS delta," \
					  /* recency: created_at of the last message (contract §20), NULL for none */ \
					  "    pg_catalog.max(num.created_at) FILTER (WHERE num.kind" EQ "'message') AS act" \
					  "  FROM num LEFT JOIN im.user_conversation u" \
					  "    ON u.user_id" EQ "num.user_id AND u.conversation_id" EQ "$2" \
					  /* joins, not correlated subqueries: no per-row scan whatever the statistics */ \
					  "  LEFT JOIN im.deleted_for_me dm" \
					  "    ON dm.user_id" EQ "num.user_id AND dm.message_id" EQ "num.message_id" \
					  "  LEFT JOIN im.deleted_for_me dt" \
					  "    ON dt.user_id" EQ "num.user_id AND dt.message_id" EQ "num.target_message_id" \
					  "  GROUP BY num.user_id)," \
					  MOVE_USERS_SQL("SELECT pg_catalog.count(*) AS n, (SELECT pg_catalog.count(*) FROM quar) AS q" \
									 " FROM cand WHERE cand.held", recency)

static SPIPlanPtr
general_run_plan(void)
{
	static SPIPlanPtr plans[2];

	if (IM_CATALOG_HAS_RECENCY())
		return im_prepare(&plans[1], GENERAL_RUN_SQL(RECENCY_SET_SQL), 3, INT8ARRAYOID, INT8OID, INT8ARRAYOID);
	return im_prepare(&plans[0], GENERAL_RUN_SQL(NO_RECENCY_SQL), 3, INT8ARRAYOID, INT8OID, INT8ARRAYOID);
}

/*
 * Deliver a run of position items (see the comment above the statements):
 * the lean statement when it applies, else the general one.  Deliveries a
 * log already held are counted as duplicates when the batch commits (a
 * batch that rolls back is retried and would count them again).
 */
static void
deliver_positions(FanoutBatch *b, FanoutItem *items, int count)
{
	Datum		args[3];
	int64	   *ids = palloc(sizeof(int64) * count);
	int			nseen;
	bool		lean;
	uint64		n;

	for (int k = 0; k < count; k++)
		ids[k] = items[k].outbox_id;
	args[0] = im_int8_array(ids, count);
	args[1] = Int64GetDatum(items[0].conversation_id);
	args[2] = seen_sources(items, count, &nseen);
	lean = lean_run_possible(items, count, nseen);
	n = im_exec(lean ? lean_run_plan() : general_run_plan(), args, NULL, 0);
	if (n < 1)
		elog(ERROR, "im_sync: delivery statement returned no row");
	im_counter_add_at_commit(IM_COUNTER_DUPLICATE_DELIVERIES,
							 im_get_int64(0, Anum_delivery_duplicates, NULL));
	if (im_get_int64(0, Anum_delivery_quarantined, NULL) > 0)
		ereport(LOG,
				(errmsg("im_sync: fanout of %d outbox items of conversation " INT64_FORMAT " from msg_seq "
						INT64_FORMAT " quarantined " INT64_FORMAT " users covered by two membership periods"
						" (not delivered to them; reconcile reports fanout_quarantine); %s",
						count, items[0].conversation_id, items[0].msg_seq,
						im_get_int64(0, Anum_delivery_quarantined, NULL), run_trace(items, count))));
	for (uint64 i = 0; i < n; i++)
	{
		bool		nobody;
		int64		user_id = im_get_int64(i, Anum_delivery_user_id, &nobody);

		if (nobody)
			continue;			/* the single row of a run delivered to nobody */
		if (im_get_int64(i, Anum_delivery_states_updated, NULL) != (int64) n)
			elog(ERROR, "im_sync: delivery of outbox item " INT64_FORMAT " found no user state for some recipients",
				 items[0].outbox_id);
		if (im_get_int64(i, Anum_delivery_doubled, NULL) != 0)
			elog(ERROR, "im_sync: user " INT64_FORMAT " is covered by two periods in conversation " INT64_FORMAT,
				 user_id, items[0].conversation_id);
		note_user(b, user_id);
	}
}

/* deliver_private's statement; kind_cases: the WHENs of the kinds with their own payload (none before the catalog had receipts and conversation pins) */
#define DELIVER_PRIVATE_SQL(kind_cases) \
	"WITH src AS (" \
	"  SELECT pe.user_id, h.high_watermark" PLUS "1 AS sync_seq, pe.private_event_id," \
	"         pe.conversation_id, pe.kind," \
	"         CASE pe.kind WHEN 'read_cursor'" \
	"              THEN pg_catalog.jsonb_build_object('read_msg_seq', pe.read_msg_seq)" \
	kind_cases \
	"              ELSE pg_catalog.jsonb_build_object('message_id', pe.message_id) END AS payload," \
	"         o.outbox_id" \
	"  FROM im.outbox o" \
	"  JOIN im.private_event pe ON pe.private_event_id" EQ "o.source_event_id" \
	"  JOIN im.user_head h ON h.user_id" EQ "pe.user_id" \
	"  WHERE o.outbox_id" EQ "$1)," \
	" ins AS (" \
	"  INSERT INTO im.inbox (user_id, sync_seq, source_event_id, delivery_scope," \
	"                        conversation_id, msg_seq, kind, payload, outbox_id)" \
	"  SELECT user_id, sync_seq, private_event_id, 0, conversation_id, NULL, kind, payload, outbox_id" \
	"  FROM src" \
	IM_INBOX_APPEND_TAIL_SQL \
	/* one row: the user delivered to (NULL: none) and the duplicates */ \
	"SELECT ins.user_id, (SELECT pg_catalog.count(*) FROM hd)," \
	"       (SELECT pg_catalog.count(*) FROM src)" MINUS "(SELECT pg_catalog.count(*) FROM ins)" \
	"FROM (SELECT 1) one LEFT JOIN ins ON true"

/*
 * A private event (read_cursor, delete_for_me, receipt, conversation_pin) into its user's log, scope 0.
 * The user's conversation state was already changed by the recording
 * transaction; only the log and the head move here.  An event the log
 * already holds (the item queued again) is a duplicate delivery: not
 * written again, counted when the batch commits.
 */
static void
deliver_private(FanoutBatch *b, FanoutItem *it)
{
	static SPIPlanPtr plan;
	static SPIPlanPtr plan_before;
	Datum		args[1];
	bool		nobody;
	int64		user_id;
	SPIPlanPtr	p;

	/* a 1.10 catalog has neither private_event.payload nor .conversation_pinned */
	if (IM_CATALOG_HAS_RECENCY())
		p = im_prepare(&plan,
					   DELIVER_PRIVATE_SQL("              WHEN 'receipt' THEN pe.payload"
										   "              WHEN 'conversation_pin'"
										   "              THEN pg_catalog.jsonb_build_object('conversation_pinned', pe.conversation_pinned)"),
					   1, INT8OID);
	else
		p = im_prepare(&plan_before, DELIVER_PRIVATE_SQL(""), 1, INT8OID);
	args[0] = Int64GetDatum(it->outbox_id);
	if (im_exec(p, args, NULL, 0) != 1)
		elog(ERROR, "im_sync: private delivery statement returned no row");
	im_counter_add_at_commit(IM_COUNTER_DUPLICATE_DELIVERIES, im_get_int64(0, 3, NULL));
	user_id = im_get_int64(0, 1, &nobody);
	if (!nobody)
		note_user(b, user_id);
}

static void
mark_done(FanoutItem *items, int count)
{
	static SPIPlanPtr plan;
	Datum		args[1];
	int64	   *ids = palloc(sizeof(int64) * count);

	for (int k = 0; k < count; k++)
		ids[k] = items[k].outbox_id;
	im_prepare(&plan,
			   "UPDATE im.outbox SET state = 'done', processed_at = pg_catalog.now() "
			   "WHERE outbox_id" EQ "ANY ($1::pg_catalog.int8[])",
			   1, INT8ARRAYOID);
	args[0] = im_int8_array(ids, count);
	im_exec(plan, args, NULL, 0);
}

/*
 * lock_timeout = im_sync.fanout_lock_timeout until fanout_lock_timeout_pop,
 * the way a function's SET clause works (an error unwinds it too): a lock
 * held for ever by someone else (a user's head, a state row) becomes a
 * 55P03, a transient failure that backs off, instead of a worker hung with
 * every conversation of its batch.
 */
static int
fanout_lock_timeout_push(void)
{
	int			nest = NewGUCNestLevel();
	char		value[32];

	snprintf(value, sizeof(value), "%d", im_fanout_lock_timeout_ms);
	(void) set_config_option("lock_timeout", value, PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	return nest;
}

static void
fanout_lock_timeout_pop(int nest)
{
	AtEOXact_GUC(true, nest);
}

/* SQLSTATE and primary message only: the detail may quote row values such as a body. */
static char *
failure_text(ErrorData *edata)
{
	return psprintf("%s: %.200s", unpack_sql_state(edata->sqlerrcode),
					edata->message ? edata->message : "(no message)");
}

/*
 * Record a failure of items ids[0..n) (contract §4); returns how many are
 * now dead letters.  A transient failure (im_fanout_error_is_transient) is
 * never an attempt: the item stays pending and backs off 1 s, 2 s, 4 s, …
 * capped at 1 min, so an outage of any length ends with the item delivered.
 * Any other failure is an attempt: backoff 10 s × 2^attempts (capped at
 * 320 s), a dead letter at im_sync.fanout_max_attempts.
 */
static int
record_failure(const int64 *ids, int n, ErrorData *edata)
{
	static SPIPlanPtr transient_plan;
	static SPIPlanPtr charged_plan;
	bool		transient = im_fanout_error_is_transient(edata->sqlerrcode);
	Datum		args[3];
	uint64		rows;
	int			dead = 0;

	if (n == 0)
		return 0;
	im_prepare(&transient_plan,
			   "UPDATE im.outbox SET transient_failures = transient_failures" PLUS "1, last_error = $2,"
			   "  next_attempt_at = pg_catalog.now()" PLUS IM_TRANSIENT_BACKOFF_SQL("transient_failures") " "
			   "WHERE outbox_id" EQ "ANY ($1::pg_catalog.int8[]) AND state" EQ "'pending' "
			   "RETURNING state",
			   3, INT8ARRAYOID, TEXTOID, INT4OID);
	im_prepare(&charged_plan,
			   "UPDATE im.outbox SET attempts = attempts" PLUS "1, last_error = $2,"
			   "  next_attempt_at = pg_catalog.now()" PLUS IM_CHARGED_BACKOFF_SQL("attempts") ","
			   "  state = CASE WHEN attempts" PLUS "1" GE "$3 THEN 'dead' ELSE 'pending' END "
			   "WHERE outbox_id" EQ "ANY ($1::pg_catalog.int8[]) AND state" EQ "'pending' "
			   "RETURNING state",
			   3, INT8ARRAYOID, TEXTOID, INT4OID);
	args[0] = im_int8_array(ids, n);
	args[1] = CStringGetTextDatum(failure_text(edata));
	args[2] = Int32GetDatum(im_fanout_max_attempts);
	rows = im_exec(transient ? transient_plan : charged_plan, args, NULL, 0);
	for (uint64 i = 0; i < rows; i++)
	{
		char	   *state = im_get_text(i, 1);

		if (strcmp(state, "dead") == 0)
			dead++;
	}
	im_counter_add(transient ? IM_COUNTER_FANOUT_TRANSIENT_FAILURES : IM_COUNTER_FANOUT_CHARGED_FAILURES,
				   (int64) rows);
	return dead;
}

/* One item failed inside its own subtransaction; true if it is now a dead letter. */
static bool
mark_failed(FanoutItem *it, ErrorData *edata)
{
	bool		dead = record_failure(&it->outbox_id, 1, edata) > 0;

	ereport(LOG,
			(errmsg("im_sync: fanout of outbox item " INT64_FORMAT " (conversation " INT64_FORMAT
					", msg_seq " INT64_FORMAT ") failed: %s%s; %s",
					it->outbox_id, it->conversation_id, it->msg_seq, failure_text(edata),
					dead ? "; now a dead letter" :
					im_fanout_error_is_transient(edata->sqlerrcode) ?
					"; transient, not counted as an attempt: backing off" : "; will retry",
					im_log_trace("fanout", it->trace_id))));
	return dead;
}

void
im_fanout_batch_failed(const ImFanoutClaim *claim, ErrorData *edata)
{
	int			dead;
	int			nest;

	im_counter_add(IM_COUNTER_FANOUT_BATCH_FAILURES, 1);
	if (claim->n == 0)
		return;
	nest = fanout_lock_timeout_push();
	dead = record_failure(claim->ids, claim->n, edata);
	fanout_lock_timeout_pop(nest);
	ereport(LOG,
			(errmsg("im_sync: a fanout batch of %d outbox items failed outside any one item: %s; %s; %s",
					claim->n, failure_text(edata),
					im_fanout_error_is_transient(edata->sqlerrcode) ?
					"transient, not counted as an attempt: every item backs off" :
					psprintf("an attempt was charged to every item (%d now dead letters)", dead),
					items_trace("fanout", claim->traces, claim->ntraces, false))));
}

/*
 * The two ends of an internal subtransaction started in cxt under owner
 * (the idiom of PL/pgSQL's exception blocks): commit it, or roll it back and
 * return a copy of the error, leaving the caller in cxt either way.
 */
static void
subxact_commit(MemoryContext cxt, ResourceOwner owner)
{
	ReleaseCurrentSubTransaction();
	MemoryContextSwitchTo(cxt);
	CurrentResourceOwner = owner;
}

static ErrorData *
subxact_abort(MemoryContext cxt, ResourceOwner owner)
{
	ErrorData  *edata;

	MemoryContextSwitchTo(cxt);
	edata = CopyErrorData();
	FlushErrorState();
	RollbackAndReleaseCurrentSubTransaction();
	MemoryContextSwitchTo(cxt);
	CurrentResourceOwner = owner;
	return edata;
}

/*
 * Offline push (contract §13): the run's `message` positions queue their push jobs in this
 * (sub)transaction, so a push exists iff the delivery commits.
 */
static void
queue_pushes(FanoutItem *items, int count)
{
	int64	   *ids = palloc(sizeof(int64) * count);
	int			n = 0;

	for (int k = 0; k < count; k++)
		if (strcmp(items[k].kind, "message") == 0)
			ids[n++] = items[k].source_event_id;
	im_push_queue_delivered(items[0].conversation_id, ids, n);
}

/*
 * a delivered run's group messages whose receipts other nodes take part in
 * (user/receipt.c, sharding.md "Receipts"), in the same subtransaction
 */
static void
receipts_delivered(FanoutItem *items, int count)
{
	int64	   *ids = palloc(sizeof(int64) * count);
	int			n = 0;

	for (int k = 0; k < count; k++)
		if (strcmp(items[k].kind, "message") == 0)
			ids[n++] = items[k].source_event_id;
	im_receipt_note_delivered(items[0].conversation_id, ids, n);
}

/*
 * a delivered run's items with recipients on other nodes get
 * their transfer records in this same subtransaction, so an item is done
 * iff its local deliveries and its transfers commit together.
 */
static void
transfer_run(FanoutItem *items, int count)
{
	int64	   *ids = palloc(sizeof(int64) * count);

	for (int k = 0; k < count; k++)
		ids[k] = items[k].outbox_id;
	im_transfer_out_write(ids, count);
}

/*
 * Deliver one item — or a run of consecutive shared_log `message` items of
 * one conversation, coalesced into one marker write per member — in its own
 * subtransaction (the way PL/pgSQL runs an exception block), so one poison
 * item does not undo the batch.  Returns true when delivered.  A failed run
 * is charged to its first item, which holds back the rest (a transient
 * failure is recorded but not charged, see record_failure).  Errors that
 * concern the whole transaction (cancel, shutdown, deadlock, serialization)
 * are re-thrown: the batch fails and its items back off.
 */
static bool
deliver_item(FanoutBatch *b, FanoutItem *it, int count, StringInfo hints, bool charge, bool *dead)
{
	MemoryContext oldcontext = CurrentMemoryContext;
	ResourceOwner oldowner = CurrentResourceOwner;
	int			nusers = b->nusers;
	int			hints_len = hints ? hints->len : 0;
	volatile bool ok = true;

	*dead = false;
	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(oldcontext);
	PG_TRY();
	{
		if (it->kind[0] == '\0')
			ereport(ERROR,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("outbox item " INT64_FORMAT " has no source event", it->outbox_id),
					 errdetail("Its source_event_id " INT64_FORMAT " names no event of the conversation.",
							   it->source_event_id)));
		if (it->private_user_id != 0)
		{
			/* a deletion for a user placed on another node goes to that node */
			if (im_shard_owns_bucket(im_shard_bucket(it->private_user_id)) ||
				!im_transfer_out_write_deletion(it->outbox_id))
				deliver_private(b, it);
		}
		else if (it->shared_log && im_kind_uses_marker(it->kind))	/* reactions and pins (contract §14) */
		{
			int64	   *ids = palloc(sizeof(int64) * count);
			int64	   *moved;
			int			nmoved;

			for (int k = 0; k < count; k++)
				ids[k] = it[k].source_event_id;
			im_shared_log_deliver(it->conversation_id, ids, count, hints, &moved, &nmoved);
			for (int k = 0; k < nmoved; k++)
				note_user(b, moved[k]);
			queue_pushes(it, count);
		}
		else
		{
			deliver_positions(b, it, count);
			if (strcmp(it->kind, "mode") == 0)
				im_shared_log_mode_delivered(it->source_event_id);
			queue_pushes(it, count);
			receipts_delivered(it, count);
		}
		if (it->private_user_id == 0)
			transfer_run(it, count);	/* the remote recipients */
		mark_done(it, count);
		subxact_commit(oldcontext, oldowner);
	}
	PG_CATCH();
	{
		ErrorData  *edata = subxact_abort(oldcontext, oldowner);

		if (edata->sqlerrcode == ERRCODE_QUERY_CANCELED ||
			edata->sqlerrcode == ERRCODE_ADMIN_SHUTDOWN ||
			edata->sqlerrcode == ERRCODE_T_R_DEADLOCK_DETECTED ||
			edata->sqlerrcode == ERRCODE_T_R_SERIALIZATION_FAILURE)
			ReThrowError(edata);
		b->nusers = nusers;		/* nothing of this item was delivered */
		if (hints)
		{
			hints->len = hints_len;
			hints->data[hints_len] = '\0';
		}
		if (charge)
			*dead = mark_failed(it, edata);
		else
			ereport(LOG,
					(errmsg("im_sync: fanout of %d items of conversation " INT64_FORMAT
							" from msg_seq " INT64_FORMAT " failed as a run (%s: %.200s); retrying them one by one; %s",
							count, it->conversation_id, it->msg_seq,
							unpack_sql_state(edata->sqlerrcode),
							edata->message ? edata->message : "(no message)",
							run_trace(it, count))));
		FreeErrorData(edata);
		ok = false;
	}
	PG_END_TRY();
	return ok;
}

static bool
is_shared_log_message(const FanoutItem *it)
{
	return it->private_user_id == 0 && it->shared_log && im_kind_uses_marker(it->kind); /* reactions and pins (contract §14) */
}

/* A position delivered as inbox events that may join a run (not `mode`). */
static bool
is_plain_position(const FanoutItem *it)
{
	return it->private_user_id == 0 && !is_shared_log_message(it) && strcmp(it->kind, "mode") != 0;
}

/*
 * Length of the run starting at items[i]: consecutive shared_log `message`
 * items of one conversation (one marker write per member), or consecutive
 * plain position items of one conversation (one head and state update per
 * user).  Private items and `mode` events are delivered alone.
 */
static int
run_length(FanoutBatch *b, int i)
{
	FanoutItem *first = &b->items[i];
	bool		(*same_kind) (const FanoutItem *);
	int			j = i;

	if (is_shared_log_message(first))
		same_kind = is_shared_log_message;
	else if (is_plain_position(first))
		same_kind = is_plain_position;
	else
		return 1;
	while (j + 1 < b->nitems &&
		   b->items[j + 1].conversation_id == first->conversation_id &&
		   same_kind(&b->items[j + 1]))
		j++;
	return j - i + 1;
}

/*
 * Deliver items[0..count) and account for it: *processed counts delivered
 * and dead items; *held is set to the conversation whose later positions
 * must wait for a failed one.  A plain run that fails as a whole is retried
 * item by item, so only the failing item is charged and held back.
 */
static void
deliver_run(FanoutBatch *b, FanoutItem *items, int count, StringInfo hints,
			int64 *processed, int64 *held)
{
	bool		dead;

	if (count > 1 && is_plain_position(items))
	{
		if (deliver_item(b, items, count, hints, false, &dead))
		{
			*processed += count;
			return;
		}
		for (int k = 0; k < count && *held != items[k].conversation_id; k++)
			deliver_run(b, &items[k], 1, hints, processed, held);
		return;
	}
	if (deliver_item(b, items, count, hints, true, &dead))
		*processed += count;
	else
	{
		if (dead)
			(*processed)++;
		/*
		 * A failed item holds back its conversation; a dead one lets it move
		 * on, except that the rest of a failed shared_log run must still go
		 * first, in the next batch.
		 */
		if (items->private_user_id == 0 && (!dead || count > 1))
			*held = items->conversation_id;
	}
}

/* Append "user:high_watermark" for every user whose head moved (final value). */
static void
append_user_hints(FanoutBatch *b, StringInfo hints)
{
	static SPIPlanPtr plan;
	Datum		args[1];
	uint64		n;
	int			nu;

	if (hints == NULL || b->nusers == 0)
		return;
	nu = im_sort_unique_int64(b->users, b->nusers);
	im_prepare(&plan,
			   "SELECT user_id, high_watermark FROM im.user_head "
			   "WHERE user_id" EQ "ANY ($1::pg_catalog.int8[]) ORDER BY user_id",
			   1, INT8ARRAYOID);
	args[0] = im_int8_array(b->users, nu);
	n = im_exec(plan, args, NULL, 0);
	for (uint64 i = 0; i < n; i++)
	{
		if (hints->len > 0)
			appendStringInfoChar(hints, ',');
		appendStringInfo(hints, INT64_FORMAT ":" INT64_FORMAT,
						 im_get_int64(i, 1, NULL), im_get_int64(i, 2, NULL));
	}
}

/*
 * One fanout batch.  isolate_large: a large conversation gets a batch of its
 * own (the workers, where latency of small conversations matters);
 * im.run_fanout does not isolate large ones, and repeats batches, so one
 * call drains what it is given.  Suspect conversations (claim_items) get a
 * batch of their own in both.  Every item claimed is noted in *claim.
 */
static int64
fanout_batch(int max_items, StringInfo hints, bool isolate_large, ImFanoutClaim *claim)
{
	FanoutBatch b;
	int64		processed = 0;
	int64		held_conversation = 0;
	int			count;
	int			nest;

	if (max_items < 1)
		return 0;
	nest = fanout_lock_timeout_push();
	memset(&b, 0, sizeof(b));
	b.maxitems = 64;
	b.items = palloc(sizeof(FanoutItem) * b.maxitems);
	b.maxusers = 64;
	b.users = palloc(sizeof(int64) * b.maxusers);

	claim_items(&b, max_items, isolate_large, claim);
	lock_batch_heads(&b);

	for (int i = 0; i < b.nitems; i += count)
	{
		FanoutItem *it = &b.items[i];

		count = run_length(&b, i);
		/* a failed position holds back the later positions of its conversation */
		if (it->private_user_id == 0 && it->conversation_id == held_conversation)
			continue;
		deliver_run(&b, it, count, hints, &processed, &held_conversation);
	}
	append_user_hints(&b, hints);
	fanout_lock_timeout_pop(nest);
	return processed;
}

int64
im_fanout_batch(int max_items, StringInfo hints, ImFanoutClaim *claim)
{
	return fanout_batch(max_items, hints, true, claim);
}

void
im_send_hints(StringInfo hints)
{
	const char *p;
	int			len;

	if (hints == NULL || hints->len == 0)
		return;
	p = hints->data;
	len = hints->len;
	while (len > 0)
	{
		int			take = len;
		int			skip;

		/* split at the last comma within the chunk limit */
		if (take > IM_HINT_CHUNK)
		{
			take = IM_HINT_CHUNK;
			while (take > 0 && p[take] != ',')
				take--;
			if (take == 0)
				elog(ERROR, "im_sync: hint entry longer than %d bytes", IM_HINT_CHUNK);
		}
		Async_Notify("im_sync_hint", pnstrdup(p, take));
		skip = (take < len && p[take] == ',') ? 1 : 0;
		p += take + skip;
		len -= take + skip;
	}
}

/*
 * One batch of im.run_fanout in a subtransaction.  A failure outside any one
 * item rolls the batch back, and its items are backed off or charged in the
 * caller's transaction, as the workers do in a new one (contract §4); the
 * call goes on and reports it as a WARNING.  A cancel (or the caller's
 * statement_timeout) is the caller's decision and is re-thrown.
 */
static int64
run_fanout_batch(int max_items, StringInfo hints, ImFanoutClaim *claim)
{
	MemoryContext oldcontext = CurrentMemoryContext;
	ResourceOwner oldowner = CurrentResourceOwner;
	int			hints_len = hints->len;
	volatile int64 n = 0;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(oldcontext);
	PG_TRY();
	{
		n = fanout_batch(max_items, hints, false, claim);
		subxact_commit(oldcontext, oldowner);
	}
	PG_CATCH();
	{
		ErrorData  *edata = subxact_abort(oldcontext, oldowner);

		/* a cancel or statement timeout is the caller's, not the batch's */
		if (edata->sqlerrcode == ERRCODE_QUERY_CANCELED)
			ReThrowError(edata);

		hints->len = hints_len;	/* nothing of the batch was delivered */
		hints->data[hints_len] = '\0';
		im_fanout_batch_failed(claim, edata);
		ereport(WARNING,
				(errmsg("im_sync: a fanout batch of %d items failed: %s; %s", claim->n, failure_text(edata),
						items_trace("fanout", claim->traces, claim->ntraces, false)),
				 errdetail(im_fanout_error_is_transient(edata->sqlerrcode) ?
						   "The failure is transient: its items back off and are not charged an attempt." :
						   "Every item of the batch was charged an attempt.")));
		FreeErrorData(edata);
		n = 0;
	}
	PG_END_TRY();
	return n;
}

/*
 * im.run_fanout(max_items DEFAULT 10000) -> items processed.  The workers'
 * batches, one after the other until max_items items were claimed or
 * nothing is due, all in the caller's transaction.  Large conversations are
 * not isolated (one call drains what it is given); suspect ones are.  Ends:
 * every claimed item is delivered, dead, or backing off past now() (the
 * transaction's start), or waits behind one that is.
 */
PG_FUNCTION_INFO_V1(im_run_fanout);
Datum
im_run_fanout(PG_FUNCTION_ARGS)
{
	int32		max_items = im_arg_int32(fcinfo, 0, "max_items", 1, PG_INT32_MAX);
	StringInfoData hints;
	int64		processed = 0;
	int64		claimed = 0;

	initStringInfo(&hints);
	im_spi_connect();
	/* on a sharded node inbound transfers are applied first */
	im_transfer_apply(max_items);
	while (claimed < max_items)
	{
		ImFanoutClaim claim;

		im_fanout_claim_init(&claim, CurrentMemoryContext);
		processed += run_fanout_batch((int) (max_items - claimed), &hints, &claim);
		if (claim.n == 0)
			break;
		claimed += claim.n;
	}
	SPI_finish();
	im_send_hints(&hints);
	PG_RETURN_INT64(processed);
}
