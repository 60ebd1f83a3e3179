/*
 * im_push_relay — drains im_sync's push queue into a push gateway that
 * speaks the Matrix push gateway API (contract §13; design §9.3, §16.1).
 *
 *   im_push_relay --db CONNINFO --key FILE [--key FILE...] --url URL
 *                 [--relay-id ID] [--concurrency N] [--log-key FILE]
 *                 [--batch N] [--lease SECONDS] [--timeout MS] [--poll SECONDS]
 *                 [--log-format text|json]
 *
 * Loop: claim jobs (im.claim_push_jobs, under a lease) as request slots
 * free up, open each sealed token with the private key its key id names,
 * POST the notification with the token as devices[0].pushkey (libcurl
 * multi: connections reused, HTTP/2 where offered, timeouts), classify the
 * answer and complete the job (im.complete_push_job).  Woken by LISTEN
 * im_sync_push, polling every --poll seconds as well.  When --db is a router
 * (im.shard_nodes() exists) the wake-ups come from the nodes: the
 * relay keeps one LISTEN connection per node (push_nodes.c), each
 * reconnecting on its own, and claims at once when one comes back.
 *
 * What it guarantees:
 *   - a job is sent at least once: a relay that dies leaves its jobs to the
 *     lease, after which any relay claims them again; a result the database
 *     could not take is kept and reported after reconnecting (`stale` if
 *     the lease lapsed meanwhile);
 *   - it never hangs on a dead server: connect_timeout, TCP keepalives and a
 *     statement_timeout on its connection; a lost connection is re-made
 *     with backoff (1 s doubling to RELAY_MAX_BACKOFF_S, 10 s: after a
 *     failover pushes resume at most that long after the promotion, as the
 *     per-node LISTEN connections do), a multi-host conninfo picks
 *     whichever host answers;
 *   - SIGTERM: no new claims, requests in flight finish and are reported,
 *     exit 0;
 *   - logs are key=value lines (or JSON lines: --log-format json,
 *     push_log.c) without tokens, notifications or bodies; targets appear
 *     as keyed hashes (--log-key, else a random key per process); every
 *     line about a job names it and the trace id of its message;
 *   - clear tokens stay in the process: no core dump (RLIMIT_CORE 0, not
 *     dumpable, so no ptrace by the same uid either), every heap block that
 *     held one is wiped when freed (ours explicitly, jansson's, libcurl's
 *     and OpenSSL's through push_wipe.c), and requests go to http:// or
 *     https:// only (--url, and any redirect, which is never followed);
 *   - a Retry-After answer is honoured up to an hour
 *     (PUSH_RETRY_AFTER_MAX_S); a malformed one is ignored.
 */
#include "common/log_hash.h"
#include "relay/push_http.h"
#include "relay/push_log.h"
#include "relay/push_nodes.h"
#include "relay/push_unseal.h"
#include "relay/push_wipe.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <curl/curl.h>
#include <libpq-fe.h>

typedef struct Config
{
	const char *db;
	const char *url;
	char		relay_id[128];
	int			concurrency;
	int			batch;
	int			lease_s;
	long		timeout_ms;
	int			poll_s;
} Config;

/* A result the database has not taken yet (connection lost). */
typedef struct Report
{
	int64_t		job_id;
	char		trace_id[IM_TRACE_ID_MAX + 1];
	char		result[16];
	long		http_status;
	long		retry_after_ms;
} Report;

static Config cfg;
static PGconn *conn;
static CURLM *multi;
static int	inflight;
static Report *reports;
static int	nreports;
static int	maxreports;
static int	sigpipe[2] = {-1, -1};
static volatile sig_atomic_t stopping;

/* counters for the exit line */
static long n_sent;
static long n_results[5];
static const char *const result_names[5] = {"delivered", "rejected", "rate_limited", "transient", "permanent"};

static void
on_signal(int sig)
{
	int			saved = errno;
	char		c = (char) sig;

	stopping = 1;
	if (write(sigpipe[1], &c, 1) < 0)
	{
		/* the pipe is full: a wake-up is already pending */
	}
	errno = saved;
}

