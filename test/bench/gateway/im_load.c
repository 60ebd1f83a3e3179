/*
 * im_load.c — load generator of test/bench/gateway_bench.sh: many im_gateway
 * WebSocket sessions (contract §10) in one libwebsockets client event loop;
 * jansson builds and reads the frames.
 *
 *   im_load pairs TOKENS SECONDS [--devices K] [--rate R] [--rate-seconds S]
 *       Devices in pairs sharing a direct conversation (the first K lines).
 *       Closed loop: every device repeats send -> sync -> ack (the three
 *       calls pgbench makes per transaction) for SECONDS; prints sends/s,
 *       frames/s and send-to-hint latency at that saturation.  With --rate R
 *       a second phase paces sends at R per second in total: the first device
 *       of each pair only sends, its partner syncs and ACKs on every hint
 *       (the same three calls per message as a cycle); prints send-to-hint
 *       p50/p99 at that moderate rate.  SECONDS 0 runs the paced phase only.
 *   im_load idle TOKENS [--ready FILE] [--hold S]
 *       Opens every session (hello -> welcome) and keeps it idle; prints when
 *       all are up (and writes FILE).  After --max-seconds (default 300) it
 *       starts no more sessions and reports those up once the started ones
 *       are.  Holds until SIGTERM/SIGINT, the end of a piped stdin, or --hold
 *       seconds (default 900).
 *   im_load storm TOKENS [--max-seconds S]
 *       Every device connects at once, says hello and syncs and ACKs until
 *       caught up; a refusal (RATE_LIMITED/UNAVAILABLE) is retried after its
 *       retry_after_ms (x 1..1.5 jitter); a close before the welcome (no
 *       frame) counts as a refusal without retry_after_ms and is retried
 *       after 1 s (x 1..1.5).  Prints the time until all are caught up, the
 *       refusals and whether each carried retry_after_ms.
 *
 * Common options: --url ws://HOST:PORT/ (default $IM_GW_URL), --src-base ADDR
 * (first loopback source address, default 127.0.0.2) and --per-src N
 * (sessions per source address, default 4000: one address has ~28,000
 * ephemeral ports, and a port bound before connect is not shared), --concurrency C (connects and hellos in
 * flight; storm: all), --timeout S (every wait for a reply, connect or close;
 * default 30).
 *
 * TOKENS lines: user_id device_id conversation_id token.
 *
 * Any failure (an unexpected status or error frame, a close, a timeout)
 * prints "im_load: FAIL ..." and exits 1, so the script never waits for a
 * run that cannot finish.  Results are lines starting with "RESULT".
 *
 * Send-to-hint latency: a send's body carries its send time ({"t":usec});
 * the partner learns the event's sync_seq from a sync, and the latency is the
 * arrival of the first hint whose high_watermark covers that sync_seq minus
 * the send time (hints are coalesced; the first covering one is when the
 * partner would have known).
 */
#include <libwebsockets.h>
#include <jansson.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <arpa/inet.h>

#define HINT_RING 32			/* recent hints of a measuring device */
#define PEND_RING 256			/* partner events seen by sync, no hint yet */
#define MAX_SRC 4096
#define MAX_CATCHUP_BATCHES 50
#define DRAIN_GRACE 1000000		/* us after a phase's last send */
#define LAUNCH_CHUNK 500

typedef enum
{
	M_PAIRS, M_IDLE, M_STORM
} mode_t_;

typedef enum
{
	ST_NONE, ST_CONNECT, ST_HELLO, ST_IDLE, ST_SEND, ST_SYNC, ST_PAGE, ST_ACK,
	ST_SNAP_BEGIN, ST_SNAP_FETCH, ST_SNAP_ACK, ST_REFUSED, ST_RETRY
} dev_state;

static const char *const state_name[] = {
	"none", "connect", "welcome", "idle", "send_result", "sync_result", "sync_result (page)",
	"ack_result", "snapshot_begin_result", "snapshot_fetch_result", "snapshot_ack_result",
	"close after refusal", "retry"
};

typedef struct
{
	int64_t		hw;
	lws_usec_t	t;
} hint_rec;

typedef struct
{
	int64_t		seq;
	lws_usec_t	t_send;
} pend_rec;

/* latency bookkeeping, only for devices that send or receive messages */
typedef struct
{
	hint_rec	hints[HINT_RING];
	int			nhints;			/* total seen; ring index = n % HINT_RING */
	pend_rec	pend[PEND_RING];
	int			npend;
} lat_state;

typedef struct dev dev;
typedef void (*dev_fn) (dev *d);

struct dev
{
	int			idx;
	int64_t		user;
	char	   *device;
	int64_t		conv;
	char	   *token;
	const char *src;
	struct lws *wsi;
	dev_state	st;
	int64_t		rid;
	const char *want;			/* reply type awaited */
	lws_usec_t	deadline;		/* 0: not waiting */
	unsigned char *tx;			/* one frame (LWS_PRE room first) */
	size_t		txlen;
	char	   *rx;
	size_t		rxlen, rxcap;
	/* sync state */
	int64_t		gen;
	int64_t		applied;
	int64_t		welcome_hw;		/* the user's high watermark at welcome */
	char	   *batch_token;
	int64_t		batch_gen, batch_hw, user_hw;
	int			batch_ok;		/* status OK (not RECOVERY) */
	int			full;			/* catch up completely, not one batch */
	int			batches;
	dev_fn		done;
	/* snapshot */
	char	   *snap_token, *snap_digest;
	int64_t		snap_pages, snap_page, snap_gen, snap_base;
	/* pairs */
	int64_t		nsent;
	int			busy;			/* in a cycle or a hint sync */
	int			receiver;		/* paced phase: syncs on hints, never sends */
	int			final_sync;		/* loop phase: the sync after the last cycle is done */
	int			hint_pending;
	lat_state  *lat;
	/* reconnects */
	int64_t		retry_ms;
	lws_sorted_usec_list_t sul;
	int			upgraded;		/* storm: had a WebSocket session once */
};

static struct
{
	mode_t_		mode;
	const char *tokens, *ready;
	double		seconds, rate, rate_seconds, hold, max_seconds, timeout;
	int			per_src, concurrency, devices;
	const char *src_base;
	char		host[256];
	int			port;
	char		path[256];
}			opt = {
	.rate_seconds = 10, .hold = 900, .max_seconds = 300, .timeout = 30,
	.per_src = 4000, .concurrency = 256, .src_base = "127.0.0.2",
};

