#!/usr/bin/python3
"""Sync benchmark (not a test): prints figures and ratios in one run.

1. Catch-up throughput: one device reads 20,000 events of its user's log
   through im.sync_changes (first call + cursor pages) at page sizes 100 and
   1,000, against a floor: the bare keyset range SELECT over im.inbox joined
   to im.event, same order, each page returned as one JSON array shaped like
   the events (contract §11 + sync_seq).  Both sides fetch the page as text
   over the same connection, so client parsing is out of both figures.
2. ACK throughput: ack_sync calls per second, each its own transaction,
   each advancing the device's cursor by one.
3. Long log: the cost of one page (page size 100) for a user whose log is
   10x longer, at the same distance from the head, as a ratio to the
   shorter log's (goal <= 1.2x).  Both the batch-starting call and a
   cursor page are timed; medians of many calls.

The long user's log is built through the API like the short one
(send_message + run_fanout), unless IM_BENCH_LONG is lowered.
"""

import os
import statistics
import sys
import time

import psycopg2
import psycopg2.extras

N = int(os.environ.get('IM_BENCH_EVENTS', '20000'))
LONG_FACTOR = int(os.environ.get('IM_BENCH_LONG_FACTOR', '10'))
REPEAT = int(os.environ.get('IM_BENCH_REPEAT', '3'))

dsn = os.environ['IM_BENCH_DSN']
db = psycopg2.connect(dsn)
db.autocommit = True
cur = db.cursor()


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


def fill(user, n, tag):
    """n messages from PEER to `user` in their direct conversation, fanned out."""
    c = q("SELECT im.direct_conversation(%s, %s)", (user, PEER))[0][0]
    t0 = time.time()
    step = 5000
    for lo in range(0, n, step):
        q("SELECT count(*) FROM generate_series(%s, %s) g, "
          "LATERAL im.send_message(%s, %s, %s || g, jsonb_build_object('text', 'bench message ' || g, 'n', g)) s",
          (lo + 1, min(n, lo + step), PEER, c, tag))
    t1 = time.time()
    while q("SELECT im.run_fanout(10000)")[0][0] > 0:
        pass
    t2 = time.time()
    hw = q("SELECT high_watermark FROM im.user_head WHERE user_id = %s", (user,))[0][0]
    log('  setup: %d sends in %.1fs (%.0f/s), fanout in %.1fs (%.0f items/s); user %d log high watermark %d'
        % (n, t1 - t0, n / (t1 - t0), t2 - t1, n / (t2 - t1), user, hw))
    return hw


def catch_up(user, dev, gen, la, limit):
    """Read the whole batch (la, hw] via sync_changes; returns events read."""
    cur.execute("SELECT status, next_cursor, has_more, jsonb_array_length(events), events::text "
                "FROM im.sync_changes(%s, %s, %s, %s, %s)", (user, dev, gen, la, limit))
    st, nxt, more, n, _ = cur.fetchone()
    assert st == 'OK', st
    total = n
    while more:
        cur.execute("SELECT next_cursor, has_more, jsonb_array_length(events), events::text "
                    "FROM im.sync_changes(%s, %s, NULL, NULL, %s, %s)", (user, dev, limit, nxt))
        nxt, more, n, _ = cur.fetchone()
        total += n
    return total


FLOOR_SQL = """
SELECT max(sync_seq), count(*), jsonb_agg(ev ORDER BY sync_seq)::text FROM (
  SELECT i.sync_seq,
         jsonb_build_object('kind', e.kind, 'conversation_id', e.conversation_id, 'msg_seq', e.msg_seq,
                            'message_id', e.message_id, 'sender_id', e.sender_id,
                            'content_type', e.content_type, 'body', e.body,
                            'target_message_id', e.target_message_id, 'recalled', e.recalled,
                            'created_at', e.created_at, 'sync_seq', i.sync_seq) AS ev
  FROM im.inbox i JOIN im.event e ON e.message_id = i.source_event_id
  WHERE i.user_id = %s AND i.sync_seq > %s AND i.sync_seq <= %s
  ORDER BY i.sync_seq LIMIT %s) page"""


def floor(user, la, hw, limit):
    total, pos = 0, la
    while pos < hw:
        cur.execute(FLOOR_SQL, (user, pos, hw, limit))
        last, n, _ = cur.fetchone()
        if not n:
            break
        total += n
        pos = last
    return total


def best_rate(fn, n_expected):
    best = None
    for _ in range(REPEAT):
        t0 = time.perf_counter()
        n = fn()
        dt = time.perf_counter() - t0
        assert n == n_expected, (n, n_expected)
        best = dt if best is None or dt < best else best
    return n_expected / best


def median_ms(fn, reps):
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1000


def main():
    t_start = time.time()
    log('sync benchmark: %d events, page sizes 100 and 1000, long log %dx, best of %d' % (N, LONG_FACTOR, REPEAT))
    log('  server: %s; fsync=%s, synchronous_commit=%s' % (
        q("SHOW server_version")[0][0], q("SHOW fsync")[0][0], q("SHOW synchronous_commit")[0][0]))
    g_short = make_device(SHORT, 'reader')
    g_ack = make_device(SHORT, 'acker')
    g_long = make_device(LONG, 'reader')
    hw_short = fill(SHORT, N, 'short-')

    log('\n1. catch-up throughput (%d events, one batch, cursor pages)' % hw_short)
    catch_up(SHORT, 'reader', g_short, 0, 1000)     # warm caches
    for limit in (100, 1000):
        sync_rate = best_rate(lambda: catch_up(SHORT, 'reader', g_short, 0, limit), hw_short)
        floor_rate = best_rate(lambda: floor(SHORT, 0, hw_short, limit), hw_short)
        log('  page %5d: sync_changes %8.0f events/s   floor (range SELECT as JSON) %8.0f events/s   '
            'sync/floor = %.2f' % (limit, sync_rate, floor_rate, sync_rate / floor_rate))

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
            cur.execute("SELECT status, next_cursor, events::text FROM im.sync_changes(%s, 'reader', %s, %s, 100)",
                        (user, gen, la))
            return cur.fetchone()
        r = first_page()
        assert r[0] == 'OK', r
        cursor = r[1]

        def next_page():
            cur.execute("SELECT status, events::text FROM im.sync_changes(%s, 'reader', NULL, NULL, 100, %s)",
                        (user, cursor))
            return cur.fetchone()

        def floor_page():
            cur.execute(FLOOR_SQL, (user, la + 100, hw, 100))
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
