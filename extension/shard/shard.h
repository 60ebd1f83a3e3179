/*
 * shard.h — several nodes' cross-file API (extension/shard/): transfers
 * out (transfer_out.c, written by fanout), in (transfer_in.c, applied by
 * the workers and im.run_fanout) and their acknowledgements
 * (transfer_ack.c); a sharded node's reconcile checks and metrics
 * (shard_reconcile.c, shard_metrics.c).  The node functions the router
 * calls (shard_node.c) export only SQL functions; placement, which every
 * layer asks, is core's (core/shard_map.h).
 */
#ifndef IM_SHARD_H
#define IM_SHARD_H

#include "postgres.h"
#include "fmgr.h"

/*
 * transfers between nodes: the destination's apply
 * (transfer_in.c), called by the workers and im.run_fanout before fanout.
 */

/*
 * Apply at most max_transfers pending inbound transfers in the caller's
 * transaction (each in its own subtransaction; a failing one is
 * quarantined).  Returns how many were applied; 0 when not sharded or
 * another applier holds the lock.  Must be called inside SPI_connect.
 */
extern int64 im_transfer_apply(int max_transfers);

/*
 * Order of inbound transfers (catalog 1.7; transfer_in.c): the single-node
 * rule of fanout, per conversation on this destination.  A transfer that
 * failed to apply is 'quarantined' with its error and retried after the
 * backoff of contract §4 (IM_*_BACKOFF_SQL); after
 * im_sync.fanout_max_attempts charged attempts it is 'dead'.  While it is
 * quarantined it holds every later transfer of its conversation on this
 * node (whichever users they carry: "later" is (msg_seq, transfer_id)
 * within the conversation, as one outbox head holds its conversation on one
 * node); a dead one holds nothing.  A quarantined transfer with no
 * next_attempt_at (judged at arrival as sent before its source's pruning
 * horizon: an operator's question, never retried by itself) holds nothing
 * either, nor does a carried receipt (source_event_id 0, user/receipt.c):
 * receipts need no order (cumulative or replacing), so a failing one is
 * retried alone and never keeps the conversation's messages from a node.
 *
 * IM_TRANSFER_HOLDERS_SQL: the quarantined transfers waiting out their
 * backoff, each with the latest pending transfer before it in its
 * conversation (pending_msg_seq, pending_transfer_id; NULLs when none).
 * IM_TRANSFER_BLOCKERS_OF_SQL(holders): per conversation, the first of
 * `holders` (a relation of those rows) with no pending transfer before it
 * (one before it may be what it missed, so it is retried right after that
 * one): the conversation's blocker.
 * IM_TRANSFERS_DUE_OF_SQL(holders, cols): the transfers an apply pass
 * takes, as rows of `cols` of im.transfer_in t: pending or retryable
 * quarantined ones, before their conversation's blocker (a carried
 * receipt, never a blocker, once its backoff is over).  An apply pass
 * reads the holders once and derives the blockers after its applies from
 * them (transfer_in.c); IM_TRANSFERS_DUE_SQL(cols) reads them itself.
 */
#define IM_TRANSFER_HOLDERS_SQL \
	"SELECT q.conversation_id, q.msg_seq, q.transfer_id," \
	"       lp.msg_seq AS pending_msg_seq, lp.transfer_id AS pending_transfer_id" \
	" FROM im.transfer_in q LEFT JOIN LATERAL (" \
	"   SELECT p.msg_seq, p.transfer_id FROM im.transfer_in p" \
	"   WHERE p.conversation_id" EQ "q.conversation_id AND p.state" EQ "'pending'" \
	"     AND (p.msg_seq, p.transfer_id)" LT "(q.msg_seq, q.transfer_id)" \
	"   ORDER BY p.msg_seq DESC, p.transfer_id DESC LIMIT 1) lp ON true" \
	" WHERE q.state" EQ "'quarantined' AND q.next_attempt_at" GT "pg_catalog.now()" \
	"   AND q.source_event_id" NE "0"
#define IM_TRANSFER_BLOCKERS_OF_SQL(holders) \
	"SELECT DISTINCT ON (h.conversation_id) h.conversation_id, h.msg_seq, h.transfer_id" \
	" FROM " holders " h WHERE h.pending_msg_seq IS NULL" \
	" ORDER BY h.conversation_id, h.msg_seq, h.transfer_id"
#define IM_TRANSFERS_DUE_OF_SQL(holders, cols) \
	"WITH blk AS (" IM_TRANSFER_BLOCKERS_OF_SQL(holders) ") " \
	"SELECT " cols " FROM im.transfer_in t LEFT JOIN blk b ON b.conversation_id" EQ "t.conversation_id " \
	"WHERE (t.state" EQ "'pending' OR (t.state" EQ "'quarantined' AND t.next_attempt_at IS NOT NULL" \
	"        AND (t.source_event_id" NE "0 OR t.next_attempt_at" LE "pg_catalog.now()))) " \
	"  AND (b.conversation_id IS NULL OR (t.msg_seq, t.transfer_id)" LT "(b.msg_seq, b.transfer_id))"