static struct lws_context *ctx;
static dev *devs;				/* the mode's devices */
static int	ndev;
static char *srcs[MAX_SRC];
static volatile sig_atomic_t stop_signal;

/* progress and counters */
static int	next_connect, inflight, nup, ndone;
static int	storm_welcome_only;	/* storm: caught up by the welcome alone */
static int	idle_target;		/* idle: sessions to open (all, or those started when time ran out) */
static int64_t frames_in, frames_out, sends, refusals, refusals_no_retry, http_refusals;
static int64_t closes_before_welcome;	/* storm: closed with no frame, counted in refusals */
static int	last_close_code;
static int64_t connect_failures;	/* storm: connects that failed before the upgrade */
static char first_connect_error[128];
static lws_usec_t t_start;
static lws_sorted_usec_list_t tick_sul, pace_sul;
/* storm timeline: when the k-th device was first upgraded and first welcomed */
static lws_usec_t *t_established, *t_welcomed;
static int	n_established, n_welcomed;

/* phases of pairs */
typedef enum
{
	PH_SETUP, PH_LOOP, PH_LOOP_DRAIN, PH_PACED, PH_PACED_DRAIN, PH_HOLD
} phase_t;
static phase_t phase = PH_SETUP;
static lws_usec_t phase_start, phase_stop, drain_until;
static dev *act;				/* devices of the loop and paced phases */
static int	nact;
static int64_t paced_issued, paced_lagged;
static int	pace_next;

static double *lat_ms;
static size_t nlat, caplat;
static struct rusage ru_phase;

static lws_usec_t
now_us(void)
{
	return lws_now_usecs();
}

static void
fail(const dev *d, const char *fmt,...)
{
	va_list		ap;

	fflush(stdout);
	if (d)
		fprintf(stderr, "im_load: FAIL user %" PRId64 " device %s (waiting for %s): ",
				d->user, d->device, state_name[d->st]);
	else
		fprintf(stderr, "im_load: FAIL ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\nim_load: progress: %d of %d up, %d caught up, %d connects/hellos in flight, %" PRId64
			" refusals (%" PRId64 " without retry_after_ms, %" PRId64 " closes before welcome, %" PRId64
			" connect failures), %.1f s since start\n", nup, ndev, ndone, inflight, refusals, refusals_no_retry,
			closes_before_welcome, connect_failures, (now_us() - t_start) / 1e6);
	_exit(1);
}

static void
add_latency(lws_usec_t dt)
{
	if (nlat == caplat)
	{
		caplat = caplat ? caplat * 2 : 4096;
		lat_ms = realloc(lat_ms, caplat * sizeof(double));
		if (!lat_ms)
			fail(NULL, "out of memory");
	}
	lat_ms[nlat++] = dt / 1000.0;
}

static int
cmp_double(const void *a, const void *b)
{
	double		x = *(const double *) a,
				y = *(const double *) b;

	return x < y ? -1 : x > y;
}

static double
pct(double p)
{
	size_t		i;

	if (!nlat)
		return -1;
	i = (size_t) (p / 100.0 * nlat);
	return lat_ms[i >= nlat ? nlat - 1 : i];
}

/* CPU share of this process since the phase began, percent of one core */
static double
cpu_pct_since(const struct rusage *r0, lws_usec_t t0)
{
	struct rusage r1;
	double		s;

	getrusage(RUSAGE_SELF, &r1);
	s = (r1.ru_utime.tv_sec - r0->ru_utime.tv_sec) + (r1.ru_stime.tv_sec - r0->ru_stime.tv_sec)
		+ ((r1.ru_utime.tv_usec - r0->ru_utime.tv_usec) + (r1.ru_stime.tv_usec - r0->ru_stime.tv_usec)) / 1e6;
	return 100.0 * s / ((now_us() - t0) / 1e6);
}

/* ---- frames ---- */

static void
send_frame(dev *d, json_t *req, dev_state st, const char *want)
{
	char	   *s;
	size_t		n;

	if (d->tx)
		fail(d, "internal: a frame is already waiting to be written");
	json_object_set_new(req, "id", json_integer(++d->rid));
	s = json_dumps(req, JSON_COMPACT);
	json_decref(req);
	if (!s)
		fail(d, "out of memory");
	n = strlen(s);
	d->tx = malloc(LWS_PRE + n);
	if (!d->tx)
		fail(d, "out of memory");
	memcpy(d->tx + LWS_PRE, s, n);
	d->txlen = n;
	free(s);
	d->st = st;
	d->want = want;
	d->deadline = now_us() + (lws_usec_t) (opt.timeout * 1e6);
	lws_callback_on_writable(d->wsi);
}

static int64_t
jint(const dev *d, json_t *o, const char *key, int nullable)
{
	json_t	   *v = json_object_get(o, key);

	if (json_is_integer(v))
		return json_integer_value(v);
	if (nullable && (!v || json_is_null(v)))
		return 0;
	fail(d, "reply without integer %s", key);
	return 0;
}

static const char *
jstr(const dev *d, json_t *o, const char *key)
{
	const char *s = json_string_value(json_object_get(o, key));

	if (!s)
		fail(d, "reply without string %s", key);
	return s;
}

static void
set_str(char **dst, const char *s)
{
	free(*dst);
	*dst = s ? strdup(s) : NULL;
}

/* ---- latency: hints and the events a sync returned ---- */

static void
record_if_measured(lws_usec_t t_send, lws_usec_t t_hint)
{
	if ((phase == PH_LOOP || phase == PH_LOOP_DRAIN || phase == PH_PACED || phase == PH_PACED_DRAIN)
		&& t_send >= phase_start && t_send < phase_stop)
		add_latency(t_hint - t_send);
}

static void
on_hint_hw(dev *d, int64_t hw)
{
	lat_state  *l = d->lat;
	lws_usec_t	t = now_us();
	int			i,
				k = 0;

	if (!l)
		return;
	l->hints[l->nhints % HINT_RING].hw = hw;
	l->hints[l->nhints % HINT_RING].t = t;
	l->nhints++;
	for (i = 0; i < l->npend; i++)
		if (l->pend[i].seq <= hw)
			record_if_measured(l->pend[i].t_send, t);
		else
			l->pend[k++] = l->pend[i];
	l->npend = k;
}

