/*
 * im_sync_router.c — the router extension's C functions (im_sync_router
 * 1.1 and later), over libpq:
 *
 *   im_router.partition_conninfo(conninfo, timeout_s)  the conninfo PL/Proxy
 *       gets for a node: parsed with PQconninfoParse, the user keyword
 *       dropped, every other option kept, connect_timeout and
 *       tcp_user_timeout added when absent, rebuilt as key='value' pairs;
 *   im_router.ping(conninfo, timeout_s)  whether a node's server answers,
 *       with PQpingParams: no credentials sent, no session ever handed to
 *       SQL, bounded by connect_timeout.
 *
 * Why the rebuilt string escapes '=' inside values: PL/Proxy (execute.c,
 * get_connstr) uses a partition's conninfo verbatim when the text "user="
 * occurs anywhere in it, and only otherwise appends user=<calling role>
 * (or the user mapping's options).  A value holding "user=" (a password,
 * an application_name) would make it connect as the router's OS user.
 * libpq's parser takes a backslash inside a quoted value as "the next
 * character literally", so writing every '=' of a value as \= keeps the
 * value and leaves "user=" only where a keyword user would stand, which is
 * never written.  Both properties are checked on every string built here.
 */
#include "postgres.h"

#include <limits.h>

#include "fmgr.h"
#include "lib/stringinfo.h"
#include "utils/builtins.h"

#include "libpq-fe.h"

PG_MODULE_MAGIC;

PG_FUNCTION_INFO_V1(im_router_partition_conninfo);
PG_FUNCTION_INFO_V1(im_router_ping);

/* libpq's options of a conninfo (only the ones it sets carry a value) */
static PQconninfoOption *
parse_conninfo(const char *conninfo)
{
	char	   *err = NULL;
	PQconninfoOption *opts = PQconninfoParse(conninfo, &err);

	if (opts == NULL)
	{
		char	   *msg = pstrdup(err ? err : "out of memory");
		int			len = strlen(msg);

		if (err)
			PQfreemem(err);
		while (len > 0 && msg[len - 1] == '\n')
			msg[--len] = '\0';
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid node conninfo: %s", msg)));
	}
	return opts;
}

static const char *
option_value(const PQconninfoOption *opts, const char *keyword)
{
	for (const PQconninfoOption *o = opts; o->keyword; o++)
		if (strcmp(o->keyword, keyword) == 0)
			return o->val;
	return NULL;
}

/* key='value' with \ before ', \ and = (see the file's comment) */
static void
append_option(StringInfo buf, const char *keyword, const char *value)
{
	if (buf->len > 0)
		appendStringInfoChar(buf, ' ');
	appendStringInfo(buf, "%s='", keyword);
	for (const char *p = value; *p; p++)
	{
		if (*p == '\'' || *p == '\\' || *p == '=')
			appendStringInfoChar(buf, '\\');
		appendStringInfoChar(buf, *p);
	}
	appendStringInfoChar(buf, '\'');
}

/*
 * The invariants of a built partition conninfo: libpq reads back every
 * option of the input but user, with its value, plus the added timeouts
 * (added_ct / added_tut, NULL when the input had its own), and PL/Proxy
 * finds no "user=" in it.  A failure is a fault of this file (elog).
 */
static void
check_built(const char *built, const PQconninfoOption *input,
			const char *added_ct, const char *added_tut)
{
	PQconninfoOption *again;
	char	   *err = NULL;

	if (strstr(built, "user=") != NULL)
		elog(ERROR, "partition conninfo holds the text \"user=\"");
	again = PQconninfoParse(built, &err);
	if (again == NULL)
	{
		if (err)
			PQfreemem(err);
		elog(ERROR, "partition conninfo does not parse back");
	}
	for (const PQconninfoOption *o = again; o->keyword; o++)
	{
		const char *want = option_value(input, o->keyword);

		if (strcmp(o->keyword, "user") == 0)
			want = NULL;
		else if (strcmp(o->keyword, "connect_timeout") == 0 && added_ct)
			want = added_ct;
		else if (strcmp(o->keyword, "tcp_user_timeout") == 0 && added_tut)
			want = added_tut;
		if ((o->val == NULL) != (want == NULL) ||
			(o->val != NULL && strcmp(o->val, want) != 0))
		{
			PQconninfoFree(again);
			elog(ERROR, "partition conninfo parses back to another value of %s", o->keyword);
		}
	}
	PQconninfoFree(again);
}

