"""Drill 3 (§19.4): pg_ctl -m immediate stop during a send storm, restart.
Every send that RETURNED is present exactly once; a retry with the same
client_msg_id returns the original (created = false); fanout catches up."""
import threading
from drill_lib import *

drill("immediate_stop_storm",
      "pg_ctl -m immediate stop while 4 clients send (workers running), then restart",
      "every send that returned is stored exactly once (sender, client_msg_id), and delivered after restart")
set_paused(False)
members = list(range(301, 311))
conv = q1("SELECT im.create_conversation('group', %s)", (members,))
returned = []
lock = threading.Lock()
stop = threading.Event()


def client(k):
    try:
        conn = connect()
        cur = conn.cursor()
        i = 0
        while not stop.is_set() and i < 5000:
            key = f"storm-{k}-{i}"
            cur.execute("SELECT message_id FROM im.send_message(%s, %s, %s, '{\"n\":1}')",
                        (members[k], conv, key))
            mid = cur.fetchone()[0]
            with lock:
                returned.append((members[k], key, mid))
            i += 1
    except psycopg2.Error:
        pass  # the server went away: whatever did not return is not promised


threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
for t in threads:
    t.start()
time.sleep(1.5)
pg_ctl("-m", "immediate", "stop")
stop.set()
for t in threads:
    t.join()
say(f"    {len(returned)} sends returned before the immediate stop")
pg_ctl("start")
check(wait_ready(), "server restarted (crash recovery)")
keys = [r[1] for r in returned]
rows = q("SELECT client_msg_id, count(*), min(message_id) FROM im.event "
         "WHERE client_msg_id = ANY(%s) GROUP BY client_msg_id", (keys,))
found = {r[0]: (r[1], r[2]) for r in rows}
lost = [k for k in keys if k not in found]
dup = [k for k, v in found.items() if v[0] != 1]
wrong = [r for r in returned if found.get(r[1], (0, r[2]))[1] != r[2]]
check(len(returned) > 0 and not lost, f"every returned send is stored ({len(lost)} lost)")
check(not dup and not wrong, "each exactly once, with the message_id it returned")
s, key, mid = returned[-1]
again = q("SELECT message_id, created FROM im.send_message(%s, %s, %s, '{\"n\":1}')", (s, conv, key))
check(again == [(mid, False)], "retrying the last returned send gives the original, created = false")
check(wait_drained(120), "fanout caught up after restart")
set_paused(True)
reconcile_zero()
finish("immediate_stop_storm")
