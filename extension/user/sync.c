/*
 * sync.c — sync_changes, ack_sync and recovery sessions (contract §5, §8.3;
 * design §7, §8, §11.1).
 *
 * Invariants protected here:
 *   - a device never skips an event: every batch serves a contiguous range
 *     (resume_from, batch_high_watermark] fixed at batch start; a range the
 *     log no longer holds answers RESET_REQUIRED, never a gap (§2.3);
 *   - a device's ACK never moves backwards and only moves within its current
 *     generation (CAS on generation and value, under the device row lock);
 *   - every reset/recovery bumps the generation, which kills every older
 *     batch token and cursor (STALE_GENERATION);
 *   - a recovery session holds a retention lease on (resume_from, …] until
 *     it completes or expires (gc.c reads it).
 *
 * Locks: the device row (FOR UPDATE), then the user's head FOR SHARE.  The
 * share lock makes the gc_floor test and the creation of a recovery lease
 * atomic with respect to gc_inbox, which advances gc_floor under FOR UPDATE
 * on the same row and computes its fence after getting it.  A cursor page
 * takes neither and writes nothing (next_page_unlocked): it changes no
 * state, and its range check reads gc_floor in the snapshot of the rows it
 * serves; when that shows a collected range it falls back to the locks.
 */
#include "core/im_sync.h"
#include "core/common.h"
#include "core/locks.h"
#include "core/shard_map.h"
#include "core/shmem.h"
#include "core/im_sql.h"
#include "core/standing.h"
#include "conversation/conversation.h"
#include "user/user.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"

/* One result row of sync_changes. */
typedef struct SyncRow
{
	const char *status;
	int32		generation;
	char	   *batch_token;	/* NULL on empty statuses */
	bool		has_range;
	int64		resume_from;
	int64		watermark;
	int64		acked;
	Datum		events;			/* jsonb, (Datum) 0 → '[]' */
	char	   *next_cursor;
	bool		has_more;
	int64		recovery_session_id;	/* 0 → NULL */
	int64		user_hw;
} SyncRow;

typedef struct UserHead
{
	int64		high_watermark;
	int64		gc_floor;
} UserHead;

static Datum
empty_events(void)
{
	return DirectFunctionCall1(jsonb_in, CStringGetDatum("[]"));
}

static void
emit_sync_row(FunctionCallInfo fcinfo, SyncRow *r)
{
	Datum		v[11];
	bool		n[11];

	memset(n, 0, sizeof(n));
	v[0] = CStringGetTextDatum(r->status);
	v[1] = Int32GetDatum(r->generation);
	if (r->batch_token)
		v[2] = CStringGetTextDatum(r->batch_token);
	else
		n[2] = true;
	v[3] = Int64GetDatum(r->resume_from);
	v[4] = Int64GetDatum(r->watermark);
	n[3] = n[4] = !r->has_range;
	v[5] = Int64GetDatum(r->acked);
	v[6] = r->events ? r->events : empty_events();
	if (r->next_cursor)
		v[7] = CStringGetTextDatum(r->next_cursor);
	else
		n[7] = true;
	v[8] = BoolGetDatum(r->has_more);
	v[9] = Int64GetDatum(r->recovery_session_id);
	n[9] = (r->recovery_session_id == 0);
	v[10] = Int64GetDatum(r->user_hw);
	im_srf_row(fcinfo, v, n);
}

/* The empty shape every non-data status has (contract §5). */
static void
set_empty(SyncRow *r, const char *status, const ImDevice *dev, int64 user_hw)
{
	memset(r, 0, sizeof(*r));
	r->status = status;
	r->generation = dev->sync_generation;
	r->acked = dev->acked_sync_seq;
	r->user_hw = user_hw;
}

static Datum
device_args(Datum *args, int64 user_id, const char *device_id)
{
	args[0] = Int64GetDatum(user_id);
	args[1] = CStringGetTextDatum(device_id);
	return (Datum) 0;
}

/*
 * The user's head under FOR SHARE (see file header).  The head exists once a
 * device is registered; create it if an older row is missing.
 */
