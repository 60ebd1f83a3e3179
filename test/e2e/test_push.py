#!/usr/bin/env python3
"""Offline push end to end — im_sync's push queue, im_push_relay
and a stub push gateway (test/e2e/push_stub.py, which answers every class
Sygnal, APNs and FCM produce), plus im_gateway for presence.

Runs in its own database (IM_PUSH_DB, default im_push_e2e), where no fanout
worker runs: the test fans out with im.run_fanout() in its own session, so
it sets push_delay / push_min_interval for that session.  The relays connect
as a role that may only claim and complete jobs (README "Grants").

Environment: PGHOST/PGPORT/PGUSER (superuser) and PGBIN (pg_dump);
IM_RELAY_BIN, IM_GW_BIN.  Every wait has a deadline; nothing asserts on
timing.
"""
import asyncio
import json
import os
import pwd
import signal
import socket
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DB = os.environ.get("IM_PUSH_DB", "im_push_e2e")
os.environ["IM_E2E_DB"] = DB
sys.path.insert(0, HERE)
import psycopg2  # noqa: E402
from imgw import Client, free_port, run_tests, wait_until  # noqa: E402
import imgw  # noqa: E402

RELAY = os.environ.get("IM_RELAY_BIN", os.path.join(ROOT, "gateway", "im_push_relay"))
GW = os.environ.get("IM_GW_BIN", os.path.join(ROOT, "gateway", "im_gateway"))
PGBIN = os.environ.get("PGBIN", "")
KEY = os.path.join(ROOT, "test", "push", "relay_key.pem")
KEY2 = os.path.join(ROOT, "test", "push", "relay_key2.pem")
PUB = os.path.join(ROOT, "test", "push", "relay_pub.pem")
PUB2 = os.path.join(ROOT, "test", "push", "relay_pub2.pem")
TMP = os.environ.get("IM_TMP", "/tmp")
RELAY_DSN = "host=%s port=%s user=im_relay_e2e dbname=%s" % (
    os.environ.get("PGHOST", "127.0.0.1"), os.environ.get("PGPORT", "5432"), DB)
PROCS = []
TOKENS = set()          # every clear token the test registered: none may leak
_users = [100000]


def connect(dbname=DB):
    c = psycopg2.connect(dbname=dbname)
    c.autocommit = True
    return c


def setup_database():
    c = connect("postgres")
    cur = c.cursor()
    cur.execute("DROP DATABASE IF EXISTS %s WITH (FORCE)" % DB)
    cur.execute("CREATE DATABASE %s" % DB)
    c.close()
    c = connect()
    cur = c.cursor()
    cur.execute("SET client_min_messages = warning")
    cur.execute("CREATE EXTENSION im_sync CASCADE")
    cur.execute("""DO $$BEGIN
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'im_relay_e2e') THEN
          CREATE ROLE im_relay_e2e LOGIN; END IF; END$$""")
    cur.execute("GRANT USAGE ON SCHEMA im TO im_relay_e2e")
    cur.execute("GRANT EXECUTE ON FUNCTION im.claim_push_jobs(text, int, interval), "
                "im.complete_push_job(bigint, text, text, int, int, text) TO im_relay_e2e")
    c.close()
    with open(os.path.join(HERE, "gateway_grants.sql")) as f:
        c = connect()
        c.cursor().execute(f.read())
        c.close()