static void
usage(void)
{
	fprintf(stderr,
			"usage: im_push_relay --db CONNINFO --key FILE [--key FILE...] --url URL\n"
			"                     [--relay-id ID] [--concurrency N] [--log-key FILE]\n"
			"                     [--batch N] [--lease SECONDS] [--timeout MS] [--poll SECONDS]\n"
			"                     [--log-format text|json]\n");
	exit(2);
}

static int
int_arg(const char *name, const char *v, int min, int max)
{
	char	   *end;
	long		n = strtol(v, &end, 10);

	if (*v == '\0' || *end != '\0' || n < min || n > max)
	{
		fprintf(stderr, "im_push_relay: %s must be an integer from %d to %d, got \"%s\"\n", name, min, max, v);
		exit(2);
	}
	return (int) n;
}

static void
parse_args(int argc, char **argv)
{
	char		err[256];
	const char *log_key = NULL;

	cfg.concurrency = 16;
	cfg.batch = 100;
	cfg.lease_s = 30;
	cfg.timeout_ms = 10000;
	cfg.poll_s = 5;
	snprintf(cfg.relay_id, sizeof(cfg.relay_id), "relay-%ld", (long) getpid());
	for (int i = 1; i < argc; i++)
	{
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (strcmp(a, "--help") == 0)
			usage();
		if (!v)
			usage();
		i++;
		if (strcmp(a, "--db") == 0)
			cfg.db = v;
		else if (strcmp(a, "--url") == 0)
			cfg.url = v;
		else if (strcmp(a, "--key") == 0)
		{
			if (push_key_load(v, err, sizeof(err)) != 0)
			{
				fprintf(stderr, "im_push_relay: %s\n", err);
				exit(2);
			}
		}
		else if (strcmp(a, "--relay-id") == 0)
		{
			if (strlen(v) < 1 || strlen(v) > 100)
			{
				fprintf(stderr, "im_push_relay: --relay-id must be 1 to 100 characters\n");
				exit(2);
			}
			snprintf(cfg.relay_id, sizeof(cfg.relay_id), "%s", v);
		}
		else if (strcmp(a, "--concurrency") == 0)
			cfg.concurrency = int_arg(a, v, 1, 1000);
		else if (strcmp(a, "--batch") == 0)
			cfg.batch = int_arg(a, v, 1, 10000);
		else if (strcmp(a, "--lease") == 0)
			cfg.lease_s = int_arg(a, v, 1, 3600);
		else if (strcmp(a, "--timeout") == 0)
			cfg.timeout_ms = int_arg(a, v, 100, 600000);
		else if (strcmp(a, "--poll") == 0)
			cfg.poll_s = int_arg(a, v, 1, 3600);
		else if (strcmp(a, "--log-key") == 0)
			log_key = v;
		else if (strcmp(a, "--log-format") == 0)
		{
			if (im_log_format_set(v) != 0)
			{
				fprintf(stderr, "im_push_relay: --log-format must be text or json\n");
				exit(2);
			}
		}
		else
			usage();
	}
	if (!cfg.db || !cfg.url || push_key_count() == 0)
		usage();
	push_log_setup(cfg.relay_id);
	/* the tokens go to an HTTP(S) push gateway only (each request enforces it too) */
	if (strncasecmp(cfg.url, "http://", 7) != 0 && strncasecmp(cfg.url, "https://", 8) != 0)
	{
		fprintf(stderr, "im_push_relay: --url must be an http:// or https:// URL\n");
		exit(2);
	}
	if (log_key ? im_log_key_load(log_key, err, sizeof(err)) != 0 : im_log_key_random() != 0)
	{
		fprintf(stderr, "im_push_relay: %s\n", log_key ? err : "no random log key");
		exit(2);
	}
	/* a request must end well inside its lease, or another relay sends it too */
	if (cfg.timeout_ms >= cfg.lease_s * 1000L)
	{
		fprintf(stderr, "im_push_relay: --timeout must be shorter than --lease\n");
		exit(2);
	}
}

/* ---- the database connection ---- */

static void
drop_connection(const char *why)
{
	if (conn)
	{
		relay_log("warning", "event=db_lost reason=\"%s\"", why);
		PQfinish(conn);
		conn = NULL;
	}
}