static void
share_user_head(int64 user_id, UserHead *h)
{
	static SPIPlanPtr plan;
	Datum		args[1];

	im_prepare(&plan,
			   "SELECT high_watermark, gc_floor FROM im.user_head "
			   "WHERE user_id" EQ "$1 FOR SHARE",
			   1, INT8OID);
	args[0] = Int64GetDatum(user_id);
	if (im_exec(plan, args, NULL, 1) != 1)
	{
		im_shard_require_user(user_id);	/* no head here: is it ours? */
		im_lock_user_heads(&user_id, 1);
		h->high_watermark = 0;
		h->gc_floor = 0;
		return;
	}
	h->high_watermark = im_get_int64(0, 1, NULL);
	h->gc_floor = im_get_int64(0, 2, NULL);
}

/* Committed high watermark without a lock (for answers only). */
static int64
user_hw_now(int64 user_id)
{
	static SPIPlanPtr plan;
	Datum		args[1];

	im_prepare(&plan,
			   "SELECT high_watermark FROM im.user_head WHERE user_id" EQ "$1",
			   1, INT8OID);
	args[0] = Int64GetDatum(user_id);
	if (im_exec(plan, args, NULL, 1) != 1)
		return 0;
	return im_get_int64(0, 1, NULL);
}

/* bump + RESETTING: the device must take a snapshot. */
static void
force_reset(ImDevice *dev)
{
	im_device_end_recovery_sessions(dev->user_id, dev->device_id, "ENDED");
	im_device_bump_generation(dev, "RESETTING");
	im_counter_add(IM_COUNTER_RESETS, 1);
}

/*
 * One page: events with sync_seq in (after, watermark], at most `limit`
 * inbox rows, as contract §11 JSON in sync_seq order.  A position the user
 * deleted for itself, and an edit or recall of it, is skipped (contract §1;
 * the same rule as fetch_messages in history.c) but still consumed, so the
 * cursor moves past it.  The page also ends before the event that would
 * push its JSON text over im_sync.max_page_bytes; its first event is always
 * taken, so every page makes progress.  The statement returns the rows; the
 * jsonb is built and measured in C (event_json.c says why).  Returns the
 * jsonb (copied to the upper context) and sets *last to the last sync_seq
 * consumed and *more.
 */
/* Result columns of read_page's statement. */
enum
{
	Anum_page_sync_seq = 1,
	Anum_page_private,			/* a private event's whole object, else NULL */
	Anum_page_event,			/* the IM_EVENT_COLUMNS_SQL columns; NULL when hidden or private */
	Anum_page_gc_floor = Anum_page_event + IM_EVENT_COLUMNS,	/* the user's head, in the rows' snapshot */
	Anum_page_user_hw
};

/* What read_page saw besides the page. */
typedef struct PageSeen
{
	uint64		rows;			/* inbox rows read */
	int64		gc_floor;		/* valid when rows > 0 */
	int64		user_hw;		/* valid when rows > 0 */
} PageSeen;

#define PRIVATE_KINDS_SQL \
	"('{read_cursor,delete_for_me,conversation_dirty,receipt,conversation_pin}'::pg_catalog.text[])"

static Datum
page_col(uint64 row, int col, bool *isnull)
{
	return SPI_getbinval(SPI_tuptable->vals[row], SPI_tuptable->tupdesc, col, isnull);
}

/* The page statement of read_page, for a catalog of shape S
 * (core/version_check.h). */
