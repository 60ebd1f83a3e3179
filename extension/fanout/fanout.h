/*
 * fanout.h — the bridge's cross-file API (extension/fanout/): fanout
 * batches (fanout.c), shared_log delivery (fanout_shared_log.c), the
 * background workers that run them (worker.c) and their wait on a standby
 * (recovery_wait.c).
 */
#ifndef IM_FANOUT_H
#define IM_FANOUT_H

#include "core/im_sync.h"
#include "core/im_sql.h"
#include "lib/stringinfo.h"

/*
 * the bridge from the conversation side to the user side:
 * outbox items become per-user log events (fanout.c, the only writer of
 * sync_seq) or, in shared_log mode, dirty markers (fanout_shared_log.c).
 */

/*
 * The outbox items a fanout batch claimed, kept in a memory context that
 * outlives the batch's transaction: when the batch fails outside any one
 * item, its items are charged (or backed off) afterwards (contract §4).
 */
typedef struct ImFanoutClaim
{
	MemoryContext cxt;
	int64	   *ids;
	int			n;
	int			max;
	char	  **traces;			/* the first claimed items' trace ids, for its log line */
	int			ntraces;
} ImFanoutClaim;
extern void im_fanout_claim_init(ImFanoutClaim *claim, MemoryContext cxt);
/*
 * Process at most max_items outbox items in the caller's transaction,
 * recording what it claims in *claim.  Appends "user_id:high_watermark" and
 * "c<conv>:<head>" hint entries to *hints (comma separated, may be NULL).
 * Returns items processed.  A conversation with more than 500 active
 * members, or whose head item failed before, gets a batch of its own, so
 * small conversations never wait for a large group's commit and a failing
 * conversation cannot take healthy ones down with it.
 * Must be called inside SPI_connect.
 */
extern int64 im_fanout_batch(int max_items, StringInfo hints, ImFanoutClaim *claim);
/*
 * A batch failed outside any one item: back off (transient) or charge an
 * attempt to (otherwise) every item it claimed.  Runs in a transaction
 * after the failed one, inside SPI_connect.
 */
extern void im_fanout_batch_failed(const ImFanoutClaim *claim, ErrorData *edata);
/* Send hints as NOTIFY im_sync_hint, one per <= 7000-byte chunk. */
extern void im_send_hints(StringInfo hints);

/*
 * shared_log delivery (fanout_shared_log.c), called by fanout in the
 * batch's transaction with the members' heads already locked.
 * im_shared_log_deliver fans out a run of consecutive shared_log `message`
 * positions of one conversation (dirty markers instead of inbox events,
 * coalesced per batch) and returns the users whose log head moved.
 * im_shared_log_mode_delivered runs after a `mode` event is delivered
 * (recount unread on the switch back to fanout).
 */
extern void im_shared_log_deliver(int64 conversation_id, int64 *message_ids, int nmessages,
								  StringInfo hints, int64 **users, int *nusers);
extern void im_shared_log_mode_delivered(int64 message_id);

/*
 * The tail of a statement that appends one event per user to the log: a
 * CTE `ins AS (INSERT INTO im.inbox … SELECT …` is closed by this fragment,
 * which skips an event the log already holds (the inbox key) and moves the
 * head of every user it appended to (CTE `hd`).  The caller holds the
 * heads and numbered the event head + 1.
 */
#define IM_INBOX_APPEND_TAIL_SQL \
	"  ON CONFLICT (user_id, source_event_id, delivery_scope) DO NOTHING" \
	"  RETURNING user_id, sync_seq)," \
	" hd AS (" \
	"  UPDATE im.user_head h SET high_watermark = ins.sync_seq FROM ins" \
	"  WHERE h.user_id" EQ "ins.user_id RETURNING h.user_id)"

/*
 * the fanout background workers (worker.c).
 */

/*
 * Register im_sync.fanout_workers workers; called from _PG_init while the
 * library is being preloaded.
 */
extern void im_worker_register(void);

/*
 * the fanout workers on a standby.
 *
 * A hot standby runs the same postgresql.conf as its primary, so it
 * preloads im_sync and starts the workers too (they start once the standby
 * is consistent, BgWorkerStart_ConsistentState).  In recovery every write
 * fails, so a worker that tried to fan out would log an error every
 * naptime for as long as the standby lives.  Instead it waits, read-only,
 * and starts working by itself when the standby is promoted: fanout runs on
 * the new primary without a restart (design doc §16).
 */

/*
 * For a background worker between transactions: true while the server is
 * in recovery (a standby, or a primary still replaying after a crash).
 * Logs one LOG line when this worker starts waiting and one when recovery
 * has ended and it starts working; nothing in between.
 */
extern bool im_worker_in_recovery(void);

#endif							/* IM_FANOUT_H */
