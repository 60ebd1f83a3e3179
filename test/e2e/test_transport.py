#!/usr/bin/env python3
"""Transport hardening of im_gateway (contract §10):
what happens before welcome, the connection caps (HTTP 503), the Origin rule
(HTTP 403), keepalive (ping, close 1001), the plain-listen refusal,
refused hellos that must not supersede the live session, and hellos that
wait for a place behind --max-pending-hello (on gateways of their
own).

Run by test/suites/62-e2e-transport.sh against a gateway (IM_GW_URL) started
with --ping-interval 1 --idle-timeout 3 --max-unauth-per-ip 3
--max-connections 10 --max-conn-per-user 2 --hello-rate-device 0.01
--hello-timeout 30, and a second one (IM_GW_ORIGIN_URL) started with
--allowed-origin https://app.example --allowed-origin http://other.example:8443.
IM_GW_BIN, IM_GW_DB and IM_GW_CERT/IM_GW_KEY are for the start-up checks.
Usage: test_transport.py [test-name-substring ...]
"""
import asyncio
import base64
import json
import os
import socket
import ssl
import struct
import subprocess
import sys
import time
import urllib.request

import psycopg2
import websockets

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from imgw import run_tests, DB, URL, Client, free_port, http_url, new_user_ids, register, sql, token  # noqa: E402

ORIGIN_URL = os.environ.get("IM_GW_ORIGIN_URL")
PORT = int(URL.rsplit(":", 1)[1].strip("/"))
MAX_UNAUTH_PER_IP = 3
MAX_CONNECTIONS = 10


def connections(url=None):
    body = urllib.request.urlopen(http_url(url) + "/metrics", timeout=5).read().decode()
    for line in body.splitlines():
        if line.startswith("im_gateway_connections "):
            return int(line.split()[1])
    raise AssertionError("no im_gateway_connections in /metrics")


async def wait_no_connections(url=None):
    """Sessions closed by earlier tests are gone (bounded polling)."""
    for _ in range(100):
        if connections(url) == 0:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("gateway still has %d sessions" % connections(url))


async def upgrade_status(url=None, **kw):
    """101 when the upgrade is accepted (the socket is closed again), else the HTTP status."""
    try:
        c = await Client.open(url=url, **kw)
    except websockets.InvalidStatusCode as e:
        return e.status_code
    await c.close()
    return 101


def epoch(user, device):
    return sql("SELECT connection_epoch FROM im.device WHERE user_id = %s AND device_id = %s",
               user, device)[0][0]


def current(user, device, ep):
    return sql("SELECT current FROM im.device_session(%s, %s, %s)", user, device, ep)[0][0]


class DeviceRowLock:
    """Holds im.device's row of a device FOR UPDATE, the row authenticate
    bumps the connection epoch of: a hello for that device stays pending."""

    def __init__(self, user, device):
        self.conn = psycopg2.connect(dbname=DB)
        with self.conn.cursor() as cur:
            cur.execute("SELECT 1 FROM im.device WHERE user_id = %s AND device_id = %s FOR UPDATE",
                        (user, device))
            assert cur.fetchall() == [(1,)]

    def waiting(self):
        """Backends of the gateway waiting for this lock."""
        return sql("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'im_gateway' "
                   "AND wait_event_type = 'Lock'")[0][0]

    def release(self):
        self.conn.rollback()
        self.conn.close()


# ------------------------------------------------------------- before welcome

async def test_hello_over_8k_not_authenticated():
    """A hello over 8 KiB is NOT_AUTHENTICATED + 4001, even with a valid
    token (it is not read to its end); one just under 8 KiB is welcomed."""
    await wait_no_connections()
    u, = new_user_ids(1)
    register(u, "big")
    c = await Client.open()
    await c.send_raw(json.dumps({"type": "hello", "token": token(u, "big"), "pad": "x" * 9000}))
    r = await c.next_frame()
    assert r["type"] == "error" and r["code"] == "NOT_AUTHENTICATED", r
    assert (await c.wait_closed())[0] == 4001
    c = await Client.open()
    r = await c.req({"type": "hello", "token": token(u, "big"), "pad": "x" * 7000})
    assert r["type"] == "welcome", r
    await c.close()
    # a large garbage first frame, in fragments: the same
    c = await Client.open()
    await c.send_raw(iter(["x" * 4096] * 3))
    r = await c.next_frame()
    assert r["code"] == "NOT_AUTHENTICATED", r
    assert (await c.wait_closed())[0] == 4001


