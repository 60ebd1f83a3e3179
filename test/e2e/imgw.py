"""Helpers for the im_gateway end-to-end tests: a small client on
python3-websockets (a client the project did not write) and psycopg2 setup.

Environment: PGHOST/PGPORT/PGUSER (the harness cluster), IM_E2E_DB (database
with im_sync), IM_GW_URL (ws://host:port/ or wss://host:port/ of the gateway
under test), IM_GW_CA (PEM certificate a wss:// gateway is trusted by; https://
through urllib trusts it too).
"""
import asyncio
import itertools
import json
import os
import random
import ssl
import sys
import time
import traceback
import urllib.request

import psycopg2
import websockets

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
from checklib import free_port, wait_until  # noqa: E402,F401  (the e2e tests take them from here)

DB = os.environ.get("IM_E2E_DB", "im_test")
URL = os.environ.get("IM_GW_URL", "ws://127.0.0.1:8080/")
HINT_TIMEOUT = float(os.environ.get("IM_E2E_HINT_TIMEOUT", "15"))
CA = os.environ.get("IM_GW_CA")
SSL_CTX = ssl.create_default_context(cafile=CA) if CA else None
if SSL_CTX:
    # urllib.request.urlopen("https://…") in the tests trusts the test CA too
    urllib.request.install_opener(urllib.request.build_opener(urllib.request.HTTPSHandler(context=SSL_CTX)))


def http_url(url=None):
    """http(s)://host:port of a ws(s):// gateway URL, without trailing '/'."""
    return (url or URL).replace("ws", "http", 1).rstrip("/")

_ids = itertools.count(1)


def pg():
    c = psycopg2.connect(dbname=DB)
    c.autocommit = True
    return c


def sql(query, *args):
    with pg() as c, c.cursor() as cur:
        cur.execute(query, args)
        try:
            return cur.fetchall()
        except psycopg2.ProgrammingError:
            return None


def new_user_ids(n):
    base = random.randint(10**9, 2 * 10**9)
    return [base + i for i in range(n)]


def register(user, device):
    sql("SELECT * FROM im.register_device(%s, %s)", user, device)


def token(user, device):
    return sql("SELECT im.issue_device_token(%s, %s, '1 hour')", user, device)[0][0]


class Closed(Exception):
    def __init__(self, code, frames):
        super().__init__("closed %s" % code)
        self.code = code
        self.frames = frames