#define SYNC_PAGE_SQL(S) \
	"SELECT r.sync_seq, " \
	"  CASE WHEN r.kind" EQ "ANY " PRIVATE_KINDS_SQL \
	"    THEN pg_catalog.jsonb_build_object('sync_seq', r.sync_seq, 'kind', r.kind, " \
	"           'conversation_id', r.conversation_id) " \
	"        " OP_CONCAT "COALESCE(r.payload, '{}'::pg_catalog.jsonb) END, " \
	"  " IM_EVENT_COLUMNS_SQL(S) ", " \
	"  (SELECT h.gc_floor FROM im.user_head h WHERE h.user_id" EQ "$1), " \
	"  (SELECT h.high_watermark FROM im.user_head h WHERE h.user_id" EQ "$1) " \
	"FROM (SELECT i.sync_seq, i.kind, i.conversation_id, i.source_event_id, i.payload " \
	"      FROM im.inbox i WHERE i.user_id" EQ "$1 " \
	"      AND i.sync_seq" GT "$2 AND i.sync_seq" LE "$3 " \
	"      ORDER BY i.sync_seq LIMIT $4) r " \
	"LEFT JOIN LATERAL (" \
	"  SELECT " IM_EVENT_COLUMNS_SQL(S) " " \
	"  FROM im.event e WHERE e.message_id" EQ "r.source_event_id " \
	"  AND r.kind" NE "ALL " PRIVATE_KINDS_SQL \
	"  AND (NOT EXISTS (SELECT 1 FROM im.deleted_for_me d0 WHERE d0.user_id" EQ "$1) " \
	"       OR " IM_NOT_DELETED_FOR_ME_SQL("$1") ") " \
	"  OFFSET 0) e ON true " \
	"ORDER BY r.sync_seq"

static Datum
read_page(int64 user_id, int64 after, int64 watermark, int32 limit,
		  int64 *last, bool *more, PageSeen *seen)
{
	static SPIPlanPtr plans[IM_SHAPES];
	SPIPlanPtr	p;
	Datum		args[4];
	ImEventPage page;
	uint64		nrows;
	uint64		taken = 0;

	/*
	 * The event is looked up row by row (OFFSET 0 keeps the lateral
	 * subquery from becoming a join the planner might hash over the whole
	 * event table), so a page costs the same however long the log is.  The
	 * deleted_for_me test runs only for a user who has deleted something
	 * (an InitPlan, once per page).  The user's gc_floor and high watermark
	 * come from the same snapshot as the rows (InitPlans too), so a caller
	 * that holds no lock on the head can tell whether gc_inbox, which moves
	 * gc_floor in the transaction that deletes, took rows of the range.
	 */
	p = IM_PREPARE_SHAPED(plans, SYNC_PAGE_SQL, 4, INT8OID, INT8OID, INT8OID, INT4OID);
	args[0] = Int64GetDatum(user_id);
	args[1] = Int64GetDatum(after);
	args[2] = Int64GetDatum(watermark);
	args[3] = Int32GetDatum(limit);
	nrows = im_exec(p, args, NULL, 0);
	seen->rows = nrows;
	if (nrows > 0)
	{
		seen->gc_floor = im_get_int64(0, Anum_page_gc_floor, NULL);
		seen->user_hw = im_get_int64(0, Anum_page_user_hw, NULL);
	}

	*last = after;
	im_event_page_begin(&page);
	for (uint64 row = 0; row < nrows; row++)
	{
		bool		isnull;
		Datum		private = page_col(row, Anum_page_private, &isnull);
		Jsonb	   *element = isnull ? NULL : DatumGetJsonbP(private);
		ImEventRow	ev;
		ImEventJson ej;
		bool		visible = element != NULL || im_event_row_read(row, Anum_page_event, &ev);
		int64		sync_seq = im_get_int64(row, Anum_page_sync_seq, NULL);
		int64		own = 0;

		if (element)
			own = im_jsonb_text_bytes(&page, element);
		else if (visible)
		{
			ev.has_sync_seq = true;
			ev.sync_seq = sync_seq;
			im_event_json_make(&page, &ev, &ej);
			own = ej.text_bytes;
		}
		/* a hidden row costs no bytes; the first visible one always fits */
		if (page.text_bytes != 0 &&
			(visible ? im_event_page_bytes_with(&page, own) : page.text_bytes) >
			(int64) im_max_page_bytes)
			break;
		if (element)
			im_event_page_add_jsonb(&page, element, own);
		else if (visible)
			im_event_page_add_event(&page, &ej);
		*last = sync_seq;
		taken++;
	}
	/*
	 * Cut by bytes: the rows left out are <= the watermark, so more remain.
	 * Otherwise the log is gap-free in (gc_floor, high watermark]: a full
	 * page that stopped below the watermark has more behind it.
	 */
	*more = taken < nrows || (nrows == (uint64) limit && *last < watermark);
	return SPI_datumTransfer(JsonbPGetDatum(im_event_page_finish(&page)), false, -1);
}