/* the longest wait between two connect tries (was 30 s: a failover could hold pushes that long) */
#define RELAY_MAX_BACKOFF_S 10

/* Issue 15: the router's nodes (none on a single node); re-read every NODES_REFRESH_S. */
#define NODES_REFRESH_S 30
static double next_nodes_refresh;

static int
refresh_nodes(void)
{
	next_nodes_refresh = push_now() + NODES_REFRESH_S;
	if (push_nodes_refresh(conn, cfg.db) == 0)
		return 0;
	drop_connection(PQerrorMessage(conn));
	return -1;
}

/*
 * Connect (one try).  Our defaults first, the caller's conninfo last, so
 * its own settings win; connect_timeout and keepalives keep a dead server
 * from hanging us.
 */
static int
connect_db(void)
{
	const char *keys[] = {"connect_timeout", "keepalives", "keepalives_idle", "keepalives_interval",
	"keepalives_count", "application_name", "dbname", NULL};
	const char *values[] = {"5", "1", "10", "5", "3", "im_push_relay", cfg.db, NULL};
	PGresult   *res;
	char		sql[128];

	conn = PQconnectdbParams(keys, values, 1);
	if (PQstatus(conn) != CONNECTION_OK)
	{
		char		msg[256];

		snprintf(msg, sizeof(msg), "%s", PQerrorMessage(conn));
		msg[strcspn(msg, "\n")] = '\0';
		relay_log("warning", "event=db_connect_failed reason=\"%s\"", msg);
		PQfinish(conn);
		conn = NULL;
		return -1;
	}
	snprintf(sql, sizeof(sql), "SET statement_timeout = %ld; LISTEN im_sync_push", cfg.timeout_ms + 20000);
	res = PQexec(conn, sql);
	if (PQresultStatus(res) != PGRES_COMMAND_OK)
	{
		PQclear(res);
		drop_connection(PQerrorMessage(conn));
		return -1;
	}
	PQclear(res);
	PQsetnonblocking(conn, 0);
	relay_log("info", "event=db_connected host=%s", PQhost(conn) ? PQhost(conn) : "?");
	return refresh_nodes();
}

static int
db_ok(void)
{
	if (conn && PQstatus(conn) != CONNECTION_OK)
		drop_connection("connection closed");
	return conn != NULL;
}

/*
 * Report one result; keep it for later if the connection is gone.  Returns
 * the job's state after (into state), or NULL when the database did not
 * take it.  The "completed" line is written here in text, and in JSON for
 * a result reported after a reconnect (flushed): otherwise the attempt's
 * one JSON line carries the state.
 */
static const char *
report(int64_t job_id, const char *trace_id, const char *result, long status, long retry_after_ms,
	   int keep, int flushed, char *state, size_t statelen)
{
	char		id[24];
	char		st[24];
	char		ra[24];
	const char *params[5] = {id, cfg.relay_id, result, status > 0 ? st : NULL, retry_after_ms >= 0 ? ra : NULL};
	PGresult   *res = NULL;
	PushJobLog	line = {.job_id = job_id, .trace_id = trace_id, .result = result, .http_status = -1, .latency_ms = -1};

	snprintf(id, sizeof(id), "%" PRId64, job_id);
	snprintf(st, sizeof(st), "%ld", status);
	snprintf(ra, sizeof(ra), "%ld", retry_after_ms > 2000000000L ? 2000000000L : retry_after_ms);
	if (db_ok())
	{
		res = PQexecParams(conn, "SELECT im.complete_push_job($1::bigint, $2, $3, $4::int, $5::int)",
						   5, NULL, params, NULL, NULL, 0);
		if (PQresultStatus(res) == PGRES_TUPLES_OK)
		{
			snprintf(state, statelen, "%s", PQgetvalue(res, 0, 0));
			PQclear(res);
			if (im_log_format_g == IM_LOG_FORMAT_TEXT || flushed)
			{
				line.event = "completed";
				line.state = state;
				push_log_job("info", &line);
			}
			return state;
		}
		{
			char		why[256];

			snprintf(why, sizeof(why), "%.200s", PQresultErrorMessage(res));
			why[strcspn(why, "\n")] = '\0';
			line.event = "complete_failed";
			line.why = why;
			push_log_job("warning", &line);
		}
		PQclear(res);
		if (PQstatus(conn) != CONNECTION_OK)
			drop_connection("connection lost while completing");
	}
	if (keep)
	{
		if (nreports == maxreports)
		{
			maxreports = maxreports ? maxreports * 2 : 64;
			reports = realloc(reports, sizeof(Report) * maxreports);
			if (!reports)
			{
				relay_log("error", "event=out_of_memory");
				exit(1);
			}
		}
		reports[nreports].job_id = job_id;
		snprintf(reports[nreports].trace_id, sizeof(reports[nreports].trace_id), "%s", trace_id ? trace_id : "");
		snprintf(reports[nreports].result, sizeof(reports[nreports].result), "%s", result);
		reports[nreports].http_status = status;
		reports[nreports].retry_after_ms = retry_after_ms;
		nreports++;
	}
	return NULL;
}