class Session:
    """The test's own session: it fans out, so its settings decide."""

    def __init__(self):
        self.c = connect()
        self.q("SET im_sync.push_public_key_file = %s", PUB)
        self.q("SET im_sync.push_delay = 0")
        self.q("SET im_sync.push_min_interval = 0")

    def q(self, query, *args):
        cur = self.c.cursor()
        cur.execute(query, args)
        try:
            return cur.fetchall()
        except psycopg2.ProgrammingError:
            return None

    def one(self, query, *args):
        return self.q(query, *args)[0][0]

    def users(self, n):
        base = _users[0]
        _users[0] += n
        return list(range(base, base + n))

    def conversation(self, members):
        return self.one("SELECT im.create_conversation('group', %s::bigint[], %s)", members, members[0])

    def device(self, user, device, token=None, preview="none"):
        self.q("SELECT * FROM im.register_device(%s, %s)", user, device)
        if token:
            TOKENS.add(token)
            self.one("SELECT im.register_push_target(%s, %s, 'fcm', 'app', %s, %s)", user, device, token, preview)

    def send(self, user, conv, text="hello", fanout=True):
        k = "push-%d-%f" % (user, time.time())
        seq = self.one("SELECT msg_seq FROM im.send_message(%s, %s, %s, %s::jsonb)",
                       user, conv, k, json.dumps({"text": text}))
        if fanout:
            self.one("SELECT im.run_fanout()")
        return seq

    def job(self, user, device):
        r = self.q("SELECT state, last_result, http_status, msg_seq FROM im.push_job WHERE user_id = %s "
                   "AND device_id = %s ORDER BY job_id DESC LIMIT 1", user, device)
        return r[0] if r else None

    def target(self, user, device):
        r = self.q("SELECT rejections, disabled_at IS NOT NULL FROM im.push_target WHERE user_id = %s "
                   "AND device_id = %s", user, device)
        return r[0] if r else None


def wait_for(what, cond, timeout=30):
    return wait_until(what, cond, timeout, step=0.05)


class StubGateway:
    def __init__(self, slow=3.0):
        self.p = subprocess.Popen([sys.executable, os.path.join(HERE, "push_stub.py"), "--port", "0",
                                   "--slow", str(slow)], stdout=subprocess.PIPE, text=True)
        PROCS.append(self.p)
        self.port = int(self.p.stdout.readline().split()[-1])
        self.url = "http://127.0.0.1:%d/_matrix/push/v1/notify" % self.port

    def requests(self, pushkey=None):
        with urllib.request.urlopen("http://127.0.0.1:%d/_stub/requests" % self.port) as r:
            reqs = json.load(r)
        return [x for x in reqs if pushkey is None or x.get("pushkey") == pushkey]


class Relay:
    def __init__(self, url, name, keys=(KEY,), db=None, extra=(), user=None, append=False):
        self.log = os.path.join(TMP, "push-relay-%s.log" % name)
        args = [RELAY, "--db", db or RELAY_DSN, "--url", url, "--relay-id", name, "--timeout", "1500",
                "--lease", "3", "--poll", "1"]
        for k in keys:
            args += ["--key", k]
        become = None
        if user:
            pw = pwd.getpwnam(user)

            def become():
                os.setgid(pw.pw_gid)
                os.setgroups([])
                os.setuid(pw.pw_uid)
        self.p = subprocess.Popen(args + list(extra), stderr=open(self.log, "a" if append else "w"),
                                  preexec_fn=become)
        PROCS.append(self.p)

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        rc = self.p.wait(30)
        assert rc == 0, "relay exit status %s after SIGTERM" % rc

    def kill(self):
        self.p.send_signal(signal.SIGKILL)
        self.p.wait(30)

    def text(self):
        with open(self.log) as f:
            return f.read()


STUB = None
MAIN = None


def start_main_relay():
    global MAIN
    MAIN = Relay(STUB.url, "main")


