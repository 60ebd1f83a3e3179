"""Drill 1 (§19.4): kill -9 of the backend right after a send commits and
before fanout; the outbox item survives the crash and fanout delivers it."""
from drill_lib import *

drill("crash_after_send",
      "kill -9 of the sending backend right after im.send_message returned (fanout paused)",
      "a returned send survives the crash with its outbox item; fanout then delivers it to every member exactly once")
set_paused(True)
conv = q1("SELECT im.create_conversation('group', '{101,102,103}')")
conn = connect()
cur = conn.cursor()
cur.execute("SELECT message_id, msg_seq FROM im.send_message(101, %s, 'crash-1', '{\"t\":\"survive\"}')", (conv,))
mid, seq = cur.fetchone()
cur.execute("SELECT pg_catalog.pg_backend_pid()")
pid = cur.fetchone()[0]
restarted = kill9_and_wait_restart(pid)
say(f"    killed backend {pid} after send returned message {mid} (msg_seq {seq}); server restarts all backends")
check(restarted, "server restarted all backends and accepts connections again")
check(q1("SELECT count(*) FROM im.event WHERE message_id = %s", (mid,)) == 1, "the message is there once")
check(q1("SELECT state FROM im.outbox WHERE source_event_id = %s", (mid,)) == "pending",
      "its outbox item survived, still pending")
set_paused(False)
check(wait_drained(60), "workers (resumed) drained the outbox")
set_paused(True)
check(q1("SELECT count(*) FROM im.inbox WHERE source_event_id = %s", (mid,)) == 3,
      "all 3 members have the message in their log exactly once")
reconcile_zero()
finish("crash_after_send")
