#!/usr/bin/env python3
"""ack_window_check.py — the failover window of a user node's applied
records (extension/doc/sharding.md, "The failover window of an
applied record"), against a running sharded installation whose node FAILING has a
synchronous streaming standby (test/harness/shards.sh standby FAILING;
standby_check.sh sets it up after its first drill).

PostgreSQL 15's logical senders do not wait for the synchronous standby:
a transaction is decoded and sent once it is flushed on the primary, while
its commit still waits for the standby.  So an applied record written in
the transaction that applies a transfer can reach the transfer's source,
which deletes the transfer, before the standby has the apply; a failover
then loses it.  The drill opens that window on purpose:

  1. the standby stops receiving WAL (ALTER SYSTEM SET primary_conninfo =
     '' on it, reload: its WAL receiver exits; a paused replay would not
     do, the flush is what the commit waits for);
  2. sends in conversations on SOURCE (another node) with members on
     FAILING; SOURCE fans out and its transfers reach FAILING, whose
     fanout worker applies them and then waits in SyncRep at commit;
  3. SOURCE confirms (its slot on FAILING) everything FAILING flushed by
     then: whatever FAILING's last transactions published has reached it;
  4. check: SOURCE still holds every transfer of the window (nothing was
     acknowledged that the standby does not have);
  5. kill -9 of FAILING's primary, promote the standby, test/harness/shards.sh
     reattach FAILING, run_fanout: every send of the window is applied on
     every recipient's node (message_facts' in_sync_scope), none twice,
     the router's reconcile is empty.

Before the applied record waited for its apply to be on the standby,
check 4 and the checks of 5 failed (the window's transfers were deleted on
SOURCE and never reached the promoted node).

Usage: ack_window_check.py ROUTER_CONNINFO SHARDS_DIR FAILING
Figures are read through the router's API; the nodes are touched only to
stage the fault and to read the two positions the window is made of
(FAILING's WAL flush position, its slots' confirmed positions) and
SOURCE's transfer rows for check 4."""
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
from checklib import ShardsDir, check, connect, failures, kill9_postmaster, wait_for  # noqa: E402

import psycopg2  # noqa: E402

ROUTER, DIR, FAILING = sys.argv[1], sys.argv[2], sys.argv[3]
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SHARDS = os.path.join(ROOT, "test", "harness", "shards.sh")
PGBIN = subprocess.check_output(["pg_config", "--bindir"], text=True).strip()
AS_SERVER = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
WINDOW_SENDS = 24


def q(conn, sql, args=None):
    cur = conn.cursor()
    cur.execute(sql, args)
    return cur.fetchall() if cur.description else None


def q1(conn, sql, args=None):
    rows = q(conn, sql, args)
    return rows[0][0] if rows else None


shards = ShardsDir(DIR)
nodes = shards.conn
names = shards.names
primary_data = shards.data_dir(FAILING)
standby_data, standby_port = shards.standbys[FAILING]
SOURCE = next(n for n in names if n != FAILING)
R = connect(ROUTER)
S = connect(nodes[SOURCE])                  # single-host: SOURCE has no standby here
F = connect(nodes[FAILING])                 # multi-host: reaches the primary (read-write)
SB = connect(f"host=127.0.0.1 port={standby_port} dbname={nodes[FAILING].split('dbname=')[1].split()[0]}"
             " user=postgres")

bucket_node = dict(q(R, "SELECT bucket, node_name FROM im_router.bucket"))
on = {n: [u for u in range(5000, 5060) if bucket_node[u % 64] == n] for n in names}
members = sorted(on[SOURCE][:2] + on[FAILING][:4] + [u for n in names if n not in (SOURCE, FAILING)
                                                     for u in on[n][:1]])
convs = []
while len(convs) < 3:
    c = q1(R, "SELECT im.create_conversation('group', %s, %s)", (members, on[SOURCE][0]))
    if bucket_node[c % 64] == SOURCE:
        convs.append(c)
q1(R, "SELECT im.run_fanout()")
check(q(R, "SELECT * FROM im.reconcile()") == [], "reconcile is empty before the window")

# ---- 1. the standby stops receiving WAL
q(SB, "ALTER SYSTEM SET primary_conninfo = ''")
q(SB, "SELECT pg_catalog.pg_reload_conf()")
check(wait_for(lambda: q1(F, "SELECT count(*) FROM pg_catalog.pg_stat_replication"
                             " WHERE application_name = %s", (f"{FAILING}_standby",)) == 0, 30),
      f"{FAILING}'s standby stopped receiving WAL")
