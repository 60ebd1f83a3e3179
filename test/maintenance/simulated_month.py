#!/usr/bin/env python3
"""A simulated month of traffic with only maintenance running.

Run by test/suites/45-maintenance.sh in a fresh database (argument 1).
Every window is shrunk so that one simulated day is one second of wall
clock (inbox_retention 7 s = 7 days, device_inactive_after 10 s, token_ttl,
recovery_ttl 1 s, snapshot_ttl 2 s, audit_retention 10 s, token_key_max_age
5 s).  Each day: messages in a few groups, read reports, fanout, devices that
sync and ACK, devices that fall silent and come back (RESET_REQUIRED and a
snapshot), snapshots begun and never installed, recovery sessions completed
or abandoned, device tokens issued and used, a device revoked and registered
again.  Maintenance is im.gc_inbox(8) twice a day (bounded chunks).

At the end, in one transaction (one now()): a last im.gc_inbox() and then
im.reconcile() must return no rows, and no table holds a row older than its
retention plus margin (plus 2 s of slack for the day's traffic).  The keys
with a secret stay few.

With --no-maintenance (the control, 12 days) the same traffic runs without
maintenance; the script then requires reconcile to report stuck snapshots
and sessions and the tables to hold rows past every retention, which shows
the scenario really produces what maintenance has to clean.
Prints one "ok"/"FAIL" line per check; exit status 1 if any failed.
"""
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
from checklib import check, failures, Session  # noqa: E402

DAY = 1.0                     # seconds of wall clock per simulated day
SLACK = "2 s"                 # rows of the current day may still be young
SETTINGS = {
    "im_sync.inbox_retention": "7s",
    "im_sync.device_inactive_after": "10s",
    "im_sync.token_ttl": "1s",
    "im_sync.recovery_ttl": "1s",
    "im_sync.snapshot_ttl": "2s",
    "im_sync.audit_retention": "10s",
    "im_sync.token_key_max_age": "5s",
}
BASE = 7_100_000
USERS = [BASE + i for i in range(1, 21)]

dbname = sys.argv[1]
maintenance = "--no-maintenance" not in sys.argv
days = 30 if maintenance else 12
rng = random.Random(8)
session = Session(dbname, options=" ".join(f"-c {k}={v}" for k, v in SETTINGS.items()))
cur, q, row = session.cur, session.q, session.row


class Device:
    def __init__(self, user, name):
        self.user, self.name = user, name
        self.gen, self.applied = row("SELECT * FROM im.register_device(%s, %s)", (user, name))[0], 0

    def activate(self):
        r = row("SELECT snapshot_token, base_sync_seq, sync_generation, manifest_digest, status "
               "FROM im.begin_snapshot(%s, %s)", (self.user, self.name))
        if r[4] != "READY":
            return
        st = row("SELECT status FROM im.ack_snapshot(%s, %s, %s, %s)", (self.user, self.name, r[0], r[3]))[0]
        if st == "OK":
            self.gen, self.applied = r[2], r[1]

    def sync(self, la=None, complete=True):
        """One batch from la (default: what it applied); ACK it if complete."""
        la = self.applied if la is None else la
        r = row("SELECT status, sync_generation, batch_token, batch_high_watermark, next_cursor, has_more "
               "FROM im.sync_changes(%s, %s, %s, %s, 50)", (self.user, self.name, self.gen, la))
        status, gen, token, wm, cursor, more = r
        if status == "RESET_REQUIRED":
            self.activate()
            return
        if status not in ("OK", "RECOVERY"):
            return
        self.gen = gen
        while more:
            cursor, more = row("SELECT next_cursor, has_more FROM im.sync_changes(%s, %s, NULL, NULL, 50, %s)",
                              (self.user, self.name, cursor))
        if complete:
            st = row("SELECT status FROM im.ack_sync(%s, %s, %s, %s)", (self.user, self.name, token, wm))[0]
            if st == "OK":
                self.applied = wm
        else:
            self.applied = la


# the world: four groups of six, phones for everyone, some tablets
convs = []
for g in range(4):
    members = USERS[g * 5:g * 5 + 6] if g < 3 else USERS[15:] + USERS[:1]
    convs.append((row("SELECT im.create_conversation('group', %s::bigint[], %s)", (members, members[0]))[0], members))
q("SELECT im.run_fanout()")
phones = {u: Device(u, "phone") for u in USERS}
tablets = {u: Device(u, "tablet") for u in USERS[:6]}
for d in list(phones.values()) + list(tablets.values()):
    d.activate()