/* a partner's message event: already covered by a hint, or wait for one */
static void
on_partner_event(dev *d, int64_t seq, lws_usec_t t_send)
{
	lat_state  *l = d->lat;
	int			i,
				first = l->nhints > HINT_RING ? l->nhints - HINT_RING : 0;

	for (i = first; i < l->nhints; i++)
		if (l->hints[i % HINT_RING].hw >= seq)
		{
			record_if_measured(t_send, l->hints[i % HINT_RING].t);
			return;
		}
	if (l->npend == PEND_RING)
		fail(d, "more than %d events seen without a hint covering them", PEND_RING);
	l->pend[l->npend].seq = seq;
	l->pend[l->npend].t_send = t_send;
	l->npend++;
}

static void
scan_events(dev *d, json_t *events)
{
	size_t		i;
	json_t	   *e;

	if (!d->lat || !json_is_array(events))
		return;
	json_array_foreach(events, i, e)
	{
		json_t	   *sender = json_object_get(e, "sender_id");
		json_t	   *t = json_object_get(json_object_get(e, "body"), "t");
		const char *kind = json_string_value(json_object_get(e, "kind"));

		if (kind && strcmp(kind, "message") == 0 && json_is_integer(sender)
			&& json_integer_value(sender) != d->user && json_is_integer(t))
			on_partner_event(d, jint(d, e, "sync_seq", 0), (lws_usec_t) json_integer_value(t));
	}
}

/* ---- sync and ack (catch-up), snapshot ---- */

static void sync_start(dev *d);

static void
catch_up(dev *d, int full, dev_fn done)
{
	d->full = full;
	d->done = done;
	d->batches = 0;
	sync_start(d);
}

static void
sync_start(dev *d)
{
	if (++d->batches > MAX_CATCHUP_BATCHES)
		fail(d, "not caught up after %d batches", MAX_CATCHUP_BATCHES);
	send_frame(d, json_pack("{s:s, s:I, s:I, s:i}", "type", "sync", "sync_generation", (json_int_t) d->gen,
							"local_applied_sync_seq", (json_int_t) d->applied, "limit", 200),
			   ST_SYNC, "sync_result");
}

static void
on_sync_result(dev *d, json_t *r)
{
	const char *status = jstr(d, r, "status");

	if (d->st == ST_SYNC && strcmp(status, "RESET_REQUIRED") == 0)
	{
		send_frame(d, json_pack("{s:s}", "type", "snapshot_begin"), ST_SNAP_BEGIN, "snapshot_begin_result");
		return;
	}
	if (strcmp(status, "OK") != 0 && strcmp(status, "RECOVERY") != 0)
		fail(d, "sync status %s", status);
	if (d->st == ST_SYNC)
	{
		set_str(&d->batch_token, jstr(d, r, "batch_token"));
		d->batch_gen = jint(d, r, "sync_generation", 0);
		d->batch_hw = jint(d, r, "batch_high_watermark", 0);
		d->batch_ok = strcmp(status, "OK") == 0;
	}
	d->user_hw = jint(d, r, "user_high_watermark", 1);
	scan_events(d, json_object_get(r, "events"));
	if (json_is_true(json_object_get(r, "has_more")))
		send_frame(d, json_pack("{s:s, s:s, s:i}", "type", "sync", "cursor", jstr(d, r, "next_cursor"), "limit", 200),
				   ST_PAGE, "sync_result");
	else
		send_frame(d, json_pack("{s:s, s:s, s:I}", "type", "ack", "batch_token", d->batch_token,
								"acked_sync_seq", (json_int_t) d->batch_hw),
				   ST_ACK, "ack_result");
}

static void
on_ack_result(dev *d, json_t *r)
{
	const char *status = jstr(d, r, "status");

	if (strcmp(status, "OK") != 0)
		fail(d, "ack status %s", status);
	d->gen = d->batch_gen;
	d->applied = d->batch_hw;
	d->st = ST_IDLE;
	d->deadline = 0;
	if (!d->full || (d->batch_ok && d->user_hw <= d->applied))
		d->done(d);
	else
		sync_start(d);
}

static void
on_snapshot(dev *d, json_t *r)
{
	const char *status = jstr(d, r, "status");

	if (d->st == ST_SNAP_BEGIN)
	{
		if (strcmp(status, "READY") != 0)
			fail(d, "snapshot_begin status %s", status);
		set_str(&d->snap_token, jstr(d, r, "snapshot_token"));
		set_str(&d->snap_digest, jstr(d, r, "manifest_digest"));
		d->snap_pages = jint(d, r, "page_count", 0);
		d->snap_gen = jint(d, r, "sync_generation", 0);
		d->snap_base = jint(d, r, "base_sync_seq", 0);
		d->snap_page = 0;
	}
	else if (strcmp(status, "OK") != 0)
		fail(d, "%s status %s", d->want, status);
	else if (d->st == ST_SNAP_FETCH)
		d->snap_page++;
	else
	{
		/* acked: the device is ACTIVE at the snapshot's base */
		d->gen = d->snap_gen;
		d->applied = d->snap_base;
		sync_start(d);
		return;
	}
	if (d->snap_page < d->snap_pages)
		send_frame(d, json_pack("{s:s, s:s, s:I}", "type", "snapshot_fetch", "snapshot_token", d->snap_token,
								"page", (json_int_t) d->snap_page),
				   ST_SNAP_FETCH, "snapshot_fetch_result");
	else
		send_frame(d, json_pack("{s:s, s:s, s:s}", "type", "snapshot_ack", "snapshot_token", d->snap_token,
								"manifest_digest", d->snap_digest),
				   ST_SNAP_ACK, "snapshot_ack_result");
}

/* ---- connections ---- */

static void connect_dev(dev *d);
static void idle_check_up(void);
static void closed_before_welcome(dev *d, int code);
static void launch_connects(void);
static void on_welcomed(dev *d);
static void hint_sync(dev *d);
static void on_send_result(dev *d);

static void
retry_cb(lws_sorted_usec_list_t *sul)
{
	dev		   *d = lws_container_of(sul, dev, sul);

	connect_dev(d);
}

