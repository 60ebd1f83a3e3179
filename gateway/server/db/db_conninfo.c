/*
 * db_conninfo.c — the keywords of one connection attempt, from a conninfo
 * parsed once (PQconninfoParse): the --db conninfo for the pool and the
 * router's LISTEN connection, and each node's conninfo (db_nodes.c) for
 * its LISTEN connection.  Plus what following a primary needs (contract
 * §10):
 *
 *   - target_session_attrs=read-write unless the conninfo says otherwise:
 *     every gateway call may write, so with a multi-host conninfo
 *     (host=a,b port=p,q) libpq skips a standby and finds the primary, and
 *     a promoted standby is found by the next attempt (a node's
 *     notifications, too, come from its primary only);
 *   - TCP keepalives (idle 10 s, 5 s apart, 3 probes) unless set: a primary
 *     whose machine died without closing its sockets is noticed;
 *   - connect_timeout, default IM_CONNECT_TIMEOUT_S: libpq ignores it in
 *     non-blocking connects (PQconnectPoll), so db_conn.c enforces it, and
 *     an attempt that timed out starts the next one at the following host
 *     (rotate): a host that accepts TCP but never answers cannot keep the
 *     gateway from reaching the others.
 *
 * Keywords given in the conninfo always win over these defaults.  A node's
 * conninfo says where the node is (host, port, dbname); who connects
 * (user, password, TLS files, …) comes from --db unless it says otherwise.
 */
#include "server/db/db_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define IM_CONNECT_TIMEOUT_S 5
#define MAX_KW 64

im_conninfo im_db_main_conninfo;

/* defaults added when the conninfo lacks them */
static const char *const default_kw[] = {
	"target_session_attrs", "keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count"
};
static const char *const default_val[] = {"read-write", "1", "10", "5", "3"};

/* where a server is: never taken from --db for a node */
static const char *const location_kw[] = {"host", "hostaddr", "port", "dbname", "service"};

static int
count_items(const char *list)
{
	int			n = 1;

	for (; *list; list++)
		n += *list == ',';
	return n;
}

static int
is_location(const char *kw)
{
	for (size_t i = 0; i < sizeof(location_kw) / sizeof(location_kw[0]); i++)
		if (!strcmp(kw, location_kw[i]))
			return 1;
	return 0;
}

static const char *
option_value(const PQconninfoOption *opts, const char *kw)
{
	for (; opts && opts->keyword; opts++)
		if (!strcmp(opts->keyword, kw) && opts->val && *opts->val)
			return opts->val;
	return NULL;
}

int
im_conninfo_parse(im_conninfo *ci, const char *conninfo, const im_conninfo *base, char **err)
{
	PQconninfoOption *o;

	memset(ci, 0, sizeof(*ci));
	ci->nhosts = 1;
	ci->connect_timeout = IM_CONNECT_TIMEOUT_S;
	ci->opts = PQconninfoParse(conninfo, err);
	if (!ci->opts)
		return -1;
	for (o = ci->opts; o->keyword; o++)
	{
		if ((!o->val || !*o->val) && base && !is_location(o->keyword))
		{
			const char *v = option_value(base->opts, o->keyword);

			if (v)
			{
				free(o->val);	/* PQconninfoFree frees values with free() */
				o->val = strdup(v);
			}
		}
		if (!o->val || !*o->val)
			continue;
		if (!strcmp(o->keyword, "host") || !strcmp(o->keyword, "hostaddr"))
		{
			int			n = count_items(o->val);

			if (n > ci->nhosts)
				ci->nhosts = n;
		}
		else if (!strcmp(o->keyword, "connect_timeout"))
		{
			/*
			 * libpq's rule (1 counts as 2); 0, "wait for ever", is exactly
			 * the hang this prevents, so it keeps the default
			 */
			int			s = atoi(o->val);

			if (s > 0)
				ci->connect_timeout = s < 2 ? 2 : s;
		}
	}
	return 0;
}

void
im_conninfo_free(im_conninfo *ci)
{
	if (ci->opts)
		PQconninfoFree(ci->opts);
	ci->opts = NULL;
}

/* list (a,b,c) rotated to start at item k, in buf; list itself when it has one item */
static const char *
rotate_list(const char *list, int k, char *buf, size_t len)
{
	int			n = count_items(list);
	const char *start = list;
	size_t		head;

	if (n <= 1 || k % n == 0 || strlen(list) + 1 > len)
		return list;
	for (k %= n; k > 0; k--)
		start = strchr(start, ',') + 1;
	head = (size_t) (start - list) - 1;	/* the items before start, without their last comma */
	snprintf(buf, len, "%s,%.*s", start, (int) head, list);
	return buf;
}

int
im_conninfo_params(const im_conninfo *ci, int first_host, const char *application_name,
				   const char **kw, const char **val, char *buf, size_t buflen)
{
	int			n = 0,
				i;
	PQconninfoOption *o;
	size_t		used = 0;

	for (i = 0; i < (int) (sizeof(default_kw) / sizeof(default_kw[0])); i++)
	{
		if (!option_value(ci->opts, default_kw[i]))
		{
			kw[n] = default_kw[i];
			val[n++] = default_val[i];
		}
	}
	for (o = ci->opts; o->keyword && n < MAX_KW - 3; o++)
	{
		if (!o->val || !*o->val || !strcmp(o->keyword, "application_name"))
			continue;
		kw[n] = o->keyword;
		if (!strcmp(o->keyword, "host") || !strcmp(o->keyword, "hostaddr") || !strcmp(o->keyword, "port"))
		{
			/* hosts and ports rotate together (a single port applies to all) */
			val[n] = rotate_list(o->val, first_host, buf + used, buflen - used);
			if (val[n] == buf + used)
				used += strlen(buf + used) + 1;
		}
		else
			val[n] = o->val;
		n++;
	}
	kw[n] = "application_name";
	val[n++] = application_name;
	kw[n] = NULL;
	val[n] = NULL;
	return n;
}
