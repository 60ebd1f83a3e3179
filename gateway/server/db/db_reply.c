/*
 * db_reply.c — an API job's result set as its reply frame, built on the
 * database thread so large results never stall the WebSocket loop.
 *
 * Scalars go through jansson; json/jsonb columns are spliced in as the text
 * PostgreSQL printed (exact numbers: never re-parsed, never turned into a
 * string).  The reply shape (one row merged, or "rows") comes from the op
 * table in frame.c.
 */
#include "server/db/db_internal.h"
#include "server/frame.h"
#include "server/db/json_splice.h"

#include <stdlib.h>
#include <string.h>

#define IM_MAX_RAW 16			/* json/jsonb columns in one result row */

static int
is_json_type(Oid t)
{
	return t == 114 || t == 3802;	/* json, jsonb */
}

/* A scalar column as a jansson value (json/jsonb columns are spliced). */
static json_t *
cell_json(const PGresult *res, int row, int col)
{
	const char *v;
	json_t	   *j;

	if (PQgetisnull(res, row, col))
		return json_null();
	v = PQgetvalue(res, row, col);
	switch (PQftype(res, col))
	{
		case 16:				/* bool */
			return json_boolean(v[0] == 't');
		case 20:				/* int8 */
		case 21:				/* int2 */
		case 23:				/* int4 */
		case 26:				/* oid */
			return json_integer(strtoll(v, NULL, 10));
		case 700:				/* float4 */
		case 701:				/* float8 */
			j = json_real(strtod(v, NULL));
			return j ? j : json_null();	/* NaN and infinities are not JSON */
		default:
			return json_string(v);
	}
}

/*
 * One row as an object text: scalars through jansson, json/jsonb columns
 * spliced in as PostgreSQL printed them (exact numbers: never re-parsed,
 * never turned into a string).  base, when given, holds keys that come
 * first (type, id) and is consumed.
 */
static char *
row_text(json_t *base, const PGresult *res, int row, const im_raw_member *extra, int nextra)
{
	json_t	   *o = base ? base : json_object();
	im_raw_member raw[IM_MAX_RAW];
	int			nraw = 0;
	int			c;
	char	   *text;

	for (c = 0; c < nextra && nraw < IM_MAX_RAW; c++)
		raw[nraw++] = extra[c];
	for (c = 0; res && c < PQnfields(res); c++)
	{
		if (is_json_type(PQftype(res, c)) && !PQgetisnull(res, row, c) && nraw < IM_MAX_RAW)
		{
			raw[nraw].name = PQfname(res, c);
			raw[nraw].text = PQgetvalue(res, row, c);
			raw[nraw].len = (size_t) PQgetlength(res, row, c);
			nraw++;
		}
		else
			json_object_set_new(o, PQfname(res, c), cell_json(res, row, c));
	}
	text = im_json_splice(o, raw, nraw);
	json_decref(o);
	if (!text)
		abort();
	return text;
}

/* The first of the named int8 columns of row 0 that is there and not NULL, else -1. */
static int64_t
first_position(const PGresult *res, const char *const *names)
{
	for (; *names; names++)
	{
		int			c = PQfnumber(res, *names);

		if (c >= 0 && PQntuples(res) > 0 && !PQgetisnull(res, 0, c))
			return strtoll(PQgetvalue(res, 0, c), NULL, 10);
	}
	return -1;
}

/*
 * What the request's log line names from the reply: msg_seq (the message
 * a write made, or the read position), sync_seq (the position an ack
 * reached, or a sync page's batch high watermark), a sync page's events.
 */
static void
log_positions(im_job *job, const PGresult *res)
{
	static const char *const msg_cols[] = {"msg_seq", "read_msg_seq", NULL};
	static const char *const sync_cols[] = {"sync_seq", "acked_sync_seq", "batch_high_watermark", NULL};

	job->msg_seq = first_position(res, msg_cols);
	job->sync_seq = first_position(res, sync_cols);
	job->page_events = -1;
	if (job->op == IM_OP_SYNC && PQntuples(res) > 0)
	{
		int			c = PQfnumber(res, "events");

		job->page_events = c >= 0 && !PQgetisnull(res, 0, c) ?
			im_json_array_count(PQgetvalue(res, 0, c), (size_t) PQgetlength(res, 0, c)) : 0;
	}
}

void
im_db_build_reply(im_job *job)
{
	json_t	   *o = json_object();
	const PGresult *res = job->res;

	json_object_set_new(o, "type", json_string(im_ops[job->op].reply_type));
	if (job->id)
		json_object_set(o, "id", job->id);
	if (job->trace_id[0])
		json_object_set_new(o, "trace_id", json_string(job->trace_id));
	log_positions(job, res);
	if (im_ops[job->op].shape == IM_REPLY_ROWS)
	{
		int			n = PQntuples(res);
		char	  **rows = calloc((size_t) n + 1, sizeof(char *));
		im_raw_member arr;
		int			r;

		if (!rows)
			abort();
		for (r = 0; r < n; r++)
			rows[r] = row_text(NULL, res, r, NULL, 0);
		arr.name = "rows";
		arr.text = im_json_array_of_texts(rows, n);
		if (!arr.text)
			abort();
		arr.len = strlen(arr.text);
		/* a recency page: the last row's cursor, null after the last page */
		if (job->op == IM_OP_RECENT_CONVERSATIONS)
		{
			int			c = PQfnumber(res, "next_cursor");

			json_object_set_new(o, "next_cursor", c >= 0 && n > 0 ? cell_json(res, n - 1, c) : json_null());
		}
		job->reply = row_text(o, NULL, 0, &arr, 1);
		for (r = 0; r < n; r++)
			free(rows[r]);
		free(rows);
		free((char *) arr.text);
	}
	else
		job->reply = row_text(o, PQntuples(res) > 0 ? res : NULL, 0, NULL, 0);
	PQclear(job->res);
	job->res = NULL;
}