/* a refusal: reconnect after retry_after_ms (x 1..1.5) once the gateway closed */
static void
on_refusal(dev *d, json_t *r)
{
	json_t	   *ra = json_object_get(r, "retry_after_ms");
	int64_t		ms = 1000;

	refusals++;
	if (json_is_integer(ra))
		ms = json_integer_value(ra);
	else
		refusals_no_retry++;
	if (opt.mode == M_PAIRS || d->lat)
		fail(d, "refused: %s", json_dumps(r, JSON_COMPACT));
	d->st = ST_REFUSED;
	d->deadline = now_us() + (lws_usec_t) (opt.timeout * 1e6);
	d->retry_ms = (int64_t) (ms * (1.0 + 0.5 * (random() / (double) RAND_MAX)));
}

/*
 * storm: the gateway closed before any welcome or refusal frame (e.g. its
 * hello timeout, 4001, fired before it read the hello): a refusal without
 * retry_after_ms; the device comes back after 1 s (x 1..1.5), as a client would
 */
static void
closed_before_welcome(dev *d, int code)
{
	if (d->st == ST_REFUSED)
		return;
	refusals++;
	refusals_no_retry++;
	closes_before_welcome++;
	if (code > 0 && last_close_code == 0)
		last_close_code = code;
	d->st = ST_REFUSED;
	d->retry_ms = (int64_t) (1000 * (1.0 + 0.5 * (random() / (double) RAND_MAX)));
}

static void
handle_frame(dev *d, json_t *f)
{
	const char *type = json_string_value(json_object_get(f, "type"));
	json_t	   *id = json_object_get(f, "id");

	if (!type)
		fail(d, "frame without type");
	if (strcmp(type, "hint") == 0)
	{
		json_t	   *hw = json_object_get(f, "high_watermark");

		if (json_is_integer(hw))
		{
			on_hint_hw(d, json_integer_value(hw));
			if (d->receiver && (phase == PH_PACED || phase == PH_PACED_DRAIN || phase == PH_HOLD))
			{
				/* the partner syncs on the hint, as a client does */
				if (d->busy)
					d->hint_pending = 1;
				else
					hint_sync(d);
			}
		}
		return;
	}
	if (strcmp(type, "error") == 0)
	{
		const char *code = json_string_value(json_object_get(f, "code"));

		if (d->st == ST_HELLO && code && (strcmp(code, "RATE_LIMITED") == 0 || strcmp(code, "UNAVAILABLE") == 0))
		{
			on_refusal(d, f);
			return;
		}
		fail(d, "error frame %s", json_dumps(f, JSON_COMPACT));
	}
	if (!d->want || !json_is_integer(id) || json_integer_value(id) != d->rid)
		fail(d, "unexpected frame %s", json_dumps(f, JSON_COMPACT));
	if (strcmp(type, d->want) != 0)
		fail(d, "got %s instead", type);
	d->want = NULL;
	d->deadline = 0;
	switch (d->st)
	{
		case ST_HELLO:
			if (t_welcomed && n_welcomed < ndev)
				t_welcomed[n_welcomed++] = now_us();
			d->gen = jint(d, f, "sync_generation", 0);
			d->applied = jint(d, f, "server_acked_sync_seq", 1);
			d->welcome_hw = jint(d, f, "high_watermark", 1);
			d->st = ST_IDLE;
			on_welcomed(d);
			break;
		case ST_SYNC:
		case ST_PAGE:
			on_sync_result(d, f);
			break;
		case ST_ACK:
			on_ack_result(d, f);
			break;
		case ST_SNAP_BEGIN:
		case ST_SNAP_FETCH:
		case ST_SNAP_ACK:
			on_snapshot(d, f);
			break;
		case ST_SEND:
			on_send_result(d);
			break;
		default:
			fail(d, "internal: reply in state %d", d->st);
	}
}

static int
callback(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in, size_t len)
{
	dev		   *d = lws_get_opaque_user_data(wsi);
	int			n;

	switch (reason)
	{
		case LWS_CALLBACK_CLIENT_CONNECTION_ERROR:
			if (!d)
				break;
			d->wsi = NULL;
			if (opt.mode == M_STORM || (in && strstr((const char *) in, "503") && opt.mode != M_PAIRS && !d->lat))
			{
				/*
				 * over a connection cap: HTTP 503, no retry_after_ms to honour;
				 * in a storm also a connection the gateway dropped before the
				 * upgrade: both come back after 0.5-1 s
				 */
				if (in && strstr((const char *) in, "503"))
					http_refusals++;
				else
				{
					connect_failures++;
					if (!first_connect_error[0])
						snprintf(first_connect_error, sizeof(first_connect_error), "%s",
								 in ? (const char *) in : "(no reason)");
				}
				d->st = ST_RETRY;
				d->deadline = 0;
				inflight--;
				lws_sul_schedule(ctx, 0, &d->sul, retry_cb, (lws_usec_t) (500000 + random() % 500000));
				launch_connects();
				break;
			}
			fail(d, "connect failed: %s", in ? (const char *) in : "(no reason)");
			break;
		case LWS_CALLBACK_CLIENT_ESTABLISHED:
			if (t_established && !d->upgraded)
			{
				d->upgraded = 1;
				t_established[n_established++] = now_us();
			}
			send_frame(d, json_pack("{s:s, s:s}", "type", "hello", "token", d->token), ST_HELLO, "welcome");
			break;
		case LWS_CALLBACK_CLIENT_WRITEABLE:
			if (!d->tx)
				break;
			n = lws_write(wsi, d->tx + LWS_PRE, d->txlen, LWS_WRITE_TEXT);
			if (n < (int) d->txlen)
				fail(d, "lws_write failed");
			free(d->tx);
			d->tx = NULL;
			frames_out++;
			break;
		case LWS_CALLBACK_CLIENT_RECEIVE:
			if (d->rxlen + len + 1 > d->rxcap)
			{
				d->rxcap = d->rxlen + len + 1 > 2 * d->rxcap ? d->rxlen + len + 1 : 2 * d->rxcap;
				d->rx = realloc(d->rx, d->rxcap);
				if (!d->rx)
					fail(d, "out of memory");
			}
			memcpy(d->rx + d->rxlen, in, len);
			d->rxlen += len;
			if (lws_is_final_fragment(wsi))
			{
				json_error_t err;
				json_t	   *f = json_loadb(d->rx, d->rxlen, 0, &err);

				if (!f)
					fail(d, "reply is not JSON: %s", err.text);
				frames_in++;
				/* idle sessions keep no buffer */
				free(d->rx);
				d->rx = NULL;
				d->rxlen = d->rxcap = 0;
				handle_frame(d, f);
				json_decref(f);
			}
			break;
		case LWS_CALLBACK_WS_PEER_INITIATED_CLOSE:
			n = len >= 2 ? (((unsigned char *) in)[0] << 8) | ((unsigned char *) in)[1] : -1;
			if (d && (d->st == ST_HELLO || d->st == ST_CONNECT) && opt.mode == M_STORM)
				closed_before_welcome(d, n);
			else if (d && d->st != ST_REFUSED && !stop_signal)
				fail(d, "gateway closed the session with %d", n);
			break;
		case LWS_CALLBACK_CLIENT_CLOSED:
			if (!d)
				break;
			d->wsi = NULL;
			free(d->tx);
			d->tx = NULL;
			if (d->st == ST_REFUSED)
			{
				d->st = ST_RETRY;
				d->deadline = 0;
				inflight--;
				lws_sul_schedule(ctx, 0, &d->sul, retry_cb, (lws_usec_t) d->retry_ms * 1000);
				launch_connects();
				break;
			}
			if ((d->st == ST_HELLO || d->st == ST_CONNECT) && opt.mode == M_STORM)
			{
				closed_before_welcome(d, -1);
				d->st = ST_RETRY;
				d->deadline = 0;
				inflight--;
				lws_sul_schedule(ctx, 0, &d->sul, retry_cb, (lws_usec_t) d->retry_ms * 1000);
				launch_connects();
				break;
			}
			if (!stop_signal)
				fail(d, "session closed");
			break;
		default:
			break;
	}
	return 0;
}

