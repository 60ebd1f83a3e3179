#!/usr/bin/env python3
"""shards_bench.py — three nodes vs one, run by test/bench/shards.sh.

One installation (`test/harness/shards.sh up N`, production durability) is measured
through its router:
  1. sends/s: CLIENTS threads calling im.send_message through the router for
     SECONDS, group conversations of MEMBERS members spread over the nodes,
     the workers running (sustained send + fanout);
  2. fanout events/s: the workers paused on every node, BATCH sends, then the
     workers resumed; time until every node's im.shard_pending() is 0
     (fanout, transfer, apply, acknowledgement); delivered events = sends x
     members; WAL bytes of all nodes and bytes decoded for the transfer slots
     (pg_stat_replication_slots.total_bytes) per delivered event;
  3. cross-node delivery lag at a fixed moderate rate: RATE sends/s in direct
     conversations whose recipient lives on another node than the
     conversation (on one node: the same pairs, all local), from the send's
     return to the recipient's hint (LISTEN im_sync_hint on the recipient's
     node); p50 / p99.
Prints one RESULT line per figure; shards.sh prints the ratios.  A bench,
not a test: it reads node tables and settings directly.
"""
import json
import os
import random
import select
import statistics
import sys
import threading
import time

import psycopg2
import psycopg2.extensions

SHARDS_DIR = sys.argv[1]
LABEL = sys.argv[2]
CLIENTS = int(os.environ.get("IM_CLIENTS", "4"))
SECONDS = float(os.environ.get("IM_SECONDS", "10"))
MEMBERS = int(os.environ.get("IM_MEMBERS", "6"))
GROUPS = int(os.environ.get("IM_GROUPS", "60"))
BATCH = int(os.environ.get("IM_BATCH", "600"))
RATE = float(os.environ.get("IM_RATE", "40"))
LAG_SECONDS = float(os.environ.get("IM_LAG_SECONDS", "10"))
DEADLINE = 300


def die(msg):
    print("shards_bench: " + msg, file=sys.stderr)
    sys.exit(1)


def connect(conninfo):
    c = psycopg2.connect(conninfo)
    c.autocommit = True
    return c


def q(conn, sql, args=None):
    with conn.cursor() as cur:
        cur.execute(sql, args)
        return cur.fetchall() if cur.description else None


nodes = {}
with open(os.path.join(SHARDS_DIR, "nodes")) as f:
    for line in f:
        name, conninfo = line.rstrip("\n").split(" ", 1)
        nodes[name] = conninfo
with open(os.path.join(SHARDS_DIR, "router")) as f:
    ROUTER = f.read().strip()
N = len(nodes)
names = sorted(nodes)


def node_of_bucket(b):
    return "node%d" % (b % N + 1)


def node_of_id(i):
    return node_of_bucket(i % 64)


node_conns = {n: connect(c) for n, c in nodes.items()}
router = connect(ROUTER)
durability = q(router, "SELECT current_setting('fsync'), current_setting('synchronous_commit'), "
                       "current_setting('full_page_writes')")
node_dur = {n: q(c, "SELECT current_setting('fsync') || '/' || current_setting('synchronous_commit') "
                    "|| '/' || current_setting('full_page_writes')")[0][0]
            for n, c in node_conns.items()}
print("RESULT %s durability nodes (fsync/synchronous_commit/full_page_writes): %s"
      % (LABEL, " ".join("%s=%s" % kv for kv in sorted(node_dur.items()))))


def pending_total():
    total = 0
    for c in node_conns.values():
        r = q(c, "SELECT outbox_pending + transfers_unacked + inbound_unapplied FROM im.shard_pending()")
        total += r[0][0]
    return total


def drain():
    t0 = time.time()
    while True:
        q(router, "SELECT im.run_fanout()")
        if pending_total() == 0:
            return
        if time.time() - t0 > DEADLINE:
            die("%s: not drained after %d s" % (LABEL, DEADLINE))
        time.sleep(0.05)


def set_paused(on, wait=True):
    for c in node_conns.values():
        q(c, "ALTER SYSTEM SET im_sync.fanout_paused = %s" % ("on" if on else "off"))
        q(c, "SELECT pg_reload_conf()")
    if wait:
        time.sleep(1.5)     # the workers read it at their next reload check


# --- the groups: members with consecutive ids, so they spread over the nodes
base = 100000
groups = []
for g in range(GROUPS):
    members = [base + g * MEMBERS + k for k in range(MEMBERS)]
    cid = q(router, "SELECT im.create_conversation('group', %s::bigint[], %s)", (members, members[0]))[0][0]
    groups.append((cid, members))
drain()
cross = sum(1 for cid, ms in groups for u in ms if node_of_id(u) != node_of_id(cid))
print("RESULT %s layout nodes=%d groups=%d members=%d recipients_on_other_nodes=%.0f%%"
      % (LABEL, N, GROUPS, MEMBERS, 100.0 * cross / (GROUPS * MEMBERS)))


