"""failover.py — failover kept safe by test (suite 75-failover).

A primary and a streaming standby (pair.py), the gateway on a multi-host
conninfo with target_session_attrs=read-write, devices sending, syncing,
ACKing and reporting reads through it (storm.py), and three rounds:

  1. synchronous standby, primary stopped with pg_ctl -m immediate;
  2. synchronous standby (the old primary rewound with pg_rewind), the
     primary's postmaster killed with kill -9;
  3. asynchronous standby whose replication is cut before the primary dies
     (pg_ctl -m immediate): what was acknowledged after the cut may be lost.

Each round: storm, kill, a pause before promotion (clients must get
UNAVAILABLE with retry_after_ms, never a hang), pg_ctl promote, the storm
goes on, then the checks, through the API only (the gateway's frames, and
im.reconcile / im.metrics / register_device / issue_device_token, which are
API functions):
  - synchronous: every acknowledged send, ACK, read report and registration
    present on the new primary, each send exactly once with the message_id
    and msg_seq it was acknowledged with;
  - asynchronous: everything acknowledged before the cut is present; the
    acknowledged sends lost after it are counted and printed; a device that
    had shown a message that no longer exists, or whose id or position now
    holds other content, has gone through RESET_REQUIRED -> snapshot;
  - always: every device ends equal to fetch_messages, im.reconcile() is
    empty, fanout runs on the new primary without a restart (its workers
    log that they start working), tokens issued before the first failover
    still authenticate, no worker error on either node, and the standby's
    workers logged exactly one "waits" line each (no error loop).
Prints the time from the primary's death to the first successful send.
"""
import asyncio
import json
import os
import re
import sys
import tempfile
import threading
import time
import urllib.request

import psycopg2

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pair as pairmod  # noqa: E402
from pair import Pair  # noqa: E402
from storm import Device, Stats, storm  # noqa: E402
import gateway_deadlines  # noqa: E402

USERS = int(os.environ.get("IM_FAILOVER_USERS", "4"))
DEVICES_PER_USER = 2
STORM_BEFORE_S = float(os.environ.get("IM_FAILOVER_BEFORE_S", "3"))
GAP_S = 2.0            # primary dead, standby not yet promoted
CUT_AHEAD_S = 2.0      # async round: the primary runs this long ahead of the cut standby
STORM_AFTER_S = float(os.environ.get("IM_FAILOVER_AFTER_S", "4"))
WAIT_LINE = "im_sync fanout worker waits: the server is in recovery"
WORK_LINE = "im_sync fanout worker starts working: recovery has ended"
WORKER_ERROR = re.compile(r"im_sync fanout worker (ERROR|FATAL|PANIC):")

failures = []
figures = []


def say(msg):
    print(msg, flush=True)


def check(ok, what):
    say("    %s  %s" % ("ok  " if ok else "FAIL", what))
    if not ok:
        failures.append(what)
    return ok


def log_text(node, since=0):
    try:
        with open(node.log, errors="replace") as f:
            f.seek(since)
            return f.read()
    except FileNotFoundError:
        return ""


def log_size(node):
    try:
        return os.path.getsize(node.log)
    except FileNotFoundError:
        return 0