def test_trace_id_in_relay_lines():
    """A message with a known trace id (contract §21): its push job carries
    it, claim_push_jobs hands it to the relay, and the relay's lines about
    the job name it, as key=value text and with --log-format json (one JSON
    line per attempt with ts, type, job_id, provider, result, http_status,
    latency_ms; the target as a keyed hash; the other lines' key=value
    pairs as members); no line holds the token, the
    notification or the message body, even at preview full.  The main
    relay is stopped meanwhile so these relays claim the jobs."""
    global MAIN
    s = Session()
    a, b = s.users(2)
    conv = s.conversation([a, b])
    token = "ok-trace-%d" % b
    s.device(b, "phone", token, preview="full")
    bad = Relay(STUB.url, "trace-badformat", extra=["--log-format", "xml"])
    assert bad.p.wait(30) == 2 and "--log-format must be text or json" in bad.text(), bad.text()
    # its SIGTERM handler is in place once it logged its start (it may have just been started)
    wait_for("the main relay's start", lambda: "event=start" in MAIN.text())
    MAIN.stop()
    try:
        for fmt in ("json", "text"):
            trace = "0af7651916cd43dd8448eb211c80319c" if fmt == "json" else "client-trace_%d" % b
            body = "body-%s-%d never logged" % (fmt, b)
            relay = Relay(STUB.url, "trace-" + fmt, extra=["--log-format", fmt])
            try:
                s.q("SELECT * FROM im.send_message(%s, %s, %s, %s::jsonb, trace_id => %s)",
                    a, conv, "trace-" + trace, json.dumps({"text": body}), trace)
                s.one("SELECT im.run_fanout()")
                job_id, job_trace = s.q("SELECT job_id, trace_id FROM im.push_job WHERE user_id = %s "
                                        "AND device_id = 'phone' ORDER BY job_id DESC LIMIT 1", b)[0]
                assert job_trace == trace, (job_trace, trace)
                wait_for("the job delivered", lambda: s.job(b, "phone")[0] == "delivered")
                pushed = STUB.requests(token)[-1]["body"]["notification"]
                assert pushed["content"] == {"text": body}, pushed   # the body did go to the push gateway
                if fmt == "json":
                    def attempt_line():
                        for ln in relay.text().splitlines():
                            o = json.loads(ln)          # every line is one JSON object
                            if o.get("type") == "push" and o.get("job_id") == job_id and o.get("event") == "sent":
                                return o
                        return None
                    wait_for("the attempt's JSON line", attempt_line)
                    o = attempt_line()
                    assert o["trace_id"] == trace and o["result"] == "delivered" and o["http_status"] == 200, o
                    assert o["provider"] == "fcm" and o["state"] == "delivered" and o["target"].startswith("h:"), o
                    assert isinstance(o["latency_ms"], (int, float)) and o["latency_ms"] >= 0, o
                    assert o["ts"].endswith("Z") and o["relay"] == "trace-json", o
                    for ln in relay.text().splitlines():
                        assert json.loads(ln)["ts"], ln
                    # a line not about a job: its key=value pairs are members, as in the gateway's lines
                    start = [json.loads(ln) for ln in relay.text().splitlines()
                             if json.loads(ln).get("event") == "start"]
                    assert start and start[0]["relay"] == "trace-json" and "detail" not in start[0], start
                    assert isinstance(start[0]["concurrency"], int) and start[0]["url_keys"] >= 1, start
                else:
                    mine = lambda: [ln for ln in relay.text().splitlines()  # noqa: E731
                                    if (" job=%d " % job_id) in ln]
                    wait_for("the sent and completed lines", lambda: len(mine()) >= 2)
                    for ln in mine():
                        assert ("trace_id=%s" % trace) in ln, ln
                    assert any("event=sent" in ln and "result=delivered status=200" in ln for ln in mine()), mine()
                    assert any("event=completed" in ln and "state=delivered" in ln for ln in mine()), mine()
                text = relay.text()
                assert token not in text and body not in text and "pushkey" not in text, text
                assert s.one("SELECT sealed_token FROM im.push_target WHERE user_id = %s", b) not in text
            finally:
                relay.stop()
    finally:
        started = MAIN.text().count("event=start")
        MAIN = Relay(STUB.url, "main", append=True)
        # its SIGTERM handler is in place once it logged its start
        wait_for("the main relay again", lambda: MAIN.text().count("event=start") > started)


