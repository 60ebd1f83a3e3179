#!/usr/bin/env python3
"""Checks the fanout background workers in a running, preloaded cluster.

Run by test/suites/40-worker.sh against database im_test (PGHOST/PGPORT/
PGUSER from the harness; workers start paused).  Each check prints one
"ok"/"FAIL" line; exit status 1 if any failed.  What it proves:
  - the configured number of workers run and idle while paused;
  - shared-memory counters survive rollback and are seen by every backend;
  - the send transaction never NOTIFYs (paused workers: no hint arrives);
  - a committing send wakes a worker through its latch (low latency);
  - unpaused workers drain the outbox into correct logs and unread counts;
  - hints follow contract §4 (user_id:hwm / c<conv>:<head>, <= 7000 bytes,
    several NOTIFYs for one big batch) and carry the committed watermarks;
  - a poison item becomes a dead letter after fanout_max_attempts while the
    workers stay up, the cluster does not restart, and others are delivered;
  - a batch that fails as a whole is logged and retried by the same worker;
  - a batch failing outside any one item is charged to its items, in a new
    transaction (dead letter after fanout_max_attempts, contract §4);
  - a worker killed with SIGTERM is restarted by the postmaster.
The test's rows are removed at the end; settings are reset.
"""
import os
import re
import select
import signal
import sys
import time

import psycopg2

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
from checklib import check, connect, failures, wait_for, Session  # noqa: E402

WORKER_TYPE = "im_sync fanout worker"
BASE = 4_000_000          # user ids of this test (nothing else uses them)
BIG = 1000                # members of the big group: hints over 7000 bytes
HINT_RE = re.compile(r"^(c?\d+:\d+)(,c?\d+:\d+)*$")

session = Session()
db, cur, q, q1, set_system = session.db, session.cur, session.q, session.q1, session.set_system


def workers():
    return sorted(r[0] for r in q("SELECT pid FROM pg_catalog.pg_stat_activity WHERE backend_type = %s", (WORKER_TYPE,)))


def drained(conv_ids):
    return q1("SELECT count(*) = 0 FROM im.outbox WHERE state = 'pending' AND conversation_id = ANY(%s)", (conv_ids,))


def drain_notifies(conn, seconds):
    out = []
    end = time.time() + seconds
    while True:
        left = end - time.time()
        if left <= 0:
            break
        if select.select([conn], [], [], left) != ([], [], []):
            conn.poll()
            while conn.notifies:
                out.append(conn.notifies.pop(0).payload)
    return out


