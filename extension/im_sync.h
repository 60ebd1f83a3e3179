/*
 * im_sync.h — shared declarations of the im_sync extension.
 *
 * One concept per file (see README "Code map"):
 *   im_sync.c      _PG_init: GUCs, shared memory, hooks; nothing else
 *   common.c       SPI plan cache, argument checks, SRF output, lock helpers
 *   conversation.c create/direct/join/leave/mode, conversation_list
 *   append.c       the single-writer append of a position + its outbox item
 *   send.c         send/recall/edit
 *   fanout.c       outbox -> per-user logs (the only writer of sync_seq)
 *   fanout_shared_log.c  fanout of shared_log groups: dirty markers
 *   shmem.c        shared memory: worker latches, commit-time wake-up, counters
 *   worker.c       fanout background workers: registration and loop
 *   device.c       devices, connection epochs, device tokens, audit
 *   token.c        HMAC-SHA256 signed tokens and the key ring
 *   sync.c         sync_changes, ack_sync, recovery sessions
 *   snapshot.c     begin/fetch/ack_snapshot
 *   history.c      fetch_messages (contract §1 visibility)
 *   read_state.c   report_read, delete_for_me, message_status, clear_dirty
 *   gc.c           gc_inbox and its fence, in chunks
 *   maintenance.c  retention of done/expired rows; what maintenance runs
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
#include "utils/timestamp.h"

/* SQLSTATE for idempotency-key conflicts (contract §3). */
#define ERRCODE_IM_CONFLICT MAKE_SQLSTATE('I', 'S', '4', '0', '9')

/* ---- settings (im_sync.c) ------------------------------------------- */
extern char *im_database;
extern int	im_fanout_workers;
extern bool im_fanout_paused;
extern int	im_fanout_max_attempts;
extern int	im_fanout_lock_timeout_ms;
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
extern int	im_max_page_bytes;
extern int	im_token_key_max_age_s;
extern int	im_audit_retention_s;
extern int	im_maintenance_interval_s;

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

/* SPI_connect; raises when it fails.  Pair with SPI_finish. */
extern void im_spi_connect(void);

/* Column getters on SPI_tuptable row `row`, column `col` (1-based). */
extern int64 im_get_int64(uint64 row, int col, bool *isnull);
extern int32 im_get_int32(uint64 row, int col, bool *isnull);
extern bool im_get_bool(uint64 row, int col, bool *isnull);
extern char *im_get_text(uint64 row, int col);	/* palloc'd in caller ctx, NULL if null */
extern Datum im_get_datum_copy(uint64 row, int col, bool *isnull); /* copied to upper ctx */

/* Argument checks: raise 22023 with a clear message. */
extern int64 im_arg_id(FunctionCallInfo fcinfo, int argno, const char *name);
extern char *im_arg_text(FunctionCallInfo fcinfo, int argno, const char *name, int max_chars);
/* User ids: 1..2^53-1 (contract §1), else 22023. */
#define IM_MAX_SAFE_INTEGER INT64CONST(9007199254740991)
#define IM_MAX_USER_ID IM_MAX_SAFE_INTEGER
extern void im_check_user_id(int64 v, const char *name);
extern int64 im_arg_user_id(FunctionCallInfo fcinfo, int argno, const char *name);

extern char *im_arg_device_id(FunctionCallInfo fcinfo, int argno);
extern int32 im_arg_int32(FunctionCallInfo fcinfo, int argno, const char *name, int32 min, int32 max);

/*
 * API functions whose arguments carry a message body or a token: every error
 * they raise (also inside SPI) leaves the statement and context out of the
 * server log (im_call_hiding_statement).  Use instead of PG_FUNCTION_INFO_V1:
 *     IM_SENSITIVE_FUNCTION(im_send_message)
 *     { …the function body, with fcinfo… }
 */
