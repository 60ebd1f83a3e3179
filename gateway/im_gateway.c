/*
 * im_gateway.c — the WebSocket gateway of im_sync (contract §10-§11).
 *
 * One libwebsockets event loop serves the "im-sync.v1" protocol and HTTP
 * (/healthz, /metrics) on one port.  Every session keeps its own outgoing
 * queue and is written exactly once per LWS_CALLBACK_SERVER_WRITEABLE; the
 * database lives in db.c's thread, which wakes this loop with
 * lws_cancel_service when results or notifications are ready.
 *
 * Invariants kept here: user and device of every call come from the
 * authenticated session (frame.c checks frames naming others); a session
 * processes its frames one at a time, in order; at most one unsent hint per
 * kind (per conversation for CONVERSATION_ADVANCED) is pending per session;
 * a bad frame only ever touches its own session.
 */
#include "admission.h"
#include "db.h"
#include "frame.h"
#include "log.h"
#include "log_hash.h"

#include <libwebsockets.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* ---- configuration ---- */

static struct
{
	char		host[128];
	int			port;
	const char *db;
	size_t		max_frame;
	int			pool;
	double		rate;			/* frames per second per session */
	double		burst;
	int			max_conn_user;	/* concurrent sessions per account */
	double		hello_rate_device;	/* hellos per second per device (bucket) */
	double		hello_burst_device;
	double		hello_rate_user;
	double		hello_burst_user;
	int			max_pending_hello;	/* hellos in flight, gateway wide */
	int			hello_timeout;	/* seconds */
	int			members_ttl;	/* seconds a member list is cached */
	/* admission before any database work (contract §10) */
	int			max_connections;	/* WebSocket sessions, gateway wide */
	int			max_unauth_per_ip;	/* sessions without welcome, per peer address */
	/* transport */
	const char *tls_cert;
	const char *tls_key;
	int			insecure;		/* allow a non-loopback --listen without TLS */
	const char *allowed_origins[16];
	int			n_allowed_origins;
	int			ping_interval;	/* seconds of silence before a ping */
	int			idle_timeout;	/* seconds of silence before close 1001 */
	int			statement_timeout_ms;	/* on every pool connection, 0: none */
	size_t		max_queue;		/* bytes of replies queued per session */
	const char *log_key;		/* file with the key of logged id hashes */
} cfg = {
	"127.0.0.1", 8080, "", 1024 * 1024, 4,
	50, 100, 16, 1, 5, 5, 20, 512, 10, 5,
	50000, 256, NULL, NULL, 0, {NULL}, 0, 30, 60,
	IM_DB_DEFAULT_STATEMENT_TIMEOUT_MS, 16 * 1024 * 1024, NULL
};

#define RETRY_UNAVAILABLE_MS 1000
#define MAX_INQUEUE 32
#define MAX_CONV_HINTS 8
/* Before welcome only a hello of at most this size is read (contract §10):
 * an unauthenticated socket never holds more than this much frame data. */
#define MAX_HELLO_BYTES 8192
/* error frames may use this much beyond --max-queue, so a reply that did
 * not fit can still be answered with its id (issue 8 item 7) */
#define ERROR_HEADROOM (1024 * 1024)
#define METRICS_MAX_AGE 5.0		/* seconds (contract §10) */

/* ---- sessions ---- */

typedef struct outmsg
{
	struct outmsg *next;
	size_t		len;
	unsigned char buf[];		/* LWS_PRE bytes, then the frame */
} outmsg;

typedef struct inframe
{
	struct inframe *next;
	size_t		len;
	char		buf[];
} inframe;

typedef struct conv_hint
{
	int64_t		conv;
	int64_t		head;
} conv_hint;

typedef struct session
{
	uint64_t	sid;
	struct lws *wsi;
	unsigned	is_http:1, registered:1, authed:1, hello_pending:1, busy:1,
				flow_off:1, in_msg:1, bad_binary:1, ping_due:1;
	int			close_code;
	int64_t		user_id;
	int64_t		epoch;
	char		device_id[65];
	double		t_open;
	double		t_heard;		/* last frame or pong from the peer */
	double		t_ping;			/* last ping sent */
	struct ip_count *unauth_ip;	/* counted as unauthenticated there */
	/* inbound */
	char	   *rx;
	size_t		rxlen,
				rxcap;
	inframe    *in_head,
			   *in_tail;
	int			in_count;
	/* outbound */
	outmsg	   *out_head,
			   *out_tail;
	size_t		out_bytes;
	int64_t		hint_hw;		/* -1: none pending */
	/* device_session re-checks: at most one in flight and one pending */
	unsigned	recheck_inflight:1, recheck_pending:1, recheck_hint:1, recheck_retry:1;
	conv_hint  *chints;			/* allocated on first use */
	int			nchints;
	/* rate limit */
	double		tokens;
	double		t_tokens;
	int			rl_streak;
	/* http */
	int			http_status;
	char	   *http_body;
	/* indexes */
	struct session *sid_next;
	struct session *user_next;
	struct session *all_prev,
			   *all_next;
} session;

#define NBUCKETS 16384
static session *sid_table[NBUCKETS];
static session *user_table[NBUCKETS];
static session *all_sessions;
static uint64_t next_sid = 1;
static struct lws_context *g_ctx;
static volatile sig_atomic_t g_terminate;
static int	g_draining;
static double g_drain_deadline;
static int	g_pending_hellos;
/*
 * Reconnect-storm pacing: hellos answered per second (moving average over
 * the 1 s tick) and the time handed to the last client refused for
 * max_pending_hello.  Each refusal gets the next free slot at that rate
 * instead of the same fixed wait, so refused clients come back spread out
 * at about the pace the gateway completes hellos, not in one herd.
 */
static long g_hellos_done;
static double g_hello_rate = 200;
static double g_hello_slot;
static int	g_first_listen_seen;
static lws_sorted_usec_list_t g_tick;

/* ---- metrics ---- */

enum
{
	OUT_ERROR = IM_OP_COUNT, OUT_HINT, OUT_NTYPES
};
static const char *const err_codes[] = {
	"BAD_FRAME", "INVALID_ARGUMENT", "FORBIDDEN", "NOT_FOUND", "CONFLICT",
	"RATE_LIMITED", "UNAVAILABLE", "INTERNAL", "NOT_AUTHENTICATED"
};
#define N_ERR_CODES (sizeof(err_codes) / sizeof(err_codes[0]))
static const int close_codes[] = {1001, 1009, 1013, 4001, 4003, 4008, 4029};
#define N_CLOSE_CODES (sizeof(close_codes) / sizeof(close_codes[0]))

static struct
{
	long		conns_current,
				conns_total,
				http_requests;
	long		frames_in[IM_OP_COUNT + 1];	/* last: undecodable */
	long		frames_out[OUT_NTYPES];
	long		errors[N_ERR_CODES];
	long		closes[N_CLOSE_CODES];
	long		hints_sent,
				hints_coalesced,
				hints_dropped;
	long		notifications;
	long		refusals;
	long		upgrades_refused_cap,	/* HTTP 503: a connection cap */
				upgrades_refused_origin;	/* HTTP 403: Origin not allowed */
	long		rechecks;		/* device_session re-checks sent */
	long		metrics_refreshes;	/* im.metrics() calls */
	long		replies_too_large;	/* replies answered UNAVAILABLE instead */
} m;

static void
count_error(const char *code)
{
	size_t		i;

	for (i = 0; i < N_ERR_CODES; i++)
		if (strcmp(code, err_codes[i]) == 0)
			m.errors[i]++;
}

/* ---- tables ---- */

static unsigned
hash64(uint64_t k)
{
	k ^= k >> 33;
	k *= 0xff51afd7ed558ccdULL;
	k ^= k >> 33;
	return (unsigned) (k & (NBUCKETS - 1));
}

static session *
find_session(uint64_t sid)
{
	session    *s;

	for (s = sid_table[hash64(sid)]; s; s = s->sid_next)
		if (s->sid == sid)
			return s;
	return NULL;
}

/*
 * Sessions are malloc'd, not lws per-session data: lws frees and re-binds
 * the user space of HTTP connections between transactions, and jobs in
 * flight find sessions by sid, never by pointer.
 */
typedef struct pss
{
	session    *s;
} pss;

static session *
register_session(struct lws *wsi, int is_http)
{
	unsigned	h;
	session    *s = calloc(1, sizeof(session));

	if (!s)
		abort();
	s->sid = next_sid++;
	s->wsi = wsi;
	s->is_http = is_http;
	s->registered = 1;
	s->hint_hw = -1;
	s->t_open = im_now();
	s->t_heard = s->t_open;
	s->tokens = cfg.burst;
	s->t_tokens = s->t_open;
	h = hash64(s->sid);
	s->sid_next = sid_table[h];
	sid_table[h] = s;
	s->all_next = all_sessions;
	if (all_sessions)
		all_sessions->all_prev = s;
	all_sessions = s;
	return s;
}

static void
user_link(session *s)
{
	unsigned	h = hash64((uint64_t) s->user_id);

	s->user_next = user_table[h];
	user_table[h] = s;
}

static void
user_unlink(session *s)
{
	session   **pp = &user_table[hash64((uint64_t) s->user_id)];

	for (; *pp; pp = &(*pp)->user_next)
		if (*pp == s)
		{
			*pp = s->user_next;
			return;
		}
}

