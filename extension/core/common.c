/*
 * common.c — the small pieces every API function shares: kept SPI plans,
 * argument checks with the contract's 22023 errors, materialized SRF output,
 * arrays.  The lock helpers are core/locks.c's.
 */
#include "core/im_sync.h"
#include "core/common.h"
#include "core/log_privacy.h"
#include "core/im_sql.h"
#include "core/worker_owner.h"

#include <stdarg.h>

#include "catalog/pg_type.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/lsyscache.h"

SPIPlanPtr
im_prepare(SPIPlanPtr *slot, const char *sql, int nargs,...)
{
	Oid			argtypes[FUNC_MAX_ARGS];
	va_list		ap;
	SPIPlanPtr	plan;

	if (*slot != NULL)
		return *slot;
	Assert(nargs <= FUNC_MAX_ARGS);
	va_start(ap, nargs);
	for (int i = 0; i < nargs; i++)
		argtypes[i] = va_arg(ap, Oid);
	va_end(ap);

	plan = SPI_prepare(sql, nargs, argtypes);
	if (plan == NULL)
		elog(ERROR, "im_sync: SPI_prepare failed (%s) for: %s",
			 SPI_result_code_string(SPI_result), sql);
	if (SPI_keepplan(plan) != 0)
		elog(ERROR, "im_sync: SPI_keepplan failed");
	*slot = plan;
	return plan;
}

uint64
im_exec(SPIPlanPtr plan, Datum *values, const char *nulls, long count)
{
	int			rc = SPI_execute_plan(plan, values, nulls, false, count);

	if (rc < 0)
		elog(ERROR, "im_sync: SPI_execute_plan failed: %s", SPI_result_code_string(rc));
	return SPI_processed;
}

static Datum
get_datum(uint64 row, int col, bool *isnull)
{
	if (SPI_tuptable == NULL || row >= SPI_processed)
		elog(ERROR, "im_sync: no result row " UINT64_FORMAT, row);
	return SPI_getbinval(SPI_tuptable->vals[row], SPI_tuptable->tupdesc, col, isnull);
}

int64
im_get_int64(uint64 row, int col, bool *isnull)
{
	bool		n;
	Datum		d = get_datum(row, col, &n);

	if (isnull)
		*isnull = n;
	return n ? 0 : DatumGetInt64(d);
}

int32
im_get_int32(uint64 row, int col, bool *isnull)
{
	bool		n;
	Datum		d = get_datum(row, col, &n);

	if (isnull)
		*isnull = n;
	return n ? 0 : DatumGetInt32(d);
}

bool
im_get_bool(uint64 row, int col, bool *isnull)
{
	bool		n;
	Datum		d = get_datum(row, col, &n);

	if (isnull)
		*isnull = n;
	return n ? false : DatumGetBool(d);
}

char *
im_get_text(uint64 row, int col)
{
	bool		n;
	Datum		d = get_datum(row, col, &n);
	char	   *tmp;
	char	   *s;

	if (n)
		return NULL;
	/* Copy into the caller's (upper) context so it survives SPI_finish. */
	tmp = TextDatumGetCString(d);
	s = SPI_palloc(strlen(tmp) + 1);
	strcpy(s, tmp);
	pfree(tmp);
	return s;
}

Datum
im_get_datum_copy(uint64 row, int col, bool *isnull)
{
	Datum		d = get_datum(row, col, isnull);
	Form_pg_attribute att = TupleDescAttr(SPI_tuptable->tupdesc, col - 1);

	if (*isnull)
		return (Datum) 0;
	/* Into the caller's (upper) context so it survives SPI_finish. */
	return SPI_datumTransfer(d, att->attbyval, att->attlen);
}

void
im_spi_connect(void)
{
	im_refuse_superuser_over_owner();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "im_sync: SPI_connect failed");
}

/* ---- argument checks -------------------------------------------------- */

static void
require_not_null(FunctionCallInfo fcinfo, int argno, const char *name)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be NULL", name)));
}

int64
im_arg_id(FunctionCallInfo fcinfo, int argno, const char *name)
{
	int64		v;

	require_not_null(fcinfo, argno, name);
	v = PG_GETARG_INT64(argno);
	if (v <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be a positive id, got " INT64_FORMAT, name, v)));
	return v;
}

/*
 * User ids are 1..2^53-1 (contract §1), so a JavaScript client reads every id
 * it is given exactly.  Every function that takes a user id checks it here.
 */
void
im_check_user_id(int64 v, const char *name)
{
	if (v < 1 || v > IM_MAX_USER_ID)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be a user id between 1 and " INT64_FORMAT ", got " INT64_FORMAT,
						name, IM_MAX_USER_ID, v),
				 errdetail("User ids are limited to 2^53-1 so that JavaScript clients read them exactly.")));
}