class Client:
    """One WebSocket session.  Replies are matched by id; hints are kept
    apart (latest NEW_EVENTS high watermark and every hint frame)."""

    def __init__(self, ws, name=""):
        self.ws = ws
        self.name = name
        self.hints = []
        self.pending = []          # non-hint frames not yet consumed
        self.welcome = None
        self.gen = None            # device sync generation
        self.applied = 0           # local applied sync_seq
        self.events = {}           # sync_seq -> event
        self.hint_event = asyncio.Event()

    @classmethod
    async def open(cls, name="", subprotocol=True, url=None, **extra):
        """extra goes to websockets.connect (origin=…, extra_headers=…)."""
        url = url or URL
        kw = dict({"max_size": None, "ping_interval": None}, **extra)
        if subprotocol:
            kw["subprotocols"] = ["im-sync.v1"]
        if url.startswith("wss:"):
            kw["ssl"] = SSL_CTX
        ws = await websockets.connect(url, **kw)
        return cls(ws, name)

    @classmethod
    async def login(cls, user, device, name="", url=None):
        c = await cls.open(name or "%s/%s" % (user, device), url=url)
        w = await c.req({"type": "hello", "token": token(user, device)})
        assert w["type"] == "welcome", w
        assert w["user_id"] == user and w["device_id"] == device, w
        c.welcome = w
        return c

    async def recv_frame(self, timeout=10):
        try:
            raw = await asyncio.wait_for(self.ws.recv(), timeout)
        except websockets.ConnectionClosed:
            raise Closed(self.ws.close_code, self.pending)
        f = json.loads(raw)
        if f.get("type") == "hint":
            self.hints.append(f)
            self.hint_event.set()
            return None
        return f

    async def req(self, frame, timeout=15):
        if "id" not in frame:
            frame = dict(frame, id=next(_ids))
        await self.ws.send(json.dumps(frame))
        return await self.reply(frame["id"], timeout)

    async def reply(self, rid, timeout=15):
        loop = asyncio.get_event_loop()
        deadline = loop.time() + timeout
        while True:
            for f in self.pending:
                if f.get("id") == rid:
                    self.pending.remove(f)
                    return f
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError("no reply to %r on %s" % (rid, self.name))
            f = await self.recv_frame(left)
            if f is not None:
                self.pending.append(f)

    async def send_raw(self, data):
        await self.ws.send(data)

    async def next_frame(self, timeout=10):
        """Next non-hint frame (for replies without id)."""
        while True:
            if self.pending:
                return self.pending.pop(0)
            f = await self.recv_frame(timeout)
            if f is not None:
                return f

    async def wait_hint(self, min_hw=None, timeout=HINT_TIMEOUT):
        loop = asyncio.get_event_loop()
        deadline = loop.time() + timeout
        while True:
            for h in self.hints:
                if h.get("reason") == "NEW_EVENTS" and (min_hw is None or h["high_watermark"] >= min_hw):
                    return h
            left = deadline - loop.time()
            if left <= 0:
                return None
            try:
                f = await self.recv_frame(left)
            except asyncio.TimeoutError:
                return None
            if f is not None:
                self.pending.append(f)

    async def wait_closed(self, timeout=15):
        loop = asyncio.get_event_loop()
        deadline = loop.time() + timeout
        frames = []
        while True:
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError("%s not closed; frames %r" % (self.name, frames))
            try:
                f = await self.recv_frame(left)
            except Closed as e:
                return e.code, frames + self.pending
            except asyncio.TimeoutError:
                continue
            if f is not None:
                frames.append(f)

    async def close(self):
        await self.ws.close()

    # ---- the client side of the sync protocol ----

    async def bootstrap(self):
        """New device: snapshot, then the log after its base."""
        b = await self.req({"type": "snapshot_begin"})
        assert b["type"] == "snapshot_begin_result" and b["status"] == "READY", b
        for page in range(b["page_count"]):
            p = await self.req({"type": "snapshot_fetch", "snapshot_token": b["snapshot_token"], "page": page})
            assert p["status"] == "OK", p
            assert isinstance(p["items"], list), p
        a = await self.req({"type": "snapshot_ack", "snapshot_token": b["snapshot_token"],
                            "manifest_digest": b["manifest_digest"]})
        assert a["status"] == "OK", a
        self.gen = b["sync_generation"]
        self.applied = b["base_sync_seq"]
        await self.catch_up()

    async def catch_up(self, limit=50):
        """Sync batches (following cursors) and ACK each, until the batch
        watermark reaches the user's watermark."""
        for _ in range(100):
            r = await self.req({"type": "sync", "sync_generation": self.gen,
                                "local_applied_sync_seq": self.applied, "limit": limit})
            assert r["type"] == "sync_result", r
            if r["status"] == "RESET_REQUIRED":
                self.events.clear()
                await self.bootstrap()
                return
            assert r["status"] in ("OK", "RECOVERY"), r
            page = r
            while True:
                assert isinstance(page["events"], list), page
                for e in page["events"]:
                    self.events[e["sync_seq"]] = e
                if not page["has_more"]:
                    break
                page = await self.req({"type": "sync", "cursor": page["next_cursor"], "limit": limit})
                assert page["status"] in ("OK", "RECOVERY"), page
            a = await self.req({"type": "ack", "batch_token": r["batch_token"],
                                "acked_sync_seq": r["batch_high_watermark"]})
            assert a["type"] == "ack_result" and a["status"] == "OK", a
            self.gen = r["sync_generation"]
            self.applied = r["batch_high_watermark"]
            if r["user_high_watermark"] <= self.applied and r["status"] == "OK":
                return
        raise AssertionError("catch_up did not converge")

    def view(self, conv):
        """Message bodies by message_id as this device's log shows them
        (recalls, takedowns and edits applied)."""
        msgs = {}
        for seq in sorted(self.events):
            e = self.events[seq]
            if e.get("conversation_id") != conv:
                continue
            if e["kind"] == "message":
                msgs[e["message_id"]] = None if e["recalled"] else e["body"]
            elif e["kind"] in ("recall", "takedown"):
                msgs[e["target_message_id"]] = None
            elif e["kind"] == "edit" and e["target_message_id"] in msgs and msgs[e["target_message_id"]] is not None:
                msgs[e["target_message_id"]] = e["body"]
        return msgs