Datum
im_router_partition_conninfo(PG_FUNCTION_ARGS)
{
	char	   *conninfo = text_to_cstring(PG_GETARG_TEXT_PP(0));
	int32		timeout_s = PG_GETARG_INT32(1);
	PQconninfoOption *opts;
	StringInfoData buf;
	char		ct[32];
	char		tut[32];
	const char *added_ct = NULL;
	const char *added_tut = NULL;

	if (timeout_s <= 0 || timeout_s > INT_MAX / 1000)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("connect timeout must be a positive number of seconds")));
	opts = parse_conninfo(conninfo);
	initStringInfo(&buf);
	PG_TRY();
	{
		for (PQconninfoOption *o = opts; o->keyword; o++)
		{
			if (o->val == NULL || strcmp(o->keyword, "user") == 0)
				continue;
			append_option(&buf, o->keyword, o->val);
		}
		if (option_value(opts, "connect_timeout") == NULL)
		{
			snprintf(ct, sizeof(ct), "%d", timeout_s);
			append_option(&buf, "connect_timeout", ct);
			added_ct = ct;
		}
		if (option_value(opts, "tcp_user_timeout") == NULL)
		{
			snprintf(tut, sizeof(tut), "%d", timeout_s * 1000);
			append_option(&buf, "tcp_user_timeout", tut);
			added_tut = tut;
		}
		check_built(buf.data, opts, added_ct, added_tut);
	}
	PG_FINALLY();
	{
		PQconninfoFree(opts);
	}
	PG_END_TRY();
	PG_RETURN_TEXT_P(cstring_to_text(buf.data));
}

/*
 * 'ok' (the server answered, including with an authentication request or
 * an error: it is up), 'reject' (it answered that it accepts no
 * connections now: starting up, shutting down — up too), 'no_response'
 * (refused, unreachable or silent within connect_timeout) or 'invalid'
 * (libpq refused the options; the text is not shown: it may quote a
 * password).  The map's user and password are not passed, so the ping
 * never logs in with the map's credentials; libpq closes whatever it opened
 * before PQpingParams returns, so an interrupt that arrives meanwhile
 * (statement_timeout, pg_cancel_backend) is raised with nothing left open.
 */
Datum
im_router_ping(PG_FUNCTION_ARGS)
{
	char	   *conninfo = text_to_cstring(PG_GETARG_TEXT_PP(0));
	int32		timeout_s = PG_GETARG_INT32(1);
	PQconninfoOption *opts;
	const char **keywords;
	const char **values;
	int			n = 0;
	char		num[32];
	PGPing		answer;
	char	   *err = NULL;

	opts = PQconninfoParse(conninfo, &err);
	if (opts == NULL)
	{
		if (err)
			PQfreemem(err);
		PG_RETURN_TEXT_P(cstring_to_text("invalid"));
	}
	for (PQconninfoOption *o = opts; o->keyword; o++)
		n++;
	keywords = palloc0(sizeof(char *) * (n + 2));
	values = palloc0(sizeof(char *) * (n + 2));
	n = 0;
	for (PQconninfoOption *o = opts; o->keyword; o++)
	{
		if (o->val == NULL || strcmp(o->keyword, "user") == 0 ||
			strcmp(o->keyword, "password") == 0)
			continue;
		keywords[n] = o->keyword;
		values[n] = o->val;
		n++;
	}
	if (option_value(opts, "connect_timeout") == NULL)
	{
		snprintf(num, sizeof(num), "%d", timeout_s > 0 ? timeout_s : 2);
		keywords[n] = "connect_timeout";
		values[n] = num;
		n++;
	}
	keywords[n] = NULL;
	values[n] = NULL;
	/* no dbname expansion: the options are the parsed ones, nothing else */
	answer = PQpingParams(keywords, values, 0);
	PQconninfoFree(opts);
	switch (answer)
	{
		case PQPING_OK:
			PG_RETURN_TEXT_P(cstring_to_text("ok"));
		case PQPING_REJECT:
			PG_RETURN_TEXT_P(cstring_to_text("reject"));
		case PQPING_NO_RESPONSE:
			PG_RETURN_TEXT_P(cstring_to_text("no_response"));
		case PQPING_NO_ATTEMPT:
			break;
	}
	PG_RETURN_TEXT_P(cstring_to_text("invalid"));
}