int64
im_arg_user_id(FunctionCallInfo fcinfo, int argno, const char *name)
{
	int64		v;

	require_not_null(fcinfo, argno, name);
	v = PG_GETARG_INT64(argno);
	im_check_user_id(v, name);
	return v;
}

char *
im_arg_text(FunctionCallInfo fcinfo, int argno, const char *name, int max_chars)
{
	char	   *s;
	int			len;

	require_not_null(fcinfo, argno, name);
	s = TextDatumGetCString(PG_GETARG_DATUM(argno));
	len = pg_mbstrlen(s);
	if (len < 1 || len > max_chars)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be 1 to %d characters long, got %d", name, max_chars, len)));
	return s;
}

char *
im_arg_device_id(FunctionCallInfo fcinfo, int argno)
{
	char	   *s;
	size_t		len;

	require_not_null(fcinfo, argno, "device_id");
	s = TextDatumGetCString(PG_GETARG_DATUM(argno));
	len = strlen(s);
	if (len < 1 || len > 64)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("device_id must be 1 to 64 characters long, got %zu bytes", len)));
	for (size_t i = 0; i < len; i++)
	{
		char		c = s[i];

		if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
			  (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("device_id may contain only A-Z a-z 0-9 . _ -"),
					 errdetail("Character %zu is not allowed.", i + 1)));
	}
	return s;
}

/* the one trace id rule of the extension, the gateway and the relay (im_sync/trace_id.h) */
bool
im_trace_id_valid(const char *s, int len)
{
	return len >= 0 && im_trace_id_ok(s, (size_t) len);
}

char *
im_arg_trace_id(FunctionCallInfo fcinfo, int argno)
{
	text	   *t;
	const char *p;
	int			len;
	char	   *s;

	if (PG_NARGS() <= argno || PG_ARGISNULL(argno))
		return NULL;
	t = PG_GETARG_TEXT_PP(argno);
	p = VARDATA_ANY(t);
	len = VARSIZE_ANY_EXHDR(t);
	if (len < 1 || len > IM_MAX_TRACE_ID)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("trace_id must be 1 to %d characters long, got %d bytes", IM_MAX_TRACE_ID, len),
				 errhint("A trace id is 1 to %d of A-Z a-z 0-9 _ -, or NULL.", IM_MAX_TRACE_ID)));
	if (!im_trace_id_valid(p, len))
	{
		int			bad = 0;

		while (bad < len && im_trace_id_valid(p + bad, 1))
			bad++;
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("trace_id may contain only A-Z a-z 0-9 _ -"),
				 errdetail("Byte %d is not allowed.", bad + 1),
				 errhint("A trace id is 1 to %d of A-Z a-z 0-9 _ -, or NULL.", IM_MAX_TRACE_ID)));
	}
	s = palloc(len + 1);
	memcpy(s, p, len);
	s[len] = '\0';
	return s;
}

char *
im_log_trace(const char *stage, const char *trace_id)
{
	if (trace_id == NULL || trace_id[0] == '\0')
		return psprintf("stage=%s", stage);
	if (!im_trace_id_valid(trace_id, (int) strlen(trace_id)))
		return psprintf("stage=%s trace_id=(invalid)", stage);
	return psprintf("stage=%s trace_id=%s", stage, trace_id);
}

int32
im_arg_int32(FunctionCallInfo fcinfo, int argno, const char *name, int32 min, int32 max)
{
	int32		v;

	require_not_null(fcinfo, argno, name);
	v = PG_GETARG_INT32(argno);
	if (v < min || v > max)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be between %d and %d, got %d", name, min, max, v)));
	return v;
}

/* ---- errors of calls that carry a body or a token ---------------------- */

/*
 * Run fn (the body of an API function) so that any error it raises, its own
 * or one raised by SPI inside it, keeps the statement and the error context
 * out of the server log: a caller passing literals has the message body or
 * token in its statement text.  Integrity errors (class 23) also keep their
 * DETAIL ("Failing row contains (…)") out of the log; the client still gets
 * the full error.  The error is rethrown unchanged otherwise (same SQLSTATE,
 * message, detail and hint).
 */
