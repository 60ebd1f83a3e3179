#!/usr/bin/python3
"""Receipt overhead benchmark (not a test): what the receipts add to the
two paths that learn the facts, ACK (im.ack_sync) and read report
(im.report_read), measured in one run on one cluster and one library.

"before" is a database whose catalog is 1.10 (the library then queues
nothing: receipt.c's im_receipt_note returns at the catalog check), "after"
one at 1.11 (each call that moves queues one im.receipt_source row).  In
each: a direct conversation with IM_BENCH_MESSAGES messages to user 2's
active device, each ACK moving the device's ACK by one position; and one
direct conversation per read call, each with one message, each read report
reading its conversation to the end (as opening a conversation does: the
unread recount has nothing above the cursor).  A round is IM_BENCH_CALLS
calls, each its own transaction.  Rounds alternate
before/after, IM_BENCH_REPEAT times; the figure is the median calls/s per
side and the ratio of medians.  The fanout workers are paused: the producer
is not on these paths (it runs in the workers' batches).
"""

import os
import statistics
import sys
import time

import psycopg2

DSN = os.environ["IM_BENCH_DSN_BASE"]
MESSAGES = int(os.environ.get("IM_BENCH_MESSAGES", "5000"))
CALLS = int(os.environ.get("IM_BENCH_CALLS", "500"))
REPEAT = int(os.environ.get("IM_BENCH_REPEAT", "9"))


def connect(db):
    c = psycopg2.connect(DSN + " dbname=" + db)
    c.autocommit = True
    return c


def setup(db):
    c = connect(db)
    cur = c.cursor()
    cur.execute("SELECT im.create_conversation('direct', ARRAY[1, 2]::bigint[], 1)")
    conv = cur.fetchone()[0]
    cur.execute("SELECT im.register_device(2, 'd')")
    cur.execute("SELECT snapshot_token, manifest_digest FROM im.begin_snapshot(2, 'd')")
    tok, dig = cur.fetchone()
    cur.execute("SELECT status FROM im.ack_snapshot(2, 'd', %s, %s)", (tok, dig))
    cur.execute("BEGIN")
    cur.execute("SELECT count(*) FROM generate_series(1, %s) i, "
                "im.send_message(1, %s, 'b-' || i, '{\"text\": \"x\"}')", (MESSAGES, conv))
    cur.execute("COMMIT")
    cur.execute("BEGIN")
    cur.execute("CREATE TEMP TABLE rc AS SELECT i, im.create_conversation('direct', "
                "ARRAY[2, 100000 + i]::bigint[], 100000 + i) AS c "
                "FROM generate_series(1, %s) i", (CALLS * REPEAT,))
    cur.execute("SELECT count(*) FROM rc, im.send_message(100000 + rc.i, rc.c, 'r-' || rc.i, "
                "'{\"text\": \"x\"}')")
    cur.execute("COMMIT")
    cur.execute("SELECT array_agg(c ORDER BY i) FROM rc")
    reads = cur.fetchone()[0]
    cur.execute("SELECT im.run_fanout(1000000)")
    cur.execute("SELECT sync_generation, server_acked_sync_seq FROM im.device_session(2, 'd', 0)")
    gen, acked = cur.fetchone()
    cur.execute("SELECT batch_token, batch_high_watermark FROM im.sync_changes(2, 'd', %s, %s, 10)",
                (gen, acked))
    bt, hw = cur.fetchone()
    cur.execute("SELECT extversion FROM pg_extension WHERE extname = 'im_sync'")
    ver = cur.fetchone()[0]
    return {"conn": c, "cur": cur, "conv": conv, "bt": bt, "hw": hw, "ack": acked,
            "reads": reads, "read": 0, "ver": ver}


def ack_round(s):
    cur = s["cur"]
    t = time.perf_counter()
    for _ in range(CALLS):
        s["ack"] += 1
        if s["ack"] > s["hw"]:
            sys.exit("IM_BENCH_MESSAGES too small for the rounds")
        cur.execute("SELECT status FROM im.ack_sync(2, 'd', %s, %s)", (s["bt"], s["ack"]))
        if cur.fetchone()[0] != "OK":
            sys.exit("ack_sync did not answer OK")
    return CALLS / (time.perf_counter() - t)


def read_round(s):
    cur = s["cur"]
    t = time.perf_counter()
    for _ in range(CALLS):
        conv = s["reads"][s["read"]]
        s["read"] += 1
        cur.execute("SELECT read_msg_seq FROM im.report_read(2, %s, 99)", (conv,))
        if cur.fetchone()[0] != 2:
            sys.exit("report_read did not move the cursor")
    return CALLS / (time.perf_counter() - t)


def main():
    sides = {"before": setup("im_bench_before"), "after": setup("im_bench_after")}
    print("catalogs: before %s, after %s" % (sides["before"]["ver"], sides["after"]["ver"]))
    rates = {(k, op): [] for k in sides for op in ("ack", "read")}
    for _ in range(REPEAT):
        for op, fn in (("ack", ack_round), ("read", read_round)):
            for k in ("before", "after"):
                rates[(k, op)].append(fn(sides[k]))
    cur = sides["after"]["cur"]
    cur.execute("SELECT count(*) FROM im.receipt_source")
    queued = cur.fetchone()[0]
    for op in ("ack", "read"):
        b = statistics.median(rates[("before", op)])
        a = statistics.median(rates[("after", op)])
        print("%-4s calls/s  before %7.1f  after %7.1f  after/before %.3f  (rounds: before %s; after %s)"
              % (op, b, a, a / b,
                 ", ".join("%.0f" % x for x in rates[("before", op)]),
                 ", ".join("%.0f" % x for x in rates[("after", op)])))
    print("receipt_source rows queued by the after side: %d (one per call)" % queued)


if __name__ == "__main__":
    main()