def wait_log_lines(node, since, line, n, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if log_text(node, since).count(line) >= n:
            return True
        time.sleep(0.2)
    return False


def workers():
    return 2  # im_sync.fanout_workers in pair.NODE_CONF


def check_standby_quiet(pair, since):
    """The standby's workers wait, one line each, no error; im.metrics()
    answers read-only and says the server is in recovery."""
    s = pair.standby
    check(wait_log_lines(s, since, WAIT_LINE, workers()),
          "standby %s: each fanout worker logged that it waits for recovery to end" % s.name)
    # a few naptimes: a worker that tried to fan out would have failed by now
    time.sleep(2.5)
    bad = [l for l in log_text(s, since).splitlines() if WORKER_ERROR.search(l)]
    check(not bad, "standby %s: no ERROR from a fanout worker (%s)" % (s.name, bad[:1]))
    rows = dict((r[0], r[1]) for r in s.q("SELECT name, value FROM im.metrics()"))
    check(rows.get("im_server_in_recovery") == 1.0 and "im_outbox_pending" in rows,
          "im.metrics() works read-only on the standby (im_server_in_recovery = 1)")


def check_promoted_works(node, since):
    text = log_text(node, since)
    check(text.count(WAIT_LINE) == workers(),
          "%s as a standby: exactly one 'waits' line per worker (no loop), got %d"
          % (node.name, text.count(WAIT_LINE)))
    check(wait_log_lines(node, since, WORK_LINE, workers()),
          "%s promoted: each fanout worker logged that it starts working, without a restart" % node.name)


def setup_data(pair):
    """Users, one group, devices and their tokens: all before the first failover."""
    p = pair.primary
    base = 7000
    users = [base + i for i in range(USERS)]
    conv = p.q("SELECT im.create_conversation('group', %s)", (users,))[0][0]
    devs = []
    for u in users:
        for k in range(DEVICES_PER_USER):
            name = "dev%d" % k
            p.q("SELECT * FROM im.register_device(%s, %s)", (u, name))
            tok = p.q("SELECT im.issue_device_token(%s, %s, '2 hours')", (u, name))[0][0]
            devs.append((u, name, tok))
    # push: a member that is never connected, with a push target: the
    # relay must go on pushing for it after every failover
    p.q("SELECT im.join_conversation(%s, %s)", (conv, PUSH_USER))
    p.q("SELECT * FROM im.register_device(%s, 'phone')", (PUSH_USER,))
    p.q("SELECT im.register_push_target(%s, 'phone', 'fcm', 'app', %s, 'none')", (PUSH_USER, PUSH_TOKEN))
    return users, conv, devs


PUSH_USER = 6999
PUSH_TOKEN = "ok-failover-phone"


class PushStub:
    """test/e2e/push_stub.py: records what the relay POSTs."""

    def __init__(self):
        import subprocess
        self.p = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e", "push_stub.py"), "--port", "0"],
                                  stdout=subprocess.PIPE, text=True)
        self.port = int(self.p.stdout.readline().split()[-1])
        self.url = "http://127.0.0.1:%d/_matrix/push/v1/notify" % self.port

    def event_ids(self):
        with urllib.request.urlopen("http://127.0.0.1:%d/_stub/requests" % self.port, timeout=5) as r:
            reqs = json.load(r)
        return [x["body"]["notification"]["event_id"] for x in reqs if x.get("pushkey") == PUSH_TOKEN]

    def reset(self):
        urllib.request.urlopen(urllib.request.Request("http://127.0.0.1:%d/_stub/reset" % self.port, data=b"",
                                                      method="POST"), timeout=5).close()

    def stop(self):
        self.p.terminate()
        self.p.wait(10)