/*
 * No lws validity timer per connection: lws keeps its timers in one sorted
 * list and inserts from the head, so a 5-minute validity timer per session
 * made every new connection walk all established ones (O(n) per connect,
 * 88% of the CPU at 4,000 sessions).  The gateway pings silent sessions
 * itself and lws answers pings; every wait here has its own deadline.
 */
static const lws_retry_bo_t no_validity_timer = {
	.secs_since_valid_ping = 0, .secs_since_valid_hangup = 0,
};

static const struct lws_protocols protocols[] = {
	{"im-sync.v1", callback, 0, 4096, 0, NULL, 0},
	{NULL, NULL, 0, 0, 0, NULL, 0}
};

static void
connect_dev(dev *d)
{
	struct lws_client_connect_info ci;

	memset(&ci, 0, sizeof(ci));
	ci.context = ctx;
	ci.address = opt.host;
	ci.port = opt.port;
	ci.path = opt.path;
	ci.host = opt.host;
	ci.protocol = "im-sync.v1";
	ci.iface = d->src;
	ci.opaque_user_data = d;
	ci.pwsi = &d->wsi;
	ci.retry_and_idle_policy = &no_validity_timer;
	d->st = ST_CONNECT;
	d->want = NULL;
	d->deadline = now_us() + (lws_usec_t) (opt.timeout * 1e6);
	inflight++;
	if (!lws_client_connect_via_info(&ci) && d->st == ST_CONNECT)
		fail(d, "cannot start a connection from %s (descriptors? ulimit -n is %ld)", d->src,
			 sysconf(_SC_OPEN_MAX));
}

static lws_sorted_usec_list_t launch_sul;

static void
launch_cb(lws_sorted_usec_list_t *sul)
{
	launch_connects();
}

/*
 * Connects the mode's devices, at most --concurrency connects/hellos in
 * flight, LAUNCH_CHUNK per turn of the event loop so that a storm's
 * thousands of connects do not keep it from serving the sockets (and the
 * timeouts) meanwhile.
 */
static void
launch_connects(void)
{
	int			n = 0;

	while (next_connect < idle_target && inflight < opt.concurrency)
	{
		if (n++ == LAUNCH_CHUNK)
		{
			lws_sul_schedule(ctx, 0, &launch_sul, launch_cb, 1000);
			return;
		}
		connect_dev(&devs[next_connect++]);
	}
}

/* ---- the closed loop and the paced phase ---- */

static void cycle_start(dev *d);
static void start_phase(phase_t ph);

static void
cycle_start(dev *d)
{
	char		cmid[96];

	d->busy = 1;
	snprintf(cmid, sizeof(cmid), "L%d-%" PRId64 "-%" PRId64, (int) getpid(), d->user, ++d->nsent);
	send_frame(d, json_pack("{s:s, s:I, s:s, s:{s:I}}", "type", "send", "conversation_id", (json_int_t) d->conv,
							"client_msg_id", cmid, "body", "t", (json_int_t) now_us()),
			   ST_SEND, "send_result");
}

/* a phase ends when every device is idle and the last hints had DRAIN_GRACE to come */
static void
check_drained(void)
{
	int			i;

	if (now_us() < phase_stop + DRAIN_GRACE)
		return;
	for (i = 0; i < nact; i++)
		if (act[i].busy)
			return;
	if (phase == PH_LOOP_DRAIN)
		start_phase(PH_PACED);
	else if (phase == PH_PACED_DRAIN)
		start_phase(PH_HOLD);
}

static void
cycle_done(dev *d)
{
	if ((phase == PH_LOOP || phase == PH_PACED) && !d->final_sync)
		sends++;
	d->busy = 0;
	if (phase == PH_LOOP && now_us() < phase_stop)
	{
		cycle_start(d);
		return;
	}
	if ((phase == PH_LOOP || phase == PH_LOOP_DRAIN) && !d->final_sync)
	{
		/* one more sync finds the partner's last messages, so their hints count */
		d->final_sync = 1;
		d->busy = 1;
		catch_up(d, 0, cycle_done);
		return;
	}
	if (d->hint_pending && (phase == PH_PACED || phase == PH_PACED_DRAIN || phase == PH_HOLD))
	{
		hint_sync(d);
		return;
	}
	check_drained();
}

static void
on_send_result(dev *d)
{
	d->st = ST_IDLE;
	if (phase == PH_PACED || phase == PH_PACED_DRAIN)
		cycle_done(d);			/* the partner syncs, on the hint */
	else
		catch_up(d, 0, cycle_done);
}

static void
hint_sync_done(dev *d)
{
	d->busy = 0;
	if (d->hint_pending)
	{
		hint_sync(d);
		return;
	}
	check_drained();
}

static void
hint_sync(dev *d)
{
	d->hint_pending = 0;
	d->busy = 1;
	catch_up(d, 0, hint_sync_done);
}