unacked_before = q1(S, "SELECT count(*) FROM im.transfer_out WHERE dest_node = %s", (FAILING,))

# ---- 2. sends on SOURCE whose transfers FAILING applies (its commit waits)
acked = []
for i in range(WINDOW_SENDS):
    g = convs[i % len(convs)]
    sender = on[SOURCE][i % 2]
    r = q(R, "SELECT * FROM im.send_message(%s, %s, %s, %s)", (sender, g, f"aw-{i}", '{"text": "window"}'))[0]
    acked.append((g, r[0], sender))
check(wait_for(lambda: q1(S, "SELECT count(*) FROM im.outbox WHERE state = 'pending'") == 0, 30),
      f"{SOURCE} fanned out the window's sends (transfers to {FAILING} written)")
check(wait_for(lambda: q1(F, "SELECT count(*) FROM pg_catalog.pg_stat_activity"
                             " WHERE query = 'im_sync fanout batch' AND wait_event = 'SyncRep'") > 0, 30),
      f"{FAILING}'s fanout worker applied transfers and waits for the standby at commit")

# ---- 3. SOURCE has confirmed everything FAILING flushed by now
flushed = q1(F, "SELECT pg_catalog.pg_current_wal_flush_lsn()")
slot = f"im_{FAILING}_to_{SOURCE}"
check(wait_for(lambda: q1(F, "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_catalog.pg_replication_slots"
                             " WHERE slot_name = %s", (flushed, slot)), 30),
      f"{SOURCE} confirmed what {FAILING} flushed while its standby lagged ({slot} at {flushed})")

# ---- 4. nothing of the window acknowledged
unacked = q1(S, "SELECT count(*) FROM im.transfer_out WHERE dest_node = %s", (FAILING,))
check(unacked >= unacked_before + WINDOW_SENDS,
      f"{SOURCE} still holds every transfer of the window (none acknowledged before {FAILING}'s standby has it)",
      f"{unacked} unacknowledged, {unacked_before} before, {WINDOW_SENDS} sends")


# ---- 5. kill -9, promote, reattach
F.close()
kill9_postmaster(primary_data)
subprocess.run(AS_SERVER + [f"{PGBIN}/pg_ctl", "-D", standby_data, "-w", "-t", "60", "promote"],
               check=True, stdout=subprocess.DEVNULL)
q(SB, "ALTER SYSTEM RESET primary_conninfo")
SB.close()
r = subprocess.run(["bash", SHARDS, "reattach", FAILING], env=dict(os.environ, IM_SHARDS_DIR=DIR),
                   capture_output=True, text=True)
check(r.returncode == 0, f"test/harness/shards.sh reattach {FAILING}", r.stderr[-800:])
q(R, "SET im_router.run_fanout_timeout = '60s'")
last_error = []


def drained():
    # the router session's first call to FAILING meets the connection to
    # the killed primary (08006) and reconnects: a retry, as any client
    try:
        q1(R, "SELECT im.run_fanout()")
        return True
    except psycopg2.Error as e:
        last_error[:] = [str(e)[:400]]
        return False


check(wait_for(drained, 90), "run_fanout drains every node after the reattach", f"{last_error}")

not_applied, doubled = [], []
for g, mid, sender in acked:
    for user, in_scope in q(R, "SELECT user_id, in_sync_scope FROM im.message_facts(%s, %s)", (sender, mid)):
        if not in_scope:
            not_applied.append((mid, user))
for g in convs:
    page = q(R, "SELECT messages FROM im.fetch_messages(%s, %s, 0, 500)", (members[-1], g))[0][0] or []
    ids = [m["message_id"] for m in page if m.get("kind", "message") == "message"]
    doubled += [m for m in set(ids) if ids.count(m) > 1]
check(not not_applied, f"every send of the window is applied on every recipient's node ({FAILING}'s included)",
      f"{len(not_applied)} missing, e.g. {not_applied[:6]}")
check(not doubled, "no message appears twice", f"{doubled[:10]}")
rec = wait_for(lambda: q(R, "SELECT * FROM im.reconcile()") == [], 60)
check(rec, "the router's reconcile is empty (cross-node check included)",
      f"{q(R, 'SELECT * FROM im.reconcile()')[:10]}")
print(f"ack_window_check: {len(acked)} sends in the window, {unacked - unacked_before} transfers held; "
      f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