static void
unregister_session(session *s)
{
	session   **pp;

	if (!s->registered)
		return;
	for (pp = &sid_table[hash64(s->sid)]; *pp; pp = &(*pp)->sid_next)
		if (*pp == s)
		{
			*pp = s->sid_next;
			break;
		}
	if (s->authed)
		user_unlink(s);
	if (s->all_prev)
		s->all_prev->all_next = s->all_next;
	else
		all_sessions = s->all_next;
	if (s->all_next)
		s->all_next->all_prev = s->all_prev;
	while (s->out_head)
	{
		outmsg	   *o = s->out_head;

		s->out_head = o->next;
		free(o);
	}
	while (s->in_head)
	{
		inframe    *f = s->in_head;

		s->in_head = f->next;
		free(f);
	}
	if (s->hello_pending)
		g_pending_hellos--;
	im_unauth_release(s->unauth_ip);
	free(s->rx);
	free(s->chints);
	free(s->http_body);
	s->registered = 0;
	free(s);
}

/* ---- outgoing ---- */

/*
 * Queues text (consumed) for the session.  Returns -1 when the session's
 * queue has no room for it: replies stop at --max-queue, error frames may
 * use ERROR_HEADROOM more.
 */
static int
enqueue_text(session *s, char *text, int out_type)
{
	size_t		len;
	size_t		cap = cfg.max_queue + (out_type == OUT_ERROR ? ERROR_HEADROOM : 0);
	outmsg	   *o;

	if (!text)
		return -1;
	len = strlen(text);
	if (s->close_code || s->out_bytes + len > cap)
	{
		free(text);
		return -1;
	}
	o = malloc(sizeof(outmsg) + LWS_PRE + len);
	if (!o)
		abort();
	o->next = NULL;
	o->len = len;
	memcpy(o->buf + LWS_PRE, text, len);
	free(text);
	if (s->out_tail)
		s->out_tail->next = o;
	else
		s->out_head = o;
	s->out_tail = o;
	s->out_bytes += len;
	m.frames_out[out_type]++;
	lws_callback_on_writable(s->wsi);
	return 0;
}

static void begin_close(session *s, int code, const char *why);

static void
send_error(session *s, json_t *id, const char *code, const char *msg, long retry_ms)
{
	count_error(code);
	/* a client that reads none of its replies is closed, never left with a
	 * request that silently got no answer */
	if (enqueue_text(s, im_error_frame(id, code, msg, retry_ms), OUT_ERROR) != 0 &&
		!s->close_code)
		begin_close(s, 1013, "send_queue_full");
}

/*
 * Every request gets a reply (issue 8 item 7): one that does not fit the
 * session's queue is answered UNAVAILABLE with its id instead.
 */
static void
send_reply(session *s, json_t *id, char *text, int out_type)
{
	if (enqueue_text(s, text, out_type) == 0 || s->close_code)
		return;
	m.replies_too_large++;
	send_error(s, id, "UNAVAILABLE",
			   "reply does not fit the session's send queue: read pending replies, "
			   "or ask for a smaller page", RETRY_UNAVAILABLE_MS);
}

static void
begin_close(session *s, int code, const char *why)
{
	size_t		i;

	if (s->close_code)
		return;
	s->close_code = code;
	for (i = 0; i < N_CLOSE_CODES; i++)
		if (close_codes[i] == code)
			m.closes[i]++;
	{
		char		hu[IM_LOG_HASH_BUF],
					hd[IM_LOG_HASH_BUF];

		im_log("info", "event=close sid=%" PRIu64 " user=%s device=%s code=%d reason=%s",
			   s->sid, s->user_id ? im_hash_user(s->user_id, hu) : "-",
			   s->device_id[0] ? im_hash_device(s->user_id, s->device_id, hd) : "-", code, why);
	}
	lws_callback_on_writable(s->wsi);
}

static void
push_hint(session *s, int64_t hw)
{
	if (!s->authed || s->close_code)
		return;
	if (s->hint_hw >= 0)
	{
		m.hints_coalesced++;
		if (hw > s->hint_hw)
			s->hint_hw = hw;
		return;
	}
	s->hint_hw = hw;
	lws_callback_on_writable(s->wsi);
}

static void
push_conv_hint(session *s, int64_t conv, int64_t head)
{
	int			i;

	if (!s->authed || s->close_code)
		return;
	for (i = 0; i < s->nchints; i++)
		if (s->chints[i].conv == conv)
		{
			m.hints_coalesced++;
			if (head > s->chints[i].head)
				s->chints[i].head = head;
			return;
		}
	if (!s->chints)
	{
		s->chints = calloc(MAX_CONV_HINTS, sizeof(conv_hint));
		if (!s->chints)
			abort();
	}
	if (s->nchints == MAX_CONV_HINTS)
	{
		/* hints may be lost: conversation_list's head_msg_seq catches up */
		m.hints_dropped++;
		memmove(s->chints, s->chints + 1, sizeof(conv_hint) * (MAX_CONV_HINTS - 1));
		s->nchints--;
	}
	s->chints[s->nchints].conv = conv;
	s->chints[s->nchints].head = head;
	s->nchints++;
	lws_callback_on_writable(s->wsi);
}

/*
 * One lws_write per writeable callback: replies first (in order), then the
 * pending hints, then the close once everything queued is out.
 */
static int
on_writeable(session *s)
{
	unsigned char buf[LWS_PRE + 160];
	int			n;

	if (s->ping_due && !s->close_code)
	{
		/*
		 * keepalive: the pong (or any frame) proves life.  The ping carries
		 * a byte because lws 4.1 reports no LWS_CALLBACK_RECEIVE_PONG for an
		 * empty pong.
		 */
		s->ping_due = 0;
		buf[LWS_PRE] = 'k';
		if (lws_write(s->wsi, buf + LWS_PRE, 1, LWS_WRITE_PING) < 1)
			return -1;
	}
	else if (s->out_head)
	{
		outmsg	   *o = s->out_head;

		n = lws_write(s->wsi, o->buf + LWS_PRE, o->len, LWS_WRITE_TEXT);
		if (n < (int) o->len)
			return -1;
		s->out_head = o->next;
		if (!s->out_head)
			s->out_tail = NULL;
		s->out_bytes -= o->len;
		free(o);
	}
	else if (s->hint_hw >= 0 && !s->close_code)
	{
		n = snprintf((char *) buf + LWS_PRE, 160,
					 "{\"type\":\"hint\",\"high_watermark\":%" PRId64 ",\"reason\":\"NEW_EVENTS\"}",
					 s->hint_hw);
		s->hint_hw = -1;
		m.hints_sent++;
		m.frames_out[OUT_HINT]++;
		if (lws_write(s->wsi, buf + LWS_PRE, (size_t) n, LWS_WRITE_TEXT) < n)
			return -1;
	}
	else if (s->nchints > 0 && !s->close_code)
	{
		conv_hint	h = s->chints[0];

		memmove(s->chints, s->chints + 1, sizeof(conv_hint) * (size_t) (s->nchints - 1));
		s->nchints--;
		n = snprintf((char *) buf + LWS_PRE, 160,
					 "{\"type\":\"hint\",\"reason\":\"CONVERSATION_ADVANCED\",\"conversation_id\":%" PRId64 ",\"head_msg_seq\":%" PRId64 "}",
					 h.conv, h.head);
		m.hints_sent++;
		m.frames_out[OUT_HINT]++;
		if (lws_write(s->wsi, buf + LWS_PRE, (size_t) n, LWS_WRITE_TEXT) < n)
			return -1;
	}
	else if (s->close_code)
	{
		lws_close_reason(s->wsi, (enum lws_close_status) s->close_code, NULL, 0);
		return -1;
	}
	if (s->out_head || (!s->close_code && (s->hint_hw >= 0 || s->nchints > 0)) || s->close_code)
		lws_callback_on_writable(s->wsi);
	return 0;
}

/* ---- jobs ---- */

static im_job *
new_job(im_job_kind kind, session *s)
{
	im_job	   *j = calloc(1, sizeof(im_job));

	if (!j)
		abort();
	j->kind = kind;
	j->sid = s ? s->sid : 0;
	return j;
}

static char *
int_str(int64_t v)
{
	char		b[32];

	snprintf(b, sizeof(b), "%" PRId64, v);
	return strdup(b);
}

static void pump(session *s);

static void
refuse(session *s, json_t *id, long retry_ms, const char *why)
{
	m.refusals++;
	send_error(s, id, "RATE_LIMITED", why, retry_ms);
	begin_close(s, 4029, why);
}

/* Small direct-mapped buckets for reconnect rates; a collision only makes
 * the limit approximate, never unbounded memory. */
#define NRATE 65536
typedef struct
{
	uint64_t	key;
	double		tokens,
				t;
} rate_slot;
static rate_slot *dev_rates, *user_rates;

static uint64_t
fnv(const char *s, uint64_t h)
{
	for (; *s; s++)
		h = (h ^ (unsigned char) *s) * 1099511628211ULL;
	return h;
}