extern Datum im_call_hiding_statement(PGFunction fn, FunctionCallInfo fcinfo);
#define IM_SENSITIVE_FUNCTION(name) \
	static Datum name##_body(PG_FUNCTION_ARGS); \
	PG_FUNCTION_INFO_V1(name); \
	Datum name(PG_FUNCTION_ARGS) { return im_call_hiding_statement(name##_body, fcinfo); } \
	static Datum name##_body(PG_FUNCTION_ARGS)

/* int8[] Datum (palloc'd in the current context) from n ids; n may be 0. */
extern Datum im_int8_array(const int64 *ids, int n);

/* Materialized SRF output for RETURNS TABLE functions. */
extern void im_srf_begin(FunctionCallInfo fcinfo);
extern void im_srf_row(FunctionCallInfo fcinfo, Datum *values, bool *nulls);
/* One output row per row of the last SPI result, its first ncols columns. */
extern void im_srf_rows_from_spi(FunctionCallInfo fcinfo, int ncols);

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

/*
 * Read the conversation row without locking it; P0002 when unknown.  conv
 * may be NULL when only existence matters.
 */
extern void im_require_conversation(int64 conversation_id, ImConversation *conv);
/* SELECT … FOR UPDATE on the conversation row; P0002 when unknown. */
extern void im_lock_conversation(int64 conversation_id, ImConversation *conv);
/* 42501 unless the user ever had a period in the conversation. */
extern void im_require_ever_member(int64 user_id, int64 conversation_id, const char *detail);
/* Sort and deduplicate in place; returns the new count. */
extern int	im_sort_unique_int64(int64 *v, int n);
/*
 * Ensure user heads exist and lock them in user_id order (n may be 0).
 * Sorts and deduplicates user_ids in place.
 */
extern void im_lock_user_heads(int64 *user_ids, int n);

/* ---- read state (read_state.c) ---------------------------------------- */
/*
 * Record a private event of user_id (kind "read_cursor" with read_msg_seq,
 * or "delete_for_me" with message_id; the unused one 0) and its outbox item
 * (msg_seq NULL, private_user_id set) in the caller's transaction, and ask
 * the workers to wake at commit.  Fanout alone assigns its sync_seq.  The
 * caller holds the user's head lock.  Returns the private_event_id.
 */
extern int64 im_enqueue_private_event(int64 user_id, int64 conversation_id,
									  const char *kind, int64 read_msg_seq,
									  int64 message_id);

/*
 * SQL predicate of contract §1: position e (an im.event row aliased `e`) is
 * not deleted for the user `user` (an SQL expression), neither the message
 * itself nor, for a recall or edit, its target (an edit would bring the
 * deleted text back).  The read paths (history, sync, message_status) use it.
 */
#define IM_NOT_DELETED_FOR_ME_SQL(user) \
	"NOT EXISTS (SELECT 1 FROM im.deleted_for_me d " \
	"         WHERE d.user_id OPERATOR(pg_catalog.=) " user " " \
	"           AND (d.message_id OPERATOR(pg_catalog.=) e.message_id " \
	"                OR d.message_id OPERATOR(pg_catalog.=) e.target_message_id))"

/*
 * Page size in bytes (im_sync.max_page_bytes): the JSON text of a jsonb
 * array of n elements is "[" e1 ", " e2 … "]", i.e. the sum over its
 * elements of (octet_length(element text) + 2).  A window sum of
 * IM_PAGE_BYTES_SQL(x) over the rows in page order, compared with the
 * setting, ends a page before the element that would push it over.
 */
#define IM_PAGE_BYTES_SQL(x) \
	"(pg_catalog.octet_length((" x ")::pg_catalog.text) OPERATOR(pg_catalog.+) 2)"

/* SQL fragment: one conversation position as contract §11 JSON, from an
 * im.event row aliased `e`. */
#define IM_EVENT_JSON_SQL \
	"pg_catalog.jsonb_build_object(" \
	"'kind', e.kind, 'conversation_id', e.conversation_id, 'msg_seq', e.msg_seq, " \
	"'message_id', e.message_id, 'sender_id', e.sender_id, " \
	"'content_type', e.content_type, 'body', e.body, " \
	"'target_message_id', e.target_message_id, 'recalled', e.recalled, " \
	"'created_at', e.created_at)"


/*
 * Unread recount of contract §3 for fanout conversations: $1 user_id,
 * $2 conversation_id, $3 read_msg_seq.  Counts `message` positions from
 * other senders whose outbox item is processed (an item is written with its
 * event and collected only after processing, so a missing item counts as
 * processed), visible to the user by a
 * membership period, not recalled by a processed recall, not deleted for
 * the user, above the read cursor.  Fanout keeps unread_count equal to this
 * by increments; report_read/delete_for_me/reconcile use it directly.
 */
#define IM_UNREAD_RECOUNT_SQL \
	"SELECT pg_catalog.count(*) FROM im.event e " \
	"WHERE e.conversation_id OPERATOR(pg_catalog.=) $2 AND e.kind OPERATOR(pg_catalog.=) 'message' " \
	"  AND e.msg_seq OPERATOR(pg_catalog.>) $3 " \
	"  AND e.sender_id OPERATOR(pg_catalog.<>) $1 " \
	"  AND NOT EXISTS (SELECT 1 FROM im.outbox o WHERE o.source_event_id OPERATOR(pg_catalog.=) e.message_id " \
	"              AND o.state OPERATOR(pg_catalog.<>) 'done') " \
	"  AND EXISTS (SELECT 1 FROM im.membership_period p WHERE p.conversation_id OPERATOR(pg_catalog.=) e.conversation_id " \
	"              AND p.user_id OPERATOR(pg_catalog.=) $1 AND p.join_seq OPERATOR(pg_catalog.<=) e.msg_seq " \
	"              AND (p.leave_seq IS NULL OR p.leave_seq OPERATOR(pg_catalog.>=) e.msg_seq)) " \
	"  AND NOT EXISTS (SELECT 1 FROM im.event r WHERE r.target_message_id OPERATOR(pg_catalog.=) e.message_id " \
	"              AND r.kind OPERATOR(pg_catalog.=) 'recall' " \
	"              AND NOT EXISTS (SELECT 1 FROM im.outbox ro WHERE ro.source_event_id OPERATOR(pg_catalog.=) r.message_id " \
	"                              AND ro.state OPERATOR(pg_catalog.<>) 'done')) " \
	"  AND NOT EXISTS (SELECT 1 FROM im.deleted_for_me d WHERE d.user_id OPERATOR(pg_catalog.=) $1 " \
	"              AND d.message_id OPERATOR(pg_catalog.=) e.message_id)"

/* ---- maintenance (gc.c, maintenance.c) -------------------------------- */
/*
 * One chunk of inbox GC in the caller's transaction: at most max_users
 * users (<= 0: all) after the stored cursor, wrapping around.  Emits rows
 * into fcinfo's tuplestore when fcinfo is not NULL.  Returns true when the
 * chunk ended a round of all users (or wrapped to start the next).
 */
extern bool im_gc_inbox_chunk(int max_users, FunctionCallInfo fcinfo);
/* Key ring and retention (everything but inbox GC), caller's transaction. */
extern void im_maintain(void);
/* emit_log_hook (device.c): keeps per-failure auth errors out of the server log. */
extern void im_auth_log_hook_install(void);

#endif							/* IM_SYNC_H */
