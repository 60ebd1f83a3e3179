"""storm.py — devices that send, sync, ACK and report reads through the
gateway for as long as they are told, across a failover.

Each device is one WebSocket session (test/e2e/imgw.py's Client, on
python3-websockets).  It does what a real client does when the database is
away: on UNAVAILABLE it waits retry_after_ms and retries the SAME request
(a send keeps its client_msg_id, so a send whose outcome was unknown is
never stored twice); on a closed session (a hello refused UNAVAILABLE with
close 1013, a 4008 after the re-check) it logs in again with the token it
was given before the failover.  A request without any reply within HANG_S
is a hang, which the suite counts as a failure (a deadline, not a timing
assertion: a working gateway answers UNAVAILABLE at once).

What each device was told is recorded, to be compared with what the new
primary holds: acknowledged sends (client_msg_id -> message_id, msg_seq),
acknowledged ACKs and read reports, and every message it had seen before
each failover (to catch an id or a position reused for other content).
"""
import asyncio
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "e2e"))
import imgw  # noqa: E402
from imgw import Client, Closed  # noqa: E402

HANG_S = 20


class Hang(Exception):
    pass


class Stats:
    """Shared by all devices of one storm."""

    def __init__(self):
        self.death = None            # monotonic time the primary was gone (its kill returned)
        self.first_send_after = None  # reply time of the first successful send requested after it
        self.unavailable = 0          # UNAVAILABLE replies (all with retry_after_ms > 0)
        self.unavailable_bad = []     # UNAVAILABLE without a usable retry_after_ms
        self.hangs = []
        self.errors = []              # any other unexpected reply
        self.relogins = 0