/* Returns 0 when allowed, else milliseconds to wait. */
static long
take_rate(rate_slot *tab, uint64_t key, double rate, double burst)
{
	rate_slot  *r = &tab[hash64(key) % NRATE];
	double		now = im_now();

	if (r->key != key || r->t == 0)
	{
		r->key = key;
		r->tokens = burst;
		r->t = now;
	}
	r->tokens += (now - r->t) * rate;
	if (r->tokens > burst)
		r->tokens = burst;
	r->t = now;
	if (r->tokens < 1)
		return (long) ceil((1 - r->tokens) / rate * 1000);
	r->tokens -= 1;
	return 0;
}

static void welcome(session *s, im_job *j, int off);

static void
hello_done(session *s)
{
	if (s->hello_pending)
	{
		s->hello_pending = 0;
		g_pending_hellos--;
		g_hellos_done++;
	}
}

/* Milliseconds a client refused for max_pending_hello should wait. */
static long
hello_retry_ms(void)
{
	double		now = im_now();
	double		rate = g_hello_rate < 20 ? 20 : g_hello_rate;

	/* the queue in flight drains first, then one slot per refused client */
	if (g_hello_slot < now + g_pending_hellos / rate)
		g_hello_slot = now + g_pending_hellos / rate;
	g_hello_slot += 1 / rate;
	if (g_hello_slot > now + 60)
		g_hello_slot = now + 60;
	return (long) ceil((g_hello_slot - now) * 1000);
}

/*
 * A hello's authenticate runs in an explicit transaction that the database
 * thread holds open (im_job.txn): on_auth first sees its result with the
 * transaction still open, checks the limits that need the identity, and
 * COMMITs only a hello it will welcome.  A refused hello is rolled back, so
 * its connection-epoch bump and NOTIFY SUPERSEDED never happen and the live
 * session of the device stays current (issue 8 item 12).  The job comes back
 * once more after the COMMIT, and only then is the session welcomed.
 * Returns 1 when the job went back to the database thread (not to be freed).
 */
static int
on_auth(session *s, im_job *j)
{
	long		wait;
	int			nuser = 0;
	session    *o;

	if (j->txn_ended)
	{
		/* the COMMIT's answer */
		if (j->status != IM_JOB_OK)
		{
			hello_done(s);
			send_error(s, j->id, "UNAVAILABLE", "database unavailable", RETRY_UNAVAILABLE_MS);
			begin_close(s, 1013, "db_unavailable");
			return 0;
		}
		welcome(s, j, 3);
		return 0;
	}
	if (j->status == IM_JOB_UNAVAILABLE)
	{
		hello_done(s);
		send_error(s, j->id, "UNAVAILABLE", "database unavailable", RETRY_UNAVAILABLE_MS);
		begin_close(s, 1013, "db_unavailable");
		return 0;
	}
	if (j->status != IM_JOB_OK || PQntuples(j->res) != 1)
	{
		int			held = j->txn_held;

		hello_done(s);
		im_log("info", "event=auth_failed sid=%" PRIu64 " sqlstate=%s", s->sid,
			   j->status == IM_JOB_SQL_ERROR ? j->sqlstate : "-");
		send_error(s, j->id, "NOT_AUTHENTICATED", "authentication failed", -1);
		begin_close(s, 4001, "auth_failed");
		if (held)
			im_db_end_txn(j, 0);
		return held;
	}
	s->user_id = strtoll(PQgetvalue(j->res, 0, 0), NULL, 10);
	snprintf(s->device_id, sizeof(s->device_id), "%s", PQgetvalue(j->res, 0, 1));
	s->epoch = strtoll(PQgetvalue(j->res, 0, 2), NULL, 10);

	/* §11.3: per-account concurrency and per-device/account reconnect rate */
	for (o = user_table[hash64((uint64_t) s->user_id)]; o; o = o->user_next)
		if (o->user_id == s->user_id && o->authed && !o->close_code &&
			strcmp(o->device_id, s->device_id) != 0)
			nuser++;
	if (nuser >= cfg.max_conn_user)
	{
		hello_done(s);
		refuse(s, j->id, 5000, "too many connections for this account");
		im_db_end_txn(j, 0);
		return 1;
	}
	wait = take_rate(dev_rates, fnv(s->device_id, (uint64_t) s->user_id * 1469598103934665603ULL),
					 cfg.hello_rate_device, cfg.hello_burst_device);
	if (!wait)
		wait = take_rate(user_rates, (uint64_t) s->user_id, cfg.hello_rate_user, cfg.hello_burst_user);
	if (wait)
	{
		hello_done(s);
		refuse(s, j->id, wait, "reconnecting too fast");
		im_db_end_txn(j, 0);
		return 1;
	}
	im_db_end_txn(j, 1);		/* welcome when the COMMIT answers */
	return 1;
}

/* The device_session columns of the hello result start at column off. */
static void
welcome(session *s, im_job *j, int off)
{
	PGresult   *r = j->res;
	json_t	   *w;

	hello_done(s);
	if (strcmp(PQgetvalue(r, 0, off + 0), "REVOKED") == 0)
	{
		begin_close(s, 4003, "revoked");
		return;
	}
	if (PQgetvalue(r, 0, off + 4)[0] != 't')
	{
		begin_close(s, 4008, "superseded");
		return;
	}
	s->authed = 1;
	im_unauth_release(s->unauth_ip);
	s->unauth_ip = NULL;
	user_link(s);
	w = json_object();
	json_object_set_new(w, "type", json_string("welcome"));
	if (j->id)
		json_object_set(w, "id", j->id);
	json_object_set_new(w, "user_id", json_integer(s->user_id));
	json_object_set_new(w, "device_id", json_string(s->device_id));
	json_object_set_new(w, "connection_epoch", json_integer(s->epoch));
	json_object_set_new(w, "sync_generation",
						PQgetisnull(r, 0, off + 1) ? json_null() : json_integer(strtoll(PQgetvalue(r, 0, off + 1), NULL, 10)));
	json_object_set_new(w, "server_acked_sync_seq",
						PQgetisnull(r, 0, off + 2) ? json_null() : json_integer(strtoll(PQgetvalue(r, 0, off + 2), NULL, 10)));
	json_object_set_new(w, "high_watermark",
						PQgetisnull(r, 0, off + 3) ? json_null() : json_integer(strtoll(PQgetvalue(r, 0, off + 3), NULL, 10)));
	json_object_set_new(w, "state", json_string(PQgetvalue(r, 0, off + 0)));
	send_reply(s, j->id, json_dumps(w, JSON_COMPACT), IM_OP_HELLO);
	json_decref(w);
	{
		char		hu[IM_LOG_HASH_BUF],
					hd[IM_LOG_HASH_BUF];

		im_log("info", "event=welcome sid=%" PRIu64 " user=%s device=%s epoch=%" PRId64,
			   s->sid, im_hash_user(s->user_id, hu), im_hash_device(s->user_id, s->device_id, hd),
			   s->epoch);
	}
	pump(s);
}

/*
 * Asks im.device_session whether the session's device is still current.
 * A notification never closes a session by itself (any role can NOTIFY,
 * issue 8 item 2): it only triggers this.  Per session at most one re-check
 * is in flight and one pending, so a flood of notifications costs at most
 * two calls per round trip.  hint: also hint afterwards (after a re-LISTEN,
 * hints may have been lost).
 */
static void
request_recheck(session *s, int hint)
{
	im_job	   *j;

	if (!s->authed || s->close_code)
		return;
	if (hint)
		s->recheck_hint = 1;
	if (s->recheck_inflight)
	{
		s->recheck_pending = 1;
		return;
	}
	s->recheck_inflight = 1;
	m.rechecks++;
	j = new_job(IM_JOB_RECHECK, s);
	j->key = s->recheck_hint;
	s->recheck_hint = 0;
	j->sql = "SELECT state, sync_generation, server_acked_sync_seq, high_watermark, current "
		"FROM im.device_session($1::bigint, $2::text, $3::bigint)";
	j->nparams = 3;
	j->params[0] = int_str(s->user_id);
	j->params[1] = strdup(s->device_id);
	j->params[2] = int_str(s->epoch);
	im_db_submit(j);
}

static void
on_recheck(session *s, im_job *j)
{
	PGresult   *r = j->res;

	s->recheck_inflight = 0;
	if (s->authed && j->status == IM_JOB_OK && PQntuples(r) == 1)
	{
		if (strcmp(PQgetvalue(r, 0, 0), "REVOKED") == 0)
		{
			begin_close(s, 4003, "revoked");
			return;
		}
		if (PQgetvalue(r, 0, 4)[0] != 't')
		{
			begin_close(s, 4008, "superseded");
			return;
		}
		if (j->key && !PQgetisnull(r, 0, 3))
			push_hint(s, strtoll(PQgetvalue(r, 0, 3), NULL, 10));
	}
	else if (s->authed && j->status == IM_JOB_UNAVAILABLE)
	{
		/*
		 * Not answered (pool not up yet after a restart, timeout): the
		 * question stays open and is asked again on the next tick, hint
		 * included, never in a loop.  An SQL error is not retried.
		 */
		s->recheck_retry = 1;
		s->recheck_hint |= j->key ? 1 : 0;
	}
	if (s->recheck_pending)
	{
		s->recheck_pending = 0;
		request_recheck(s, 0);
	}
}