/*
 * Fill r with a data page of the batch described by c (purpose B claims)
 * starting after `after`, plus a cursor when more remains.
 *
 * `locked`: the caller holds the device row and the user's head FOR SHARE
 * and has checked gc_floor; `user_hw` is the high watermark it read under
 * that lock, which is the committed value until this transaction ends.
 * Without the locks (a cursor page) the page is served only if the rows'
 * snapshot shows the range intact: rows were read and gc_floor <= `after`.
 * Otherwise nothing is filled and false is returned; the caller takes the
 * locks and decides (RESET_REQUIRED when the rest of the batch is gone).
 */
static bool
serve_page(MemoryContext upper, SyncRow *r, const ImTokenClaims *batch,
		   int64 after, int32 limit, const char *status, int64 acked,
		   bool locked, int64 user_hw)
{
	ImTokenClaims claims[2];
	char	   *tokens[2];
	int64		last;
	bool		more;
	PageSeen	seen;
	Datum		events;
	MemoryContext old;

	events = read_page(batch->user_id, after, batch->watermark, limit,
					   &last, &more, &seen);
	if (!locked)
	{
		if (seen.rows == 0 || seen.gc_floor > after)
			return false;
		user_hw = seen.user_hw;
	}
	memset(r, 0, sizeof(*r));
	r->status = status;
	r->generation = batch->sync_generation;
	r->has_range = true;
	r->resume_from = batch->resume_from;
	r->watermark = batch->watermark;
	r->acked = acked;
	r->recovery_session_id = batch->recovery_session_id;
	r->events = events;
	r->has_more = more;
	claims[0] = *batch;
	if (more)
	{
		/* A cursor is the batch plus its position; it expires with it. */
		claims[1] = *batch;
		claims[1].purpose = IM_TOKEN_CURSOR;
		claims[1].position = last;
	}
	/* one key read for both; in `upper` so they survive SPI_finish */
	old = MemoryContextSwitchTo(upper);
	im_token_sign_several(claims, more ? 2 : 1, tokens);
	MemoryContextSwitchTo(old);
	r->batch_token = tokens[0];
	r->next_cursor = more ? tokens[1] : NULL;
	r->user_hw = user_hw;
	return true;
}

static void
make_batch_claims(ImTokenClaims *c, const ImDevice *dev, int64 resume_from,
				  int64 watermark, int64 session_id, TimestampTz session_expires)
{
	TimestampTz now = GetCurrentTimestamp();

	memset(c, 0, sizeof(*c));
	c->purpose = IM_TOKEN_BATCH;
	c->user_id = dev->user_id;
	strlcpy(c->device_id, dev->device_id, sizeof(c->device_id));
	c->registration = dev->registration;
	c->sync_generation = dev->sync_generation;
	c->resume_from = resume_from;
	c->watermark = watermark;
	c->recovery_session_id = session_id;
	c->issued_at = now;
	c->expires_at = now + (int64) im_token_ttl_s * USECS_PER_SEC;
	/* tokens and cursors expire no later than their recovery session */
	if (session_id != 0 && session_expires < c->expires_at)
		c->expires_at = session_expires;
}

/* The device's ACTIVE recovery session, if any. */
typedef struct RecoverySession
{
	int64		id;
	int32		generation;
	int64		resume_from;
	int64		watermark;
	TimestampTz expires_at;
} RecoverySession;

/* Result columns of active_session. */
enum
{
	Anum_session_id = 1,
	Anum_session_generation,
	Anum_session_resume_from,
	Anum_session_watermark,
	Anum_session_expires_at
};