def test_offline_push_one_per_window():
    """A device offline: exactly one push per coalescing window, the right
    badge, no sender and no content at preview none, default_payload with
    conversation and msg_seq."""
    s = Session()
    a, b = s.users(2)
    conv = s.conversation([a, b])
    s.device(a, "phone", "ok-a-%d" % a)
    s.device(b, "phone", "ok-b-%d" % b)
    s.q("SET im_sync.push_delay = '1s'")
    for i in range(3):
        last = s.send(a, conv, "m%d" % i)
    wait_for("the push", lambda: s.job(b, "phone")[0] == "delivered")
    got = STUB.requests("ok-b-%d" % b)
    assert len(got) == 1, got
    n = got[0]["body"]["notification"]
    assert n["counts"]["unread"] == 3, n
    assert "sender" not in n and "content" not in n, n
    assert n["devices"][0]["data"]["default_payload"] == {"conversation_id": conv, "msg_seq": last}, n
    assert n["room_id"] == str(conv) and n["type"] == "im.message", n
    assert not STUB.requests("ok-a-%d" % a), "the sender's own device was pushed"
    # the next window: one more push
    s.send(a, conv, "m3")
    wait_for("the second push", lambda: len(STUB.requests("ok-b-%d" % b)) == 2)
    wait_for("the second job done", lambda: s.job(b, "phone")[0] == "delivered")
    assert STUB.requests("ok-b-%d" % b)[1]["body"]["notification"]["counts"]["unread"] == 4


def test_preview_sender_and_full():
    s = Session()
    a, b = s.users(2)
    conv = s.conversation([a, b])
    s.device(b, "phone", "ok-full-%d" % b, preview="full")
    s.send(a, conv, "visible")
    wait_for("the push", lambda: STUB.requests("ok-full-%d" % b))
    n = STUB.requests("ok-full-%d" % b)[0]["body"]["notification"]
    assert n["sender"] == str(a) and n["content"] == {"text": "visible"}, n
    s.q("SELECT im.set_notify(%s, %s, preview => 'sender')", b, conv)
    wait_for("the job done", lambda: s.job(b, "phone")[0] == "delivered")
    s.send(a, conv, "hidden")
    wait_for("the second push", lambda: len(STUB.requests("ok-full-%d" % b)) == 2)
    n = STUB.requests("ok-full-%d" % b)[1]["body"]["notification"]
    assert n["sender"] == str(a) and "content" not in n, n


def test_result_classes():
    """Each answer class -> the contract's job state and target state."""
    s = Session()
    a, b = s.users(2)
    conv = s.conversation([a, b])
    cases = {"ok": ("delivered", "delivered", 200, (0, False)),
             "rej": ("dead", "rejected", 200, (1, False)),
             "r410": ("dead", "rejected", 410, (1, False)),
             "r429": ("retry", "rate_limited", 429, (0, False)),
             "r500": ("retry", "transient", 500, (0, False)),
             "r502": ("retry", "transient", 502, (0, False)),
             "r400": ("dead", "permanent", 400, (0, False)),
             "redir": ("dead", "permanent", 302, (0, False)),     # to file://, not followed
             "slow": ("retry", "transient", None, (0, False)),
             "close": ("retry", "transient", None, (0, False))}
    for prefix in cases:
        s.device(b, prefix, "%s-cls-%d" % (prefix, b))
    s.send(a, conv)
    for prefix, (state, result, status, target) in cases.items():
        wait_for("the %s job's result" % prefix, lambda: (s.job(b, prefix) or [None, None])[1] is not None)
        got = s.job(b, prefix)
        assert got[:3] == (state, result, status), (prefix, got)
        assert s.target(b, prefix) == target, (prefix, s.target(b, prefix))
    # 429 honours Retry-After (7 s) or the backoff (10 s), whichever is later
    wait = s.one("SELECT extract(epoch FROM not_before - now()) FROM im.push_job WHERE user_id = %s "
                 "AND device_id = 'r429'", b)
    assert 5 < wait <= 10.5, wait