static void
on_api(session *s, im_job *j)
{
	s->busy = 0;
	if (j->status == IM_JOB_OK)
	{
		send_reply(s, j->id, j->reply, j->op);
		j->reply = NULL;
	}
	else if (j->status == IM_JOB_UNAVAILABLE)
		send_error(s, j->id, "UNAVAILABLE",
				   strcmp(j->sqlstate, "57014") == 0 ? "request took too long (statement timeout), retry later"
				   : "database unavailable, retry later", RETRY_UNAVAILABLE_MS);
	else
	{
		const char *ss = j->sqlstate;
		const char *code;

		/* contract §10: 22P05 is \u0000 in a body, 22003 an integer out of
		 * its column's range */
		if (!strcmp(ss, "22023") || !strcmp(ss, "22P02") || !strcmp(ss, "22P05") ||
			!strcmp(ss, "22003"))
			code = "INVALID_ARGUMENT";
		else if (!strcmp(ss, "42501"))
			code = "FORBIDDEN";
		else if (!strcmp(ss, "P0002"))
			code = "NOT_FOUND";
		else if (!strcmp(ss, "IS409"))
			code = "CONFLICT";
		else
			code = "INTERNAL";
		if (strcmp(code, "INTERNAL") == 0)
		{
			char		hu[IM_LOG_HASH_BUF];

			im_log("error", "event=internal_error sid=%" PRIu64 " user=%s op=%s sqlstate=%s msg=\"%s\"",
				   s->sid, im_hash_user(s->user_id, hu), im_ops[j->op].type, ss, j->errmsg ? j->errmsg : "");
			send_error(s, j->id, code, "internal error", -1);
		}
		else
			send_error(s, j->id, code, j->errmsg, -1);
	}
	if (g_draining)
		begin_close(s, 1001, "shutdown");
	else
		pump(s);
}

/* ---- shared_log member cache ---- */

#define NMEMBERS 256
typedef struct
{
	int64_t		conv;
	int64_t	   *users;
	int			nusers;
	double		fetched;
	int			inflight;
	int64_t		pending_head;	/* -1: none */
} members_slot;
static members_slot members[NMEMBERS];

static void
deliver_conv_hint(members_slot *ms, int64_t head)
{
	int			i;

	for (i = 0; i < ms->nusers; i++)
	{
		session    *s;

		for (s = user_table[hash64((uint64_t) ms->users[i])]; s; s = s->user_next)
			if (s->user_id == ms->users[i])
				push_conv_hint(s, ms->conv, head);
	}
}

/* "{u1,u2,…}": the users with an authenticated session here (malloc'd). */
static char *
connected_users_array(void)
{
	size_t		cap = 64,
				len = 0;
	char	   *b = malloc(cap);
	session    *s;

	if (!b)
		abort();
	b[len++] = '{';
	for (s = all_sessions; s; s = s->all_next)
	{
		if (!s->authed || s->close_code)
			continue;
		if (len + 24 > cap)
		{
			cap *= 2;
			b = realloc(b, cap);
			if (!b)
				abort();
		}
		len += (size_t) snprintf(b + len, cap - len, "%s%" PRId64, len > 1 ? "," : "", s->user_id);
	}
	b[len++] = '}';
	b[len] = '\0';
	return b;
}

static void
conv_hint_cb(void *arg, int64_t conv, int64_t head)
{
	members_slot *ms = &members[hash64((uint64_t) conv) % NMEMBERS];

	(void) arg;
	if (ms->conv == conv && !ms->inflight && im_now() - ms->fetched < cfg.members_ttl)
	{
		deliver_conv_hint(ms, head);
		return;
	}
	if (ms->conv == conv && ms->inflight)
	{
		if (head > ms->pending_head)
			ms->pending_head = head;
		return;
	}
	if (ms->inflight)
		return;					/* slot busy for another conversation: hint lost */
	free(ms->users);
	ms->users = NULL;
	ms->nusers = 0;
	ms->conv = conv;
	ms->inflight = 1;
	ms->pending_head = head;
	{
		im_job	   *j = new_job(IM_JOB_MEMBERS, NULL);

		j->key = conv;
		/*
		 * Only which of this gateway's connected users are active members
		 * (issue 8 item 6): the gateway role cannot list a conversation's
		 * members.
		 */
		j->sql = "SELECT u FROM im.members_among($1::bigint, $2::bigint[]) u";
		j->nparams = 2;
		j->params[0] = int_str(conv);
		j->params[1] = connected_users_array();
		im_db_submit(j);
	}
}

static void
on_members(im_job *j)
{
	members_slot *ms = &members[hash64((uint64_t) j->key) % NMEMBERS];
	int			i;

	if (ms->conv != j->key)
		return;
	ms->inflight = 0;
	if (j->status != IM_JOB_OK)
	{
		ms->fetched = 0;
		im_log("warn", "event=members_lookup_failed conv=%" PRId64 " sqlstate=%s", j->key,
			   j->status == IM_JOB_SQL_ERROR ? j->sqlstate : "-");
		return;
	}
	ms->nusers = PQntuples(j->res);
	ms->users = calloc((size_t) ms->nusers + 1, sizeof(int64_t));
	if (!ms->users)
		abort();
	for (i = 0; i < ms->nusers; i++)
		ms->users[i] = strtoll(PQgetvalue(j->res, i, 0), NULL, 10);
	ms->fetched = im_now();
	if (ms->pending_head >= 0)
		deliver_conv_hint(ms, ms->pending_head);
	ms->pending_head = -1;
}

static void
user_hint_cb(void *arg, int64_t user, int64_t hw)
{
	session    *s;

	(void) arg;
	for (s = user_table[hash64((uint64_t) user)]; s; s = s->user_next)
		if (s->user_id == user)
			push_hint(s, hw);
}

static void
on_notify(im_job *j)
{
	m.notifications++;
	if (strcmp(j->channel, "im_sync_hint") == 0)
	{
		if (im_parse_hint_payload(j->payload, user_hint_cb, conv_hint_cb, NULL) > 0)
			im_log("warn", "event=bad_hint_payload");
	}
	else if (strcmp(j->channel, "im_sync_device") == 0)
	{
		im_device_event ev;
		session    *s;

		if (im_parse_device_event(j->payload, &ev) != 0)
		{
			im_log("warn", "event=bad_device_payload");
			return;
		}
		for (s = user_table[hash64((uint64_t) ev.user_id)]; s; s = s->user_next)
		{
			if (s->user_id != ev.user_id || strcmp(s->device_id, ev.device_id) != 0)
				continue;
			/* a supersession is by a newer epoch; anything else is re-checked */
			if (ev.revoked || s->epoch < ev.epoch)
				request_recheck(s, 0);
		}
	}
}

static void
on_listen_up(void)
{
	session    *s;

	/* After a (re)LISTEN, notifications may have been missed: re-check every
	 * session and hint it, so revocations, supersessions and new events sent
	 * while we were deaf are not lost. */
	if (!g_first_listen_seen)
	{
		g_first_listen_seen = 1;
		if (!all_sessions)
			return;
	}
	for (s = all_sessions; s; s = s->all_next)
		request_recheck(s, 1);
}

static char *metrics_text(PGresult *extra);

static void
on_http_job(session *s, im_job *j)
{
	int			ok = j->status == IM_JOB_OK;

	s->http_status = ok ? 200 : 503;
	s->http_body = strdup(ok ? "ok\n" : "database unavailable\n");
	lws_callback_on_writable(s->wsi);
}

/*
 * /metrics cache (issue 8 item 4): im.metrics() scans tables, and scrapes
 * need no authentication, so its result is reused for METRICS_MAX_AGE
 * seconds (aged from when the call was sent) and at most one call is in
 * flight; scrapes arriving meanwhile wait for it.  The gateway's own
 * counters are always current.
 */
static struct
{
	PGresult   *res;			/* NULL: none usable */
	double		at;
	int			inflight;
	uint64_t   *waiting;		/* sids of HTTP sessions waiting */
	int			nwaiting,
				capwaiting;
} mcache;

static void
answer_metrics(session *s)
{
	int			fresh = mcache.res && im_now() - mcache.at <= METRICS_MAX_AGE;

	s->http_status = 200;
	s->http_body = metrics_text(fresh ? mcache.res : NULL);
	lws_callback_on_writable(s->wsi);
}

static void
request_metrics(session *s)
{
	im_job	   *j;

	if (mcache.res && im_now() - mcache.at <= METRICS_MAX_AGE)
	{
		answer_metrics(s);
		return;
	}
	if (mcache.nwaiting == mcache.capwaiting)
	{
		mcache.capwaiting = mcache.capwaiting ? mcache.capwaiting * 2 : 16;
		mcache.waiting = realloc(mcache.waiting, sizeof(uint64_t) * (size_t) mcache.capwaiting);
		if (!mcache.waiting)
			abort();
	}
	mcache.waiting[mcache.nwaiting++] = s->sid;
	if (mcache.inflight)
		return;
	mcache.inflight = 1;
	m.metrics_refreshes++;
	j = new_job(IM_JOB_METRICS, NULL);
	j->sql = "SELECT name, value, help FROM im.metrics()";
	im_db_submit(j);
}