async def converge(client, conv, want, timeout=30):
    """catch_up until the client's view of conv equals want (fanout is
    asynchronous: the workers may not have delivered yet)."""
    loop = asyncio.get_event_loop()
    deadline = loop.time() + timeout
    while True:
        await client.catch_up()
        v = client.view(conv)
        if v == want:
            return v
        if loop.time() > deadline:
            raise AssertionError("%s view %r != %r" % (client.name, v, want))
        await asyncio.sleep(0.3)


async def expect(c, frame, typ):
    """c's answer to frame, which must be of type typ."""
    r = await c.req(frame)
    assert r["type"] == typ, (frame, r)
    return r


async def wait_events(c, conv, pred, timeout=30):
    """catch_up until an event of conv satisfies pred (fanout is asynchronous)."""
    loop = asyncio.get_event_loop()
    deadline = loop.time() + timeout
    while True:
        await c.catch_up()
        found = [e for e in c.events.values() if e.get("conversation_id") == conv and pred(e)]
        if found:
            return found
        assert loop.time() < deadline, "%s: no matching event in %r" % (c.name, list(c.events.values()))
        await asyncio.sleep(0.3)


async def until(what, pred, timeout=60, step=0.05):
    """wait_until for a coroutine: the event loop runs while pred() is false."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for " + what)
        await asyncio.sleep(step)


class DeviceRowLock:
    """One device's im.device row held FOR UPDATE in a transaction of its
    own, on the node dsn names (default: DB): a hello of that device waits
    there (authenticate bumps that row).  waiters() counts the sessions it
    blocks; release() ends the transaction."""

    def __init__(self, user, device, dsn=None):
        self.dsn = dsn or "dbname=%s" % DB
        self.conn = psycopg2.connect(self.dsn)
        with self.conn.cursor() as cur:
            cur.execute("SELECT pg_backend_pid()")
            self.pid = cur.fetchone()[0]
            cur.execute("SELECT 1 FROM im.device WHERE user_id = %s AND device_id = %s FOR UPDATE",
                        (user, device))
            assert cur.fetchall() == [(1,)]

    def waiters(self):
        c = psycopg2.connect(self.dsn)
        c.autocommit = True
        try:
            with c.cursor() as cur:
                cur.execute("SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                            (self.pid,))
                return cur.fetchone()[0]
        finally:
            c.close()

    def release(self):
        self.conn.rollback()
        self.conn.close()


def run_tests(tests, label="e2e", timeout=120):
    """Run each test (a coroutine function, or a plain function) in turn,
    those whose name contains one of the command-line words if any are
    given; print ok/FAIL with the time taken and a last "<label>: N failed"
    line.  Returns the exit status (1 if any failed)."""
    want = sys.argv[1:]
    failed = 0
    for t in tests:
        if want and not any(w in t.__name__ for w in want):
            continue
        t0 = time.monotonic()
        try:
            if asyncio.iscoroutinefunction(t):
                asyncio.run(asyncio.wait_for(t(), timeout))
            else:
                t()
            print("ok   %s (%.1fs)" % (t.__name__, time.monotonic() - t0), flush=True)
        except Exception:
            failed += 1
            print("FAIL %s (%.1fs)" % (t.__name__, time.monotonic() - t0), flush=True)
            traceback.print_exc()
    print("%s: %d failed" % (label, failed), flush=True)
    return 1 if failed else 0