static bool
active_session(int64 user_id, const char *device_id, RecoverySession *s)
{
	static SPIPlanPtr plan;
	Datum		args[2];
	bool		isnull;

	im_prepare(&plan,
			   "SELECT recovery_session_id, sync_generation, resume_from, batch_high_watermark, expires_at "
			   "FROM im.recovery_session WHERE user_id" EQ "$1 "
			   "AND device_id" EQ "$2 AND state" EQ "'ACTIVE' "
			   "ORDER BY recovery_session_id DESC LIMIT 1",
			   2, INT8OID, TEXTOID);
	device_args(args, user_id, device_id);
	if (im_exec(plan, args, NULL, 1) != 1)
		return false;
	s->id = im_get_int64(0, Anum_session_id, NULL);
	s->generation = im_get_int32(0, Anum_session_generation, NULL);
	s->resume_from = im_get_int64(0, Anum_session_resume_from, NULL);
	s->watermark = im_get_int64(0, Anum_session_watermark, NULL);
	s->expires_at = DatumGetTimestampTz(SPI_getbinval(SPI_tuptable->vals[0],
													  SPI_tuptable->tupdesc, Anum_session_expires_at,
													  &isnull));
	return true;
}

static void
new_session(const ImDevice *dev, int64 resume_from, int64 watermark, RecoverySession *s)
{
	static SPIPlanPtr plan;
	Datum		args[6];
	bool		isnull;

	im_prepare(&plan,
			   "INSERT INTO im.recovery_session (user_id, device_id, sync_generation, resume_from, "
			   "  batch_high_watermark, expires_at) "
			   "VALUES ($1, $2, $3, $4, $5, pg_catalog.now()" PLUS
			   "        pg_catalog.make_interval(secs => $6)) "
			   "RETURNING recovery_session_id, expires_at",
			   6, INT8OID, TEXTOID, INT4OID, INT8OID, INT8OID, FLOAT8OID);
	device_args(args, dev->user_id, dev->device_id);
	args[2] = Int32GetDatum(dev->sync_generation);
	args[3] = Int64GetDatum(resume_from);
	args[4] = Int64GetDatum(watermark);
	args[5] = Float8GetDatum((double) im_recovery_ttl_s);
	im_exec(plan, args, NULL, 0);
	s->id = im_get_int64(0, 1, NULL);
	s->generation = dev->sync_generation;
	s->resume_from = resume_from;
	s->watermark = watermark;
	s->expires_at = DatumGetTimestampTz(SPI_getbinval(SPI_tuptable->vals[0],
													  SPI_tuptable->tupdesc, 2, &isnull));
}

/* Start of a batch: the nine rules of contract §5, first match decides. */
static void
start_batch(MemoryContext upper, SyncRow *r, ImDevice *dev, bool cg_null, int32 cg,
			int64 la, int32 limit)
{
	UserHead	head;
	RecoverySession s;
	ImTokenClaims c;
	bool		same_gen = !cg_null && cg == dev->sync_generation;
	int64		ack = dev->acked_sync_seq;

	/* 1 */
	if (strcmp(dev->state, "REVOKED") == 0)
	{
		set_empty(r, "DEVICE_REVOKED", dev, user_hw_now(dev->user_id));
		return;
	}
	im_device_touch(dev->user_id, dev->device_id);
	share_user_head(dev->user_id, &head);

	/* 2: the snapshot call bumps */
	if (strcmp(dev->state, "NEW") == 0 || strcmp(dev->state, "RESETTING") == 0)
	{
		set_empty(r, "RESET_REQUIRED", dev, head.high_watermark);
		return;
	}
	if (strcmp(dev->state, "RECOVERING") == 0)
	{
		bool		have = active_session(dev->user_id, dev->device_id, &s);

		/* 3: lease ran out (or lost): the replay range is no longer held */
		if (!have || s.generation != dev->sync_generation ||
			GetCurrentTimestamp() >= s.expires_at)
		{
			im_device_end_recovery_sessions(dev->user_id, dev->device_id, "EXPIRED");
			im_device_bump_generation(dev, "RESETTING");
			im_counter_add(IM_COUNTER_RESETS, 1);
			set_empty(r, "RESET_REQUIRED", dev, head.high_watermark);
			return;
		}
		/* 4: the same session batch again */
		if (same_gen && la >= s.resume_from)
		{
			make_batch_claims(&c, dev, s.resume_from, s.watermark, s.id, s.expires_at);
			(void) serve_page(upper, r, &c, s.resume_from, limit, "RECOVERY", ack,
							 true, head.high_watermark);
			return;
		}
	}
	else if (strcmp(dev->state, "ACTIVE") == 0 && same_gen && la >= ack)
	{
		/* 5: ahead of anything ever issued: corrupt cursor */
		/* 6: server ACK older than the retained log */
		if (la > dev->issued_sync_seq || ack < head.gc_floor)
		{
			force_reset(dev);
			set_empty(r, "RESET_REQUIRED", dev, head.high_watermark);
			return;
		}
		/* 7 */
		{
			int64		wm = Min(head.high_watermark, ack + (int64) im_max_batch_events);

			im_device_note_issued(dev, wm);
			make_batch_claims(&c, dev, ack, wm, 0, 0);
			(void) serve_page(upper, r, &c, ack, limit, "OK", ack, true, head.high_watermark);
			return;
		}
	}

	/* 8: rollback, reinstall, other generation — replay if the log holds it */
	if (head.gc_floor <= la && ack - la <= (int64) im_recovery_max_replay &&
		la <= dev->issued_sync_seq)
	{
		int64		wm = Min(head.high_watermark, la + (int64) im_max_batch_events);

		wm = Max(wm, ack);
		im_device_end_recovery_sessions(dev->user_id, dev->device_id, "ENDED");
		im_device_bump_generation(dev, "RECOVERING");
		new_session(dev, la, wm, &s);
		im_device_note_issued(dev, wm);
		make_batch_claims(&c, dev, la, wm, s.id, s.expires_at);
		(void) serve_page(upper, r, &c, la, limit, "RECOVERY", ack, true,
						 head.high_watermark);
		return;
	}

	/* 9 */
	force_reset(dev);
	set_empty(r, "RESET_REQUIRED", dev, head.high_watermark);
}