static void
flush_reports(void)
{
	int			n = nreports;
	Report	   *copy;
	char		state[32];

	if (n == 0 || !db_ok())
		return;
	copy = malloc(sizeof(Report) * n);
	if (!copy)
		return;
	memcpy(copy, reports, sizeof(Report) * n);
	nreports = 0;
	for (int i = 0; i < n; i++)
		report(copy[i].job_id, copy[i].trace_id, copy[i].result, copy[i].http_status, copy[i].retry_after_ms,
			   1, 1, state, sizeof(state));
	free(copy);
}

/*
 * One attempt of a job: its line and its report.  Text: the attempt's
 * line, then report's "completed" line; JSON: one line after the report,
 * with the job's state after ("unreported" while the database has not
 * taken it).
 */
static void
attempt(const char *level, PushJobLog *line, long retry_after_ms)
{
	char		state[32];
	const char *after;

	if (im_log_format_g == IM_LOG_FORMAT_TEXT)
		push_log_job(level, line);
	after = report(line->job_id, line->trace_id, line->result, line->http_status > 0 ? line->http_status : 0,
				   retry_after_ms, 1, 0, state, sizeof(state));
	if (im_log_format_g == IM_LOG_FORMAT_JSON)
	{
		line->state = after ? after : "unreported";
		push_log_job(level, line);
	}
}

/* ---- claiming and sending ---- */

static void
start_job(const char *job_id_s, const char *target_s, const char *provider, const char *sealed,
		  const char *notification, const char *trace_id)
{
	int64_t		job_id = strtoll(job_id_s, NULL, 10);
	int64_t		target = strtoll(target_s, NULL, 10);
	char		err[256];
	char	   *token = NULL;
	size_t		token_len = 0;
	PushRequest *r;
	PushJobLog	line = {.job_id = job_id, .push_target_id = target, .provider = provider,
	.http_status = -1, .latency_ms = -1};

	/* a trace id not of the contract's form is not logged (it could break a text line) */
	if (!trace_id || !im_trace_id_ok(trace_id, strlen(trace_id)))
		trace_id = NULL;
	line.trace_id = trace_id;
	if (push_unseal(sealed, &token, &token_len, err, sizeof(err)) != 0)
	{
		/* our key ring, not the token: retried (a key change may be under way) */
		line.event = "unseal_failed";
		line.result = "transient";
		line.why = err;
		attempt("error", &line, -1);
		return;
	}
	r = push_request_new(cfg.url, job_id, target, notification, token, token_len, cfg.timeout_ms, err, sizeof(err));
	if (!r)
	{
		push_token_free(token, token_len);
		line.event = "bad_notification";
		line.result = "permanent";
		line.why = err;
		attempt("error", &line, -1);
		return;
	}
	snprintf(r->provider, sizeof(r->provider), "%s", provider ? provider : "");
	snprintf(r->trace_id, sizeof(r->trace_id), "%s", trace_id ? trace_id : "");
	curl_multi_add_handle(multi, r->easy);
	inflight++;
}