async def test_frame_while_hello_pending():
    """A second frame while the hello is pending is NOT_AUTHENTICATED + 4001
    (nothing is queued behind a hello), and the hello that was pending is
    rolled back: it never bumps the device's connection epoch."""
    await wait_no_connections()
    u, = new_user_ids(1)
    register(u, "pend")
    e0 = epoch(u, "pend")
    tok = token(u, "pend")            # before the lock: issuing reads the row too
    lock = DeviceRowLock(u, "pend")
    try:
        c = await Client.open()
        await c.send_raw(json.dumps({"type": "hello", "id": 1, "token": tok}))
        for _ in range(100):          # the hello reached the lock
            if lock.waiting() > 0:
                break
            await asyncio.sleep(0.05)
        assert lock.waiting() > 0, "hello did not wait for the device row"
        await c.send_raw(json.dumps({"type": "ping", "id": 2}))
        r = await c.next_frame()
        assert r["type"] == "error" and r["code"] == "NOT_AUTHENTICATED", r
        assert (await c.wait_closed())[0] == 4001
    finally:
        lock.release()
    # the pending authenticate ran after the lock and rolled back: a new
    # login (queued behind it on the row lock) is exactly one epoch later
    live = await Client.login(u, "pend")
    assert live.welcome["connection_epoch"] == e0 + 1, (e0, live.welcome)
    assert epoch(u, "pend") == e0 + 1
    await live.close()


# -------------------------------------------------------------------- caps

async def test_unauth_per_ip_cap_503():
    """More than --max-unauth-per-ip sockets without welcome from one
    address: the upgrade gets HTTP 503; a welcome frees the slot."""
    await wait_no_connections()
    u, = new_user_ids(1)
    register(u, "cap")
    held = [await Client.open() for _ in range(MAX_UNAUTH_PER_IP)]
    try:
        assert await upgrade_status() == 503
        w = await held[0].req({"type": "hello", "token": token(u, "cap")})
        assert w["type"] == "welcome", w
        assert await upgrade_status() == 101
        assert (await held[0].req({"type": "ping"}))["type"] == "pong"
    finally:
        for c in held:
            await c.close()


async def test_global_connection_cap_503():
    """More than --max-connections sessions: the upgrade gets HTTP 503, the
    sessions in keep working, and a closed one frees its place."""
    await wait_no_connections()
    users = new_user_ids(MAX_CONNECTIONS)
    for u in users:
        register(u, "g")
    live = [await Client.login(u, "g") for u in users]
    try:
        assert await upgrade_status() == 503
        for c in live:
            assert (await c.req({"type": "ping"}))["type"] == "pong"
        await live.pop().close()
        for _ in range(100):
            if connections() < MAX_CONNECTIONS:
                break
            await asyncio.sleep(0.1)
        assert await upgrade_status() == 101
    finally:
        for c in live:
            await c.close()


# ------------------------------------------------------------------ origin

async def test_origin_same_host_default():
    """Without --allowed-origin: no Origin (not a browser) and a same-host
    Origin are accepted, a foreign one gets HTTP 403."""
    await wait_no_connections()
    assert await upgrade_status() == 101
    assert await upgrade_status(origin="http://127.0.0.1:%d" % PORT) == 101
    assert await upgrade_status(origin="HTTP://127.0.0.1:%d/" % PORT) == 101
    assert await upgrade_status(origin="http://127.0.0.1") == 403        # port 80 implied
    assert await upgrade_status(origin="http://evil.example") == 403
    assert await upgrade_status(origin="http://127.0.0.1:%d" % (PORT + 1)) == 403
    assert await upgrade_status(origin="null") == 403


async def test_origin_allow_list():
    """With --allowed-origin: only listed origins; same-host is then foreign."""
    assert ORIGIN_URL, "IM_GW_ORIGIN_URL not set"
    port = int(ORIGIN_URL.rsplit(":", 1)[1].strip("/"))
    assert await upgrade_status(ORIGIN_URL, origin="https://app.example") == 101
    assert await upgrade_status(ORIGIN_URL, origin="http://other.example:8443") == 101
    assert await upgrade_status(ORIGIN_URL, origin="https://evil.example") == 403
    assert await upgrade_status(ORIGIN_URL, origin="http://127.0.0.1:%d" % port) == 403
    assert await upgrade_status(ORIGIN_URL) == 101
    u, = new_user_ids(1)
    register(u, "o")
    c = await Client.open(url=ORIGIN_URL, origin="https://app.example")
    w = await c.req({"type": "hello", "token": token(u, "o")})
    assert w["type"] == "welcome", w
    await c.close()


# --------------------------------------------------------------- keepalive