/*
 * A continuation page (contract §5: only the cursor counts) under the
 * device lock and the head's share lock: the path of a page whose range
 * may have been collected.
 */
static void
next_page(MemoryContext upper, SyncRow *r, ImDevice *dev, int64 user_id,
		  const char *cursor, int32 limit)
{
	ImTokenClaims c;
	const char *fail = im_token_check(cursor, IM_TOKEN_CURSOR, user_id, dev,
									  IM_EARLIER_REGISTRATION_STALE, &c);
	UserHead	head;

	if (fail)
	{
		set_empty(r, fail, dev, user_hw_now(user_id));
		return;
	}
	im_device_touch(dev->user_id, dev->device_id);
	share_user_head(user_id, &head);
	/* The rest of the batch was collected (device left behind): never a gap. */
	if (head.gc_floor > c.position)
	{
		force_reset(dev);
		set_empty(r, "RESET_REQUIRED", dev, head.high_watermark);
		return;
	}
	{
		int64		after = c.position;

		c.purpose = IM_TOKEN_BATCH;
		c.position = 0;
		(void) serve_page(upper, r, &c, after, limit,
						  c.recovery_session_id ? "RECOVERY" : "OK", dev->acked_sync_seq,
						  true, head.high_watermark);
	}
}

/*
 * A continuation page that writes nothing, so its commit waits for no WAL
 * flush: the device row is read without a lock and the page is served as of
 * that read (a reset, revocation or ACK committing meanwhile orders after
 * this call; the tokens it returns then fail like any older token).  The
 * cursor's range is immutable until gc_inbox collects it, which read_page's
 * snapshot shows; only then are the locks taken (next_page decides).  A
 * failed token is answered from the same unlocked read, writing nothing.
 * Returns false when the caller must take the locks and use next_page.
 */
static bool
next_page_unlocked(MemoryContext upper, SyncRow *r, int64 user_id, const char *device_id,
				   const char *cursor, int32 limit)
{
	ImDevice	dev;
	ImTokenClaims c;
	const char *fail;
	int64		after;

	im_read_device(user_id, device_id, &dev);
	fail = im_token_check(cursor, IM_TOKEN_CURSOR, user_id, &dev,
						  IM_EARLIER_REGISTRATION_STALE, &c);
	if (fail)
	{
		set_empty(r, fail, &dev, user_hw_now(user_id));
		return true;
	}
	after = c.position;
	c.purpose = IM_TOKEN_BATCH;
	c.position = 0;
	if (!serve_page(upper, r, &c, after, limit,
					c.recovery_session_id ? "RECOVERY" : "OK", dev.acked_sync_seq,
					false, 0))
		return false;
	/* the GC fence's inactivity rule reads last_seen_at (30 days) */
	im_device_touch_coarse(user_id, device_id);
	return true;
}