/* paced phase: the sends due by now go to idle senders (even indexes) in turn */
static void
pace_cb(lws_sorted_usec_list_t *sul)
{
	lws_usec_t	t = now_us();
	int64_t		due;
	int			tried;

	if (phase != PH_PACED)
		return;
	if (t >= phase_stop)
	{
		phase = PH_PACED_DRAIN;
		drain_until = t + (lws_usec_t) (opt.timeout * 1e6);
		return;
	}
	due = (int64_t) ((t - phase_start) / 1e6 * opt.rate) + 1;
	while (paced_issued < due)
	{
		for (tried = 0; tried < nact / 2 && act[pace_next].busy; tried++)
			pace_next = (pace_next + 2) % nact;
		if (tried == nact / 2)
		{
			paced_lagged++;		/* every sender waits for its send_result: the rate is not held */
			break;
		}
		cycle_start(&act[pace_next]);
		pace_next = (pace_next + 2) % nact;
		paced_issued++;
	}
	lws_sul_schedule(ctx, 0, &pace_sul, pace_cb, 2000);
}

static void
print_latency(const char *what)
{
	qsort(lat_ms, nlat, sizeof(double), cmp_double);
	printf(" send_to_hint_p50_ms=%.1f send_to_hint_p99_ms=%.1f send_to_hint_max_ms=%.1f samples=%zu",
		   pct(50), pct(99), nlat ? lat_ms[nlat - 1] : -1.0, nlat);
	(void) what;
}

static int64_t
unhinted(void)
{
	int64_t		n = 0;
	int			i,
				k;

	for (i = 0; i < nact; i++)
		for (k = 0; act[i].lat && k < act[i].lat->npend; k++)
			if (act[i].lat->pend[k].t_send >= phase_start && act[i].lat->pend[k].t_send < phase_stop)
				n++;
	return n;
}

static void
start_phase(phase_t ph)
{
	lws_usec_t	t = now_us();
	int			i;
	double		el = (t - phase_start) / 1e6;

	/* results of the phase that ends */
	if (phase == PH_LOOP_DRAIN)
	{
		el = (phase_stop - phase_start) / 1e6;
		printf("RESULT pairs devices=%d seconds=%.1f sends_per_s=%.1f frames_per_s=%.1f client_cpu_pct=%.0f",
			   nact, el, sends / el, (frames_in + frames_out) / el, cpu_pct_since(&ru_phase, phase_start));
		print_latency("loop");
		printf(" unhinted=%" PRId64 "\n", unhinted());
		fflush(stdout);
		if (opt.rate <= 0)
			ph = PH_HOLD;
	}
	else if (phase == PH_PACED_DRAIN)
	{
		el = (phase_stop - phase_start) / 1e6;
		printf("RESULT paced senders=%d receivers=%d rate_goal=%.0f sends_per_s=%.1f all_senders_busy_ticks=%" PRId64
			   " client_cpu_pct=%.0f", nact / 2, nact / 2, opt.rate, sends / el, paced_lagged,
			   cpu_pct_since(&ru_phase, phase_start));
		print_latency("paced");
		printf(" unhinted=%" PRId64 "\n", unhinted());
		fflush(stdout);
	}
	(void) el;
	phase = ph;
	phase_start = t;
	nlat = 0;
	sends = frames_in = frames_out = 0;
	getrusage(RUSAGE_SELF, &ru_phase);
	switch (ph)
	{
		case PH_LOOP:
			phase_stop = t + (lws_usec_t) (opt.seconds * 1e6);
			for (i = 0; i < nact; i++)
				cycle_start(&act[i]);
			break;
		case PH_PACED:
			phase_stop = t + (lws_usec_t) (opt.rate_seconds * 1e6);
			for (i = 0; i < nact; i++)
				act[i].final_sync = 0;
			paced_issued = paced_lagged = 0;
			pace_next = 0;
			for (i = 0; i < nact; i++)
				act[i].receiver = i % 2;
			lws_sul_schedule(ctx, 0, &pace_sul, pace_cb, 1000);
			break;
		case PH_HOLD:
			if (opt.mode == M_PAIRS)
			{
				fflush(stdout);
				_exit(0);
			}
			printf("im_load: holding %d idle sessions (SIGTERM, end of stdin or %.0f s)\n", ndev, opt.hold);
			fflush(stdout);
			phase_stop = t + (lws_usec_t) (opt.hold * 1e6);
			break;
		default:
			break;
	}
}

/* ---- modes ---- */

static void
pairs_ready(dev *d)
{
	d->busy = 0;
	inflight--;
	if (++nup == nact)
	{
		printf("im_load: %d devices up and caught up in %.1f s\n", nact, (now_us() - t_start) / 1e6);
		fflush(stdout);
		phase = PH_SETUP;
		/* the closed loop, then (--rate) the paced phase */
		start_phase(opt.seconds > 0 ? PH_LOOP : PH_PACED);
	}
	else if (opt.mode == M_PAIRS)
		launch_connects();
}

/* seconds from the start until the share q (0..1] of the n marks */
static double
mark_s(const lws_usec_t *t, int n, double q)
{
	int			i = (int) (q * n + 0.5) - 1;

	if (n == 0)
		return -1;
	return (t[i < 0 ? 0 : i >= n ? n - 1 : i] - t_start) / 1e6;
}

static void
storm_done(dev *d)
{
	inflight--;
	if (++ndone == ndev)
	{
		/* where the time went: each device's first upgrade, and the welcomes */
		printf("RESULT storm_timeline upgraded_s=%.2f/%.2f/%.2f welcomed_s=%.2f/%.2f/%.2f/%.2f"
			   " (upgrades: 1st/50%%/100%% of %d; welcomes: 1st/50%%/90%%/100%%)\n",
			   mark_s(t_established, n_established, 0), mark_s(t_established, n_established, 0.5),
			   mark_s(t_established, n_established, 1), mark_s(t_welcomed, n_welcomed, 0),
			   mark_s(t_welcomed, n_welcomed, 0.5), mark_s(t_welcomed, n_welcomed, 0.9),
			   mark_s(t_welcomed, n_welcomed, 1), n_established);
		printf("RESULT storm devices=%d all_caught_up_s=%.2f caught_up_at_welcome=%d refusals=%" PRId64
			   " refusals_without_retry_after=%" PRId64 " closes_before_welcome=%" PRId64 " first_close_code=%d"
			   " http_503=%" PRId64 " connect_failures=%" PRId64 " first_connect_error=\"%s\" client_cpu_pct=%.0f\n",
			   ndev, (now_us() - t_start) / 1e6, storm_welcome_only, refusals, refusals_no_retry, closes_before_welcome,
			   last_close_code, http_refusals, connect_failures, first_connect_error,
			   cpu_pct_since(&ru_phase, t_start));
		fflush(stdout);
		_exit(0);
	}
}