def test_retry_after_forms():
    """Retry-After: delay-seconds that overflow a long once multiplied by 1000
    are capped at an hour (they wrapped to 384 ms, so the 10 s backoff
    ruled), negative or malformed values are ignored (the backoff), an
    HTTP-date ahead is honoured and one gone by leaves the backoff."""
    s = Session()
    a, b = s.users(2)
    conv = s.conversation([a, b])
    cases = {"r429huge": (3500, 3600.5), "r429neg": (5, 10.5), "r429junk": (5, 10.5),
             "r429past": (5, 10.5), "r429date": (20, 40.5)}
    for prefix in cases:
        s.device(b, prefix, "%s-ra-%d" % (prefix, b))
    s.send(a, conv)
    for prefix, (low, high) in cases.items():
        wait_for("the %s job's result" % prefix, lambda: (s.job(b, prefix) or [None, None])[1] is not None)
        assert s.job(b, prefix)[:3] == ("retry", "rate_limited", 429), (prefix, s.job(b, prefix))
        wait = s.one("SELECT extract(epoch FROM not_before - now()) FROM im.push_job WHERE user_id = %s "
                     "AND device_id = %s", b, prefix)
        assert low < wait <= high, (prefix, wait)


def test_relay_refuses_other_schemes():
    """--url naming another scheme than http or https: the relay does not
    start (exit 2), so no token goes to a file, gopher, ftp or dict URL
    (each request is limited to http and https by libcurl too: make
    relay-test)."""
    for url in ("file:///etc/passwd", "gopher://127.0.0.1:%d/" % STUB.port,
                "ftp://127.0.0.1:%d/" % STUB.port, "dict://127.0.0.1:%d/" % STUB.port):
        relay = Relay(url, "scheme")
        try:
            rc = relay.p.wait(30)
        except subprocess.TimeoutExpired:
            raise AssertionError("the relay runs with --url %s" % url)
        assert rc == 2, (url, rc)
        assert "--url must be an http:// or https:// URL" in relay.text(), relay.text()


def test_relay_not_dumpable():
    """The relay holds clear tokens: its core file size is 0 (soft and hard)
    and it is not dumpable, so no process of its uid may ptrace it or read
    its memory; the kernel shows that by giving its /proc/PID files to
    root.  Run as nobody when the test is root, so the owner tells."""
    user = "nobody" if os.geteuid() == 0 else None
    relay = Relay(STUB.url, "nodump", user=user,
                  db="host=127.0.0.1 port=%d user=im_relay_e2e dbname=%s" % (free_port(), DB))
    try:
        wait_for("the relay's start", lambda: "event=start" in relay.text())
        with open("/proc/%d/limits" % relay.p.pid) as f:
            core = [line.split() for line in f if line.startswith("Max core file size")][0]
        assert core[4:6] == ["0", "0"], core
        with open("/proc/%d/status" % relay.p.pid) as f:
            uid = int([line.split()[1] for line in f if line.startswith("Uid:")][0])
        assert uid != 0, "the relay runs as root: its /proc owner tells nothing"
        owner = os.stat("/proc/%d/status" % relay.p.pid).st_uid
        assert owner == 0, "the relay (uid %d) is dumpable: /proc/PID is owned by uid %d" % (uid, owner)
    finally:
        relay.stop()


def test_three_rejections_disable():
    s = Session()
    a, b = s.users(2)
    conv = s.conversation([a, b])
    s.device(b, "phone", "rej-3x-%d" % b)
    for i in range(3):
        s.send(a, conv)
        want = "target_disabled" if i == 2 else "dead"
        wait_for("rejection %d" % (i + 1), lambda: s.job(b, "phone")[0] == want)
        assert s.target(b, "phone") == (i + 1, i == 2), s.target(b, "phone")
    s.send(a, conv)
    assert s.one("SELECT count(*) FROM im.push_job WHERE user_id = %s AND state = 'pending'", b) == 0
    # one rejection between deliveries does not disable
    s.device(b, "tablet", "ok-then-%d" % b)
    s.send(a, conv)
    wait_for("delivered", lambda: s.job(b, "tablet")[0] == "delivered")


def test_two_relays_send_each_job_once():
    s = Session()
    users = s.users(41)
    sender = users[0]
    convs = []
    for u in users[1:]:
        convs.append(s.conversation([sender, u]))
        s.device(u, "phone", "ok-two-%d" % u)
    second = Relay(STUB.url, "second")
    try:
        for c in convs:
            s.send(sender, c, fanout=False)
        s.one("SELECT im.run_fanout()")
        wait_for("every job delivered", lambda: s.one(
            "SELECT count(*) FROM im.push_job WHERE user_id = ANY(%s) AND state = 'delivered'", users[1:]) == 40, 60)
        for u in users[1:]:
            assert len(STUB.requests("ok-two-%d" % u)) == 1, u
        by = s.q("SELECT relay_id, count(*) FROM im.push_job WHERE user_id = ANY(%s) GROUP BY 1", users[1:])
        print("   jobs per relay:", dict(by))
    finally:
        second.stop()