static void
on_metrics(im_job *j)
{
	int			i;

	mcache.inflight = 0;
	if (mcache.res)
		PQclear(mcache.res);
	mcache.res = NULL;
	if (j->status == IM_JOB_OK)
	{
		mcache.res = j->res;	/* kept: the job no longer owns it */
		j->res = NULL;
		mcache.at = j->t_submit;
	}
	for (i = 0; i < mcache.nwaiting; i++)
	{
		session    *s = find_session(mcache.waiting[i]);

		if (s)
			answer_metrics(s);
	}
	mcache.nwaiting = 0;
}

static void
handle_done(void)
{
	im_job	   *j = im_db_take_done();

	while (j)
	{
		im_job	   *next = j->next;
		session    *s = j->sid ? find_session(j->sid) : NULL;
		int			handed_back = 0;

		switch (j->kind)
		{
			case IM_JOB_NOTIFY:
				on_notify(j);
				break;
			case IM_JOB_LISTEN_UP:
				on_listen_up();
				break;
			case IM_JOB_MEMBERS:
				on_members(j);
				break;
			case IM_JOB_METRICS:
				on_metrics(j);
				break;
			default:
				if ((!s || s->close_code) && j->txn_held && !j->txn_ended)
				{
					/* an open hello transaction of a gone session is rolled
					 * back; the job is the database thread's from here on */
					if (s)
						hello_done(s);
					im_db_end_txn(j, 0);
					handed_back = 1;
					break;
				}
				if (!s)
					break;		/* session gone: drop */
				if (j->kind == IM_JOB_HEALTH)
					on_http_job(s, j);
				else if (s->close_code)
				{
					hello_done(s);
					s->busy = 0;
				}
				else if (j->kind == IM_JOB_API)
					on_api(s, j);
				else if (j->kind == IM_JOB_AUTH)
					handed_back = on_auth(s, j);
				else if (j->kind == IM_JOB_RECHECK)
					on_recheck(s, j);
				break;
		}
		if (!handed_back)
			im_job_free(j);
		j = next;
	}
}

/* ---- frames ---- */

static void
process_frame(session *s, const char *buf, size_t len)
{
	im_request req;
	im_decode_status st;
	im_job	   *j;
	int			i;

	st = im_decode_frame(buf, len, s->user_id, s->authed ? s->device_id : NULL, &req);
	m.frames_in[st == IM_DECODE_BAD_FRAME ? IM_OP_COUNT : (int) req.op]++;	/* op COUNT: unreadable */
	if (!s->authed)
	{
		/* the first frame must be a valid hello */
		if (st != IM_DECODE_OK || req.op != IM_OP_HELLO)
		{
			send_error(s, req.id, "NOT_AUTHENTICATED", "the first frame must be a valid hello", -1);
			begin_close(s, 4001, "no_hello");
			im_request_free(&req);
			return;
		}
		if (g_pending_hellos >= cfg.max_pending_hello)
		{
			refuse(s, req.id, hello_retry_ms(), "gateway busy authenticating, retry later");
			im_request_free(&req);
			return;
		}
		s->hello_pending = 1;
		g_pending_hellos++;
		j = new_job(IM_JOB_AUTH, s);
		j->txn = 1;				/* limits are checked before COMMIT: see on_auth */
	}
	else if (st == IM_DECODE_BAD_FRAME)
	{
		send_error(s, req.id, "BAD_FRAME", req.err, -1);
		im_request_free(&req);
		return;
	}
	else if (st == IM_DECODE_INVALID)
	{
		send_error(s, req.id, "INVALID_ARGUMENT", req.err, -1);
		im_request_free(&req);
		return;
	}
	else if (st == IM_DECODE_FORBIDDEN)
	{
		send_error(s, req.id, "FORBIDDEN", req.err, -1);
		im_request_free(&req);
		return;
	}
	else if (req.op == IM_OP_HELLO)
	{
		send_error(s, req.id, "BAD_FRAME", "already authenticated", -1);
		im_request_free(&req);
		return;
	}
	else if (req.op == IM_OP_PING)
	{
		json_t	   *p = json_object();

		json_object_set_new(p, "type", json_string("pong"));
		if (req.id)
			json_object_set(p, "id", req.id);
		send_reply(s, req.id, json_dumps(p, JSON_COMPACT), IM_OP_PING);
		json_decref(p);
		im_request_free(&req);
		return;
	}
	else
	{
		j = new_job(IM_JOB_API, s);
		s->busy = 1;
	}
	j->op = req.op;
	j->sql = req.sql;
	j->id = req.id;
	req.id = NULL;
	j->nparams = req.nparams;
	for (i = 0; i < req.nparams; i++)
	{
		j->params[i] = req.params[i];
		req.params[i] = NULL;
	}
	req.nparams = 0;
	im_db_submit(j);
}

/* Runs queued frames in order while no request of the session is in flight. */
static void
pump(session *s)
{
	while (!s->busy && !s->hello_pending && !s->close_code && s->in_head)
	{
		inframe    *f = s->in_head;

		s->in_head = f->next;
		if (!s->in_head)
			s->in_tail = NULL;
		s->in_count--;
		process_frame(s, f->buf, f->len);
		free(f);
	}
	if (s->flow_off && s->in_count < MAX_INQUEUE / 2)
	{
		s->flow_off = 0;
		lws_rx_flow_control(s->wsi, 1);
	}
}

/* Pre-welcome violation: NOT_AUTHENTICATED, then close 4001; its receive
 * buffer goes at once and nothing more is read into it. */
static void
not_authenticated(session *s, const char *why)
{
	send_error(s, NULL, "NOT_AUTHENTICATED", why, -1);
	begin_close(s, 4001, "not_authenticated");
	free(s->rx);
	s->rx = NULL;
	s->rxcap = 0;
	s->rxlen = 0;
}

static void
frame_arrived(session *s, const char *buf, size_t len)
{
	double		now = im_now();
	inframe    *f;

	if (s->close_code || g_draining)
		return;
	if (!s->authed && (s->hello_pending || s->in_head))
	{
		/*
		 * Before welcome the hello is the only frame (contract §10): nothing
		 * is queued behind a pending hello, so an unauthenticated socket
		 * holds at most one frame of at most MAX_HELLO_BYTES.
		 */
		not_authenticated(s, "no frame may follow hello before welcome");
		return;
	}
	/* per-connection token bucket */
	s->tokens += (now - s->t_tokens) * cfg.rate;
	if (s->tokens > cfg.burst)
		s->tokens = cfg.burst;
	s->t_tokens = now;
	if (s->tokens < 1)
	{
		long		wait = (long) ceil((1 - s->tokens) / cfg.rate * 1000);

		if (++s->rl_streak >= 10)
		{
			send_error(s, NULL, "RATE_LIMITED", "rate limit exceeded persistently", wait);
			begin_close(s, 4029, "rate_limited");
		}
		else
			send_error(s, NULL, "RATE_LIMITED", "rate limit exceeded", wait);
		return;
	}
	s->tokens -= 1;
	s->rl_streak = 0;
	f = malloc(sizeof(inframe) + len + 1);
	if (!f)
		abort();
	f->next = NULL;
	f->len = len;
	memcpy(f->buf, buf, len);
	f->buf[len] = '\0';
	if (s->in_tail)
		s->in_tail->next = f;
	else
		s->in_head = f;
	s->in_tail = f;
	s->in_count++;
	if (s->in_count >= MAX_INQUEUE && !s->flow_off)
	{
		s->flow_off = 1;
		lws_rx_flow_control(s->wsi, 0);
	}
	pump(s);
}

/* ---- metrics text ---- */

typedef struct
{
	char	   *b;
	size_t		len,
				cap;
} sbuf;

static void
sb_printf(sbuf *sb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void
sb_printf(sbuf *sb, const char *fmt, ...)
{
	va_list		ap;
	int			n;

	for (;;)
	{
		va_start(ap, fmt);
		n = vsnprintf(sb->b + sb->len, sb->cap - sb->len, fmt, ap);
		va_end(ap);
		if (n >= 0 && (size_t) n < sb->cap - sb->len)
		{
			sb->len += (size_t) n;
			return;
		}
		sb->cap = sb->cap * 2 + (size_t) n + 64;
		sb->b = realloc(sb->b, sb->cap);
		if (!sb->b)
			abort();
	}
}

static int
metric_name_ok(const char *s)
{
	if (!*s)
		return 0;
	for (; *s; s++)
		if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
			  (*s >= '0' && *s <= '9') || *s == '_' || *s == ':'))
			return 0;
	return 1;
}