conv_ids = []
try:
    n_workers = int(q1("SHOW im_sync.fanout_workers"))
    start_time = q1("SELECT pg_catalog.pg_postmaster_start_time()")
    pids = wait_for(lambda: len(workers()) == n_workers and workers(), 15)
    check(bool(pids) and len(pids) == n_workers, f"{n_workers} fanout workers are running", f"saw {workers()}")

    # --- shared-memory counters: survive the rollback of the failing call
    # and are seen by every backend (im_auth_failures_total, contract §8)
    metric = "SELECT value FROM im.metrics() WHERE name = 'im_auth_failures_total'"
    before = q1(metric)
    other_conn = connect()
    for _ in range(3):
        try:
            other_conn.cursor().execute("SELECT * FROM im.authenticate('not-a-token')")
        except psycopg2.Error:
            pass
    other_conn.close()
    after = q1(metric)
    check(before is not None and after == before + 3,
          "failed authentications are counted in shared memory across rollback and backends", f"{before} -> {after}")

    listener = connect()
    listener.cursor().execute("LISTEN im_sync_hint")

    # --- paused: nothing is fanned out and the send itself sends no NOTIFY
    members = list(range(BASE + 1, BASE + 4))
    small = q1("SELECT im.create_conversation('group', %s::bigint[], %s)", (members, members[0]))
    conv_ids.append(small)
    q("SELECT * FROM im.send_message(%s, %s, 'w-paused', '{\"text\": \"paused\"}')", (members[0], small))
    hints = drain_notifies(listener, 1.5)
    check(hints == [], "paused workers and the send transaction send no hint", f"got {hints}")
    check(q1("SELECT count(*) FROM im.outbox WHERE conversation_id = %s AND state = 'pending'", (small,)) == 2,
          "paused workers leave the outbox alone")

    # --- unpause: the backlog is drained
    set_system("im_sync.fanout_paused", "off")
    ok = wait_for(lambda: drained([small]), 30)
    check(ok, "unpaused workers drain the backlog")
    drain_notifies(listener, 0.2)

    # --- commit-time wake-up: latency well under the 1 s poll interval
    lat = []
    for i in range(20):
        t0 = time.time()
        q("SELECT * FROM im.send_message(%s, %s, %s, '{\"text\": \"wake\"}')", (members[1], small, f"w-wake-{i}"))
        wait_for(lambda: drained([small]), 10, step=0.005)
        lat.append(time.time() - t0)
    avg = sum(lat) / len(lat)
    check(avg < 0.3, "a committing send wakes a worker (mean send-to-fanout latency < 0.3 s; polling alone gives ~0.5 s)", f"mean {avg:.3f}s")
    drain_notifies(listener, 0.2)

    # --- big group: logs, unread, and hint chunking
    big = list(range(BASE + 100, BASE + 100 + BIG))
    bigc = q1("SELECT im.create_conversation('group', %s::bigint[], %s)", (big, big[0]))
    conv_ids.append(bigc)
    for i in range(5):
        q("SELECT * FROM im.send_message(%s, %s, %s, '{\"text\": \"big\"}')", (big[0], bigc, f"w-big-{i}"))
    ok = wait_for(lambda: drained([bigc]), 60)
    check(ok, f"workers drain a {BIG}-member group")
    hints = drain_notifies(listener, 1.0)
    rows = q("""SELECT count(*), count(DISTINCT i.user_id),
                       bool_and(h.high_watermark = (SELECT count(*) FROM im.inbox j WHERE j.user_id = i.user_id))
                  FROM im.inbox i JOIN im.user_head h USING (user_id) WHERE i.conversation_id = %s""", (bigc,))
    check(rows[0][0] == BIG * 6 and rows[0][1] == BIG and rows[0][2],
          "every member got create + 5 messages once, heads gap-free", f"{rows}")
    unread = q("SELECT unread_count, count(*) FROM im.user_conversation WHERE conversation_id = %s GROUP BY 1 ORDER BY 1", (bigc,))
    check(unread == [(0, 1), (5, BIG - 1)], "unread: 5 for receivers, 0 for the sender", f"{unread}")

    sizes = [len(h.encode()) for h in hints]
    check(len(hints) >= 2, "a batch whose hints exceed 7000 bytes sends several NOTIFYs", f"{len(hints)} notifies")
    check(all(s <= 7000 for s in sizes), "every hint payload is <= 7000 bytes", f"sizes {sizes}")
    check(all(HINT_RE.match(h) for h in hints), "hint payloads are comma-separated user_id:hwm / c<conv>:<head> pairs",
          f"{[h[:80] for h in hints if not HINT_RE.match(h)]}")
    hinted = {}
    for h in hints:
        for entry in h.split(","):
            k, v = entry.split(":")
            if not k.startswith("c"):
                hinted[int(k)] = max(hinted.get(int(k), 0), int(v))
    heads = dict(q("SELECT user_id, high_watermark FROM im.user_head WHERE user_id = ANY(%s)", (big,)))
    check(all(hinted.get(u) == heads[u] for u in big), "hints name every member with its committed high watermark",
          f"{sum(1 for u in big if hinted.get(u) != heads[u])} members differ")

    # --- poison item: dead letter, workers survive, others delivered
    q("CREATE TABLE public.im_worker_poison (client_msg_id text PRIMARY KEY)")
    q("INSERT INTO public.im_worker_poison VALUES ('w-poison')")
    q("""CREATE FUNCTION public.im_worker_poison_trg() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           IF EXISTS (SELECT 1 FROM im.event e JOIN public.im_worker_poison p USING (client_msg_id)
                       WHERE e.message_id = NEW.source_event_id) THEN
             RAISE EXCEPTION 'poison item for the worker test';
           END IF;
           RETURN NEW;
         END $$""")
    q("CREATE TRIGGER im_worker_poison BEFORE INSERT ON im.inbox FOR EACH ROW EXECUTE FUNCTION public.im_worker_poison_trg()")
    set_system("im_sync.fanout_max_attempts", "2")
    pids_before = workers()
    other = q1("SELECT im.create_conversation('group', %s::bigint[], %s)", ([BASE + 10, BASE + 11], BASE + 10))
    conv_ids.append(other)
    # sent with a trace id (contract §21): the workers' lines about the item carry it
    q("SELECT * FROM im.send_message(%s, %s, 'w-poison', '{\"text\": \"poison\"}', 'text', NULL, 'trace-w-poison_27')",
      (members[0], small))
    q("SELECT * FROM im.send_message(%s, %s, 'w-after-poison', '{\"text\": \"waits\"}')", (members[0], small))
    q("SELECT * FROM im.send_message(%s, %s, 'w-other', '{\"text\": \"other conversation\"}')", (BASE + 10, other))
    state = wait_for(lambda: q1("""SELECT o.state FROM im.outbox o JOIN im.event e ON e.message_id = o.source_event_id
                                    WHERE e.client_msg_id = 'w-poison' AND o.state = 'dead'"""), 90, step=0.5)
    check(state == "dead", "a poison item becomes a dead letter after fanout_max_attempts",
          f"{q('SELECT o.state, o.attempts, o.last_error FROM im.outbox o JOIN im.event e ON e.message_id = o.source_event_id WHERE e.client_msg_id = %s', ('w-poison',))}")
    ok = wait_for(lambda: drained([small, other]), 30)
    check(ok, "items after the dead letter and in other conversations are delivered")
    got = q1("""SELECT count(*) FROM im.inbox i JOIN im.event e ON e.message_id = i.source_event_id
                 WHERE e.client_msg_id IN ('w-after-poison', 'w-other')""")
    check(got == 3 + 2, "the later item reaches its 3 members and the other conversation's 2", f"{got}")
    check(q1("SELECT count(*) FROM im.inbox i JOIN im.event e ON e.message_id = i.source_event_id WHERE e.client_msg_id = 'w-poison'") == 0,
          "the dead letter wrote nothing")
    check(workers() == pids_before, "the workers survived the poison item (same pids)", f"{pids_before} -> {workers()}")
    check(q1("SELECT pg_catalog.pg_postmaster_start_time()") == start_time, "the cluster did not restart")
    log = os.path.join(os.environ.get("IM_TMP", "/nonexistent"), "server.log")
    if os.path.exists(log):
        item_id = q1("SELECT o.outbox_id FROM im.outbox o JOIN im.event e ON e.message_id = o.source_event_id "
                     "WHERE e.client_msg_id = 'w-poison'")
        lines = [l for l in open(log, errors="replace").read().splitlines()
                 if f"fanout of outbox item {item_id} " in l]
        traced = [l for l in lines if l.rstrip().endswith("stage=fanout trace_id=trace-w-poison_27")]
        check(len(lines) >= 2 and len(traced) == len(lines),
              "every worker line about the poison item ends with its stage and trace id",
              f"{len(traced)} of {len(lines)}: {lines[:2]}")
        check(any("now a dead letter" in l for l in traced), "the dead-letter line carries the trace id")
    q("DROP TRIGGER im_worker_poison ON im.inbox")
    q("DROP FUNCTION public.im_worker_poison_trg()")
    q("DROP TABLE public.im_worker_poison")
    set_system("im_sync.fanout_max_attempts", None)

    # --- a whole batch fails (the outbox update itself raises, outside the
    # per-item subtransactions): the worker logs it, stays up and retries
    q("""CREATE FUNCTION public.im_worker_batch_trg() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           IF EXISTS (SELECT 1 FROM im.event e WHERE e.message_id = NEW.source_event_id
                         AND e.client_msg_id = 'w-batch-poison') THEN
             RAISE EXCEPTION 'batch poison for the worker test';
           END IF;
           RETURN NEW;
         END $$""")
    q("CREATE TRIGGER im_worker_batch BEFORE UPDATE ON im.outbox FOR EACH ROW EXECUTE FUNCTION public.im_worker_batch_trg()")
    pids_before = workers()
    q("SELECT * FROM im.send_message(%s, %s, 'w-batch-poison', '{\"text\": \"batch\"}')", (members[0], small))
    log = os.path.join(os.environ.get("IM_TMP", "/nonexistent"), "server.log")
    if os.path.exists(log):
        seen = wait_for(lambda: open(log, errors="replace").read().count("batch poison for the worker test") >= 4, 40, step=0.5)
        check(seen, "a failing batch is logged and retried by the same worker")
    else:
        time.sleep(8)
    check(workers() == pids_before, "workers survive failing batches (same pids)", f"{pids_before} -> {workers()}")
    check(q1("SELECT pg_catalog.pg_postmaster_start_time()") == start_time, "failing batches do not restart the cluster")
    q("DROP TRIGGER im_worker_batch ON im.outbox")
    q("DROP FUNCTION public.im_worker_batch_trg()")
    check(wait_for(lambda: drained([small]), 30), "once the cause is gone the item is delivered")

    # --- a batch failing outside any one item with a non-transient error
    # (user B+21's head is missing and cannot be created while the batch
    # locks its heads) is charged, in a new transaction, to every item it
    # held (contract §4): a dead letter after fanout_max_attempts, not a
    # batch retried for ever at no cost; another conversation is delivered
    # meanwhile.  Before the fix the item stayed pending with 0 attempts.
    set_system("im_sync.fanout_max_attempts", "2")
    q("CREATE TABLE public.im_worker_head_fault (user_id bigint PRIMARY KEY)")
    q("""CREATE FUNCTION public.im_worker_head_fault_trg() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           IF EXISTS (SELECT 1 FROM public.im_worker_head_fault f WHERE f.user_id = NEW.user_id) THEN
             RAISE EXCEPTION 'head fault for the worker test';
           END IF;
           RETURN NEW;
         END $$""")
    q("CREATE TRIGGER im_worker_head_fault BEFORE INSERT ON im.user_head FOR EACH ROW "
      "EXECUTE FUNCTION public.im_worker_head_fault_trg()")
    # one transaction, so no worker sees the conversation before its head is gone
    q("BEGIN")
    broken = q1("SELECT im.create_conversation('group', %s::bigint[], %s)", ([BASE + 20, BASE + 21], BASE + 20))
    q("DELETE FROM im.user_head WHERE user_id = %s", (BASE + 21,))
    q("INSERT INTO public.im_worker_head_fault VALUES (%s)", (BASE + 21,))
    q("COMMIT")
    conv_ids.append(broken)
    q("SELECT * FROM im.send_message(%s, %s, 'w-beside-broken', '{\"text\": \"healthy\"}')", (BASE + 10, other))
    dead = wait_for(lambda: q1("SELECT state = 'dead' AND attempts = 2 FROM im.outbox WHERE conversation_id = %s",
                               (broken,)), 90, step=0.5)
    check(dead, "a batch failing outside any one item is charged to its items: a dead letter after fanout_max_attempts",
          f"{q('SELECT state, attempts, transient_failures, last_error FROM im.outbox WHERE conversation_id = %s', (broken,))}")
    check(wait_for(lambda: drained([other]), 30), "another conversation is delivered meanwhile")
    check(workers() == pids_before, "workers survive the failing batches (same pids)", f"{pids_before} -> {workers()}")
    q("DROP TRIGGER im_worker_head_fault ON im.user_head")
    q("DROP FUNCTION public.im_worker_head_fault_trg()")
    q("DROP TABLE public.im_worker_head_fault")
    set_system("im_sync.fanout_max_attempts", None)

    # --- SIGTERM: the postmaster restarts the worker, the others keep running
    before = workers()
    victim = before[0]
    os.kill(victim, signal.SIGTERM)
    after = wait_for(lambda: (lambda w: len(w) == n_workers and victim not in w and w)(workers()), 30, step=0.2)
    check(bool(after), "a worker killed with SIGTERM is restarted", f"{before} -> {workers()}")
    check(set(before[1:]) <= set(after or []), "the other workers were not restarted", f"{before} -> {after}")
    check(q1("SELECT pg_catalog.pg_postmaster_start_time()") == start_time, "SIGTERM of a worker does not restart the cluster")
    q("SELECT * FROM im.send_message(%s, %s, 'w-after-restart', '{\"text\": \"again\"}')", (members[2], small))
    check(wait_for(lambda: drained([small]), 30), "the restarted workers deliver new messages")
