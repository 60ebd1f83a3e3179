/*
 * im_sync.h — shared declarations of the im_sync extension.
 *
 * One concept per file (see README "Code map"):
 *   im_sync.c      _PG_init: GUCs, shared memory, hooks; nothing else
 *   common.c       SPI plan cache, argument checks, SRF output, lock helpers
 *   conversation.c create/direct/join/leave/mode, conversation_list
 *   send.c         send/recall/edit: the single-writer append + outbox
 *   fanout.c       outbox -> per-user logs (the only writer of sync_seq)
 *   worker.c       fanout background workers, commit-time wake-up, hints
 *   device.c       devices, connection epochs, device tokens, audit
 *   token.c        HMAC-SHA256 signed tokens and the key ring
 *   sync.c         sync_changes, ack_sync, recovery sessions
 *   snapshot.c     begin/fetch/ack_snapshot
 *   history.c      fetch_messages (contract §1 visibility)
 *   read_state.c   report_read, delete_for_me, message_status, unread recount
 *   gc.c           gc_inbox and its fence
 *   shared_log.c   large-group dirty markers, clear_dirty
 *   reconcile.c    im.reconcile
 *   metrics.c      im.metrics
 */
#ifndef IM_SYNC_H
#define IM_SYNC_H

#include "postgres.h"
#include "fmgr.h"
#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "utils/jsonb.h"

/* SQLSTATE for idempotency-key conflicts (contract §3). */
#define ERRCODE_IM_CONFLICT MAKE_SQLSTATE('I', 'S', '4', '0', '9')

/* ---- settings (im_sync.c) ------------------------------------------- */
extern char *im_database;
extern int	im_fanout_workers;
extern bool im_fanout_paused;
extern int	im_fanout_max_attempts;
extern int	im_inbox_retention_s;
extern int	im_device_inactive_after_s;
extern int	im_recovery_max_replay;
extern int	im_recovery_ttl_s;
extern int	im_token_ttl_s;
extern int	im_snapshot_ttl_s;
extern int	im_max_batch_events;
extern int	im_max_body_bytes;
extern int	im_shared_log_min_members;
extern int	im_reconcile_outbox_age_s;

/* Maximum number of fanout workers (shared memory is sized for this). */
#define IM_MAX_FANOUT_WORKERS 32

/* ---- shared memory (worker.c) ----------------------------------------- */
extern Size im_shmem_size(void);
extern void im_shmem_init(void);
extern void im_worker_register(void);
/* Ask fanout workers to wake up once the current transaction commits. */
extern void im_wake_fanout_at_commit(void);
/* Cluster-wide counters that must survive a rollback (failed auth, …). */
typedef enum ImCounter
{
	IM_COUNTER_AUTH_FAILURES,
	IM_COUNTER_STALE_ACKS,
	IM_COUNTER_DUPLICATE_DELIVERIES,
	IM_COUNTER_RESETS,
	IM_COUNTER_GC_DELETED,
	IM_COUNTER__COUNT
} ImCounter;
extern void im_counter_add(ImCounter which, int64 delta);
extern int64 im_counter_get(ImCounter which);

/* ---- fanout (fanout.c) ------------------------------------------------ */
/*
 * Process at most max_items outbox items in the caller's transaction.
 * Appends "user_id:high_watermark" and "c<conv>:<head>" hint entries to
 * *hints (comma separated, may be NULL).  Returns items processed.
 * Must be called inside SPI_connect.
 */
extern int64 im_fanout_batch(int max_items, StringInfo hints);
/* Send hints as NOTIFY im_sync_hint, one per <= 7000-byte chunk. */
extern void im_send_hints(StringInfo hints);

/* ---- common.c --------------------------------------------------------- */

/*
 * Prepared-and-kept SPI plans.  Usage:
 *     static SPIPlanPtr plan;
 *     im_prepare(&plan, "SELECT … $1 …", 1, INT8OID);
 * The plan is prepared on first use in this backend and kept.
 */
extern SPIPlanPtr im_prepare(SPIPlanPtr *slot, const char *sql, int nargs,...);
/* Execute a kept plan; raises on SPI error; returns SPI_processed. */
extern uint64 im_exec(SPIPlanPtr plan, Datum *values, const char *nulls, long count);

/* Column getters on SPI_tuptable row `row`, column `col` (1-based). */
extern int64 im_get_int64(uint64 row, int col, bool *isnull);
extern int32 im_get_int32(uint64 row, int col, bool *isnull);
extern bool im_get_bool(uint64 row, int col, bool *isnull);
extern char *im_get_text(uint64 row, int col);	/* palloc'd in caller ctx, NULL if null */
extern Datum im_get_datum_copy(uint64 row, int col, bool *isnull); /* copied to upper ctx */

/* Argument checks: raise 22023 with a clear message. */
extern int64 im_arg_id(FunctionCallInfo fcinfo, int argno, const char *name);
extern char *im_arg_text(FunctionCallInfo fcinfo, int argno, const char *name, int max_chars);
extern char *im_arg_device_id(FunctionCallInfo fcinfo, int argno);
extern int32 im_arg_int32(FunctionCallInfo fcinfo, int argno, const char *name, int32 min, int32 max);

/* Materialized SRF output for RETURNS TABLE functions. */
extern void im_srf_begin(FunctionCallInfo fcinfo);
extern void im_srf_row(FunctionCallInfo fcinfo, Datum *values, bool *nulls);

/*
 * Lock helpers, always in the contract's lock order:
 * conversation row, then device rows, then user heads by user_id, then user
 * conversation states by (user_id, conversation_id).
 */
typedef struct ImConversation
{
	int64		conversation_id;
	char		kind[8];		/* "direct" | "group" */
	char		mode[12];		/* "fanout" | "shared_log" */
	int64		head_msg_seq;
} ImConversation;

/* SELECT … FOR UPDATE on the conversation row; P0002 when unknown. */
extern void im_lock_conversation(int64 conversation_id, ImConversation *conv);
/* Ensure user heads exist and lock them in user_id order (n may be 0). */
extern void im_lock_user_heads(int64 *user_ids, int n);

/* SQL fragment: one conversation position as contract §11 JSON, from an
 * im.event row aliased `e`. */
#define IM_EVENT_JSON_SQL \
	"pg_catalog.jsonb_build_object(" \
	"'kind', e.kind, 'conversation_id', e.conversation_id, 'msg_seq', e.msg_seq, " \
	"'message_id', e.message_id, 'sender_id', e.sender_id, " \
	"'content_type', e.content_type, 'body', e.body, " \
	"'target_message_id', e.target_message_id, 'recalled', e.recalled, " \
	"'created_at', e.created_at)"

#endif							/* IM_SYNC_H */