static char *
metrics_text(PGresult *extra)
{
	sbuf		sb = {malloc(4096), 0, 4096};
	int			i;
	long		cum = 0;

	if (!sb.b)
		abort();
	sb_printf(&sb, "# HELP im_gateway_connections Open WebSocket sessions.\n# TYPE im_gateway_connections gauge\nim_gateway_connections %ld\n", m.conns_current);
	sb_printf(&sb, "# HELP im_gateway_connections_total WebSocket sessions accepted.\n# TYPE im_gateway_connections_total counter\nim_gateway_connections_total %ld\n", m.conns_total);
	sb_printf(&sb, "# HELP im_gateway_frames_in_total Frames received by type.\n# TYPE im_gateway_frames_in_total counter\n");
	for (i = 0; i < IM_OP_COUNT; i++)
		sb_printf(&sb, "im_gateway_frames_in_total{type=\"%s\"} %ld\n", im_ops[i].type, m.frames_in[i]);
	sb_printf(&sb, "im_gateway_frames_in_total{type=\"invalid\"} %ld\n", m.frames_in[IM_OP_COUNT]);
	sb_printf(&sb, "# HELP im_gateway_frames_out_total Frames sent by type.\n# TYPE im_gateway_frames_out_total counter\n");
	for (i = 0; i < IM_OP_COUNT; i++)
		sb_printf(&sb, "im_gateway_frames_out_total{type=\"%s\"} %ld\n", im_ops[i].reply_type, m.frames_out[i]);
	sb_printf(&sb, "im_gateway_frames_out_total{type=\"error\"} %ld\nim_gateway_frames_out_total{type=\"hint\"} %ld\n",
			  m.frames_out[OUT_ERROR], m.frames_out[OUT_HINT]);
	sb_printf(&sb, "# HELP im_gateway_errors_total Error frames by code.\n# TYPE im_gateway_errors_total counter\n");
	for (i = 0; i < (int) N_ERR_CODES; i++)
		sb_printf(&sb, "im_gateway_errors_total{code=\"%s\"} %ld\n", err_codes[i], m.errors[i]);
	sb_printf(&sb, "# HELP im_gateway_closes_total Sessions closed by the gateway by close code.\n# TYPE im_gateway_closes_total counter\n");
	for (i = 0; i < (int) N_CLOSE_CODES; i++)
		sb_printf(&sb, "im_gateway_closes_total{code=\"%d\"} %ld\n", close_codes[i], m.closes[i]);
	sb_printf(&sb, "# HELP im_gateway_hints_sent_total Hint frames written.\n# TYPE im_gateway_hints_sent_total counter\nim_gateway_hints_sent_total %ld\n", m.hints_sent);
	sb_printf(&sb, "# HELP im_gateway_hints_coalesced_total Hints merged into a pending one.\n# TYPE im_gateway_hints_coalesced_total counter\nim_gateway_hints_coalesced_total %ld\n", m.hints_coalesced);
	sb_printf(&sb, "# HELP im_gateway_hints_dropped_total Conversation hints dropped (too many pending).\n# TYPE im_gateway_hints_dropped_total counter\nim_gateway_hints_dropped_total %ld\n", m.hints_dropped);
	sb_printf(&sb, "# HELP im_gateway_notifications_total Notifications received.\n# TYPE im_gateway_notifications_total counter\nim_gateway_notifications_total %ld\n", m.notifications);
	sb_printf(&sb, "# HELP im_gateway_device_rechecks_total im.device_session re-checks after notifications or a re-LISTEN.\n# TYPE im_gateway_device_rechecks_total counter\nim_gateway_device_rechecks_total %ld\n", m.rechecks);
	sb_printf(&sb, "# HELP im_gateway_metrics_refreshes_total im.metrics() calls made for /metrics.\n# TYPE im_gateway_metrics_refreshes_total counter\nim_gateway_metrics_refreshes_total %ld\n", m.metrics_refreshes);
	sb_printf(&sb, "# HELP im_gateway_replies_too_large_total Replies that did not fit a session's queue (answered UNAVAILABLE).\n# TYPE im_gateway_replies_too_large_total counter\nim_gateway_replies_too_large_total %ld\n", m.replies_too_large);
	sb_printf(&sb, "# HELP im_gateway_refusals_total Connections refused by admission limits.\n# TYPE im_gateway_refusals_total counter\nim_gateway_refusals_total %ld\n", m.refusals);
	sb_printf(&sb, "# HELP im_gateway_upgrades_refused_total WebSocket upgrades refused before a session existed.\n# TYPE im_gateway_upgrades_refused_total counter\n"
			  "im_gateway_upgrades_refused_total{reason=\"cap\"} %ld\nim_gateway_upgrades_refused_total{reason=\"origin\"} %ld\n",
			  m.upgrades_refused_cap, m.upgrades_refused_origin);
	sb_printf(&sb, "# HELP im_gateway_pool_waits_total Job-polls that found every pool connection busy.\n# TYPE im_gateway_pool_waits_total counter\nim_gateway_pool_waits_total %ld\n", im_db_stats_g.pool_waits);
	sb_printf(&sb, "# HELP im_gateway_db_connects_total Database connection attempts.\n# TYPE im_gateway_db_connects_total counter\nim_gateway_db_connects_total %ld\n", im_db_stats_g.reconnects);
	sb_printf(&sb, "# HELP im_gateway_pool_ready Pool connections up.\n# TYPE im_gateway_pool_ready gauge\nim_gateway_pool_ready %d\n", im_db_stats_g.pool_ready);
	sb_printf(&sb, "# HELP im_gateway_listen_ready LISTEN connection up.\n# TYPE im_gateway_listen_ready gauge\nim_gateway_listen_ready %d\n", im_db_stats_g.listen_ready);
	sb_printf(&sb, "# HELP im_gateway_db_seconds Database round trip.\n# TYPE im_gateway_db_seconds histogram\n");
	for (i = 0; i < 11; i++)
	{
		cum += im_db_stats_g.hist[i];
		sb_printf(&sb, "im_gateway_db_seconds_bucket{le=\"%g\"} %ld\n", im_db_hist_bounds[i], cum);
	}
	cum += im_db_stats_g.hist[11];
	sb_printf(&sb, "im_gateway_db_seconds_bucket{le=\"+Inf\"} %ld\nim_gateway_db_seconds_sum %f\nim_gateway_db_seconds_count %ld\n",
			  cum, im_db_stats_g.hist_sum, im_db_stats_g.hist_count);
	if (extra)
	{
		for (i = 0; i < PQntuples(extra); i++)
		{
			const char *name = PQgetvalue(extra, i, 0);
			char		help[256];
			size_t		k,
						o = 0;

			if (!metric_name_ok(name) || PQgetisnull(extra, i, 1))
				continue;
			/* help text on one line */
			for (k = 0; PQgetvalue(extra, i, 2)[k] && o < sizeof(help) - 1; k++)
			{
				char		c = PQgetvalue(extra, i, 2)[k];

				help[o++] = (c == '\n' || c == '\\') ? ' ' : c;
			}
			help[o] = '\0';
			sb_printf(&sb, "# HELP %s %s\n%s %s\n", name, help, name, PQgetvalue(extra, i, 1));
		}
	}
	return sb.b;
}

/* ---- admission of an upgrade (no database) ---- */

/*
 * Refuses with an HTTP status; returning 1 tells lws the response is sent.
 * The status line is written here: lws_return_http_status would say
 * HTTP/1.0 at this stage (the request version is parsed later), which
 * WebSocket clients reject as a response to their HTTP/1.1 upgrade.
 */
static int
refuse_upgrade(struct lws *wsi, unsigned status, const char *why, const char *ip)
{
	unsigned char buf[LWS_PRE + 768];
	unsigned char *start = buf + LWS_PRE,
			   *p = start,
			   *end = buf + sizeof(buf) - 1;
	char		line[64],
				body[160],
				clen[16];
	int			nline,
				nbody,
				nclen;

	im_log("info", "event=upgrade_refused status=%u reason=\"%s\" peer=%s", status, why, ip);
	nline = snprintf(line, sizeof(line), "HTTP/1.1 %u %s", status,
					 status == HTTP_STATUS_FORBIDDEN ? "Forbidden" : "Service Unavailable");
	nbody = snprintf(body, sizeof(body), "%s\n", why);
	nclen = snprintf(clen, sizeof(clen), "%d", nbody);
	if (lws_add_http_header_by_name(wsi, NULL, (unsigned char *) line, nline, &p, end) ||
		lws_add_http_header_by_token(wsi, WSI_TOKEN_HTTP_CONTENT_TYPE,
									 (unsigned char *) "text/plain", 10, &p, end) ||
		lws_add_http_header_by_token(wsi, WSI_TOKEN_HTTP_CONTENT_LENGTH,
									 (unsigned char *) clen, nclen, &p, end) ||
		lws_add_http_header_by_token(wsi, WSI_TOKEN_CONNECTION,
									 (unsigned char *) "close", 5, &p, end) ||
		lws_finalize_http_header(wsi, &p, end) ||
		end - p < nbody)
		return -1;
	memcpy(p, body, (size_t) nbody);
	p += nbody;
	if (lws_write(wsi, start, (size_t) (p - start), LWS_WRITE_HTTP) != (int) (p - start))
		return -1;
	return 1;
}

/* Header value (copied into buf) or NULL when absent. */
static const char *
header(struct lws *wsi, enum lws_token_indexes t, char *buf, int len)
{
	if (lws_hdr_total_length(wsi, t) <= 0 || lws_hdr_total_length(wsi, t) >= len)
		return NULL;
	return lws_hdr_copy(wsi, buf, len, t) < 0 ? NULL : buf;
}

/*
 * LWS_CALLBACK_HTTP_CONFIRM_UPGRADE: the caps and the Origin rule are
 * decided here, before a session exists (contract §10): over the global
 * connection cap or the address's unauthenticated cap, HTTP 503; an Origin
 * that is neither listed (--allowed-origin) nor, without a list, the same
 * host as the Host header, HTTP 403.
 */