#define IM_TRANSFERS_DUE_SQL(cols) IM_TRANSFERS_DUE_OF_SQL("(" IM_TRANSFER_HOLDERS_SQL ")", cols)
/*
 * transfer_out.c: in the fanout (sub)transaction of delivered
 * position items, one transfer record per other node that places some of
 * their recipients.  Nothing on an unsharded node.
 */
extern void im_transfer_out_write(const int64 *outbox_ids, int n);

/*
 * transfer_out.c: the transfer of a delete_for_me private item whose user
 * is placed on another node (user/read_state.c's hand-off), in the item's
 * fanout subtransaction instead of a local delivery.  False when the item
 * is no such hand-off (then it is delivered here as any private item).
 */
extern bool im_transfer_out_write_deletion(int64 outbox_id);

/* transfer_ack.c: the back channel (applied records, settled and released) */
extern void im_transfer_ack_settle_stored(void);

/*
 * Trust between nodes (transfer_trust.c).  How the row an arrival trigger
 * fires for got here: replicated by a subscription's worker, inserted by a
 * session, or by a superuser session playing an apply worker
 * (session_replication_role = replica; the claimed sender is believed,
 * every other check holds).  *from: the node the subscription replicates
 * from (NULL with *why when its name does not say).
 */
typedef enum ImArrival
{
	IM_ARRIVAL_LOCAL,
	IM_ARRIVAL_SUBSCRIPTION,
	IM_ARRIVAL_PLAYED
} ImArrival;

extern ImArrival im_transfer_arrival(const char *self, const char **from, const char **why);

/*
 * The fate of a row an arrival trigger fires for, as far as it does not
 * depend on the row's kind: writer is the node the row says wrote it (a
 * transfer's source, an ack's acker), addressee the node it is for (a
 * transfer's destination, the acknowledged transfer's source).
 *   IM_ROW_OWN: this node's own row for another node (not replicated): stored;
 *   IM_ROW_FOREIGN_LOCAL: a session's row for another node: dropped unseen;
 *   IM_ROW_CHECK: delivered (or played) by *from: the kind's refusal check decides;
 *   IM_ROW_REFUSED: refused, *reason says why.
 * *via: how it got here (for im_transfer_refuse).
 */
typedef enum ImRowFate
{
	IM_ROW_OWN,
	IM_ROW_FOREIGN_LOCAL,
	IM_ROW_CHECK,
	IM_ROW_REFUSED
} ImRowFate;

extern ImRowFate im_transfer_row_fate(const char *self, const char *writer, const char *addressee,
									  ImArrival *via, const char **from, const char **reason);

/* NULL when this node takes the row in; else why not */
extern const char *im_transfer_refusal(const char *self, const char *from, const char *source,
									   const char *dest, int64 conversation_id);
extern const char *im_receipt_transfer_refusal(const char *self, const char *from, const char *source,
											   const char *dest, int64 sender_id);
extern const char *im_ack_refusal(const char *self, const char *from, const char *source,
								  const char *applied_by);

/*
 * A refused row: from a subscription a WARNING (with the trace id of the
 * row's item when known, else NULL) and an im.transfer_refused row (the
 * caller then drops the row); from a session an error.
 */
extern void im_transfer_refuse(ImArrival via, const char *kind, const char *from, const char *source,
							   const char *dest, const char *applied_by, int64 transfer_id,
							   bool has_conversation, int64 conversation_id, const char *reason,
							   const char *trace_id);

/* ERROR (the apply fails: quarantined) unless every payload row is the conversation's */
extern void im_transfer_check_payload(Datum payload, int64 conversation_id, int64 source_event_id);
extern uint64 im_transfer_ack_release(void);

/*
 * im.reconcile() and im.metrics() on a sharded node
 * (shard_reconcile.c, shard_metrics.c).
 */

/* emit the current SPI result of a single-node check, keeping this node's rows */
extern void im_shard_reconcile_rows_from_spi(FunctionCallInfo fcinfo);

/* the transfer checks; nothing on an unsharded node */
extern void im_shard_reconcile(FunctionCallInfo fcinfo);

/*
 * The queries behind the transfer rows of im.metrics() (shard_metrics.c):
 * each returns name, value, help[, type, label_key, label_value] of gauges.
 * Fills queries and returns how many; 0 on an unsharded node.
 */
#define IM_SHARD_METRIC_QUERIES 2
extern int	im_shard_metric_queries(const char *queries[IM_SHARD_METRIC_QUERIES]);

#endif							/* IM_SHARD_H */
