#!/usr/bin/env python3
"""standby_check.py — a node fails over to its standby
(extension/doc/sharding.md), against a running sharded installation whose
node FAILING has a synchronous streaming standby and a multi-host conninfo
in the router's map (test/harness/shards.sh standby FAILING; standby_check.sh sets
it all up).

The drill: a send storm through the router over conversations on every
node and a gateway on the router; `kill -9` of FAILING's primary
postmaster; while it is down sends elsewhere go on and its own calls fail
with 08006; `pg_ctl promote` of the standby; the same router session and
the gateway reach the new primary with no reconfiguration (the map's
version is unchanged); the operator step `test/harness/shards.sh reattach FAILING`
(PostgreSQL 15 does not carry logical slots to a standby: the slots on
FAILING are gone and its subscriptions' origins may stand behind what the
old primary confirmed); then everything acknowledged is there exactly once,
applied on every recipient's node, and the router's reconcile is empty.

Usage: standby_check.py ROUTER_CONNINFO SHARDS_DIR FAILING
Every figure is read through the router's API (or the gateway's /metrics);
the nodes are touched only to stage the fault (kill -9, promote)."""
import os
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
from checklib import ShardsDir, check, connect, failures, free_port, kill9_postmaster, queries, wait_for  # noqa: E402

import psycopg2  # noqa: E402

ROUTER, DIR, FAILING = sys.argv[1], sys.argv[2], sys.argv[3]
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SHARDS = os.path.join(ROOT, "test", "harness", "shards.sh")
PGBIN = subprocess.check_output(["pg_config", "--bindir"], text=True).strip()
AS_SERVER = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

shards = ShardsDir(DIR)
names = shards.names
primary_data = shards.data_dir(FAILING)
standby_data = shards.standbys[FAILING][0]

R = connect(ROUTER)
q, q1 = queries(R)


bucket_node = dict(q("SELECT bucket, node_name FROM im_router.bucket"))
USERS = list(range(4000, 4030))   # 10 per node (buckets round robin)
MEMBERS = [sorted({USERS[(i * 3 + k * 4) % len(USERS)] for k in range(7)}) for i in range(9)]
groups = [q1("SELECT im.create_conversation('group', %s, %s)", (m, m[0])) for m in MEMBERS]
conv_members = dict(zip(groups, MEMBERS))
on_failing = [g for g in groups if bucket_node[g % 64] == FAILING]
elsewhere = [g for g in groups if bucket_node[g % 64] != FAILING]
check(on_failing and elsewhere, f"conversations on {FAILING} and elsewhere", f"{groups}")
check(any(bucket_node[u % 64] == FAILING for m in MEMBERS for u in m),
      f"members placed on {FAILING} (transfers to it)")
q1("SELECT im.run_fanout()")

# ---- a gateway on the router: one LISTEN connection per node
gw_port = free_port()
gw_log = open(os.path.join(DIR, "standby-gateway.log"), "w")
gw = subprocess.Popen([os.path.join(ROOT, "gateway", "im_gateway"), "--listen", f"127.0.0.1:{gw_port}",
                       "--pool", "2", "--db", ROUTER], stdout=gw_log, stderr=subprocess.STDOUT)


def gw_metric(name):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{gw_port}/metrics", timeout=2) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
    except OSError:
        return None
    return None


check(wait_for(lambda: gw_metric("im_gateway_listen_nodes_ready") == len(names), 30),
      "the gateway listens on every node", f"{gw_metric('im_gateway_listen_nodes_ready')}")

# ---- the storm: acknowledged sends are recorded with the time they returned
acked = []      # (conversation, message_id, msg_seq, sender, returned_at)
errors = []     # (conversation, sqlstate, at)
stop = threading.Event()
lock = threading.Lock()


def storm(tag):
    conn = connect(ROUTER)
    i = 0
    while not stop.is_set():
        g = groups[i % len(groups)]
        sender = conv_members[g][i % len(conv_members[g])]
        i += 1
        try:
            r = q("SELECT * FROM im.send_message(%s, %s, %s, %s)",
                  (sender, g, f"sb-{tag}-{i}", '{"text": "storm"}'), conn)[0]
            with lock:
                acked.append((g, r[0], r[1], sender, time.time()))
        except psycopg2.InterfaceError:
            conn = connect(ROUTER)
        except psycopg2.Error as e:
            with lock:
                errors.append((g, e.pgcode, time.time()))
            time.sleep(0.05)


threads = [threading.Thread(target=storm, args=(t,)) for t in range(2)]
for t in threads:
    t.start()
check(wait_for(lambda: len(acked) >= 40, 60), "the storm sends through the router", f"{len(acked)}")
version = q1("SELECT im_router.cluster_version()")


# ---- kill -9 of the failing node's primary postmaster (and, as a machine
# crash would, any child still alive after a grace period: only children of
# that very postmaster pid: checklib.kill9_postmaster)
killed_at = time.time()
kill9_postmaster(primary_data)


def outage_seen():
    with lock:
        failed_here = any(g in on_failing and s == "08006" and at > killed_at for g, s, at in errors)
        ok_elsewhere = sum(1 for g, _, _, _, at in acked if g in elsewhere and at > killed_at)
    return failed_here and ok_elsewhere >= 10