static int
admit_upgrade(struct lws *wsi)
{
	char		ip[48],
				origin[256],
				host[256];
	const char *o,
			   *h;

	lws_get_peer_simple(wsi, ip, sizeof(ip));
	if (g_draining || m.conns_current >= cfg.max_connections)
	{
		m.upgrades_refused_cap++;
		return refuse_upgrade(wsi, HTTP_STATUS_SERVICE_UNAVAILABLE,
							  "too many connections", ip);
	}
	if (im_unauth_count(ip) >= cfg.max_unauth_per_ip)
	{
		m.upgrades_refused_cap++;
		return refuse_upgrade(wsi, HTTP_STATUS_SERVICE_UNAVAILABLE,
							  "too many unauthenticated connections from this address", ip);
	}
	o = header(wsi, WSI_TOKEN_ORIGIN, origin, sizeof(origin));
	if (!o && lws_hdr_total_length(wsi, WSI_TOKEN_ORIGIN) > 0)
		o = "";					/* present but unreadable: not allowed */
	h = header(wsi, WSI_TOKEN_HOST, host, sizeof(host));
	if (!im_origin_allowed(o, h, cfg.allowed_origins, cfg.n_allowed_origins))
	{
		m.upgrades_refused_origin++;
		return refuse_upgrade(wsi, HTTP_STATUS_FORBIDDEN, "origin not allowed", ip);
	}
	return 0;
}

/* ---- lws callback ---- */

static int
callback_im(struct lws *wsi, enum lws_callback_reasons reason,
			void *user, void *in, size_t len)
{
	pss		   *p = (pss *) user;
	session    *s = p ? p->s : NULL;

	switch (reason)
	{
		case LWS_CALLBACK_EVENT_WAIT_CANCELLED:
			handle_done();
			break;

		case LWS_CALLBACK_HTTP_CONFIRM_UPGRADE:
			return admit_upgrade(wsi);

		case LWS_CALLBACK_ESTABLISHED:
			if (g_draining)
				return -1;
			s = p->s = register_session(wsi, 0);
			m.conns_current++;
			m.conns_total++;
			{
				char		ip[48];

				lws_get_peer_simple(wsi, ip, sizeof(ip));
				s->unauth_ip = im_unauth_take(ip);
			}
			break;

		case LWS_CALLBACK_RECEIVE_PONG:
			if (s)
				s->t_heard = im_now();
			break;

		case LWS_CALLBACK_RECEIVE:
			if (!s || s->close_code)
				break;
			if (!s->in_msg)
			{
				s->rxlen = 0;
				s->in_msg = 1;
				s->bad_binary = lws_frame_is_binary(wsi) ? 1 : 0;
			}
			s->t_heard = im_now();
			if (!s->authed && s->rxlen + len > MAX_HELLO_BYTES)
			{
				/* stop accumulating: the hello may not be larger */
				not_authenticated(s, "hello larger than 8 KiB");
				break;
			}
			if (s->rxlen + len > cfg.max_frame)
			{
				begin_close(s, 1009, "frame_too_large");
				lws_close_reason(wsi, LWS_CLOSE_STATUS_MESSAGE_TOO_LARGE, NULL, 0);
				return -1;
			}
			if (s->rxlen + len > s->rxcap)
			{
				size_t		cap = s->rxcap ? s->rxcap : 1024;

				while (cap < s->rxlen + len)
					cap *= 2;
				s->rx = realloc(s->rx, cap);
				if (!s->rx)
					abort();
				s->rxcap = cap;
			}
			memcpy(s->rx + s->rxlen, in, len);
			s->rxlen += len;
			if (!lws_is_final_fragment(wsi))
				break;
			s->in_msg = 0;
			if (s->bad_binary)
			{
				/* binary frames are not JSON text: decoded as garbage */
				frame_arrived(s, "\x01", 1);
			}
			else
				frame_arrived(s, s->rx, s->rxlen);
			/* idle sessions keep no receive buffer */
			if (s->rxcap > 4096 || !s->in_head)
			{
				free(s->rx);
				s->rx = NULL;
				s->rxcap = 0;
			}
			break;

		case LWS_CALLBACK_SERVER_WRITEABLE:
			if (!s)
				break;
			return on_writeable(s);

		case LWS_CALLBACK_CLOSED:
			if (s)
			{
				m.conns_current--;
				unregister_session(s);
				p->s = NULL;
			}
			break;

		case LWS_CALLBACK_HTTP:
			{
				const char *uri = (const char *) in;
				im_job	   *j;

				if (!s)
					s = p->s = register_session(wsi, 1);
				m.http_requests++;
				free(s->http_body);
				s->http_body = NULL;
				if (uri && strcmp(uri, "/healthz") == 0)
				{
					j = new_job(IM_JOB_HEALTH, s);
					j->sql = "SELECT 1";
				}
				else if (uri && strcmp(uri, "/metrics") == 0)
				{
					request_metrics(s);
					break;
				}
				else
				{
					s->http_status = 404;
					s->http_body = strdup("not found\n");
					lws_callback_on_writable(wsi);
					break;
				}
				im_db_submit(j);
				break;
			}

		case LWS_CALLBACK_HTTP_WRITEABLE:
			{
				unsigned char hdr[LWS_PRE + 512];
				unsigned char *start = hdr + LWS_PRE,
						   *p = start,
						   *end = hdr + sizeof(hdr) - 1;
				size_t		blen;
				unsigned char *body;
				int			rc;

				if (!s || !s->http_body)
					break;
				blen = strlen(s->http_body);
				if (lws_add_http_common_headers(wsi, (unsigned) s->http_status,
												"text/plain; version=0.0.4", (lws_filepos_t) blen, &p, end) ||
					lws_finalize_write_http_header(wsi, start, &p, end))
					return 1;
				body = malloc(LWS_PRE + blen + 1);
				if (!body)
					abort();
				memcpy(body + LWS_PRE, s->http_body, blen);
				rc = lws_write(wsi, body + LWS_PRE, blen, LWS_WRITE_HTTP_FINAL);
				free(body);
				free(s->http_body);
				s->http_body = NULL;
				if (rc < (int) blen)
					return -1;
				if (lws_http_transaction_completed(wsi))
					return -1;
				break;
			}

		case LWS_CALLBACK_CLOSED_HTTP:
		case LWS_CALLBACK_HTTP_DROP_PROTOCOL:
			if (s && s->is_http)
			{
				unregister_session(s);
				p->s = NULL;
			}
			break;

		default:
			break;
	}
	return 0;
}

static struct lws_protocols protocols[] = {
	/* protocols[0] also takes HTTP and ws clients that name no subprotocol */
	{"im-sync.v1", callback_im, sizeof(pss), 4096, 0, NULL, 0},
	{NULL, NULL, 0, 0, 0, NULL, 0}
};

/* ---- timers, signals, main ---- */

static void
tick(lws_sorted_usec_list_t *sul)
{
	session    *s;
	double		now = im_now();

	/* only seconds with hellos in flight tell the rate */
	if (g_pending_hellos > 0 || g_hellos_done > 0)
		g_hello_rate = 0.5 * g_hello_rate + 0.5 * (double) g_hellos_done;
	g_hellos_done = 0;
	for (s = all_sessions; s; s = s->all_next)
	{
		if (s->is_http || s->close_code)
			continue;
		if (!s->authed && !s->hello_pending && now - s->t_open > cfg.hello_timeout)
			begin_close(s, 4001, "hello_timeout");
		/* keepalive (contract §10): ping after ping_interval of silence,
		 * again every ping_interval; close 1001 after idle_timeout */
		else if (now - s->t_heard >= cfg.idle_timeout)
			begin_close(s, 1001, "idle_timeout");
		else if (now - s->t_heard >= cfg.ping_interval && now - s->t_ping >= cfg.ping_interval)
		{
			s->t_ping = now;
			s->ping_due = 1;
			lws_callback_on_writable(s->wsi);
		}
		if (!s->close_code && s->recheck_retry && !s->recheck_inflight)
		{
			s->recheck_retry = 0;
			request_recheck(s, 0);
		}
	}
	lws_sul_schedule(g_ctx, 0, &g_tick, tick, LWS_US_PER_SEC);
}

static void
on_signal(int sig)
{
	(void) sig;
	g_terminate = 1;
	if (g_ctx)
		lws_cancel_service(g_ctx);
}

static void
wake_lws(void *arg)
{
	lws_cancel_service((struct lws_context *) arg);
}

