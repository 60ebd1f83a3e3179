/*
 * common.h — helpers every API file uses (common.c): kept SPI plans and
 * column getters, argument checks, SRF output, arrays.  The lock helpers are
 * core/locks.h's.
 */
#ifndef IM_COMMON_H
#define IM_COMMON_H

#include "core/im_sync.h"

#include "executor/spi.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"


/*
 * Prepared-and-kept SPI plans.  Usage:
 *     static SPIPlanPtr plan;
 *     im_prepare(&plan, "SELECT … $1 …", 1, INT8OID);
 * The plan is prepared on first use in this backend and kept.
 */
extern SPIPlanPtr im_prepare(SPIPlanPtr *slot, const char *sql, int nargs,...);
/* Execute a kept plan; raises on SPI error; returns SPI_processed. */
extern uint64 im_exec(SPIPlanPtr plan, Datum *values, const char *nulls, long count);

/*
 * SPI_connect; raises when it fails.  Pair with SPI_finish.  Refuses (42501)
 * a superuser current user over tables a non-superuser owns (worker_owner.h).
 */
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
 * The trailing trace_id argument of a write (contract §21): NULL when the
 * call has no such argument (an older catalog's signature) or passes NULL;
 * otherwise 1..IM_MAX_TRACE_ID characters of [A-Za-z0-9_-], else 22023
 * (the value itself is never echoed: it is caller input).  Checked in C,
 * byte by byte: it runs on every send.
 */
#include "im_sync/trace_id.h"
#define IM_MAX_TRACE_ID IM_TRACE_ID_MAX
extern char *im_arg_trace_id(FunctionCallInfo fcinfo, int argno);
/* Whether s[0..len) is a trace id of that form. */
extern bool im_trace_id_valid(const char *s, int len);
/*
 * The fields a worker's log line about an item ends with: "stage=<stage>"
 * and, when the item has one, " trace_id=<id>" (palloc'd).  A stored value
 * not of the trace id form (a row written by hand or by a forged payload)
 * is shown as "(invalid)", never quoted: log lines carry no caller text.
 */
extern char *im_log_trace(const char *stage, const char *trace_id);

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

/*
 * SQLSTATE classes 08, 40, 53, 57, 58 and 55P03: never charged (§4).  The
 * retry rule of fanout's outbox items and of inbound transfers alike.
 */
extern bool im_fanout_error_is_transient(int sqlerrcode);

/* int8[] Datum (palloc'd in the current context) from n ids; n may be 0. */
extern Datum im_int8_array(const int64 *ids, int n);

/* Materialized SRF output for RETURNS TABLE functions. */
extern void im_srf_begin(FunctionCallInfo fcinfo);
extern void im_srf_row(FunctionCallInfo fcinfo, Datum *values, bool *nulls);
/* One output row per row of the last SPI result, its first ncols columns. */
extern void im_srf_rows_from_spi(FunctionCallInfo fcinfo, int ncols);

/* 42501 unless the user ever had a period in the conversation. */
extern void im_require_ever_member(int64 user_id, int64 conversation_id, const char *detail);
/*
 * Append v to a palloc'd array of *n of *max (> 0) elements, doubling it
 * (in the context it was allocated in) when full.
 */
extern void im_int64_push(int64 **array, int *n, int *max, int64 v);
/* Sort and deduplicate in place; returns the new count. */
extern int	im_sort_unique_int64(int64 *v, int n);
#endif							/* IM_COMMON_H */