finally:
    try:
        set_system("im_sync.fanout_paused", None)
        set_system("im_sync.fanout_max_attempts", None)
        q("DROP TRIGGER IF EXISTS im_worker_poison ON im.inbox")
        q("DROP FUNCTION IF EXISTS public.im_worker_poison_trg()")
        q("DROP TABLE IF EXISTS public.im_worker_poison")
        q("DROP TRIGGER IF EXISTS im_worker_batch ON im.outbox")
        q("DROP FUNCTION IF EXISTS public.im_worker_batch_trg()")
        q("DROP TRIGGER IF EXISTS im_worker_head_fault ON im.user_head")
        q("DROP FUNCTION IF EXISTS public.im_worker_head_fault_trg()")
        q("DROP TABLE IF EXISTS public.im_worker_head_fault")
        # Remove this test's rows so later suites see a clean database.
        if conv_ids:
            time.sleep(1.5)   # let the workers see the reload and idle
            for sql in [
                "DELETE FROM im.fanout_quarantine WHERE outbox_id IN (SELECT outbox_id FROM im.outbox WHERE conversation_id = ANY(%(c)s))",
                "DELETE FROM im.inbox WHERE user_id >= %(lo)s AND user_id < %(hi)s",
                "DELETE FROM im.user_conversation WHERE conversation_id = ANY(%(c)s)",
                "DELETE FROM im.user_head WHERE user_id >= %(lo)s AND user_id < %(hi)s",
                "DELETE FROM im.outbox WHERE conversation_id = ANY(%(c)s)",
                "DELETE FROM im.private_event WHERE conversation_id = ANY(%(c)s)",
                "DELETE FROM im.membership_period WHERE conversation_id = ANY(%(c)s)",
                "DELETE FROM im.event WHERE conversation_id = ANY(%(c)s) AND target_message_id IS NOT NULL",
                "DELETE FROM im.event WHERE conversation_id = ANY(%(c)s)",
                "DELETE FROM im.conversation WHERE conversation_id = ANY(%(c)s)",
            ]:
                q(sql, {"c": conv_ids, "lo": BASE, "hi": BASE + 1_000_000})
    except Exception as e:  # cleanup problems are failures too
        check(False, "cleanup", str(e))

print(f"worker checks: {len(failures)} failed")
sys.exit(1 if failures else 0)