static void
usage(void)
{
	fprintf(stderr,
			"usage: im_gateway [options]\n"
			"  --listen HOST:PORT        (env IM_GATEWAY_LISTEN, default 127.0.0.1:8080)\n"
			"  --db CONNINFO             (env IM_GATEWAY_DB, default: libpq environment)\n"
			"  --max-frame BYTES         largest frame, bigger closes 1009 (default 1048576)\n"
			"  --pool N                  database connections for requests (default 4)\n"
			"  --rate R --burst B        per-connection frames/s token bucket (50/100)\n"
			"  --max-conn-per-user N     concurrent sessions per account (16)\n"
			"  --hello-rate-device R     reconnects/s per device, burst 5 (1)\n"
			"  --hello-rate-user R       reconnects/s per account, burst 20 (5)\n"
			"  --max-pending-hello N     hellos in flight gateway-wide (512)\n"
			"  --hello-timeout S         seconds to send hello (10)\n"
			"  --max-connections N       WebSocket sessions gateway-wide, over it HTTP 503 (50000)\n"
			"  --max-unauth-per-ip N     sessions without welcome per peer address, over it HTTP 503 (256)\n"
			"  --tls-cert FILE --tls-key FILE  serve wss:// and https:// (PEM files)\n"
			"  --insecure                allow a non-loopback --listen without TLS\n"
			"  --allowed-origin ORIGIN   accepted Origin (repeatable; default: same host only)\n"
			"  --ping-interval S         ping a session silent this long (30)\n"
			"  --idle-timeout S          close 1001 a session silent this long (60)\n"
			"  --statement-timeout MS    statement_timeout of pool connections, 0 none (10000)\n"
			"  --max-queue BYTES         replies queued per session; a reply over it is\n"
			"                            answered UNAVAILABLE (16777216)\n"
			"  --log-key FILE            key of the user/device hashes in the log\n"
			"                            (default: random per process)\n");
}

static int
parse_listen(const char *v)
{
	const char *c = strrchr(v, ':');

	if (!c || c == v || (size_t) (c - v) >= sizeof(cfg.host))
		return -1;
	memcpy(cfg.host, v, (size_t) (c - v));
	cfg.host[c - v] = '\0';
	cfg.port = atoi(c + 1);
	return cfg.port > 0 && cfg.port < 65536 ? 0 : -1;
}

int
main(int argc, char **argv)
{
	struct lws_context_creation_info info;
	const char *env;
	int			i;
	struct rlimit rl;

	if ((env = getenv("IM_GATEWAY_LISTEN")) && parse_listen(env) != 0)
	{
		fprintf(stderr, "bad IM_GATEWAY_LISTEN\n");
		return 2;
	}
	if ((env = getenv("IM_GATEWAY_DB")))
		cfg.db = env;
	for (i = 1; i < argc; i++)
	{
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!strcmp(a, "--help") || !strcmp(a, "-h"))
		{
			usage();
			return 0;
		}
		if (!strcmp(a, "--insecure"))
		{
			cfg.insecure = 1;
			continue;
		}
		if (!v)
		{
			usage();
			return 2;
		}
		i++;
		if (!strcmp(a, "--listen"))
		{
			if (parse_listen(v) != 0)
			{
				fprintf(stderr, "bad --listen %s\n", v);
				return 2;
			}
		}
		else if (!strcmp(a, "--db"))
			cfg.db = v;
		else if (!strcmp(a, "--max-frame"))
			cfg.max_frame = (size_t) strtoull(v, NULL, 10);
		else if (!strcmp(a, "--pool"))
			cfg.pool = atoi(v);
		else if (!strcmp(a, "--rate"))
			cfg.rate = atof(v);
		else if (!strcmp(a, "--burst"))
			cfg.burst = atof(v);
		else if (!strcmp(a, "--max-conn-per-user"))
			cfg.max_conn_user = atoi(v);
		else if (!strcmp(a, "--hello-rate-device"))
			cfg.hello_rate_device = atof(v);
		else if (!strcmp(a, "--hello-rate-user"))
			cfg.hello_rate_user = atof(v);
		else if (!strcmp(a, "--max-pending-hello"))
			cfg.max_pending_hello = atoi(v);
		else if (!strcmp(a, "--hello-timeout"))
			cfg.hello_timeout = atoi(v);
		else if (!strcmp(a, "--max-connections"))
			cfg.max_connections = atoi(v);
		else if (!strcmp(a, "--max-unauth-per-ip"))
			cfg.max_unauth_per_ip = atoi(v);
		else if (!strcmp(a, "--tls-cert"))
			cfg.tls_cert = v;
		else if (!strcmp(a, "--tls-key"))
			cfg.tls_key = v;
		else if (!strcmp(a, "--allowed-origin"))
		{
			if (cfg.n_allowed_origins == (int) (sizeof(cfg.allowed_origins) / sizeof(cfg.allowed_origins[0])))
			{
				fprintf(stderr, "im_gateway: at most 16 --allowed-origin\n");
				return 2;
			}
			cfg.allowed_origins[cfg.n_allowed_origins++] = v;
		}
		else if (!strcmp(a, "--ping-interval"))
			cfg.ping_interval = atoi(v);
		else if (!strcmp(a, "--idle-timeout"))
			cfg.idle_timeout = atoi(v);
		else if (!strcmp(a, "--statement-timeout"))
			cfg.statement_timeout_ms = atoi(v);
		else if (!strcmp(a, "--max-queue"))
			cfg.max_queue = (size_t) strtoull(v, NULL, 10);
		else if (!strcmp(a, "--log-key"))
			cfg.log_key = v;
		else
		{
			usage();
			return 2;
		}
	}
	if (cfg.max_frame < 64 || cfg.rate <= 0 || cfg.burst < 1 || cfg.pool < 1 ||
		cfg.max_connections < 1 || cfg.max_unauth_per_ip < 1 ||
		cfg.ping_interval < 1 || cfg.idle_timeout <= cfg.ping_interval ||
		cfg.statement_timeout_ms < 0 || cfg.max_queue < 1024)
	{
		fprintf(stderr, "im_gateway: bad limits (--idle-timeout must exceed --ping-interval)\n");
		return 2;
	}
	if (!cfg.tls_cert != !cfg.tls_key)
	{
		fprintf(stderr, "im_gateway: --tls-cert and --tls-key go together\n");
		return 2;
	}
	if (cfg.tls_cert && (access(cfg.tls_cert, R_OK) != 0 || access(cfg.tls_key, R_OK) != 0))
	{
		fprintf(stderr, "im_gateway: cannot read --tls-cert %s or --tls-key %s\n", cfg.tls_cert, cfg.tls_key);
		return 2;
	}
	/* plain ws:// carries tokens in clear text: loopback only, unless asked */
	if (!cfg.tls_cert && !cfg.insecure && !im_host_is_loopback(cfg.host))
	{
		fprintf(stderr, "im_gateway: refusing to listen on %s without TLS: give --tls-cert/--tls-key, "
				"or --insecure to serve plain ws:// on a non-loopback address\n", cfg.host);
		return 2;
	}
	{
		char		err[256];

		if (cfg.log_key ? im_log_key_load(cfg.log_key, err, sizeof(err)) != 0
			: im_log_key_random() != 0)
		{
			fprintf(stderr, "bad --log-key: %s\n", cfg.log_key ? err : "no random bytes");
			return 2;
		}
	}
	im_db_set_statement_timeout(cfg.statement_timeout_ms);
	dev_rates = calloc(NRATE, sizeof(rate_slot));
	user_rates = calloc(NRATE, sizeof(rate_slot));
	for (i = 0; i < NMEMBERS; i++)
		members[i].pending_head = -1;
	/* many idle connections need many descriptors */
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max)
	{
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}

	lws_set_log_level(LLL_ERR, NULL);
	memset(&info, 0, sizeof(info));
	info.port = cfg.port;
	info.iface = (strcmp(cfg.host, "0.0.0.0") == 0 || strcmp(cfg.host, "*") == 0) ? NULL : cfg.host;
	info.protocols = protocols;
	info.options = LWS_SERVER_OPTION_DISABLE_IPV6;
	info.timeout_secs = 20;
	if (cfg.tls_cert)
	{
		/* OpenSSL through lws: wss:// and https:// on the one port */
		info.options |= LWS_SERVER_OPTION_DO_SSL_GLOBAL_INIT;
		info.ssl_cert_filepath = cfg.tls_cert;
		info.ssl_private_key_filepath = cfg.tls_key;
	}
	g_ctx = lws_create_context(&info);
	if (!g_ctx)
	{
		im_log("error", "event=listen_failed listen=%s:%d", cfg.host, cfg.port);
		return 1;
	}
	signal(SIGPIPE, SIG_IGN);
	signal(SIGTERM, on_signal);
	signal(SIGINT, on_signal);
	if (im_db_start(cfg.db, cfg.pool, wake_lws, g_ctx) != 0)
	{
		im_log("error", "event=db_thread_failed");
		return 1;
	}
	lws_sul_schedule(g_ctx, 0, &g_tick, tick, LWS_US_PER_SEC);
	im_log("info", "event=started listen=%s:%d tls=%s pool=%d max_frame=%zu statement_timeout_ms=%d",
		   cfg.host, cfg.port, cfg.tls_cert ? "on" : "off", cfg.pool, cfg.max_frame, cfg.statement_timeout_ms);

	while (lws_service(g_ctx, 0) >= 0)
	{
		if (g_terminate && !g_draining)
		{
			session    *s;

			/* drain: answer what is in flight, then close 1001 */
			g_draining = 1;
			g_drain_deadline = im_now() + 5;
			im_log("info", "event=draining sessions=%ld", m.conns_current);
			for (s = all_sessions; s; s = s->all_next)
				if (!s->is_http && !s->busy)
					begin_close(s, 1001, "shutdown");
		}
		if (g_draining && (m.conns_current == 0 || im_now() > g_drain_deadline))
			break;
	}
	lws_context_destroy(g_ctx);
	im_db_stop();
	im_log("info", "event=stopped");
	return 0;
}