msg = 0
start = time.time()
for day in range(days):
    day_start = time.time()
    for _ in range(12):
        conv, members = rng.choice(convs)
        msg += 1
        q("SELECT count(*) FROM im.send_message(%s, %s, %s, %s)",
          (rng.choice(members), conv, f"m{msg}", '{"t": "x"}'))
    for _ in range(3):
        conv, members = rng.choice(convs)
        u = rng.choice(members)
        q("SELECT count(*) FROM im.report_read(%s, %s, %s)", (u, conv, 10 ** 9))
    q("SELECT im.run_fanout()")
    # phones sync every day; a tablet only every fourth day, and two tablets
    # fall silent for two weeks (past device_inactive_after), then return
    for d in phones.values():
        d.sync()
    for i, d in enumerate(tablets.values()):
        silent = i < 2 and 5 <= day < 19
        if day % 4 == i % 4 and not silent:
            d.sync()
    # a rollback: a recovery batch, completed or abandoned
    d = phones[rng.choice(USERS)]
    if d.applied >= 3:
        d.sync(la=d.applied - 2, complete=rng.random() < 0.5)
    # on day 3 a device rolls back, gets a recovery batch and is never seen
    # again: only maintenance ends its session
    if day == 3:
        lost = Device(USERS[0], "lost")
        lost.activate()
        lost.sync()
        lost.sync(la=max(0, lost.applied - 2), complete=False)
    # a new device begins a snapshot and never installs it
    u = rng.choice(USERS)
    Device(u, f"x{day}")
    q("SELECT status FROM im.begin_snapshot(%s, %s)", (u, f"x{day}"))
    # device tokens: issued (audit rows), used
    for u in rng.sample(USERS, 2):
        t = row("SELECT im.issue_device_token(%s, 'phone', '3 seconds')", (u,))[0]
        q("SELECT * FROM im.authenticate(%s)", (t,))
    # every fifth day a tablet is revoked and registered again
    if day % 5 == 4:
        u = USERS[(day // 5) % 6]
        q("SELECT im.revoke_device(%s, 'tablet')", (u,))
        tablets[u] = Device(u, "tablet")
        tablets[u].activate()
    if maintenance:
        for _ in range(2):
            q("SELECT count(*) FROM im.gc_inbox(8)")
    time.sleep(max(0.0, DAY - (time.time() - day_start)))
print(f"{days} simulated days in {time.time() - start:.0f} s, {msg} messages")

# one transaction, one now(): the last maintenance, then the checks
cur.execute("BEGIN")
if maintenance:
    q("SELECT count(*) FROM im.gc_inbox()")
findings = q("SELECT check_name, count(*) FROM im.reconcile() GROUP BY 1 ORDER BY 1")
stale = {
    "outbox (done)": "SELECT count(*) FROM im.outbox WHERE state = 'done' "
                     "AND processed_at < now() - %(ret)s::interval - %(slack)s::interval",
    "private_event": "SELECT count(*) FROM im.private_event p WHERE created_at < now() - %(ret)s::interval - %(slack)s::interval "
                     "AND NOT EXISTS (SELECT 1 FROM im.inbox i WHERE i.user_id = p.user_id AND i.source_event_id = p.private_event_id)",
    "inbox": "SELECT count(*) FROM im.inbox WHERE created_at < now() - %(ret)s::interval - %(inactive)s::interval - %(slack)s::interval",
    "snapshot": "SELECT count(*) FROM im.snapshot WHERE expires_at < now() - %(snap)s::interval - %(slack)s::interval",
    "recovery_session (ended)": "SELECT count(*) FROM im.recovery_session WHERE state <> 'ACTIVE' "
                                "AND COALESCE(ended_at, expires_at) < now() - %(ttl)s::interval - %(slack)s::interval",
    "recovery_session (expired, still ACTIVE)": "SELECT count(*) FROM im.recovery_session WHERE state = 'ACTIVE' "
                                               "AND expires_at < now() - %(ttl)s::interval - %(slack)s::interval",
    "audit": "SELECT count(*) FROM im.audit WHERE at < now() - %(audit)s::interval - %(slack)s::interval",
}
params = {"ret": "7 s", "inactive": "10 s", "snap": "2 s", "ttl": "1 s", "audit": "10 s", "slack": SLACK}
old_rows = {name: row(sql, params)[0] for name, sql in stale.items()}
sizes = row("SELECT (SELECT count(*) FROM im.outbox), (SELECT count(*) FROM im.inbox), "
           "(SELECT count(*) FROM im.private_event), (SELECT count(*) FROM im.snapshot), "
           "(SELECT count(*) FROM im.snapshot_page), (SELECT count(*) FROM im.recovery_session), "
           "(SELECT count(*) FROM im.audit), (SELECT count(*) FROM im.token_key), "
           "(SELECT count(*) FROM im.token_key WHERE secret IS NOT NULL)")
cur.execute("COMMIT")
print("rows at the end: outbox %d, inbox %d, private_event %d, snapshot %d, snapshot_page %d, "
      "recovery_session %d, audit %d, token_key %d (%d with a secret)" % sizes)

if maintenance:
    check(findings == [], "reconcile() returns no rows after a month of maintenance", str(findings))
    for name, n in old_rows.items():
        check(n == 0, f"no {name} row older than its retention", f"{n} rows")
    check(sizes[8] <= 3, "at most 3 token keys keep a secret", f"{sizes[8]} keys")
    check(sizes[7] - sizes[8] >= 2, "keys were rotated and retired on their own", f"{sizes[7]} keys")
else:
    names = {n for n, _ in findings}
    check({"snapshot_stuck", "recovery_session_stuck"} <= names,
          "control: without maintenance reconcile reports stuck snapshots and sessions", str(findings))
    check(all(old_rows[n] > 0 for n in ("outbox (done)", "snapshot", "audit", "recovery_session (ended)")),
          "control: without maintenance rows outlive every retention", str(old_rows))
sys.exit(1 if failures else 0)
