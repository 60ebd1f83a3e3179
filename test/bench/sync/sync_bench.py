#!/usr/bin/python3
"""Sync benchmark (not a test): prints figures and ratios in one run.

1. Catch-up throughput: one device reads 20,000 events of its user's log
   through im.sync_changes (first call + cursor pages, signed batch tokens
   and cursors included) at page sizes 100 and 1,000, against the floor of
   the floor: the bare range query over the same inbox rows joined to their
   im.event rows, ORDER BY sync_seq LIMIT page from the last position, each
   page returned as one jsonb_agg of objects with the same keys as the
   API's events (contract §11 + sync_seq).  Both sides are prepared
   statements fetched the same way over the same connection (the page as
   text, so client parsing is out of both figures), in alternating rounds;
   the ratio is the median of the rounds' ratios.
2. ACK throughput: ack_sync calls per second, each its own transaction,
   each advancing the device's cursor by one.
3. Long log: the cost of one page (page size 100) for a user whose log is
   10x longer, at the same distance from the head, as a ratio to the
   shorter log's (goal <= 1.2x).  Both the batch-starting call and a
   cursor page are timed; medians of many calls.

Both logs are built by bulk SQL writing the rows fanout writes (see fill());
the write path's own rate is printed for context from 1,000 API sends.
"""

import os
import statistics
import sys
import time

import psycopg2
import psycopg2.extras

N = int(os.environ.get('IM_BENCH_EVENTS', '20000'))
LONG_FACTOR = int(os.environ.get('IM_BENCH_LONG_FACTOR', '10'))
REPEAT = int(os.environ.get('IM_BENCH_REPEAT', '5'))

dsn = os.environ['IM_BENCH_DSN']
db = psycopg2.connect(dsn)
db.autocommit = True
cur = db.cursor()
cur.execute("SELECT pg_backend_pid()")
BACKEND_PID = cur.fetchone()[0]


def q(sql, args=()):
    cur.execute(sql, args)
    return cur.fetchall() if cur.description else None


def log(msg):
    print(msg, flush=True)


# One batch covers the whole catch-up, so it can be read again and again
# without ACKing (the device stays at its cursor).
q("SET im_sync.max_batch_events = %s", (str(N * LONG_FACTOR + 10),))

SHORT, LONG, PEER = 1, 2, 3


def make_device(user, dev):
    """A device made ACTIVE at cursor 0 by an (empty) snapshot."""
    q("SELECT * FROM im.register_device(%s, %s)", (user, dev))
    b = q("SELECT status, sync_generation, snapshot_token, manifest_digest FROM im.begin_snapshot(%s, %s)", (user, dev))[0]
    assert b[0] == 'READY', b
    a = q("SELECT status FROM im.ack_snapshot(%s, %s, %s, %s)", (user, dev, b[2], b[3]))[0]
    assert a[0] == 'OK', a
    return b[1]


def fill_api(user, n, tag):
    """n messages from PEER to `user` through send_message + run_fanout."""
    c = q("SELECT im.direct_conversation(%s, %s)", (user, PEER))[0][0]
    t0 = time.time()
    q("SELECT count(*) FROM generate_series(1, %s) g, "
      "LATERAL im.send_message(%s, %s, %s || g, jsonb_build_object('text', 'bench message ' || g, 'n', g)) s",
      (n, PEER, c, tag))
    t1 = time.time()
    while q("SELECT im.run_fanout(10000)")[0][0] > 0:
        pass
    t2 = time.time()
    log('  write path (context): %d sends in %.2fs (%.0f/s), fanout in %.2fs (%.0f items/s, 2 recipients each)'
        % (n, t1 - t0, n / (t1 - t0), t2 - t1, n / (t2 - t1)))