/* Claim as many jobs as there are free request slots; true if it got all it asked for. */
static int
claim(void)
{
	char		n[16];
	char		lease[32];
	const char *params[3] = {cfg.relay_id, n, lease};
	int			want = cfg.concurrency - inflight;
	int			got;
	PGresult   *res;

	if (want <= 0 || stopping || !db_ok())
		return 0;
	if (want > cfg.batch)
		want = cfg.batch;
	snprintf(n, sizeof(n), "%d", want);
	snprintf(lease, sizeof(lease), "%d seconds", cfg.lease_s);
	/*
	 * Columns by name: trace_id is there on a node of 1.10 or later, not
	 * on an older node or through a router that does not pass it on (then
	 * the job's lines say trace_id=-).
	 */
	res = PQexecParams(conn, "SELECT * FROM im.claim_push_jobs($1, $2::int, $3::interval)",
					   3, NULL, params, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		relay_log("warning", "event=claim_failed reason=\"%.200s\"", PQresultErrorMessage(res));
		PQclear(res);
		if (PQstatus(conn) != CONNECTION_OK)
			drop_connection("connection lost while claiming");
		return 0;
	}
	got = PQntuples(res);
	{
		int			c_job = PQfnumber(res, "job_id");
		int			c_target = PQfnumber(res, "push_target_id");
		int			c_provider = PQfnumber(res, "provider");
		int			c_sealed = PQfnumber(res, "sealed_token");
		int			c_notification = PQfnumber(res, "notification");
		int			c_trace = PQfnumber(res, "trace_id");

		if (c_job < 0 || c_target < 0 || c_sealed < 0 || c_notification < 0)
		{
			relay_log("error", "event=claim_failed reason=\"claim_push_jobs lacks a column this relay needs\"");
			PQclear(res);
			return 0;
		}
		for (int i = 0; i < got; i++)
			start_job(PQgetvalue(res, i, c_job), PQgetvalue(res, i, c_target),
					  c_provider >= 0 ? PQgetvalue(res, i, c_provider) : NULL,
					  PQgetvalue(res, i, c_sealed), PQgetvalue(res, i, c_notification),
					  c_trace >= 0 && !PQgetisnull(res, i, c_trace) ? PQgetvalue(res, i, c_trace) : NULL);
	}
	PQclear(res);
	return got == want;
}

/* Report every finished request; returns how many finished. */
static int
finish_requests(void)
{
	CURLMsg    *m;
	int			left;
	int			finished = 0;

	while ((m = curl_multi_info_read(multi, &left)) != NULL)
	{
		PushRequest *r = NULL;
		PushOutcome o;
		PushJobLog	line = {.event = "sent", .latency_ms = -1};

		if (m->msg != CURLMSG_DONE)
			continue;
		curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **) &r);
		o = push_classify(r, m->data.result);
		curl_multi_remove_handle(multi, r->easy);
		inflight--;
		n_sent++;
		for (int i = 0; i < 5; i++)
			if (strcmp(o.result, result_names[i]) == 0)
				n_results[i]++;
		line.job_id = r->job_id;
		line.trace_id = r->trace_id;
		line.push_target_id = r->push_target_id;
		line.provider = r->provider[0] ? r->provider : NULL;
		line.result = o.result;
		line.http_status = o.http_status;
		line.latency_ms = (push_now() - r->started) * 1000;
		line.why = o.why ? o.why : "";
		attempt("info", &line, o.retry_after_ms);
		push_request_free(r);
		finished++;
	}
	return finished;
}

/* true if a NOTIFY im_sync_push arrived (or the connection needs looking at) */
static int
drain_notifies(void)
{
	PGnotify   *n;
	int			got = 0;

	if (!conn)
		return 0;
	if (!PQconsumeInput(conn))
	{
		drop_connection(PQerrorMessage(conn));
		return 0;
	}
	while ((n = PQnotifies(conn)) != NULL)
	{
		got = 1;
		PQfreemem(n);
	}
	return got;
}

