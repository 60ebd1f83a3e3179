"""Drill 2 (§19.4): kill -9 of the fanout worker mid-batch, 20 times in a
row; every kill restarts all backends (expected).  Afterwards every message
is in every member's log exactly once, sync_seq gap-free (reconcile)."""
from drill_lib import *

ROUNDS = 20
drill("worker_kill_loop",
      f"kill -9 of an im_sync fanout worker while it processes a backlog, {ROUNDS} times in a row",
      "fanout is idempotent and atomic per transaction: no lost, duplicated or half-written delivery; heads = logs")
set_paused(True)
members = list(range(201, 241))
conv = q1("SELECT im.create_conversation('group', %s)", (members,))
conv2 = q1("SELECT im.create_conversation('group', %s)", (members[:10],))
conn = connect()
cur = conn.cursor()
sent = []
for i in range(300):
    c = conv if i % 3 else conv2
    cur.execute("SELECT message_id FROM im.send_message(%s, %s, %s, '{\"n\":1}')",
                (members[i % 10], c, f"wk-{i}"))
    sent.append(cur.fetchone()[0])
conn.close()
set_paused(False)
kills = 0
for r in range(ROUNDS):
    pids = []
    deadline = time.time() + 20
    while not pids and time.time() < deadline:
        try:
            pids = worker_pids()
        except psycopg2.Error:
            wait_ready()
        if not pids:
            time.sleep(0.05)
    if not pids:
        break
    # Requeue a slice so there is always a batch in flight to interrupt
    # (redelivery of done items must change nothing).
    try:
        q("UPDATE im.outbox SET state = 'pending', attempts = 0 WHERE source_event_id = ANY(%s)",
          (sent[r * 15:(r + 1) * 15],))
    except psycopg2.Error:
        wait_ready()
    time.sleep(0.02 * (r % 5))
    try:
        kill9_and_wait_restart(pids[0])
    except psycopg2.Error:
        wait_ready()
    kills += 1
check(kills == ROUNDS, f"killed a fanout worker {kills} times (server restarted each time)")
check(wait_drained(120), "workers drained the outbox after the last restart")
set_paused(True)
got = q1("SELECT count(*) FROM im.inbox WHERE source_event_id = ANY(%s)", (sent,))
want = sum(40 if i % 3 else 10 for i in range(300))
check(got == want, f"every message in every member's log exactly once ({got} = {want})")
reconcile_zero()
finish("worker_kill_loop")