BULK_SQL = """
WITH conv AS (SELECT head_msg_seq AS head FROM im.conversation WHERE conversation_id = %(c)s),
     hd AS (SELECT high_watermark AS hw FROM im.user_head WHERE user_id = %(u)s),
     ev AS (INSERT INTO im.event (conversation_id, msg_seq, kind, sender_id, client_msg_id, content_type, body, mode)
            SELECT %(c)s, conv.head + g, 'message', %(peer)s, %(tag)s || g, 'text',
                   jsonb_build_object('text', 'bench message ' || g, 'n', g), 'fanout'
            FROM conv, generate_series(1, %(n)s) g
            RETURNING message_id, msg_seq),
     ob AS (INSERT INTO im.outbox (conversation_id, msg_seq, source_event_id, state, processed_at)
            SELECT %(c)s, msg_seq, message_id, 'done', now() FROM ev
            RETURNING outbox_id, source_event_id, msg_seq)
INSERT INTO im.inbox (user_id, sync_seq, source_event_id, delivery_scope, conversation_id, msg_seq, kind, outbox_id)
SELECT %(u)s, hd.hw + ob.msg_seq - conv.head, ob.source_event_id, %(period)s, %(c)s, ob.msg_seq, 'message', ob.outbox_id
FROM ob, hd, conv
"""


def fill(user, n, tag):
    """The user's log grows by n message events in a direct conversation
    with PEER.  Built by bulk SQL writing the rows fanout writes (event,
    processed outbox item, the user's inbox event, head and state), because
    220,000 events through send_message + run_fanout do not fit the bench's
    time budget on a small machine; the read path measured is the same."""
    c = q("SELECT im.direct_conversation(%s, %s)", (user, PEER))[0][0]
    while q("SELECT im.run_fanout(10000)")[0][0] > 0:
        pass
    period = q("SELECT membership_period_id FROM im.membership_period WHERE conversation_id = %s AND user_id = %s",
               (c, user))[0][0]
    t0 = time.time()
    db.autocommit = False
    step = 50000
    for lo in range(0, n, step):
        k = min(step, n - lo)
        cur.execute(BULK_SQL, dict(c=c, u=user, peer=PEER, tag='%s%d-' % (tag, lo), n=k, period=period))
        cur.execute("UPDATE im.conversation SET head_msg_seq = head_msg_seq + %s WHERE conversation_id = %s", (k, c))
        cur.execute("UPDATE im.user_head SET high_watermark = high_watermark + %s WHERE user_id = %s", (k, user))
    cur.execute("UPDATE im.user_conversation uc SET last_msg_seq = x.head_msg_seq, version = version + 1 "
                "FROM im.conversation x WHERE x.conversation_id = uc.conversation_id AND uc.conversation_id = %s "
                "AND uc.user_id = %s", (c, user))
    db.commit()
    db.autocommit = True
    q("ANALYZE im.inbox")
    q("ANALYZE im.event")
    hw = q("SELECT high_watermark FROM im.user_head WHERE user_id = %s", (user,))[0][0]
    log('  setup: user %d log filled to high watermark %d in %.1fs (bulk SQL)' % (user, hw, time.time() - t0))
    return hw


# The API's calls, prepared like the gateway prepares them (gateway/server/frame.c).
API_PREPARE = [
    "PREPARE sync_first(bigint, text, int, bigint, int) AS "
    "SELECT status, next_cursor, has_more, jsonb_array_length(events), events::text "
    "FROM im.sync_changes($1, $2, $3, $4, $5)",
    "PREPARE sync_next(bigint, text, int, text) AS "
    "SELECT status, next_cursor, has_more, jsonb_array_length(events), events::text "
    "FROM im.sync_changes($1, $2, NULL, NULL, $3, $4)",
]


def catch_up(user, dev, gen, la, limit):
    """Read the whole batch (la, hw] via sync_changes; returns events read."""
    cur.execute("EXECUTE sync_first(%s, %s, %s, %s, %s)", (user, dev, gen, la, limit))
    st, nxt, more, n, _ = cur.fetchone()
    assert st == 'OK', st
    total = n
    while more:
        cur.execute("EXECUTE sync_next(%s, %s, %s, %s)", (user, dev, limit, nxt))
        st, nxt, more, n, _ = cur.fetchone()
        assert st == 'OK', st
        total += n
    return total