int
main(int argc, char **argv)
{
	struct sigaction sa;
	double		next_connect = 0;
	double		backoff = 1;
	double		next_poll = 0;
	int			wake = 1;
	int			backlog = 0;
	struct rlimit no_core = {0, 0};
	char		err[256];

	/*
	 * Before a key is read or a token opened: no core file, and no
	 * ptrace or /proc/PID/mem by processes of our uid (not dumpable).
	 */
	if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 || setrlimit(RLIMIT_CORE, &no_core) != 0)
	{
		fprintf(stderr, "im_push_relay: cannot disable core dumps: %s\n", strerror(errno));
		return 1;
	}
	/* every block jansson, libcurl and OpenSSL free is wiped (also initialises libcurl) */
	if (push_wipe_install(err, sizeof(err)) != 0)
	{
		fprintf(stderr, "im_push_relay: %s\n", err);
		return 1;
	}
	parse_args(argc, argv);
	if (pipe(sigpipe) != 0 || fcntl(sigpipe[0], F_SETFL, O_NONBLOCK) != 0 ||
		fcntl(sigpipe[1], F_SETFL, O_NONBLOCK) != 0)
		return 1;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	if (!(multi = curl_multi_init()))
		return 1;
	curl_multi_setopt(multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, (long) cfg.concurrency);
	curl_multi_setopt(multi, CURLMOPT_PIPELINING, (long) CURLPIPE_MULTIPLEX);
	relay_log("info", "event=start url_keys=%d concurrency=%d lease_s=%d", push_key_count(), cfg.concurrency, cfg.lease_s);

	for (;;)
	{
		struct curl_waitfd extra[2 + PUSH_NODES_MAX];
		int			nextra = 0;
		int			running = 0;
		int			timeout_ms;
		double		t = push_now();

		if (stopping && inflight == 0)
		{
			flush_reports();
			break;
		}
		if (!conn && t >= next_connect)
		{
			if (connect_db() == 0)
			{
				backoff = 1;
				wake = 1;
				flush_reports();
			}
			else
			{
				next_connect = t + backoff;
				backoff = backoff * 2 > RELAY_MAX_BACKOFF_S ? RELAY_MAX_BACKOFF_S : backoff * 2;
			}
		}
		if (conn && t >= next_nodes_refresh)
			refresh_nodes();
		if (conn && (wake || t >= next_poll))
		{
			wake = 0;
			next_poll = t + cfg.poll_s;
			/* a claim that got every job it asked for may have left more */
			backlog = claim();
		}
		curl_multi_perform(multi, &running);
		/* freed slots go to waiting jobs at once */
		if (finish_requests() > 0 && backlog)
			wake = 1;

		if (conn)
		{
			extra[nextra].fd = PQsocket(conn);
			extra[nextra].events = CURL_WAIT_POLLIN;
			extra[nextra].revents = 0;
			nextra++;
		}
		nextra += push_nodes_waitfds(extra + nextra, PUSH_NODES_MAX);
		extra[nextra].fd = sigpipe[0];
		extra[nextra].events = CURL_WAIT_POLLIN;
		extra[nextra].revents = 0;
		nextra++;
		timeout_ms = inflight > 0 ? 50 : (int) ((next_poll - push_now()) * 1000);
		if (!conn)
			timeout_ms = (int) ((next_connect - push_now()) * 1000);
		if (timeout_ms < 0)
			timeout_ms = 0;
		if (timeout_ms > 1000)
			timeout_ms = 1000;
		timeout_ms = push_nodes_timeout_ms(push_now(), timeout_ms);
		if (wake)
			timeout_ms = 0;
		curl_multi_poll(multi, extra, (unsigned) nextra, timeout_ms, NULL);
		if (conn && extra[0].revents)
			wake |= drain_notifies();
		wake |= push_nodes_io(extra, nextra - 1, push_now());
		if (extra[nextra - 1].revents)
		{
			char		buf[16];

			while (read(sigpipe[0], buf, sizeof(buf)) > 0)
				;
		}
	}
	relay_log("info", "event=stop sent=%ld delivered=%ld rejected=%ld rate_limited=%ld transient=%ld permanent=%ld unreported=%d",
		  n_sent, n_results[0], n_results[1], n_results[2], n_results[3], n_results[4], nreports);
	push_nodes_close();
	curl_multi_cleanup(multi);
	curl_global_cleanup();
	if (conn)
		PQfinish(conn);
	return 0;
}