IM_SENSITIVE_FUNCTION(im_sync_changes)
{
	MemoryContext upper = CurrentMemoryContext;
	int64		user_id = im_arg_user_id(fcinfo, 0, "user_id");
	char	   *device_id = im_arg_device_id(fcinfo, 1);
	int32		limit = im_arg_int32(fcinfo, 4, "page_limit", 1, 10000);
	int64		la = 0;
	ImDevice	dev;
	SyncRow		r;

	if (!PG_ARGISNULL(3))
	{
		la = PG_GETARG_INT64(3);
		if (la < 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("local_applied_sync_seq must not be negative, got " INT64_FORMAT, la),
					 errhint("Pass NULL or 0 for a device that has applied nothing.")));
	}

	im_srf_begin(fcinfo);
	im_spi_connect();
	im_user_check_standing(user_id);	/* IS403 for a suspended account (contract §17) */
	if (PG_ARGISNULL(5))
	{
		im_lock_device(user_id, device_id, &dev);
		start_batch(upper, &r, &dev, PG_ARGISNULL(2), PG_ARGISNULL(2) ? 0 : PG_GETARG_INT32(2),
					la, limit);
	}
	else
	{
		char	   *cursor = text_to_cstring(PG_GETARG_TEXT_PP(5));

		if (!next_page_unlocked(upper, &r, user_id, device_id, cursor, limit))
		{
			im_lock_device(user_id, device_id, &dev);
			next_page(upper, &r, &dev, user_id, cursor, limit);
		}
	}
	SPI_finish();
	emit_sync_row(fcinfo, &r);
	return (Datum) 0;
}

static void
emit_ack(FunctionCallInfo fcinfo, const char *status, int64 acked)
{
	Datum		v[2];
	bool		n[2] = {false, false};

	v[0] = CStringGetTextDatum(status);
	v[1] = Int64GetDatum(acked);
	im_srf_row(fcinfo, v, n);
}

/*
 * Recovery batch ACK: below the watermark changes nothing; the full
 * watermark completes the session (CAS on id, state and generation), makes
 * the device ACTIVE and its ACK max(ACK, watermark).
 */
static const char *
ack_recovery(const ImTokenClaims *c, ImDevice *dev, int64 ack_seq)
{
	static SPIPlanPtr sel;
	static SPIPlanPtr done;
	static SPIPlanPtr activate;
	Datum		args[4];
	char	   *state;

	im_prepare(&sel,
			   "SELECT state FROM im.recovery_session "
			   "WHERE recovery_session_id" EQ "$1",
			   1, INT8OID);
	args[0] = Int64GetDatum(c->recovery_session_id);
	if (im_exec(sel, args, NULL, 1) != 1)
		return "RESET_REQUIRED";
	state = im_get_text(0, 1);
	if (strcmp(state, "COMPLETED") == 0)
		return "OK";
	if (strcmp(state, "ACTIVE") != 0)
		return "RESET_REQUIRED";
	if (ack_seq < c->watermark)
		return "OK";

	im_prepare(&done,
			   "UPDATE im.recovery_session SET state = 'COMPLETED', ended_at = pg_catalog.now() "
			   "WHERE recovery_session_id" EQ "$1 "
			   "AND state" EQ "'ACTIVE' AND sync_generation" EQ "$2",
			   2, INT8OID, INT4OID);
	args[0] = Int64GetDatum(c->recovery_session_id);
	args[1] = Int32GetDatum(c->sync_generation);
	if (im_exec(done, args, NULL, 0) != 1)
		return "OK";			/* lost the race to an identical ACK: it completed */

	im_prepare(&activate,
			   "UPDATE im.device SET state = 'ACTIVE', "
			   "  acked_sync_seq = GREATEST(acked_sync_seq, $4), "
			   "  acked_at = pg_catalog.now(), last_seen_at = pg_catalog.now() "
			   "WHERE user_id" EQ "$1 AND device_id" EQ "$2 "
			   "AND sync_generation" EQ "$3 AND state" EQ "'RECOVERING' "
			   "RETURNING acked_sync_seq",
			   4, INT8OID, TEXTOID, INT4OID, INT8OID);
	device_args(args, dev->user_id, dev->device_id);
	args[2] = Int32GetDatum(c->sync_generation);
	args[3] = Int64GetDatum(c->watermark);
	if (im_exec(activate, args, NULL, 0) == 1)
	{
		int64		before = dev->acked_sync_seq;

		dev->acked_sync_seq = im_get_int64(0, 1, NULL);
		strlcpy(dev->state, "ACTIVE", sizeof(dev->state));
		/* the recovery batch's ACK covers up to its watermark: receipts (receipt.c) */
		im_receipt_note(dev->user_id, 0, before, dev->acked_sync_seq);
	}
	return "OK";
}