static void
on_welcomed(dev *d)
{
	if (d->lat)
	{
		/* pairs: catch up, then the phases */
		d->busy = 1;
		catch_up(d, 1, pairs_ready);
		return;
	}
	if (opt.mode == M_STORM)
	{
		/*
		 * A welcome whose acked position is the user's head says there is
		 * nothing to fetch (same generation, contract §10): a client is
		 * caught up without a sync, as the reference client is.
		 */
		if (d->applied == d->welcome_hw)
		{
			storm_welcome_only++;
			storm_done(d);
			return;
		}
		catch_up(d, 1, storm_done);
		return;
	}
	/* idle */
	inflight--;
	nup++;
	idle_check_up();
}

/* idle: every session to open is up: say so (and in the ready file), hold */
static void
idle_check_up(void)
{
	if (nup == idle_target)
	{
		printf("RESULT idle sessions=%d of %d up_s=%.1f%s refusals=%" PRId64 " refusals_without_retry_after=%" PRId64
			   " http_503=%" PRId64 " source_addresses=%d client_cpu_pct=%.0f\n",
			   nup, ndev, (now_us() - t_start) / 1e6, nup < ndev ? " (time limit: --max-seconds)" : "",
			   refusals, refusals_no_retry, http_refusals,
			   (nup + opt.per_src - 1) / opt.per_src, cpu_pct_since(&ru_phase, t_start));
		fflush(stdout);
		if (opt.ready)
		{
			FILE	   *f = fopen(opt.ready, "w");

			if (!f)
				fail(NULL, "cannot write %s", opt.ready);
			fprintf(f, "%d\n", nup);
			fclose(f);
		}
		start_phase(PH_HOLD);
	}
	else
		launch_connects();
}

/* once a second: timeouts of every wait, phase ends, stop requests */
static void
tick_cb(lws_sorted_usec_list_t *sul)
{
	lws_usec_t	t = now_us();
	int			i;

	for (i = 0; i < ndev; i++)
		if (devs[i].deadline && t > devs[i].deadline)
			fail(&devs[i], "no answer within %.0f s", opt.timeout);
	if (phase == PH_LOOP && t >= phase_stop)
		phase = PH_LOOP_DRAIN;
	if (phase == PH_LOOP_DRAIN || phase == PH_PACED_DRAIN)
		check_drained();
	if (phase == PH_PACED_DRAIN && t > drain_until)
		fail(NULL, "paced phase did not drain within %.0f s", opt.timeout);
	if (phase == PH_HOLD && t > phase_stop)
		stop_signal = 1;
	if (phase == PH_SETUP && opt.mode != M_IDLE && t - t_start > (lws_usec_t) (opt.max_seconds * 1e6))
		fail(NULL, "%d of %d devices caught up after %.0f s (refusals %" PRId64 ")",
			 opt.mode == M_STORM ? ndone : nup, ndev, opt.max_seconds, refusals);
	if (opt.mode == M_IDLE && idle_target == ndev && nup < ndev
		&& t - t_start > (lws_usec_t) (opt.max_seconds * 1e6))
	{
		/* out of time: the sessions started so far finish, no new ones */
		idle_target = next_connect;
		fprintf(stderr, "im_load: %d of %d sessions up after %.0f s; finishing the %d started\n",
				nup, ndev, opt.max_seconds, idle_target - nup);
		idle_check_up();
	}
	if (phase == PH_HOLD)
	{
		struct stat sb;

		/* a piped stdin that ends (or says anything) stops the hold */
		if (fstat(0, &sb) == 0 && (S_ISFIFO(sb.st_mode) || isatty(0)))
		{
			struct pollfd p = {.fd = 0,.events = POLLIN};

			if (poll(&p, 1, 0) > 0)
				stop_signal = 1;
		}
	}
	if (stop_signal)
		lws_cancel_service(ctx);
	lws_sul_schedule(ctx, 0, &tick_sul, tick_cb, 1000000);
}

/* ---- setup ---- */

static dev *
load_tokens(const char *path, int *n, int max)
{
	FILE	   *f = fopen(path, "r");
	char		line[4096],
				dv[256],
				tok[2048];
	long long	u,
				c;
	dev		   *v = NULL;
	int			cap = 0;

	*n = 0;
	if (!f)
		fail(NULL, "cannot open %s: %s", path, strerror(errno));
	while ((max <= 0 || *n < max) && fgets(line, sizeof(line), f))
	{
		if (sscanf(line, "%lld %255s %lld %2047s", &u, dv, &c, tok) != 4)
			fail(NULL, "%s: bad line: %s", path, line);
		if (*n == cap)
		{
			cap = cap ? cap * 2 : 1024;
			v = realloc(v, cap * sizeof(dev));
			if (!v)
				fail(NULL, "out of memory");
		}
		memset(&v[*n], 0, sizeof(dev));
		v[*n].idx = *n;
		v[*n].user = u;
		v[*n].device = strdup(dv);
		v[*n].conv = c;
		v[*n].token = strdup(tok);
		(*n)++;
	}
	fclose(f);
	if (*n == 0)
		fail(NULL, "%s: no tokens", path);
	return v;
}

static void
assign_sources(dev *v, int n, int offset)
{
	struct in_addr a;
	uint32_t	base;
	int			i,
				k;

	if (inet_pton(AF_INET, opt.src_base, &a) != 1 || (ntohl(a.s_addr) >> 24) != 127)
		fail(NULL, "--src-base %s: need a 127.x.y.z address", opt.src_base);
	base = ntohl(a.s_addr);
	for (i = 0; i < n; i++)
	{
		k = (i + offset) / opt.per_src;
		if (k >= MAX_SRC || ((base + k) >> 24) != 127)
			fail(NULL, "too many source addresses (raise --per-src)");
		if (!srcs[k])
		{
			struct in_addr b = {.s_addr = htonl(base + k)};
			char		buf[INET_ADDRSTRLEN];

			inet_ntop(AF_INET, &b, buf, sizeof(buf));
			srcs[k] = strdup(buf);
		}
		v[i].src = srcs[k];
	}
}

