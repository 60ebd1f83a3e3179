#!/usr/bin/env python3
"""The first fanout worker runs maintenance on its own (contract §8).

Run by test/suites/45-maintenance.sh against database im_test (the workers'
database; they start paused).  With the workers unpaused,
im_sync.maintenance_interval = 1 s and inbox_retention = 0: 200 users (two
GC chunks of 100, exactly: the round must still end) get a message; the
worker collects every one of their logs down to the fence in committed
chunks (an idle device's ACK holds one user's fence), and the rest of
maintenance, which runs once a round ends, runs too (an expired READY
snapshot becomes ABANDONED).  Bounded polling, no timed assertion.  The test's
rows are removed at the end; settings are reset.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
from checklib import check, failures, wait_for, Session  # noqa: E402

BASE = 7_200_000
USERS = [BASE + i for i in range(1, 201)]
session = Session()
q, q1 = session.q, session.q1


def set_system(settings):
    for name, value in settings.items():
        if value is None:
            q(f"ALTER SYSTEM RESET {name}")
        else:
            q(f"ALTER SYSTEM SET {name} = %s", (value,))
    q("SELECT pg_catalog.pg_reload_conf()")


conv = q1("SELECT im.create_conversation('group', %s::bigint[], %s)", (USERS, USERS[0]))
q("SELECT * FROM im.register_device(%s, 'a')", (USERS[1],))
q("SELECT a.status FROM im.begin_snapshot(%s, 'a') b, "
  "LATERAL im.ack_snapshot(%s, 'a', b.snapshot_token, b.manifest_digest) a", (USERS[1], USERS[1]))
q("SELECT * FROM im.register_device(%s, 's')", (USERS[2],))
q("SELECT status FROM im.begin_snapshot(%s, 's')", (USERS[2],))
q("UPDATE im.snapshot SET expires_at = now() - interval '1 s' WHERE user_id = %s", (USERS[2],))
q("SELECT count(*) FROM im.send_message(%s, %s, 'wm-1', '{\"t\": 1}')", (USERS[0], conv))
try:
    set_system({"im_sync.fanout_paused": "off", "im_sync.maintenance_interval": "1s",
                "im_sync.inbox_retention": "0"})
    # the fence: the ACK of the ACTIVE device where there is one, else all
    collected = wait_for(lambda: q1(
        "SELECT count(*) FROM im.user_head h WHERE user_id = ANY(%s) AND high_watermark = 2 "
        "AND gc_floor = LEAST(2, COALESCE((SELECT min(d.acked_sync_seq) FROM im.device d "
        "    WHERE d.user_id = h.user_id AND d.state = 'ACTIVE'), 2))",
        (USERS,)) == len(USERS), 90)
    check(collected, "the worker collected all 200 logs (two chunks) down to the fence",
          str(q("SELECT gc_floor, count(*) FROM im.user_head WHERE user_id = ANY(%s) GROUP BY 1", (USERS,))))
    ack = q1("SELECT acked_sync_seq FROM im.device WHERE user_id = %s AND device_id = 'a'", (USERS[1],))
    check(q1("SELECT count(*) FROM im.inbox WHERE user_id = %s", (USERS[1],)) == 2 - ack,
          "the idle device's ACK held its user's fence")
    abandoned = wait_for(lambda: q1("SELECT state FROM im.snapshot WHERE user_id = %s", (USERS[2],)) == "ABANDONED", 30)
    check(abandoned, "the worker's maintenance abandoned an expired snapshot")
    check(q1("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'im_sync fanout worker'") >= 1,
          "the workers are still up")
finally:
    set_system({"im_sync.fanout_paused": None, "im_sync.maintenance_interval": None,
                "im_sync.inbox_retention": None})
    set_system({"im_sync.fanout_paused": "on"})
    args = {"c": [conv], "u": USERS}
    for sql in ("DELETE FROM im.snapshot WHERE user_id = ANY(%(u)s)",
                "DELETE FROM im.recovery_session WHERE user_id = ANY(%(u)s)",
                "DELETE FROM im.device WHERE user_id = ANY(%(u)s)",
                "DELETE FROM im.inbox WHERE user_id = ANY(%(u)s)",
                "DELETE FROM im.user_conversation WHERE conversation_id = ANY(%(c)s)",
                "DELETE FROM im.user_head WHERE user_id = ANY(%(u)s)",
                "DELETE FROM im.outbox WHERE conversation_id = ANY(%(c)s)",
                "DELETE FROM im.membership_period WHERE conversation_id = ANY(%(c)s)",
                "DELETE FROM im.event WHERE conversation_id = ANY(%(c)s)",
                "DELETE FROM im.conversation WHERE conversation_id = ANY(%(c)s)"):
        q(sql, args)
sys.exit(1 if failures else 0)