/*
 * ack_sync (§8.3): the ACK only moves forward, only in the token's
 * generation, never beyond the token's watermark.
 */
IM_SENSITIVE_FUNCTION(im_ack_sync)
{
	static SPIPlanPtr cas;
	int64		user_id = im_arg_user_id(fcinfo, 0, "user_id");
	char	   *device_id = im_arg_device_id(fcinfo, 1);
	int64		ack_seq;
	ImDevice	dev;
	ImTokenClaims c;
	const char *status;
	Datum		args[5];

	if (PG_ARGISNULL(3) || PG_GETARG_INT64(3) < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ack_seq must be a non-negative sync_seq"),
				 errhint("Acknowledge the highest sync_seq the device has applied.")));
	ack_seq = PG_GETARG_INT64(3);

	im_srf_begin(fcinfo);
	im_spi_connect();
	im_user_check_standing(user_id);	/* IS403 for a suspended account (contract §17) */
	/* Device row lock: concurrent ACKs of one device are applied one by one. */
	im_lock_device(user_id, device_id, &dev);
	if (PG_ARGISNULL(2))
		status = "INVALID_TOKEN";
	else
		status = im_token_check(text_to_cstring(PG_GETARG_TEXT_PP(2)), IM_TOKEN_BATCH,
								user_id, &dev, IM_EARLIER_REGISTRATION_STALE, &c);
	if (status != NULL)
	{
		if (strcmp(status, "STALE_GENERATION") == 0)
			im_counter_add(IM_COUNTER_STALE_ACKS, 1);
	}
	else if (ack_seq > c.watermark)
		status = "BEYOND_WATERMARK";
	else if (c.recovery_session_id != 0)
		status = ack_recovery(&c, &dev, ack_seq);
	else
	{
		/* §8.3 monotone CAS: never backwards, only in this generation */
		im_prepare(&cas,
				   "UPDATE im.device SET acked_sync_seq = $4, acked_at = pg_catalog.now(), "
				   "  last_seen_at = pg_catalog.now() "
				   "WHERE user_id" EQ "$1 AND device_id" EQ "$2 "
				   "AND sync_generation" EQ "$3 AND state" EQ "'ACTIVE' "
				   "AND acked_sync_seq" LT "$4 "
				   "RETURNING acked_sync_seq",
				   4, INT8OID, TEXTOID, INT4OID, INT8OID);
		device_args(args, user_id, device_id);
		args[2] = Int32GetDatum(c.sync_generation);
		args[3] = Int64GetDatum(ack_seq);
		if (im_exec(cas, args, NULL, 0) == 1)
		{
			int64		before = dev.acked_sync_seq;

			dev.acked_sync_seq = im_get_int64(0, 1, NULL);
			/* the ACK moved: one queued row for the receipts (receipt.c) */
			im_receipt_note(user_id, 0, before, dev.acked_sync_seq);
		}
		status = "OK";
	}
	if (strcmp(status, "DEVICE_REVOKED") != 0)
		im_device_touch(user_id, device_id);
	SPI_finish();
	emit_ack(fcinfo, status, dev.acked_sync_seq);
	return (Datum) 0;
}