static void
on_signal(int sig)
{
	stop_signal = 1;
	if (ctx)
		lws_cancel_service(ctx);
}

static void
usage(void)
{
	fprintf(stderr,
			"usage: im_load pairs TOKENS SECONDS [--devices K] [--rate R] [--rate-seconds S]\n"
			"       im_load idle TOKENS [--ready FILE] [--hold S]\n"
			"       im_load storm TOKENS [--max-seconds S]\n"
			"  common: --url ws://HOST:PORT/ (or IM_GW_URL) --src-base 127.0.0.2 --per-src N\n"
			"          --concurrency C --timeout S\n");
	exit(2);
}

static void
parse_args(int argc, char **argv)
{
	const char *url = getenv("IM_GW_URL");
	const char *prot,
			   *ads,
			   *path;
	static char urlbuf[512];
	int			i = 3;

	if (argc < 3)
		usage();
	if (strcmp(argv[1], "pairs") == 0)
	{
		opt.mode = M_PAIRS;
		if (argc < 4)
			usage();
		opt.seconds = atof(argv[3]);
		i = 4;
	}
	else if (strcmp(argv[1], "idle") == 0)
		opt.mode = M_IDLE;
	else if (strcmp(argv[1], "storm") == 0)
		opt.mode = M_STORM;
	else
		usage();
	opt.tokens = argv[2];
	for (; i < argc; i++)
	{
		const char *a = argv[i],
				   *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!v)
			usage();
		i++;
		if (!strcmp(a, "--rate"))
			opt.rate = atof(v);
		else if (!strcmp(a, "--rate-seconds"))
			opt.rate_seconds = atof(v);
		else if (!strcmp(a, "--ready"))
			opt.ready = v;
		else if (!strcmp(a, "--devices"))
			opt.devices = atoi(v);
		else if (!strcmp(a, "--hold"))
			opt.hold = atof(v);
		else if (!strcmp(a, "--max-seconds"))
			opt.max_seconds = atof(v);
		else if (!strcmp(a, "--timeout"))
			opt.timeout = atof(v);
		else if (!strcmp(a, "--url"))
			url = v;
		else if (!strcmp(a, "--src-base"))
			opt.src_base = v;
		else if (!strcmp(a, "--per-src"))
			opt.per_src = atoi(v);
		else if (!strcmp(a, "--concurrency"))
			opt.concurrency = atoi(v);
		else
			usage();
	}
	if (!url)
		fail(NULL, "no --url and no IM_GW_URL");
	snprintf(urlbuf, sizeof(urlbuf), "%s", url);
	if (lws_parse_uri(urlbuf, &prot, &ads, &opt.port, &path) || strcmp(prot, "ws"))
		fail(NULL, "--url %s: need ws://HOST:PORT/", url);
	snprintf(opt.host, sizeof(opt.host), "%s", ads);
	snprintf(opt.path, sizeof(opt.path), "/%s", path);
	if (opt.per_src <= 0 || opt.concurrency <= 0 || opt.timeout <= 0)
		fail(NULL, "--per-src, --concurrency and --timeout must be positive");
	if (opt.mode == M_PAIRS && opt.seconds <= 0 && opt.rate <= 0)
		fail(NULL, "pairs: SECONDS 0 needs --rate");
}

int
main(int argc, char **argv)
{
	struct lws_context_creation_info info;
	struct rlimit rl;
	int			i;

	parse_args(argc, argv);
	srandom((unsigned) getpid());
	/* descriptors: one per session; lws sizes its tables from the limit */
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max)
	{
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	devs = load_tokens(opt.tokens, &ndev, opt.mode == M_PAIRS ? opt.devices : 0);
	idle_target = ndev;
	assign_sources(devs, ndev, 0);
	if (opt.mode == M_PAIRS)
	{
		if (ndev % 2)
			fail(NULL, "pairs: an even number of devices is needed");
		act = devs;
		nact = ndev;
		for (i = 0; i < ndev; i++)
			devs[i].lat = calloc(1, sizeof(lat_state));
	}
	if (opt.mode == M_STORM)
	{
		opt.concurrency = ndev;
		t_established = calloc(ndev, sizeof(lws_usec_t));
		t_welcomed = calloc(ndev, sizeof(lws_usec_t));
		if (!t_established || !t_welcomed)
			fail(NULL, "out of memory");
	}
	if ((long) rl.rlim_max < ndev + 64)
		fail(NULL, "%d sessions need as many descriptors; the hard limit is %ld (ulimit -Hn)",
			 ndev, (long) rl.rlim_max);

	lws_set_log_level(LLL_ERR, NULL);
	memset(&info, 0, sizeof(info));
	info.port = CONTEXT_PORT_NO_LISTEN;
	info.protocols = protocols;
	info.options = LWS_SERVER_OPTION_DISABLE_IPV6;
	info.timeout_secs = (unsigned) opt.timeout;
	info.connect_timeout_secs = (unsigned) opt.timeout;
	info.retry_and_idle_policy = &no_validity_timer;
	/* client handshakes in flight each hold a header table */
	info.max_http_header_pool = (unsigned short) (opt.concurrency + 16 > 60000 ? 60000 : opt.concurrency + 16);
	if (opt.mode == M_STORM)
	{
		/*
		 * storm: lws' libev loop (epoll) when its plugin loads — poll() hands
		 * the kernel every descriptor at every wake-up.  The storm ends with
		 * _exit from inside the loop, so lws_service never has to return.
		 */
		info.options |= LWS_SERVER_OPTION_LIBEV;
		ctx = lws_create_context(&info);
		info.options &= ~(uint64_t) LWS_SERVER_OPTION_LIBEV;
	}
	if (!ctx)
		ctx = lws_create_context(&info);
	if (!ctx)
		fail(NULL, "lws_create_context failed");
	signal(SIGTERM, on_signal);
	signal(SIGINT, on_signal);
	signal(SIGPIPE, SIG_IGN);

	t_start = now_us();
	getrusage(RUSAGE_SELF, &ru_phase);
	lws_sul_schedule(ctx, 0, &tick_sul, tick_cb, 1000000);
	launch_connects();
	while (!stop_signal)
		if (lws_service(ctx, 0) < 0)
			break;
	fflush(stdout);
	if (opt.mode != M_IDLE || phase != PH_HOLD)
		fail(NULL, "stopped before the run finished");
	_exit(0);
}