# The floor, prepared once like the API's kept plans.
FLOOR_PREPARE = """
PREPARE floor_page(bigint, bigint, int) AS
SELECT max(sync_seq), count(*), jsonb_agg(ev ORDER BY sync_seq)::text FROM (
  SELECT i.sync_seq,
         jsonb_build_object('kind', e.kind, 'conversation_id', e.conversation_id, 'msg_seq', e.msg_seq,
                            'message_id', e.message_id, 'sender_id', e.sender_id,
                            'content_type', e.content_type, 'body', e.body,
                            'target_message_id', e.target_message_id, 'recalled', e.recalled,
                            'created_at', e.created_at, 'sync_seq', i.sync_seq) AS ev
  FROM im.inbox i JOIN im.event e ON e.message_id = i.source_event_id
  WHERE i.user_id = $1 AND i.sync_seq > $2
  ORDER BY i.sync_seq LIMIT $3) page"""
FLOOR_SQL = "EXECUTE floor_page(%s, %s, %s)"


def floor(user, la, hw, limit):
    total, pos = 0, la
    while pos < hw:
        cur.execute(FLOOR_SQL, (user, pos, limit))
        last, n, _ = cur.fetchone()
        if not n:
            break
        total += n
        pos = last
    return total


def backend_cpu_ns():
    """CPU time the server process of this connection has used (Linux
    schedstat; the bench's cluster runs on this machine), or None."""
    try:
        with open('/proc/%d/schedstat' % BACKEND_PID) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def compare_rates(api, flr, n_expected):
    """Alternating timed rounds of both sides; median rates, the median of
    the per-round ratios (load from elsewhere hits both alike) and the
    median server CPU per round of each side (load-independent)."""
    rates, cpu, ratios = {'api': [], 'floor': []}, {'api': [], 'floor': []}, []
    for _ in range(REPEAT):
        pair = []
        for name, fn in (('api', api), ('floor', flr)):
            c0 = backend_cpu_ns()
            t0 = time.perf_counter()
            n = fn()
            dt = time.perf_counter() - t0
            c1 = backend_cpu_ns()
            assert n == n_expected, (name, n, n_expected)
            rates[name].append(n / dt)
            if c0 is not None and c1 is not None:
                cpu[name].append((c1 - c0) / 1e6)
            pair.append(n / dt)
        ratios.append(pair[0] / pair[1])
    med = {k: statistics.median(v) if v else None for k, v in cpu.items()}
    return (statistics.median(rates['api']), statistics.median(rates['floor']),
            statistics.median(ratios), ratios, med)


def median_ms(fn, reps):
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1000