# --- 1. sends/s, workers running
def sender(idx, stop_at, out):
    c = connect(ROUTER)
    n = 0
    rnd = random.Random(idx)
    while time.time() < stop_at:
        cid, ms = groups[rnd.randrange(len(groups))]
        q(c, "SELECT msg_seq FROM im.send_message(%s, %s, %s, %s::jsonb)",
          (ms[0], cid, "b-%d-%d-%d" % (idx, n, rnd.randrange(1 << 30)), json.dumps({"text": "x"})))
        n += 1
    out[idx] = n
    c.close()


out = {}
stop_at = time.time() + SECONDS
threads = [threading.Thread(target=sender, args=(i, stop_at, out)) for i in range(CLIENTS)]
for t in threads:
    t.start()
for t in threads:
    t.join()
sends = sum(out.values())
print("RESULT %s sends_per_s=%.1f clients=%d seconds=%.0f (workers running)" % (LABEL, sends / SECONDS, CLIENTS, SECONDS))
drain()


# --- 2. fanout events/s, WAL and transfer bytes per delivered event
def wal_lsn_sum():
    return sum(q(c, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")[0][0] for c in node_conns.values())


def slot_bytes():
    return sum(q(c, "SELECT COALESCE(sum(total_bytes), 0) FROM pg_stat_replication_slots")[0][0]
               for c in node_conns.values())


set_paused(True)
rnd = random.Random(7)
for i in range(BATCH):
    cid, ms = groups[i % len(groups)]
    q(router, "SELECT msg_seq FROM im.send_message(%s, %s, %s, %s::jsonb)",
      (ms[i % MEMBERS], cid, "f-%d-%d" % (i, rnd.randrange(1 << 30)), json.dumps({"text": "fanout"})))
held = pending_total()
if held < BATCH:
    die("%s: the paused workers fanned out (%d of %d items held)" % (LABEL, held, BATCH))
wal0, slot0 = wal_lsn_sum(), slot_bytes()
t0 = time.time()
set_paused(False, wait=False)
while pending_total() > 0:
    if time.time() - t0 > DEADLINE:
        die("%s: fanout not drained after %d s" % (LABEL, DEADLINE))
    time.sleep(0.02)
elapsed = max(time.time() - t0, 0.001)
events = BATCH * MEMBERS
wal = float(wal_lsn_sum() - wal0)
time.sleep(1.0)     # slot statistics are reported by the walsenders with a delay
slot = float(slot_bytes() - slot0)
print("RESULT %s fanout_events_per_s=%.0f events=%d drain_s=%.2f wal_bytes_per_event=%.0f "
      "transfer_bytes_per_event=%.0f" % (LABEL, events / elapsed, events, elapsed, wal / events, slot / events))

# --- 3. delivery lag at a fixed rate
pairs = []
u = 500000
while len(pairs) < 10 and u < 600000:
    a, b = u, u + 1
    u += 2
    cid = q(router, "SELECT im.direct_conversation(%s, %s)", (a, b))[0][0]
    if N == 1 or (node_of_id(cid) != node_of_id(b)):
        pairs.append((a, b, cid))
if len(pairs) < 10:
    die("not enough cross-node pairs")
drain()
listeners = {}
for n, c in nodes.items():
    lc = connect(c)
    q(lc, "LISTEN im_sync_hint")
    listeners[n] = lc
wanted = {}     # user -> high watermark it must reach
lags = []
interval = 1.0 / RATE
next_at = time.time()
end = time.time() + LAG_SECONDS
i = 0
waiting = {}    # recipient -> send return time
while time.time() < end or waiting:
    now = time.time()
    if now >= next_at and time.time() < end:
        a, b, cid = pairs[i % len(pairs)]
        if b not in waiting:
            q(router, "SELECT msg_seq FROM im.send_message(%s, %s, %s, %s::jsonb)",
              (a, cid, "l-%d-%d" % (i, random.randrange(1 << 30)), json.dumps({"text": "lag"})))
            waiting[b] = time.time()
        i += 1
        next_at += interval
    if time.time() > end + 30:
        die("%s: %d hints never arrived" % (LABEL, len(waiting)))
    ready, _, _ = select.select(list(listeners.values()), [], [], max(0.0, min(0.005, next_at - time.time())))
    for lc in ready:
        lc.poll()
        while lc.notifies:
            note = lc.notifies.pop(0)
            t = time.time()
            for entry in note.payload.split(","):
                user = int(entry.split(":")[0])
                if user in waiting:
                    lags.append(t - waiting.pop(user))
lags.sort()
p50 = lags[len(lags) // 2] * 1000
p99 = lags[min(len(lags) - 1, int(len(lags) * 0.99))] * 1000
print("RESULT %s lag_ms_p50=%.1f lag_ms_p99=%.1f sends=%d rate=%.0f/s (send return -> recipient's hint)"
      % (LABEL, p50, p99, len(lags), RATE))