class BlackHole:
    """Accepts connections and never answers: a relay's requests hang."""

    def __init__(self):
        self.s = socket.socket()
        self.s.bind(("127.0.0.1", 0))
        self.s.listen(100)
        self.url = "http://127.0.0.1:%d/_matrix/push/v1/notify" % self.s.getsockname()[1]


def test_killed_relay_jobs_go_out_after_lease():
    """A relay killed with kill -9 mid-batch: its jobs are sent by another
    relay once the lease lapsed, none lost, each once at the real gateway."""
    s = Session()
    users = s.users(11)
    sender = users[0]
    MAIN.stop()                       # SIGTERM: drains and exits 0
    hole = BlackHole()
    doomed = Relay(hole.url, "doomed", extra=["--timeout", "20000", "--lease", "30", "--concurrency", "100"])
    try:
        for u in users[1:]:
            c = s.conversation([sender, u])
            s.device(u, "phone", "ok-kill-%d" % u)
            s.send(sender, c, fanout=False)
        s.one("SELECT im.run_fanout()")
        wait_for("the doomed relay's claims", lambda: s.one(
            "SELECT count(*) FROM im.push_job WHERE user_id = ANY(%s) AND state = 'claimed' "
            "AND relay_id = 'doomed'", users[1:]) == 10)
        doomed.kill()
        # the lease is 30 s: shorten it as if time passed (the relay is dead)
        s.q("UPDATE im.push_job SET lease_until = now() WHERE relay_id = 'doomed' AND state = 'claimed'")
        start_main_relay()
        wait_for("every job delivered", lambda: s.one(
            "SELECT count(*) FROM im.push_job WHERE user_id = ANY(%s) AND state = 'delivered'", users[1:]) == 10, 60)
        for u in users[1:]:
            assert len(STUB.requests("ok-kill-%d" % u)) == 1, u
    finally:
        if MAIN.p.poll() is not None:
            start_main_relay()


def test_rolled_back_fanout_and_controls_queue_nothing():
    s = Session()
    a, b = s.users(2)
    conv = s.conversation([a, b])
    s.device(b, "phone", "ok-rb-%d" % b)
    s.send(a, conv, fanout=False)
    s.q("BEGIN")
    s.one("SELECT im.run_fanout()")
    s.q("ROLLBACK")
    assert s.job(b, "phone") is None
    s.one("SELECT im.run_fanout()")
    wait_for("the push after the real fanout", lambda: s.job(b, "phone")[0] == "delivered")
    m = s.one("SELECT max(message_id) FROM im.event WHERE conversation_id = %s", conv)
    s.q("DELETE FROM im.push_job WHERE user_id = %s", b)
    s.q("SELECT * FROM im.react(%s, %s, %s, 'like', true, 'rb-r')", a, conv, m)
    s.q("SELECT * FROM im.pin_message(%s, %s, %s, true, 'rb-p')", a, conv, m)
    s.q("SELECT * FROM im.join_conversation(%s, %s)", conv, s.users(1)[0])
    s.one("SELECT im.run_fanout()")
    assert s.job(b, "phone") is None