def main():
    t_start = time.time()
    q(FLOOR_PREPARE)
    for sql in API_PREPARE:
        q(sql)
    log('sync benchmark: %d events, page sizes 100 and 1000, long log %dx, %d alternating rounds'
        % (N, LONG_FACTOR, REPEAT))
    log('  server: %s; fsync=%s, synchronous_commit=%s' % (
        q("SHOW server_version")[0][0], q("SHOW fsync")[0][0], q("SHOW synchronous_commit")[0][0]))
    g_short = make_device(SHORT, 'reader')
    g_ack = make_device(SHORT, 'acker')
    g_long = make_device(LONG, 'reader')
    fill_api(4, 1000, 'api-')
    hw_short = fill(SHORT, N, 'short-')

    log('\n1. catch-up throughput (%d events, one batch, cursor pages)' % hw_short)
    catch_up(SHORT, 'reader', g_short, 0, 1000)     # warm caches
    floor(SHORT, 0, hw_short, 1000)
    for limit in (100, 1000):
        sync_rate, floor_rate, ratio, ratios, cpu_ms = compare_rates(
            lambda: catch_up(SHORT, 'reader', g_short, 0, limit),
            lambda: floor(SHORT, 0, hw_short, limit), hw_short)
        log('  page %5d: sync_changes %8.0f events/s   floor (range query as one jsonb_agg) %8.0f events/s   '
            'sync/floor = %.2f (goal >= 0.9; rounds %s)'
            % (limit, sync_rate, floor_rate, ratio, ' '.join('%.2f' % x for x in ratios)))
        if cpu_ms['api'] and cpu_ms['floor']:
            log('              server CPU per catch-up: sync_changes %.1f ms, floor %.1f ms, floor/sync = %.2f'
                % (cpu_ms['api'], cpu_ms['floor'], cpu_ms['floor'] / cpu_ms['api']))
    # What production durability costs the API per page: a batch's first
    # call locks and touches the device row, so it commits WAL and waits for
    # its flush; cursor pages write nothing (at most one last_seen_at touch
    # a second); the floor writes nothing.  Cluster-wide WAL, so background
    # work (autovacuum) can add to it.
    for limit in (100, 1000):
        l0 = q("SELECT pg_current_wal_insert_lsn()")[0][0]
        catch_up(SHORT, 'reader', g_short, 0, limit)
        wal = q("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s)", (l0,))[0][0]
        pages = -(-hw_short // limit)
        log('  page %5d: WAL per sync_changes call %.0f bytes (%d calls; floor: none)'
            % (limit, float(wal) / pages, pages))

    log('\n2. ACK throughput (ack_sync, one transaction each, cursor +1 each)')
    cur.execute("SELECT batch_token, batch_high_watermark FROM im.sync_changes(%s, 'acker', %s, 0, 1)", (SHORT, g_ack))
    tok, hw = cur.fetchone()
    n_acks = min(5000, hw)
    t0 = time.perf_counter()
    for s in range(1, n_acks + 1):
        cur.execute("SELECT status FROM im.ack_sync(%s, 'acker', %s, %s)", (SHORT, tok, s))
    dt = time.perf_counter() - t0
    assert cur.fetchone()[0] == 'OK'
    log('  %d acks in %.2fs: %.0f acks/s (%.3f ms each)' % (n_acks, dt, n_acks / dt, dt * 1000 / n_acks))

    log('\n3. one page on a %dx longer log (same distance from the head)' % LONG_FACTOR)
    hw_long = fill(LONG, N * LONG_FACTOR, 'long-')
    results = {}
    for user, gen, hw in ((SHORT, g_short, hw_short), (LONG, g_long, hw_long)):
        la = hw - 1000
        cur.execute("SELECT batch_token FROM im.sync_changes(%s, 'reader', %s, 0, 1)", (user, gen))
        tok = cur.fetchone()[0]
        cur.execute("SELECT status FROM im.ack_sync(%s, 'reader', %s, %s)", (user, tok, la))
        assert cur.fetchone()[0] == 'OK'

        def first_page():
            cur.execute("EXECUTE sync_first(%s, 'reader', %s, %s, 100)", (user, gen, la))
            return cur.fetchone()
        r = first_page()
        assert r[0] == 'OK', r
        cursor = r[1]

        def next_page():
            cur.execute("EXECUTE sync_next(%s, 'reader', 100, %s)", (user, cursor))
            return cur.fetchone()

        def floor_page():
            cur.execute(FLOOR_SQL, (user, la + 100, 100))
            return cur.fetchone()
        for f in (first_page, next_page, floor_page):
            median_ms(f, 20)
        results[user] = (median_ms(first_page, 300), median_ms(next_page, 300), median_ms(floor_page, 300))
    s, l = results[SHORT], results[LONG]
    log('  log length          %10d   %10d' % (hw_short, hw_long))
    log('  first page (ms)     %10.3f   %10.3f   long/short = %.2f (goal <= 1.2)' % (s[0], l[0], l[0] / s[0]))
    log('  cursor page (ms)    %10.3f   %10.3f   long/short = %.2f (goal <= 1.2)' % (s[1], l[1], l[1] / s[1]))
    log('  floor page (ms)     %10.3f   %10.3f   long/short = %.2f' % (s[2], l[2], l[2] / s[2]))
    log('\nsync benchmark done in %.0fs' % (time.time() - t_start))


if __name__ == '__main__':
    sys.exit(main())
