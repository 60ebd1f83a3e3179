/*
 * db_conninfo.c — the keywords of one connection attempt, from the --db
 * conninfo parsed once (PQconninfoParse), plus what following a primary
 * needs (contract §10, issue 14):
 *
 *   - target_session_attrs=read-write unless the conninfo says otherwise:
 *     every gateway call may write, so with a multi-host conninfo
 *     (host=a,b port=p,q) libpq skips a standby and finds the primary, and
 *     a promoted standby is found by the next attempt;
 *   - TCP keepalives (idle 10 s, 5 s apart, 3 probes) unless set: a primary
 *     whose machine died without closing its sockets is noticed;
 *   - connect_timeout, default IM_CONNECT_TIMEOUT_S: libpq ignores it in
 *     non-blocking connects (PQconnectPoll), so db_conn.c enforces it, and
 *     an attempt that timed out starts the next one at the following host
 *     (rotate): a host that accepts TCP but never answers cannot keep the
 *     gateway from reaching the others.
 *
 * Keywords given in the conninfo always win over these defaults.
 */
#include "db_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define IM_CONNECT_TIMEOUT_S 5
#define MAX_KW 64

static PQconninfoOption *g_opts;
static int	g_nhosts = 1;
static double g_connect_timeout = IM_CONNECT_TIMEOUT_S;

/* defaults added when the conninfo lacks them */
static const char *const default_kw[] = {
	"target_session_attrs", "keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count"
};
static const char *const default_val[] = {"read-write", "1", "10", "5", "3"};

static int
count_items(const char *list)
{
	int			n = 1;

	for (; *list; list++)
		n += *list == ',';
	return n;
}

int
im_conninfo_init(const char *conninfo, char **err)
{
	PQconninfoOption *o;

	g_opts = PQconninfoParse(conninfo, err);
	if (!g_opts)
		return -1;
	for (o = g_opts; o->keyword; o++)
	{
		if (!o->val || !*o->val)
			continue;
		if (!strcmp(o->keyword, "host") || !strcmp(o->keyword, "hostaddr"))
		{
			int			n = count_items(o->val);

			if (n > g_nhosts)
				g_nhosts = n;
		}
		else if (!strcmp(o->keyword, "connect_timeout"))
		{
			/*
			 * libpq's rule (1 counts as 2); 0, "wait for ever", is exactly
			 * the hang this prevents, so it keeps the default
			 */
			int			s = atoi(o->val);

			if (s > 0)
				g_connect_timeout = s < 2 ? 2 : s;
		}
	}
	return 0;
}

double
im_conninfo_connect_timeout(void)
{
	return g_connect_timeout;
}

int
im_conninfo_nhosts(void)
{
	return g_nhosts;
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
im_conninfo_params(int first_host, const char *application_name,
				   const char **kw, const char **val, char *buf, size_t buflen)
{
	int			n = 0,
				i;
	PQconninfoOption *o;
	size_t		used = 0;

	for (i = 0; i < (int) (sizeof(default_kw) / sizeof(default_kw[0])); i++)
	{
		int			given = 0;

		for (o = g_opts; o->keyword; o++)
			if (!strcmp(o->keyword, default_kw[i]) && o->val && *o->val)
				given = 1;
		if (!given)
		{
			kw[n] = default_kw[i];
			val[n++] = default_val[i];
		}
	}
	for (o = g_opts; o->keyword && n < MAX_KW - 3; o++)
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