check(wait_for(outage_seen, 60),
      f"{FAILING} down: its conversations fail with 08006, sends elsewhere succeed",
      f"errors {sorted({(s, g in on_failing) for g, s, _ in errors})}")
other_errors = sorted({s for g, s, at in errors if g in elsewhere})
check(other_errors == [], "no send to a conversation elsewhere failed", f"{other_errors}")

# ---- promotion: the same router session reaches the new primary
subprocess.run(AS_SERVER + [f"{PGBIN}/pg_ctl", "-D", standby_data, "-w", "-t", "60", "promote"],
               check=True, stdout=subprocess.DEVNULL)
promoted_at = time.time()


def send_to_failing():
    try:
        return q("SELECT * FROM im.send_message(%s, %s, %s, %s)",
                 (conv_members[on_failing[0]][0], on_failing[0], f"sb-main-{time.time()}", '{"text": "after"}'))
    except psycopg2.Error:
        return None


check(wait_for(send_to_failing, 60), "after the promotion the router reaches the new primary (multi-host conninfo)")
check(q1("SELECT im_router.cluster_version()") == version, "… with no reconfiguration (the map's version is the same)")
check(wait_for(lambda: sum(1 for g, _, _, _, at in acked if g in on_failing and at > promoted_at) >= 10, 60),
      "the storm's sends to the promoted node succeed again")
check(wait_for(lambda: gw_metric("im_gateway_listen_nodes_ready") == len(names), 60),
      "the gateway's LISTEN connection reaches the new primary", f"{gw_metric('im_gateway_listen_nodes_ready')}")
stop.set()
for t in threads:
    t.join(60)

# ---- the operator step: slots on the failed node are gone (PostgreSQL 15)
# (IM_STANDBY_NO_REATTACH=1 leaves it out, to see what it repairs: the
# checks below then fail)
env = dict(os.environ, IM_SHARDS_DIR=DIR)
if not os.environ.get("IM_STANDBY_NO_REATTACH"):
    r = subprocess.run(["bash", SHARDS, "reattach", FAILING], env=env, capture_output=True, text=True)
    check(r.returncode == 0, f"test/harness/shards.sh reattach {FAILING}", r.stderr[-800:])
q("SET im_router.run_fanout_timeout = %s", (os.environ.get("IM_STANDBY_FANOUT_TIMEOUT", "120s"),))
try:
    q1("SELECT im.run_fanout()")
    check(True, "run_fanout drains every node after the reattach")
except psycopg2.Error as e:
    check(False, "run_fanout drains every node after the reattach", str(e)[:400])

# ---- the promoted node's transfer ids carry its new WAL timeline (bits 40
# and up, transfer_out.c), so none can equal an id the old primary sent
# that a destination recorded before the failover: the other nodes have
# transfers from FAILING on two timelines, the later above every earlier one
prefixes = set()
for name, conninfo in q("SELECT node_name, conninfo FROM im.shard_nodes()"):
    if name == FAILING:
        continue
    c = psycopg2.connect(conninfo)
    try:
        prefixes |= {r[0] for r in q("SELECT DISTINCT transfer_id >> 40 FROM im.transfer_in WHERE source_node = %s",
                                     (FAILING,), conn=c)}
    finally:
        c.close()
check(len(prefixes) >= 2 and min(prefixes) >= 1,
      f"transfers from {FAILING} carry its timelines before and after the promotion", f"{sorted(prefixes)}")

# ---- nothing acknowledged lost, nothing applied twice
acked_by_conv = {}
for g, mid, seq, sender, _ in acked:
    acked_by_conv.setdefault(g, []).append((mid, seq, sender))
lost, doubled, gaps = [], [], []
for g, sent in acked_by_conv.items():
    reader = conv_members[g][-1]
    got, after = [], 0
    while True:
        page = q("SELECT messages, next_after_seq, has_more FROM im.fetch_messages(%s, %s, %s, 500)",
                 (reader, g, after))[0]
        got += [(m["message_id"], m["msg_seq"]) for m in (page[0] or []) if m.get("kind", "message") == "message"]
        after = page[1]
        if not page[2]:
            break
    ids = [m for m, _ in got]
    lost += [mid for mid, _, _ in sent if mid not in ids]
    doubled += [mid for mid in set(ids) if ids.count(mid) > 1]
check(not lost, "every acknowledged send is in its conversation", f"{lost[:10]}")
check(not doubled, "no message appears twice", f"{doubled[:10]}")
not_applied = []
for g, mid, seq, sender, _ in acked:
    for row in q("SELECT user_id, in_sync_scope FROM im.message_facts(%s, %s)", (sender, mid)):
        if not row[1]:
            not_applied.append((mid, row[0]))
check(not not_applied, "every acknowledged send is applied on every recipient's node", f"{not_applied[:10]}")
rec = wait_for(lambda: q("SELECT * FROM im.reconcile()") == [], 60)
check(rec, "the router's reconcile is empty (cross-node check included)", f"{q('SELECT * FROM im.reconcile()')[:10]}")
print(f"standby_check: {len(acked)} sends acknowledged ({sum(1 for a in acked if a[0] in on_failing)} on {FAILING}), "
      f"{len(errors)} refused during the outage")

gw.terminate()
try:
    gw.wait(10)
except subprocess.TimeoutExpired:
    gw.kill()
gw_log.close()
print(f"standby_check: {len(failures)} failure(s)")
sys.exit(1 if failures else 0)
