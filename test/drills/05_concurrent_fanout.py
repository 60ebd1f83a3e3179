"""Drill 5 (§19.4): several fanout workers writing to the same users at
once: both background workers plus 3 sessions calling im.run_fanout on a
backlog of 4 conversations that share their members."""
import threading
from drill_lib import *

drill("concurrent_fanout",
      "2 background workers + 3 concurrent im.run_fanout callers on one backlog whose conversations share users",
      "sync_seq unique and gap-free per user, head = log, events of one conversation in msg_seq order per user")
set_paused(True)
users = list(range(601, 621))
convs = [q1("SELECT im.create_conversation('group', %s)", (users,)) for _ in range(4)]
conn = connect()
cur = conn.cursor()
for i in range(200):
    cur.execute("SELECT im.send_message(%s, %s, %s, '{\"n\":1}')", (users[i % 20], convs[i % 4], f"cf-{i}"))
conn.close()
set_paused(False)
errors = []


def runner():
    try:
        c = connect()
        for _ in range(200):
            cur = c.cursor()
            cur.execute("SELECT im.run_fanout(7)")
            if cur.fetchone()[0] == 0 and pending() == 0:
                break
        c.close()
    except psycopg2.Error as e:
        errors.append(str(e).splitlines()[0])


ts = [threading.Thread(target=runner) for _ in range(3)]
for t in ts:
    t.start()
for t in ts:
    t.join()
check(not errors, f"no errors or deadlocks in concurrent fanout ({errors[:2]})")
check(wait_drained(60), "backlog drained")
set_paused(True)
bad_order = q1("""SELECT count(*) FROM (
  SELECT msg_seq < lag(msg_seq) OVER (PARTITION BY user_id, conversation_id ORDER BY sync_seq) AS bad
  FROM im.inbox WHERE conversation_id = ANY(%s)) x WHERE bad""", (convs,))
check(bad_order == 0, "per user, each conversation's events have increasing sync_seq in msg_seq order")
check(q1("SELECT count(*) FROM im.inbox WHERE conversation_id = ANY(%s)", (convs,)) == 20 * (200 + 4),
      "every position reached every member once")
reconcile_zero()
finish("concurrent_fanout")