async def test_online_device_gets_no_push():
    """Online through the gateway (presence) -> no push; coming online or
    ACKing within push_delay -> suppressed."""
    s = Session()
    a, b = s.users(2)
    conv = s.conversation([a, b])
    s.device(b, "phone", "ok-on-%d" % b)
    c = await Client.login(b, "phone")
    wait_for("presence", lambda: s.one("SELECT count(*) FROM im.presence WHERE user_id = %s", b) == 1)
    s.send(a, conv)
    assert s.job(b, "phone") is None, s.job(b, "phone")
    await c.close()
    wait_for("offline", lambda: s.one("SELECT count(*) FROM im.presence WHERE user_id = %s", b) == 0)
    # offline: a job, held for push_delay; the device connects and syncs meanwhile
    s.q("SET im_sync.push_delay = '1h'")
    s.send(a, conv)
    assert s.job(b, "phone")[0] == "pending"
    c = await Client.login(b, "phone")
    await c.bootstrap()
    await c.close()
    wait_for("offline", lambda: s.one("SELECT count(*) FROM im.presence WHERE user_id = %s", b) == 0)
    s.q("UPDATE im.push_job SET not_before = now() WHERE user_id = %s", b)   # the delay ends
    wait_for("suppressed", lambda: s.job(b, "phone")[0] == "suppressed")
    assert not STUB.requests("ok-on-%d" % b)


def test_recalled_before_claim_suppressed():
    s = Session()
    a, b = s.users(2)
    conv = s.conversation([a, b])
    s.device(b, "phone", "ok-rc-%d" % b)
    s.q("SET im_sync.push_delay = '1h'")
    m = s.one("SELECT message_id FROM im.send_message(%s, %s, 'rc-1', '{\"text\": \"oops\"}')", a, conv)
    s.one("SELECT im.run_fanout()")
    s.q("SELECT * FROM im.recall_message(%s, %s, 'rc-2', %s)", a, conv, m)
    s.one("SELECT im.run_fanout()")
    s.q("UPDATE im.push_job SET not_before = now() WHERE user_id = %s", b)
    wait_for("suppressed", lambda: s.job(b, "phone")[0] == "suppressed")
    assert not STUB.requests("ok-rc-%d" % b)


def test_mute_unmute_overrides():
    s = Session()
    a, b = s.users(2)
    conv = s.conversation([a, b])
    s.device(b, "phone", "ok-mute-%d" % b)
    key = "ok-mute-%d" % b
    s.q("SELECT im.set_notify(%s, %s, mute_until => 'infinity')", b, conv)
    s.send(a, conv)
    s.q("SELECT im.set_notify(%s, %s, preview => 'full')", b, conv)    # keeps the mute
    s.send(a, conv)
    assert s.job(b, "phone") is None
    s.q("SELECT im.set_notify(%s, mute_until => 'infinity')", b)       # account muted
    s.q("SELECT im.set_notify(%s, %s, mute_until => now() - interval '1 s')", b, conv)   # override unmutes
    s.send(a, conv, "through the override")
    wait_for("pushed", lambda: STUB.requests(key))
    # the target's preview (none) is less revealing than the override's (full): no content
    assert "content" not in STUB.requests(key)[0]["body"]["notification"]
    wait_for("done", lambda: s.job(b, "phone")[0] == "delivered")
    s.q("SELECT im.set_notify(%s, %s, clear => true)", b, conv)        # back to the account's mute
    s.send(a, conv)
    assert s.job(b, "phone")[0] == "delivered"                         # no new job
    assert len(STUB.requests(key)) == 1


def test_key_change_two_keys():
    """Tokens sealed with the new key while old ones exist: a relay holding
    both private keys opens each with the key its key id names."""
    s = Session()
    a, b = s.users(2)
    conv = s.conversation([a, b])
    s.device(b, "old", "ok-oldkey-%d" % b)
    s.q("SET im_sync.push_public_key_file = %s", PUB2)
    s.device(b, "new", "ok-newkey-%d" % b)
    s.send(a, conv)
    # MAIN holds only the old key: the new-key job fails as transient (retry)
    wait_for("old key delivered", lambda: s.job(b, "old")[0] == "delivered")
    wait_for("new key retried", lambda: s.job(b, "new")[0] == "retry")
    both = Relay(STUB.url, "both", keys=(KEY, KEY2))
    try:
        def delivered_by_both():
            # MAIN may claim it first and fail again: make it due again each time
            s.q("UPDATE im.push_job SET not_before = now() WHERE user_id = %s AND state = 'retry'", b)
            return s.job(b, "new")[0] == "delivered"
        wait_for("new key delivered", delivered_by_both, 60)
        assert len(STUB.requests("ok-newkey-%d" % b)) == 1
    finally:
        both.stop()
    assert "no --key file holds key id" in MAIN.text()