class Device:
    def __init__(self, url, user, device, token, conv, stats):
        self.url, self.user, self.device, self.token, self.conv = url, user, device, token, conv
        self.stats = stats
        self.name = "%s/%s" % (user, device)
        self.c = None                 # imgw.Client (one session; replaced on re-login)
        self.gen = None               # None: needs a snapshot first
        self.applied = 0
        self.msgs = {}                # message_id -> (msg_seq, body): what this device shows
        self.seen = {}                # message_id -> {(msg_seq, body)} ever shown, across resets
        self.n = 0
        self.sent = {}                # client_msg_id -> (message_id, msg_seq, monotonic time acknowledged)
        self.acked = 0                # last acked_sync_seq answered OK
        self.read_to = 0              # last read report answered
        self.resets = []              # monotonic times of RESET_REQUIRED
        self.welcome = None
        self.first_server_ack = None

    # ---- requests with the client's retry rules ----
    async def req(self, frame):
        """One request: retried after retry_after_ms while UNAVAILABLE,
        re-sent after a re-login when the session closed."""
        while True:
            try:
                if self.c is None:
                    await self.login()
                t_req = time.monotonic()
                r = await self.req_once(frame)
                if r.get("type") == "error" and r.get("code") == "UNAVAILABLE":
                    await self.unavailable(r)
                    continue
                if r.get("type") == "error" and r.get("code") == "RATE_LIMITED":
                    await asyncio.sleep(max(r.get("retry_after_ms") or 0, 1) / 1000)
                    continue
                if r.get("type") == "error":
                    raise AssertionError("%s: %s -> %r" % (self.name, frame["type"], r))
                if (frame["type"] == "send" and self.stats.death is not None and t_req > self.stats.death
                        and self.stats.first_send_after is None):
                    self.stats.first_send_after = time.monotonic()
                return r
            except (Closed, OSError, imgw.websockets.ConnectionClosed):
                await self.drop()
                await asyncio.sleep(0.2)

    async def req_once(self, frame):
        """Sends frame and returns its reply.  The gateway's RATE_LIMITED
        error carries no id (receive.c refuses the frame before reading
        it); with one request in flight per device it is that request's."""
        rid = next(imgw._ids)
        await self.c.ws.send(json.dumps(dict(frame, id=rid)))
        deadline = time.monotonic() + HANG_S
        while True:
            for f in self.c.pending:
                if f.get("id") == rid or (f.get("type") == "error" and f.get("code") == "RATE_LIMITED"
                                          and f.get("id") is None):
                    self.c.pending.remove(f)
                    return f
            left = deadline - time.monotonic()
            if left <= 0:
                raise Hang("%s: no reply to %s within %ss (unmatched frames %r)"
                           % (self.name, frame["type"], HANG_S, self.c.pending[:3]))
            try:
                f = await self.c.recv_frame(left)
            except asyncio.TimeoutError:
                continue
            if f is not None:
                self.c.pending.append(f)

    async def unavailable(self, r):
        ms = r.get("retry_after_ms")
        self.stats.unavailable += 1
        if not isinstance(ms, int) or ms <= 0:
            self.stats.unavailable_bad.append(r)
            ms = 500
        await asyncio.sleep(ms / 1000)

    async def drop(self):
        if self.c is not None:
            try:
                await self.c.close()
            except Exception:
                pass
        self.c = None

    async def login(self):
        """hello with the device's token (issued before any failover)."""
        while True:
            try:
                c = await Client.open(self.name, url=self.url)
            except OSError:
                await asyncio.sleep(0.2)
                continue
            try:
                w = await c.req({"type": "hello", "token": self.token}, timeout=HANG_S)
            except TimeoutError:
                raise Hang("%s: no reply to hello within %ss" % (self.name, HANG_S))
            except (Closed, imgw.websockets.ConnectionClosed):
                await asyncio.sleep(0.2)
                continue
            if w.get("type") == "welcome":
                self.c = c
                self.welcome = w
                self.stats.relogins += 1
                return
            await c.close()
            if w.get("code") == "UNAVAILABLE":
                await self.unavailable(w)
                continue
            raise AssertionError("%s: hello -> %r" % (self.name, w))

    # ---- the client side of the sync protocol (imgw.Client's, with retries) ----
    async def fetch_all(self, up_to=None):
        """message_id -> (msg_seq, body) of the conversation as
        fetch_messages pages it (the server's truth for this user)."""
        out, after = {}, 0
        while True:
            f = {"type": "fetch_messages", "conversation_id": self.conv, "after_seq": after, "limit": 200}
            if up_to is not None:
                f["up_to_seq"] = up_to
            r = await self.req(f)
            for m in r["messages"]:
                if m.get("kind", "message") == "message":
                    out[m["message_id"]] = (m["msg_seq"], None if m.get("recalled") else m["body"])
            if not r["has_more"]:
                return out
            after = r["next_after_seq"]

    def apply(self, e):
        if e.get("kind") == "message" and e.get("conversation_id") == self.conv:
            self.msgs[e["message_id"]] = (e["msg_seq"], None if e.get("recalled") else e["body"])
            self.seen.setdefault(e["message_id"], set()).add((e["msg_seq"], repr(e["body"])))

    async def bootstrap(self):
        """RESET_REQUIRED or a new device: snapshot, then the history up to
        the snapshot's last_msg_seq with fetch_messages (what a client
        rebuilds from); the log after the base follows in catch_up."""
        b = await self.req({"type": "snapshot_begin"})
        assert b["status"] == "READY", b
        last = 0
        for page in range(b["page_count"]):
            p = await self.req({"type": "snapshot_fetch", "snapshot_token": b["snapshot_token"], "page": page})
            if p["status"] != "OK":
                return False          # the snapshot went away under a failover: start again
            for it in p["items"]:
                if it["conversation_id"] == self.conv:
                    last = it["last_msg_seq"] or 0
        a = await self.req({"type": "snapshot_ack", "snapshot_token": b["snapshot_token"],
                            "manifest_digest": b["manifest_digest"]})
        if a["status"] != "OK":
            return False
        self.msgs = await self.fetch_all(up_to=last) if last else {}
        for mid, (seq, body) in self.msgs.items():
            self.seen.setdefault(mid, set()).add((seq, repr(body)))
        self.gen = b["sync_generation"]
        self.applied = b["base_sync_seq"]
        self.acked = a["acked_sync_seq"]
        return True

    async def catch_up(self, limit=50):
        """Sync batches and ACK each until the batch watermark reaches the
        user's; RESET_REQUIRED -> snapshot, then go on.  A batch that went
        away under a failover (its token unknown to the new primary, a
        stale generation) simply starts again from the device's state."""
        for _ in range(200):
            if self.gen is None and not await self.bootstrap():
                continue
            r = await self.req({"type": "sync", "sync_generation": self.gen,
                                "local_applied_sync_seq": self.applied, "limit": limit})
            if self.stats.death is not None and self.first_server_ack is None:
                # the server's ACK as the first sync after a death finds it
                self.first_server_ack = r["server_acked_sync_seq"] or 0
            if r["status"] == "RESET_REQUIRED":
                self.resets.append(time.monotonic())
                self.gen = None
                continue
            assert r["status"] in ("OK", "RECOVERY"), r
            page, got = r, []
            while True:
                got.extend(page["events"])
                if not page["has_more"]:
                    break
                page = await self.req({"type": "sync", "cursor": page["next_cursor"], "limit": limit})
                if page["status"] not in ("OK", "RECOVERY"):
                    break
            if page["status"] not in ("OK", "RECOVERY"):
                continue
            a = await self.req({"type": "ack", "batch_token": r["batch_token"],
                                "acked_sync_seq": r["batch_high_watermark"]})
            if a["status"] != "OK":
                continue              # STALE_GENERATION and the like: ask again
            for e in sorted(got, key=lambda e: e["sync_seq"]):
                self.apply(e)
            self.gen = r["sync_generation"]
            self.applied = r["batch_high_watermark"]
            self.acked = a["acked_sync_seq"]
            if r["user_high_watermark"] <= self.applied and r["status"] == "OK":
                return
        raise AssertionError("%s: catch_up did not converge" % self.name)

    # ---- one storm ----
    async def run(self, stop, every_sync=3):
        while not stop.is_set():
            self.n += 1
            cmid = "%s-%s-%d" % (self.user, self.device, self.n)
            r = await self.req({"type": "send", "conversation_id": self.conv, "client_msg_id": cmid,
                                "body": {"cmid": cmid}})
            self.sent[cmid] = (r["message_id"], r["msg_seq"], time.monotonic())
            if self.n % every_sync == 0:
                await self.catch_up()
                r = await self.req({"type": "read", "conversation_id": self.conv, "read_to_seq": r["msg_seq"]})
                self.read_to = max(self.read_to, r["read_msg_seq"])


async def storm(devices, stop, stats):
    """Runs every device until stop is set; returns the failures."""
    tasks = [asyncio.ensure_future(d.run(stop)) for d in devices]
    failures = []
    for d, t in zip(devices, tasks):
        try:
            await t
        except Hang as e:
            stats.hangs.append(str(e))
            failures.append(str(e))
        except Exception as e:   # noqa: BLE001 — reported and counted as a failure
            failures.append("%s: %r" % (d.name, e))
    return failures