def check_relay_follows(pair, stub, sender, conv):
    """A message sent after the promotion reaches the offline member's
    phone: the relay found the new primary on its multi-host conninfo.  The
    push is recognised by the message's id among pushes received after a
    reset (after an asynchronous failover, ids and positions of lost
    messages are reused, so an older push could look like this one); it is
    queued in the fanout transaction, so once it arrived every member's log
    has the message (the devices' final catch-up relies on that)."""
    stub.reset()
    mid, seq = pair.primary.q("SELECT message_id, msg_seq FROM im.send_message(%s, %s, %s, '{\"text\": \"after\"}')",
                              (sender, conv, "push-after-%d" % time.monotonic_ns()))[0]
    # The message may coalesce into the pair's job from the storm, which may
    # be backing off after a transient answer (10 s doubling per attempt:
    # the relay's 1.5 s request timeout on a loaded machine); the push is
    # due at that job's not_before, not now.  Past that: the relay's
    # reconnect (backoff at most 10 s, two hosts of connect_timeout 5 s)
    # and a poll — 30 s.  (A fixed 30 s from the send failed once under a
    # full run's load.)
    def job():
        return pair.primary.q(
            "SELECT j.state, j.attempts, j.message_id,"
            "       greatest(extract(epoch FROM j.not_before - now()), 0)::float8"
            "  FROM im.push_job j WHERE j.user_id = %s AND j.conversation_id = %s"
            "   AND j.state IN ('pending', 'retry', 'claimed') ORDER BY j.job_id DESC LIMIT 1", (PUSH_USER, conv))
    first = job()
    due_in = first[0][3] if first else 0.0
    deadline = time.monotonic() + due_in + 30
    while time.monotonic() < deadline and str(mid) not in stub.event_ids():
        time.sleep(0.2)
    pushed = str(mid) in stub.event_ids()
    check(pushed,
          "the push relay follows the primary: a message sent after the promotion (message %d, msg_seq %d) was "
          "pushed to the offline member's phone" % (mid, seq)
          + ("" if pushed else " (its job after the send — state, attempts, message, due in s: %s; now: %s)"
             % (first, job())))
    if not pushed:      # what the relay did meanwhile: its log without the per-push lines
        with open(os.path.join(pair.base, "relay.log"), errors="replace") as f:
            lines = [ln.rstrip() for ln in f if "event=sent" not in ln and "event=completed" not in ln]
        print("    relay log (last 25 lines without sent/completed):\n      " + "\n      ".join(lines[-25:]), flush=True)
    check(wait_drained(pair.primary), "fanout drained the outbox after that message")


def multi_host_conn(pair):
    """What an application back end holds: libpq picks the writable node."""
    c = psycopg2.connect(pair.conninfo())
    c.autocommit = True
    return c


class Registrar(threading.Thread):
    """Registers new devices through the multi-host conninfo, retrying
    after any connection error, while the storm runs; records what was
    acknowledged (and when)."""

    def __init__(self, pair, user, tag):
        super().__init__(daemon=True)
        self.pair, self.user, self.tag = pair, user, tag
        self.stop = threading.Event()
        self.acked = []   # (device_id, monotonic time)

    def run(self):
        i, conn = 0, None
        while not self.stop.is_set():
            dev = "reg-%s-%d" % (self.tag, i)
            try:
                if conn is None:
                    conn = multi_host_conn(self.pair)
                    # every round adds new devices of one user: above the
                    # device cap (im_sync.max_devices_per_user, 20) otherwise
                    with conn.cursor() as cur:
                        cur.execute("SET im_sync.max_devices_per_user = 100000")
                with conn.cursor() as cur:
                    cur.execute("SELECT state FROM im.register_device(%s, %s)", (self.user, dev))
                    cur.fetchall()
                self.acked.append((dev, time.monotonic()))
                i += 1
                time.sleep(0.2)
            except psycopg2.Error:
                try:
                    conn and conn.close()
                except psycopg2.Error:
                    pass
                conn = None
                time.sleep(0.3)


async def final_state(devices):
    """After the storm: each device catches up; the server's view per device."""
    truth = None
    for d in devices:
        await d.catch_up()
    # one fetch is the truth for everyone: all are members of the one group
    truth = await devices[0].fetch_all()
    return truth