def test_relay_reconnects_multi_host():
    """A multi-host conninfo (a dead host first) works; a lost connection is
    re-made with backoff and the relay goes on."""
    s = Session()
    a, b = s.users(2)
    conv = s.conversation([a, b])
    s.device(b, "phone", "ok-mh-%d" % b)
    dead = free_port()
    dsn = "host=127.0.0.1,127.0.0.1 port=%d,%s user=im_relay_e2e dbname=%s" % (dead, os.environ["PGPORT"], DB)
    mh = Relay(STUB.url, "multihost", db=dsn)
    try:
        wait_for("connected", lambda: "event=db_connected" in mh.text())
        s.q("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'im_push_relay'")
        wait_for("reconnected", lambda: mh.text().count("event=db_connected") >= 2)
        s.send(a, conv)
        wait_for("delivered", lambda: s.job(b, "phone")[0] == "delivered")
    finally:
        mh.stop()


def test_no_clear_token_anywhere():
    """pg_dump, every table and the relay logs hold no token in the clear."""
    s = Session()
    assert len(TOKENS) > 20, TOKENS
    dump = subprocess.run([os.path.join(PGBIN, "pg_dump") if PGBIN else "pg_dump", "-d", DB],
                          capture_output=True, check=True).stdout
    tables = [r[0] for r in s.q("SELECT c.oid::regclass::text FROM pg_class c WHERE c.relnamespace = "
                                "'im'::regnamespace AND c.relkind = 'r'")]
    texts = [dump]
    for t in tables:
        texts.append("\n".join(str(r) for r in s.q("SELECT t::text FROM %s t" % t)).encode())
    for name in ("main", "second", "doomed", "both", "multihost", "trace-json", "trace-text"):
        p = os.path.join(TMP, "push-relay-%s.log" % name)
        if os.path.exists(p):
            with open(p, "rb") as f:
                texts.append(f.read())
    assert b"im.push_target" in dump and b"sealed_token" in dump, "the dump has no push targets"
    for t in TOKENS:
        for blob in texts:
            assert t.encode() not in blob, "token %s found in the clear" % t[:6]
    # the relay logs name targets by keyed hash only
    assert "target=h:" in MAIN.text()


def main():
    global STUB
    setup_database()
    STUB = StubGateway(slow=3.0)
    port = free_port()
    gw = subprocess.Popen([GW, "--listen", "127.0.0.1:%d" % port, "--pool", "2",
                           "--db", "host=%s port=%s user=im_gateway_e2e dbname=%s" % (
                               os.environ.get("PGHOST"), os.environ.get("PGPORT"), DB)],
                          stderr=open(os.path.join(TMP, "push-gateway.log"), "w"))
    PROCS.append(gw)
    imgw.URL = "ws://127.0.0.1:%d/" % port
    wait_for("the gateway", lambda: subprocess.run(["curl", "-fs", "http://127.0.0.1:%d/healthz" % port],
                                                    capture_output=True).returncode == 0)
    start_main_relay()
    try:
        rc = run_tests([test_trace_id_in_relay_lines, test_offline_push_one_per_window, test_preview_sender_and_full, test_result_classes,
                        test_retry_after_forms, test_relay_refuses_other_schemes, test_relay_not_dumpable,
                        test_three_rejections_disable, test_two_relays_send_each_job_once,
                        test_killed_relay_jobs_go_out_after_lease, test_rolled_back_fanout_and_controls_queue_nothing,
                        test_online_device_gets_no_push, test_recalled_before_claim_suppressed,
                        test_mute_unmute_overrides, test_key_change_two_keys, test_relay_reconnects_multi_host,
                        test_no_clear_token_anywhere], label="push e2e", timeout=120)
        MAIN.stop()
    finally:
        for p in PROCS:
            if p.poll() is None:
                p.kill()
    return rc


if __name__ == "__main__":
    sys.exit(main())