Datum
im_call_hiding_statement(PGFunction fn, FunctionCallInfo fcinfo)
{
	MemoryContext cxt = CurrentMemoryContext;
	Datum		result = (Datum) 0;

	im_sensitive_call_enter();
	PG_TRY();
	{
		result = fn(fcinfo);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		im_sensitive_call_leave();
		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		edata->hide_stmt = true;
		edata->hide_ctx = true;
		if (ERRCODE_TO_CATEGORY(edata->sqlerrcode) == ERRCODE_INTEGRITY_CONSTRAINT_VIOLATION &&
			edata->detail != NULL && edata->detail_log == NULL)
			edata->detail_log = pstrdup("The detail is left out of the server log: it may show a message body.");
		ReThrowError(edata);
	}
	PG_END_TRY();
	im_sensitive_call_leave();
	return result;
}

/* ---- the retry rule's error classes (fanout and transfers) ------------ */

bool
im_fanout_error_is_transient(int sqlerrcode)
{
	int			class = ERRCODE_TO_CATEGORY(sqlerrcode);

	return sqlerrcode == ERRCODE_LOCK_NOT_AVAILABLE ||
		class == ERRCODE_CONNECTION_EXCEPTION ||
		class == ERRCODE_TRANSACTION_ROLLBACK ||
		class == ERRCODE_INSUFFICIENT_RESOURCES ||
		class == ERRCODE_OPERATOR_INTERVENTION ||
		class == ERRCODE_SYSTEM_ERROR;
}

/* ---- SRF output ------------------------------------------------------- */

void
im_srf_begin(FunctionCallInfo fcinfo)
{
	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
}

void
im_srf_row(FunctionCallInfo fcinfo, Datum *values, bool *nulls)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;

	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
}

void
im_srf_rows_from_spi(FunctionCallInfo fcinfo, int ncols)
{
	Datum	   *values = palloc(sizeof(Datum) * ncols);
	bool	   *nulls = palloc(sizeof(bool) * ncols);

	for (uint64 r = 0; r < SPI_processed; r++)
	{
		for (int c = 0; c < ncols; c++)
			values[c] = SPI_getbinval(SPI_tuptable->vals[r], SPI_tuptable->tupdesc,
									  c + 1, &nulls[c]);
		/* the tuplestore copies the row, so SPI memory may go after */
		im_srf_row(fcinfo, values, nulls);
	}
	pfree(values);
	pfree(nulls);
}

/* ---- arrays ----------------------------------------------------------- */

Datum
im_int8_array(const int64 *ids, int n)
{
	Datum	   *elems = palloc(sizeof(Datum) * Max(n, 1));

	for (int i = 0; i < n; i++)
		elems[i] = Int64GetDatum(ids[i]);
	return PointerGetDatum(construct_array(elems, n, INT8OID, 8, true, TYPALIGN_DOUBLE));
}

void
im_int64_push(int64 **array, int *n, int *max, int64 v)
{
	if (*n == *max)
	{
		*max *= 2;
		*array = repalloc(*array, sizeof(int64) * *max);
	}
	(*array)[(*n)++] = v;
}

/* ---- sorting --------------------------------------------------------- */

static int
cmp_int64(const void *a, const void *b)
{
	int64		x = *(const int64 *) a;
	int64		y = *(const int64 *) b;

	return (x > y) - (x < y);
}

int
im_sort_unique_int64(int64 *v, int n)
{
	int			k = 0;

	qsort(v, n, sizeof(int64), cmp_int64);
	for (int i = 0; i < n; i++)
		if (k == 0 || v[k - 1] != v[i])
			v[k++] = v[i];
	return k;
}

/*
 * 42501 unless the user has or had a membership period in the conversation
 * (contract §6 fetch_messages, §7 report_read); detail says what was refused.
 */
void
im_require_ever_member(int64 user_id, int64 conversation_id, const char *detail)
{
	static SPIPlanPtr plan;
	Datum		args[2];

	im_prepare(&plan,
			   "SELECT 1 FROM im.membership_period "
			   "WHERE conversation_id" EQ "$2 "
			   "AND user_id" EQ "$1 LIMIT 1",
			   2, INT8OID, INT8OID);
	args[0] = Int64GetDatum(user_id);
	args[1] = Int64GetDatum(conversation_id);
	if (im_exec(plan, args, NULL, 1) != 1)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("user " INT64_FORMAT " was never a member of conversation " INT64_FORMAT,
						user_id, conversation_id),
				 errdetail("%s", detail)));
}