def wait_drained(node, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = dict((r[0], r[1]) for r in node.q("SELECT name, value FROM im.metrics()"))
        if m.get("im_outbox_pending") == 0:
            return True
        time.sleep(0.2)
    return False


async def one_round(pair, devices, label, kill, synchronous, standby_since, cut=False):
    say("")
    say("--- round: %s" % label)
    stats = Stats()
    for d in devices:
        d.stats = stats
    stop = asyncio.Event()
    reg = Registrar(pair, devices[0].user, label.split(",")[0].replace(" ", ""))
    reg.start()
    task = asyncio.ensure_future(storm(devices, stop, stats))
    await asyncio.sleep(STORM_BEFORE_S)
    t_safe = None
    if cut:
        # Asynchronous replication lags: what is promised is only what the
        # standby has.  Sends acknowledged before t_safe are on it (it has
        # replayed past the primary's WAL position taken after t_safe).
        t_safe = time.monotonic()
        await asyncio.to_thread(pair.wait_standby_caught_up)
        await asyncio.to_thread(pair.cut_replication)
        await asyncio.sleep(CUT_AHEAD_S)
    # what every device showed and was told, just before the death
    seen_before = {d.name: {k: set(v) for k, v in d.seen.items()} for d in devices}
    acked_at_death = {d.name: d.acked for d in devices}
    read_at_death = {}
    for d in devices:
        read_at_death[d.user] = max(read_at_death.get(d.user, 0), d.read_to)
    for d in devices:
        d.first_server_ack = None
    old_primary, new_primary = pair.primary, pair.standby
    await asyncio.to_thread(kill, old_primary)
    stats.death = time.monotonic()
    await asyncio.sleep(GAP_S)
    unavailable_in_gap = stats.unavailable
    await asyncio.to_thread(pair.promote)
    t_promoted = time.monotonic()
    # read state right after promotion, before the storm reports more
    # (im.conversation_list: the API the "conversations" frame calls)
    read_after = {}
    for d in devices[::DEVICES_PER_USER]:
        read_after[d.user] = pair.primary.q(
            "SELECT read_msg_seq FROM im.conversation_list(%s) WHERE conversation_id = %s",
            (d.user, d.conv))[0][0]
    await asyncio.sleep(STORM_AFTER_S)
    stop.set()
    storm_failures = await task
    reg.stop.set()
    reg.join()
    for f in storm_failures:
        check(False, "storm: " + f)

    # ---- never a hang; UNAVAILABLE with retry_after_ms between death and promotion
    check(not stats.hangs, "no request went unanswered for %ss (hangs: %d)" % (20, len(stats.hangs)))
    check(unavailable_in_gap > 0 and not stats.unavailable_bad,
          "between the death and the promotion clients got UNAVAILABLE with retry_after_ms (%d replies)"
          % unavailable_in_gap)
    check(stats.first_send_after is not None, "sends succeed again after the promotion")
    if stats.first_send_after is not None:
        ft = stats.first_send_after - stats.death
        pt = stats.first_send_after - t_promoted
        figures.append((label, ft, pt))
        say("    figure: primary death -> first successful send %.2f s (of which %.1f s waiting before "
            "promotion; promotion -> first send %.2f s)" % (ft, t_promoted - stats.death, pt))

    # ---- the new primary's workers
    check_promoted_works(new_primary, standby_since)
    check(wait_drained(pair.primary), "fanout drained the outbox on the new primary")
    check_relay_follows(pair, STUB, devices[0].user, devices[0].conv)

    # ---- the end state, through the API
    truth = await final_state(devices)
    by_cmid = {}
    for mid, (seq, body) in truth.items():
        if isinstance(body, dict) and "cmid" in body:
            by_cmid.setdefault(body["cmid"], []).append((mid, seq))
    dups = [k for k, v in by_cmid.items() if len(v) > 1]
    check(not dups, "no client_msg_id stored twice (%d duplicated)" % len(dups))
    acked = [(cmid, v, d) for d in devices for cmid, v in d.sent.items()]
    lost = [(cmid, v) for cmid, v, d in acked if cmid not in by_cmid]
    moved = [(cmid, v, by_cmid[cmid]) for cmid, v, d in acked
             if cmid in by_cmid and by_cmid[cmid][0] != (v[0], v[1])]
    check(not moved, "every stored acknowledged send has the message_id and msg_seq it was acknowledged with "
          "(%d differ)" % len(moved))
    if synchronous:
        check(not lost, "synchronous: every acknowledged send is present (%d acknowledged, %d lost)"
              % (len(acked), len(lost)))
    else:
        early = [c for c, v in lost if v[2] < t_safe]
        check(not early, "asynchronous: every send acknowledged before the standby caught up is present "
              "(%d lost)" % len(early))
        say("    report: asynchronous standby cut %.1f s before the death: %d of %d acknowledged sends lost "
            "(all acknowledged after the cut)" % (CUT_AHEAD_S, len(lost), len(acked)))
        figures.append((label + " lost", len(lost), len(acked)))
    # ACKs and read reports acknowledged before the death
    short = [(d.name, acked_at_death[d.name], d.first_server_ack) for d in devices
             if d.first_server_ack is not None and d.first_server_ack < acked_at_death[d.name]]
    rshort = [(u, read_at_death[u], read_after[u]) for u in read_after if read_after[u] < read_at_death[u]]
    if not synchronous:
        say("    report: ACKs lost (a device's server ACK after the failover below its last acknowledged "
            "one): %d of %d devices; read reports lost: %d of %d users"
            % (len(short), len(devices), len(rshort), len(read_after)))
    if synchronous:
        check(not short and all(d.first_server_ack is not None for d in devices),
              "synchronous: every ACK acknowledged before the death is the server's ACK after it (%r)" % short)
        check(not rshort, "synchronous: every read report acknowledged before the death is kept (%r)" % rshort)
    # registrations
    regs = reg.acked if synchronous else [r for r in reg.acked if r[1] < t_safe]
    missing = []
    # present: device_session answers for it (P0002 for a device never registered)
    for dev, _ in regs:
        try:
            rows = pair.primary.q("SELECT state FROM im.device_session(%s, %s, 0)", (devices[0].user, dev))
            if not rows:
                missing.append(dev)
        except psycopg2.Error:
            missing.append(dev)
    check(bool(regs) and not missing, "%s: every acknowledged registration present (%d, %d missing)"
          % ("synchronous" if synchronous else "before the cut", len(regs), len(missing)))

    # every device equal to fetch_messages; lost or reused content rebuilt
    for d in devices:
        check(d.msgs == truth, "%s ends equal to fetch_messages (%d messages)" % (d.name, len(truth)))
    confused = []
    rebuilt = 0
    for d in devices:
        stale = [mid for mid, shown in seen_before[d.name].items()
                 if mid not in truth or (truth[mid][0], repr(truth[mid][1])) not in shown]
        if stale:
            reset_after = [t for t in d.resets if t >= stats.death]
            if reset_after:
                rebuilt += 1
            else:
                confused.append((d.name, stale[:3]))
    shown_before = {}
    for d in devices:
        for mid, shown in seen_before[d.name].items():
            for seq, body in shown:
                shown_before[mid] = (seq, body)
    gone = [mid for mid in shown_before if mid not in truth]
    reused_ids = [mid for mid, (seq, body) in shown_before.items()
                  if mid in truth and (truth[mid][0], repr(truth[mid][1])) != (seq, body)]
    seq_now = {seq: (mid, repr(body)) for mid, (seq, body) in truth.items()}
    reused_seqs = [seq for mid, (seq, body) in shown_before.items()
                   if seq in seq_now and seq_now[seq] != (mid, body)]
    if not synchronous:
        say("    report: messages devices had shown that no longer exist: %d; their message_id now holding other "
            "content: %d; their msg_seq now holding another message: %d"
            % (len(gone), len(reused_ids), len(reused_seqs)))
    else:
        check(not gone and not reused_ids and not reused_seqs,
              "synchronous: nothing a device had shown is gone or reused (%d, %d, %d)"
              % (len(gone), len(reused_ids), len(reused_seqs)))
    check(not confused, "every device that had shown a lost or reused message rebuilt (RESET_REQUIRED -> "
          "snapshot): %d rebuilt, not rebuilt %r" % (rebuilt, confused))
    if not synchronous:
        say("    report: %d devices rebuilt from a snapshot after the failover" % rebuilt)
    # tokens from before the first failover, reconciliation
    for d in devices:
        await d.drop()
    relogins = 0
    for d in devices:
        await d.login()
        relogins += 1
    check(relogins == len(devices), "tokens issued before the failover still authenticate (%d devices)" % relogins)
    rec = pair.primary.q("SELECT check_name, severity, detail::text FROM im.reconcile()")
    for r in rec[:10]:
        say("    reconcile: %r" % (r,))
    check(not rec, "im.reconcile() is empty on the new primary (%d rows)" % len(rec))
    return old_primary


def gateway_up(timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            urllib.request.urlopen("http://127.0.0.1:%d/healthz" % pairmod.GATEWAY_PORT, timeout=2)
            return True
        except Exception:
            time.sleep(0.2)
    return False


async def main_async(pair):
    standby_at = 0  # the standby's log began with its start
    global STUB
    users, conv, devs = setup_data(pair)
    STUB = PushStub()
    pairmod.PUSH_URL = STUB.url
    say("--- the gateway never hangs on a silent database")
    await asyncio.to_thread(gateway_deadlines.run, pair, devs, check)
    pair.start_clients()
    check(gateway_up(), "gateway up on the multi-host conninfo")
    url = "ws://127.0.0.1:%d/" % pairmod.GATEWAY_PORT
    stats = Stats()
    devices = [Device(url, u, name, tok, conv, stats) for u, name, tok in devs]
    for d in devices:
        await d.catch_up()
    check_standby_quiet(pair, standby_at)

    pair.set_synchronous(True)
    old = await one_round(pair, devices, "synchronous, pg_ctl -m immediate",
                          lambda n: n.stop_immediate(), synchronous=True, standby_since=standby_at)
    if os.environ.get("IM_FAILOVER_ROUNDS") == "1":
        return
    at = log_size(old)
    await asyncio.to_thread(pair.attach_old_primary_by_rewind)
    check_standby_quiet(pair, at)
    pair.set_synchronous(True)
    old = await one_round(pair, devices, "synchronous, kill -9 of the postmaster",
                          lambda n: n.kill9_postmaster(), synchronous=True, standby_since=at)
    at = log_size(old)
    await asyncio.to_thread(pair.attach_old_primary_by_rewind)
    check_standby_quiet(pair, at)
    pair.set_synchronous(False)
    await one_round(pair, devices, "asynchronous cut off, pg_ctl -m immediate",
                    lambda n: n.stop_immediate(), synchronous=False, standby_since=at, cut=True)
    for n in pair.nodes:
        bad = [l for l in log_text(n, pair.log_checked_from[n.name]).splitlines() if WORKER_ERROR.search(l)]
        for l in bad[:5]:
            say("    %s: %s" % (n.name, l))
        check(not bad, "node %s: no ERROR/FATAL line from a fanout worker in its log since the setup" % n.name)


STUB = None


def main():
    base = tempfile.mkdtemp(prefix="im_failover.", dir=os.environ.get("IM_TMP"))
    os.chmod(base, 0o755)
    pair = Pair(base)
    t0 = time.monotonic()
    try:
        pair.init_primary()
        pair.attach_standby_by_basebackup()
        asyncio.run(main_async(pair))
    except Exception as e:  # noqa: BLE001
        import traceback
        traceback.print_exc()
        failures.append("aborted: %r" % e)
    finally:
        pair.stop_all()
        if STUB:
            STUB.stop()
    say("")
    for label, a, b in figures:
        if label.endswith(" lost"):
            say("figure: %s: %d of %d" % (label, a, b))
        else:
            say("figure: %s: death -> first send %.2f s, promotion -> first send %.2f s" % (label, a, b))
    say("failover: %d failed checks (%.0f s; logs in %s)" % (len(failures), time.monotonic() - t0, base))
    if failures:
        for f in failures:
            say("  FAIL " + f)
        return 1
    if not os.environ.get("IM_KEEP"):
        import shutil
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