def raw_ws_connect(port, path="/"):
    """A WebSocket client that never answers pings: a plain socket after the
    handshake (RFC 6455), reading nothing until asked."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall(("GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n"
               "Sec-WebSocket-Protocol: im-sync.v1\r\n\r\n" % (path, port, key)).encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(1)
        assert chunk, "closed during handshake"
        head += chunk
    assert head.startswith(b"HTTP/1.1 101"), head
    return s


def raw_send_text(s, text):
    data = text.encode()
    mask = os.urandom(4)
    hdr = bytes([0x81])
    if len(data) < 126:
        hdr += bytes([0x80 | len(data)])
    else:
        hdr += bytes([0x80 | 126]) + struct.pack("!H", len(data))
    s.sendall(hdr + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))


def raw_frames(s, timeout):
    """(opcode, payload) of every frame until the peer closes the socket."""
    s.settimeout(timeout)
    buf = b""
    while True:
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            break
        if not chunk:
            break
        buf += chunk
    frames = []
    while len(buf) >= 2:
        op, n = buf[0] & 0x0F, buf[1] & 0x7F
        off = 2
        if n == 126:
            n, off = struct.unpack("!H", buf[2:4])[0], 4
        elif n == 127:
            n, off = struct.unpack("!Q", buf[2:10])[0], 10
        frames.append((op, buf[off:off + n]))
        buf = buf[off + n:]
    return frames


async def test_idle_client_closed_1001():
    """An authenticated client that does not answer pings gets pings
    (--ping-interval 1) and then close 1001 (--idle-timeout 3)."""
    await wait_no_connections()
    u, = new_user_ids(1)
    register(u, "deaf")
    s = raw_ws_connect(PORT)
    raw_send_text(s, json.dumps({"type": "hello", "token": token(u, "deaf")}))
    frames = await asyncio.get_event_loop().run_in_executor(None, raw_frames, s, 20)
    s.close()
    ops = [op for op, _ in frames]
    assert ops and ops[0] == 0x1 and json.loads(frames[0][1])["type"] == "welcome", frames[:1]
    assert 0x9 in ops, "no ping before the close: %r" % ops
    assert ops[-1] == 0x8, "last frame is not a close: %r" % ops
    code = struct.unpack("!H", frames[-1][1][:2])[0]
    assert code == 1001, code


async def test_answering_client_stays():
    """A client whose library answers pings stays open past the idle timeout."""
    await wait_no_connections()
    u, = new_user_ids(1)
    register(u, "alive")
    c = await Client.login(u, "alive")      # websockets answers pings by itself
    await asyncio.sleep(5)                  # > --idle-timeout 3, silent on our side
    assert (await c.req({"type": "ping"}))["type"] == "pong"
    await c.close()


# ------------------------------------------------- refused hellos (item 12)

async def test_rate_refused_hello_keeps_live_session():
    """The device's hello bucket (burst 5, --hello-rate-device 0.01) is
    spent by five logins, each superseding the last; the sixth hello is
    refused (RATE_LIMITED, 4029) and must not supersede the fifth: its
    authenticate is rolled back, so the live session never gets 4008, still
    answers ping and sync, and device_session says its epoch is current."""
    await wait_no_connections()
    u, = new_user_ids(1)
    register(u, "flap")
    live = None
    for _ in range(5):
        c = await Client.login(u, "flap")
        if live is not None:
            assert (await live.wait_closed())[0] == 4008
        live = c
    ep = live.welcome["connection_epoch"]
    extra = await Client.open()
    r = await extra.req({"type": "hello", "token": token(u, "flap")})
    assert r["type"] == "error" and r["code"] == "RATE_LIMITED", r
    assert (await extra.wait_closed())[0] == 4029
    assert epoch(u, "flap") == ep, (epoch(u, "flap"), ep)
    assert current(u, "flap", ep) is True
    assert (await live.req({"type": "ping"}))["type"] == "pong"
    s = await live.req({"type": "sync", "sync_generation": live.welcome["sync_generation"],
                        "local_applied_sync_seq": 0})
    assert s["type"] == "sync_result", s
    assert (await live.req({"type": "ping"}))["type"] == "pong"   # no 4008 came meanwhile
    await live.close()


async def test_conn_cap_refused_hello_keeps_epoch():
    """--max-conn-per-user 2: with two other devices in, the third device's
    hello is refused and its connection epoch stays what it was."""
    await wait_no_connections()
    u, = new_user_ids(1)
    for d in ("a", "b", "c"):
        register(u, d)
    c = await Client.login(u, "c")
    ep_c = c.welcome["connection_epoch"]
    await c.close()
    a = await Client.login(u, "a")
    b = await Client.login(u, "b")
    third = await Client.open()
    r = await third.req({"type": "hello", "token": token(u, "c")})
    assert r["type"] == "error" and r["code"] == "RATE_LIMITED", r
    assert (await third.wait_closed())[0] == 4029
    assert epoch(u, "c") == ep_c, (epoch(u, "c"), ep_c)
    assert current(u, "c", ep_c) is True
    for x in (a, b):
        assert (await x.req({"type": "ping"}))["type"] == "pong"
        await x.close()


# ------------------------------------------------------------------ start-up

def start_gateway(*args, binary=None, env=None):
    return subprocess.Popen([binary or os.environ["IM_GW_BIN"], "--db", os.environ["IM_GW_DB"]] + list(args),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, **env) if env else None)


def healthz(url):
    ctx = ssl.create_default_context(cafile=os.environ["IM_GW_CERT"])
    for _ in range(100):
        try:
            return urllib.request.urlopen(url + "/healthz", timeout=2, context=ctx).status
        except OSError:
            time.sleep(0.1)
    return None


async def test_non_loopback_listen_needs_tls():
    """--listen 0.0.0.0 without TLS exits non-zero with a clear message;
    with --insecure, or with --tls-cert/--tls-key, it serves."""
    port = free_port("0.0.0.0")
    p = start_gateway("--listen", "0.0.0.0:%d" % port)
    _, err = p.communicate(timeout=10)
    assert p.returncode != 0, p.returncode
    assert "without TLS" in err and "--insecure" in err, err
    for extra, scheme in ((["--insecure"], "http"),
                          (["--tls-cert", os.environ["IM_GW_CERT"], "--tls-key", os.environ["IM_GW_KEY"]], "https")):
        port = free_port("0.0.0.0")
        p = start_gateway("--listen", "0.0.0.0:%d" % port, *extra)
        try:
            code = healthz("%s://127.0.0.1:%d" % (scheme, port))
            assert code == 200, (extra, code, p.poll(), p.stderr.read()[-2000:] if p.poll() is not None else "")
        finally:
            p.terminate()
            p.wait(timeout=10)
    # half a TLS configuration is refused too
    p = start_gateway("--listen", "127.0.0.1:%d" % free_port(), "--tls-cert", os.environ["IM_GW_CERT"])
    _, err = p.communicate(timeout=10)
    assert p.returncode != 0 and "--tls-key" in err, (p.returncode, err)


async def test_failed_hellos_leave_pool_usable():
    """A hello whose statement is already prepared on its pool connection
    sends BEGIN and the statement as one pipeline; when the statement fails
    (a bad token) the transaction is rolled back and the connection serves
    the next hellos and requests as before."""
    await wait_no_connections()
    a, b = new_user_ids(2)
    register(a, "pipe")
    register(b, "pipe")
    ca = await Client.login(a, "pipe")      # prepares the hello statement
    for bad in ("not-a-token", token(a, "pipe") + "x"):
        c = await Client.open()
        r = await c.req({"type": "hello", "token": bad})
        assert r["type"] == "error" and r["code"] == "NOT_AUTHENTICATED", r
        assert (await c.wait_closed())[0] == 4001
    cb = await Client.login(b, "pipe")
    for c in (ca, cb):
        r = await c.req({"type": "sync", "sync_generation": c.welcome["sync_generation"],
                         "local_applied_sync_seq": c.welcome["server_acked_sync_seq"] or 0})
        assert r["type"] == "sync_result", r
    await ca.close()
    await cb.close()


def check_max_connections_lowered():
    """--max-connections above what RLIMIT_NOFILE allows is lowered at start
    (logged), so connections past the descriptors get HTTP 503 at the
    upgrade instead of failed accepts."""
    import resource
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY:
        return
    p = start_gateway("--listen", "127.0.0.1:%d" % free_port(), "--max-connections", str(hard + 1000),
                      "--pool", "2")
    try:
        lines = []
        for line in p.stderr:
            lines.append(line)
            if "event=started" in line:
                break
        assert any("event=max_connections_lowered" in x for x in lines), lines
        started = [x for x in lines if "event=started" in x][0]
        n = int(started.split("max_connections=")[1].split()[0])
        assert 0 < n < hard, (n, hard)
    finally:
        p.terminate()
        p.wait(timeout=10)


async def test_max_connections_fits_descriptors():
    await asyncio.get_event_loop().run_in_executor(None, check_max_connections_lowered)


# ------------------------------------------- hellos waiting for a place

class HelloQueueGateway:
    """A gateway of its own whose hellos go to the database one at a time
    (--max-pending-hello 1; --pool 2 leaves one connection to hellos) with
    two places to wait behind it (--max-waiting-hello 2); no statement
    timeout, so a hello behind a locked device row stays in flight."""

    def __init__(self, hello_timeout, *limits, binary=None, env=None):
        """limits: other options, e.g. a larger --max-pending-hello; binary,
        env: another gateway build and its environment."""
        port = free_port()
        self.url = "ws://127.0.0.1:%d/" % port
        self.proc = start_gateway("--listen", "127.0.0.1:%d" % port, "--pool", "2",
                                  "--max-pending-hello", "1", "--max-waiting-hello", "2",
                                  "--hello-timeout", str(hello_timeout), "--statement-timeout", "0",
                                  *limits, binary=binary, env=env)
        for _ in range(100):
            try:
                if urllib.request.urlopen(http_url(self.url) + "/healthz", timeout=2).status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise AssertionError("hello-queue gateway did not start")

    def metric(self, name):
        body = urllib.request.urlopen(http_url(self.url) + "/metrics", timeout=5).read().decode()
        for line in body.splitlines():
            if line.startswith(name + " "):
                return int(float(line.split()[1]))
        raise AssertionError("no %s in /metrics" % name)

    async def until(self, name, value):
        for _ in range(200):
            if self.metric(name) == value:
                return
            await asyncio.sleep(0.05)
        raise AssertionError("%s is %d, not %d" % (name, self.metric(name), value))

    async def hello(self, tok, rid):
        c = await Client.open(url=self.url)
        await c.send_raw(json.dumps({"type": "hello", "id": rid, "token": tok}))
        return c

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=10)


def queue_users(n):
    """n new users with a device "q" and its token (issued before any row
    lock: issuing reads the device row)."""
    users = new_user_ids(n)
    for u in users:
        register(u, "q")
    return users, [token(u, "q") for u in users]


async def stalled_first_hello(gw, user, tok):
    """A hello (id 1) of user's device "q" in flight, stalled on its locked
    device row: every later hello has to wait behind it."""
    lock = DeviceRowLock(user, "q")
    c = await gw.hello(tok, 1)
    for _ in range(100):
        if lock.waiting() > 0:
            break
        await asyncio.sleep(0.05)
    assert lock.waiting() > 0, "the first hello did not reach the device row"
    await gw.until("im_gateway_hellos_in_flight", 1)
    return c, lock


async def test_hello_over_limit_waits_and_is_answered():
    """A hello over --max-pending-hello is not refused: it waits on its own
    connection and is welcomed once the hello in flight is answered."""
    users, toks = queue_users(2)
    gw = HelloQueueGateway(hello_timeout=60)
    lock = None
    try:
        first, lock = await stalled_first_hello(gw, users[0], toks[0])
        second = await gw.hello(toks[1], 2)
        await gw.until("im_gateway_hellos_waiting", 1)
        lock.release()
        lock = None
        for c, rid, u in ((first, 1, users[0]), (second, 2, users[1])):
            r = await c.reply(rid)
            assert r["type"] == "welcome" and r["user_id"] == u, r
        await gw.until("im_gateway_hellos_waiting", 0)
        assert gw.metric("im_gateway_hellos_waited_total") == 1
        assert gw.metric("im_gateway_refusals_total") == 0
        for c in (first, second):
            assert (await c.req({"type": "ping"}))["type"] == "pong"
            await c.close()
    finally:
        if lock:
            lock.release()
        gw.stop()


async def test_full_hello_queue_refuses_with_retry_after():
    """With --max-waiting-hello places taken, the next hello is refused at
    once (RATE_LIMITED with retry_after_ms, close 4029) and authenticates
    nothing; the waiting ones are welcomed afterwards."""
    users, toks = queue_users(4)
    e_refused = epoch(users[3], "q")
    gw = HelloQueueGateway(hello_timeout=60)
    lock = None
    try:
        first, lock = await stalled_first_hello(gw, users[0], toks[0])
        waiting = [await gw.hello(toks[1], 2), await gw.hello(toks[2], 3)]
        await gw.until("im_gateway_hellos_waiting", 2)
        extra = await gw.hello(toks[3], 4)
        r = await extra.reply(4)
        assert r["type"] == "error" and r["code"] == "RATE_LIMITED", r
        assert isinstance(r.get("retry_after_ms"), int) and r["retry_after_ms"] > 0, r
        assert (await extra.wait_closed())[0] == 4029
        assert epoch(users[3], "q") == e_refused
        lock.release()
        lock = None
        for c, rid in zip([first] + waiting, (1, 2, 3)):
            assert (await c.reply(rid))["type"] == "welcome"
            await c.close()
    finally:
        if lock:
            lock.release()
        gw.stop()


async def test_closed_waiting_hello_frees_its_place():
    """A waiting hello whose socket closes leaves the queue at once: its
    place goes to the next hello (which waits instead of being refused) and
    its own authenticate never runs (the device's epoch stays)."""
    users, toks = queue_users(4)
    e_gone = epoch(users[1], "q")
    gw = HelloQueueGateway(hello_timeout=60)
    lock = None
    try:
        first, lock = await stalled_first_hello(gw, users[0], toks[0])
        gone = await gw.hello(toks[1], 2)
        kept = await gw.hello(toks[2], 3)
        await gw.until("im_gateway_hellos_waiting", 2)
        await gone.close()
        await gw.until("im_gateway_hellos_waiting", 1)
        late = await gw.hello(toks[3], 4)
        await gw.until("im_gateway_hellos_waiting", 2)
        lock.release()
        lock = None
        for c, rid in ((first, 1), (kept, 3), (late, 4)):
            assert (await c.reply(rid))["type"] == "welcome"
            await c.close()
        assert gw.metric("im_gateway_refusals_total") == 0
        assert epoch(users[1], "q") == e_gone
    finally:
        if lock:
            lock.release()
        gw.stop()


async def test_waiting_hello_times_out_with_retry_after():
    """A hello that waited --hello-timeout for a place is refused
    (RATE_LIMITED with retry_after_ms, close 4029) while the hello ahead of
    it is still in flight; it authenticated nothing."""
    users, toks = queue_users(2)
    e_waiting = epoch(users[1], "q")
    gw = HelloQueueGateway(hello_timeout=2)
    lock = None
    try:
        first, lock = await stalled_first_hello(gw, users[0], toks[0])
        waiting = await gw.hello(toks[1], 2)
        r = await waiting.reply(2, timeout=30)
        assert r["type"] == "error" and r["code"] == "RATE_LIMITED", r
        assert isinstance(r.get("retry_after_ms"), int) and r["retry_after_ms"] > 0, r
        assert (await waiting.wait_closed())[0] == 4029
        assert lock.waiting() > 0, "the hello ahead was answered: the refusal proves nothing"
        assert gw.metric("im_gateway_hellos_waiting") == 0
        assert epoch(users[1], "q") == e_waiting
        lock.release()
        lock = None
        assert (await first.reply(1))["type"] == "welcome"
        await first.close()
    finally:
        if lock:
            lock.release()
        gw.stop()


# ------------------------------------- several hellos in one transaction

def batch_gateway():
    """A gateway whose hellos queue behind one stalled hello on its one
    hello connection (--pool 2) and then run as one batch; one connection
    per account (--max-conn-per-user 1) so a hello can be refused in it."""
    return HelloQueueGateway(60, "--max-pending-hello", "64", "--max-conn-per-user", "1")


async def queued_batch(gw, first_user, first_tok, hellos):
    """Stalls a first hello, queues hellos ((token, id) pairs) behind it,
    releases it: the queued ones run as one transaction.  Returns the
    first's client and the queued clients."""
    first, lock = await stalled_first_hello(gw, first_user, first_tok)
    try:
        queued = [await gw.hello(t, rid) for t, rid in hellos]
        await gw.until("im_gateway_hellos_in_flight", 1 + len(hellos))
        batches = gw.metric("im_gateway_hello_batches_total")
    finally:
        lock.release()
    assert (await first.reply(1))["type"] == "welcome"
    return first, queued, batches


def auth_failures():
    return sql("SELECT value FROM im.metrics() WHERE name = 'im_auth_failures_total'")[0][0]


async def test_hello_batch_fails_only_the_bad_hellos():
    """Five hellos authenticated in one transaction, two of them bad (a
    revoked device's token, a forged token): only those two get
    NOT_AUTHENTICATED/4001, both counted as failed authentications, and the
    revoked device's epoch stays; the three good ones are welcomed and
    their sessions work."""
    users, toks = queue_users(5)
    revoked_tok = toks[2]
    sql("SELECT im.revoke_device(%s, 'q')", users[2])
    e_revoked = epoch(users[2], "q")
    fails = auth_failures()
    gw = batch_gateway()
    try:
        hellos = [(toks[1], 2), (revoked_tok, 3), (toks[3], 4), ("AAAA.forged", 5), (toks[4], 6)]
        welcomed = {2: users[1], 4: users[3], 6: users[4]}   # id -> user
        first, queued, batches = await queued_batch(gw, users[0], toks[0], hellos)
        for c, (tok, rid) in zip(queued, hellos):
            r = await c.reply(rid)
            if rid in welcomed:
                assert r["type"] == "welcome" and r["user_id"] == welcomed[rid], r
            else:
                assert r["type"] == "error" and r["code"] == "NOT_AUTHENTICATED", r
                assert (await c.wait_closed())[0] == 4001
        assert gw.metric("im_gateway_hello_batches_total") == batches + 1
        assert gw.metric("im_gateway_hellos_batched_total") == 5
        assert auth_failures() == fails + 2
        assert epoch(users[2], "q") == e_revoked
        for c in [first] + [queued[0], queued[2], queued[4]]:
            assert (await c.req({"type": "ping"}))["type"] == "pong"
            await c.close()
    finally:
        gw.stop()


def faults_bin():
    """The test build with db_hello_batch.c's fault hook (gateway/Makefile)."""
    return os.environ.get("IM_GW_FAULTS_BIN") or os.path.join(
        os.path.dirname(os.environ["IM_GW_BIN"]), "im_gateway_faults")


async def test_hello_batch_failed_savepoint_welcomes_none():
    """A batch whose SAVEPOINT before its second hello fails on the server
    (im_gateway_faults, IM_GW_FAULT_BATCH_SAVEPOINT=1).  ROLLBACK TO
    SAVEPOINT would then reach the first hello's savepoint and undo it while
    its result is kept (it used to be welcomed with an epoch the database
    never kept); the batch is failed as after a failed BEGIN: both hellos
    get UNAVAILABLE/1013, none is welcomed, no epoch moves, and later hellos
    are welcomed."""
    users, toks = queue_users(3)
    before = {u: epoch(u, "q") for u in users}
    gw = HelloQueueGateway(60, "--max-pending-hello", "64", binary=faults_bin(),
                           env={"IM_GW_FAULT_BATCH_SAVEPOINT": "1"})
    try:
        hellos = [(toks[1], 2), (toks[2], 3)]
        first, queued, batches = await queued_batch(gw, users[0], toks[0], hellos)
        for c, (tok, rid) in zip(queued, hellos):
            r = await c.reply(rid)
            assert r["type"] == "error" and r["code"] == "UNAVAILABLE", r
            assert (await c.wait_closed())[0] == 1013
        assert gw.metric("im_gateway_hello_batches_total") == batches + 1
        assert epoch(users[1], "q") == before[users[1]]
        assert epoch(users[2], "q") == before[users[2]]
        again = await Client.login(users[1], "q", url=gw.url)
        assert again.welcome["connection_epoch"] == epoch(users[1], "q") == before[users[1]] + 1
        for c in (first, again):
            assert (await c.req({"type": "ping"}))["type"] == "pong"
            await c.close()
    finally:
        gw.stop()


async def test_queued_hellos_of_one_device_run_in_order():
    """A live session of a device, then two hellos of the same device (its
    one token, as a reconnecting device sends it) queued where a batch would
    take both: the second waits until the first's transaction is over
    (hello_order.h), so the live one and the first get 4008
    and the second stays current with the highest epoch, in the order the
    gateway received them.  (Hellos with two different tokens not yet
    accepted by this gateway are not ordered by their unverified claims.)"""
    users, toks = queue_users(2)
    u = users[1]
    gw = batch_gateway()
    try:
        live = await Client.login(u, "q", url=gw.url)
        ep0 = live.welcome["connection_epoch"]
        waits = gw.metric("im_gateway_hello_device_waits_total")
        tok = token(u, "q")
        hellos = [(tok, 2), (tok, 3)]
        first, (a, b), batches = await queued_batch(gw, users[0], toks[0], hellos)
        wa, wb = await a.reply(2), await b.reply(3)
        assert wa["type"] == "welcome" and wb["type"] == "welcome", (wa, wb)
        assert gw.metric("im_gateway_hello_device_waits_total") == waits + 1
        assert gw.metric("im_gateway_hello_batches_total") == batches   # not batched together
        assert ep0 < wa["connection_epoch"] < wb["connection_epoch"], (ep0, wa, wb)
        assert (await live.wait_closed())[0] == 4008
        assert (await a.wait_closed())[0] == 4008
        assert current(u, "q", wb["connection_epoch"]) is True
        assert (await b.req({"type": "ping"}))["type"] == "pong"
        for c in (first, b):
            await c.close()
    finally:
        gw.stop()


async def test_hello_batch_refused_hello_leaves_no_trace():
    """A hello refused in its batch (--max-conn-per-user 1, its account
    already has another device in) gets RATE_LIMITED/4029 and must not
    supersede: the batch is rolled back and the others run again, so the
    refused device's epoch stays, and the other hellos are welcomed once,
    each with an epoch one above what it had (the rolled-back bump left
    nothing)."""
    users, toks = queue_users(4)
    busy = users[1]
    register(busy, "other")
    gw = batch_gateway()
    try:
        in_already = await Client.login(busy, "other", url=gw.url)
        e_refused = epoch(busy, "q")
        e_ok = [epoch(users[2], "q"), epoch(users[3], "q")]
        reruns = gw.metric("im_gateway_hello_batch_reruns_total")
        hellos = [(toks[2], 3), (toks[1], 2), (toks[3], 4)]
        first, (ok1, refused, ok2), batches = await queued_batch(gw, users[0], toks[0], hellos)
        r = await refused.reply(2)
        assert r["type"] == "error" and r["code"] == "RATE_LIMITED", r
        assert (await refused.wait_closed())[0] == 4029
        for c, rid, u, e in ((ok1, 3, users[2], e_ok[0]), (ok2, 4, users[3], e_ok[1])):
            w = await c.reply(rid)
            assert w["type"] == "welcome" and w["user_id"] == u, w
            assert w["connection_epoch"] == e + 1 == epoch(u, "q"), (w, e)
        assert gw.metric("im_gateway_hello_batches_total") >= batches + 2   # the batch, then its rerun
        assert gw.metric("im_gateway_hello_batch_reruns_total") == reruns + 1
        assert epoch(busy, "q") == e_refused
        assert sql("SELECT count(*) FROM im.presence WHERE user_id = %s AND device_id = 'q'", busy)[0][0] == 0
        for u in users[2:]:   # set online by the hello's own transaction, committed with it
            assert sql("SELECT count(*) FROM im.presence WHERE user_id = %s AND device_id = 'q'", u)[0][0] == 1
        for c in (first, ok1, ok2, in_already):
            assert (await c.req({"type": "ping"}))["type"] == "pong"
            await c.close()
    finally:
        gw.stop()


async def test_stalled_handshakes_do_not_hold_back_new_connections():
    """At most 256 accepted connections are inside lws' handshake at once;
    the others wait as descriptors.  300 sockets that never send their
    upgrade request hold more than those places, yet a new client still
    upgrades and logs in at once (waiting ones are handed over in steps
    regardless), and every closed socket gives its place back.  (All from
    127.0.0.1: --max-unauth-per-ip, which also caps one address's connections
    before their upgrade, is raised out of the way.)"""
    users, _ = queue_users(1)
    gw = HelloQueueGateway(60, "--max-unauth-per-ip", "1000")
    raw = []
    try:
        for _ in range(300):
            raw.append(socket.create_connection(("127.0.0.1", int(gw.url.rsplit(":", 1)[1].strip("/")))))
        await gw.until("im_gateway_handshakes", 300)
        assert gw.metric("im_gateway_accepts_kept_back_total") >= 300 - 256
        c = await Client.login(users[0], "q", url=gw.url)
        assert (await c.req({"type": "ping"}))["type"] == "pong"
        await c.close()
        for r in raw:
            r.close()
        raw = []
        await gw.until("im_gateway_handshakes", 0)
        assert gw.metric("im_gateway_accepts_waiting") == 0
    finally:
        for r in raw:
            r.close()
        gw.stop()


TESTS = [test_hello_over_8k_not_authenticated, test_frame_while_hello_pending,
         test_unauth_per_ip_cap_503, test_global_connection_cap_503,
         test_origin_same_host_default, test_origin_allow_list,
         test_idle_client_closed_1001, test_answering_client_stays,
         test_rate_refused_hello_keeps_live_session, test_conn_cap_refused_hello_keeps_epoch,
         test_non_loopback_listen_needs_tls, test_failed_hellos_leave_pool_usable,
         test_max_connections_fits_descriptors,
         test_hello_over_limit_waits_and_is_answered, test_full_hello_queue_refuses_with_retry_after,
         test_closed_waiting_hello_frees_its_place, test_waiting_hello_times_out_with_retry_after,
         test_stalled_handshakes_do_not_hold_back_new_connections,
         test_hello_batch_fails_only_the_bad_hellos, test_hello_batch_failed_savepoint_welcomes_none,
         test_queued_hellos_of_one_device_run_in_order,
         test_hello_batch_refused_hello_leaves_no_trace]


def main():
    return run_tests(TESTS, "transport")


if __name__ == "__main__":
    sys.exit(main())
