#!/usr/bin/env python3
"""Load generator for test/bench/gateway_bench.sh (python3-websockets, asyncio).

Modes:
  pairs SECONDS TOKENS_FILE [nolat]  devices in pairs sharing a direct conversation.
                                Throughput: each device loops send -> sync -> ack
                                (pgbench's three calls), reports sends/s, frames/s.
                                Then latency (SECONDS/2, >= 5 s): send -> partner
                                gets hint -> partner syncs + ACKs -> sends back;
                                reports send-to-hint p50/p99.
  idle TOKENS_FILE PIDFILE      open every token's session, say hello, hold them;
                                prints when all are open, waits for SIGUSR1... (see script)
  storm TOKENS_FILE             connect all at once; refusals are retried after
                                retry_after_ms (+ jitter); each device syncs and ACKs.

TOKENS_FILE lines: user_id device_id conversation_id token
"""
import asyncio
import json
import os
import random
import signal
import sys
import time

import websockets

URL = os.environ["IM_GW_URL"]


def load_tokens(path):
    rows = []
    with open(path) as f:
        for line in f:
            u, d, conv, tok = line.split()
            rows.append((int(u), d, int(conv), tok))
    return rows


class Stats:
    def __init__(self):
        self.frames_in = 0
        self.frames_out = 0
        self.sends = 0
        self.lat = []
        self.refusals = 0
        self.refusals_without_retry = 0


class Dev:
    def __init__(self, st, user, device, conv, tok):
        self.st, self.user, self.device, self.conv, self.tok = st, user, device, conv, tok
        self.ws = None
        self.rid = 0
        self.waiters = {}
        self.hint = asyncio.Event()
        self.gen = None
        self.applied = 0
        self.reader = None

    async def connect(self):
        self.ws = await websockets.connect(URL, subprotocols=["im-sync.v1"], max_size=None,
                                           ping_interval=None, close_timeout=1)
        self.reader = asyncio.ensure_future(self.read_loop())

    async def read_loop(self):
        try:
            async for raw in self.ws:
                self.st.frames_in += 1
                f = json.loads(raw)
                if f.get("type") == "hint":
                    self.hint.set()
                    continue
                w = self.waiters.pop(f.get("id"), None)
                if w and not w.done():
                    w.set_result(f)
        except websockets.ConnectionClosed:
            pass
        for w in self.waiters.values():
            if not w.done():
                w.set_exception(ConnectionError("closed"))

    async def req(self, frame):
        self.rid += 1
        frame["id"] = self.rid
        fut = asyncio.get_event_loop().create_future()
        self.waiters[self.rid] = fut
        self.st.frames_out += 1
        await self.ws.send(json.dumps(frame))
        return await fut

    async def hello(self):
        r = await self.req({"type": "hello", "token": self.tok})
        if r["type"] == "welcome":
            self.gen = r["sync_generation"]
            self.applied = r["server_acked_sync_seq"] or 0
        return r

    async def sync_ack(self):
        for _ in range(50):
            r = await self.req({"type": "sync", "sync_generation": self.gen,
                                "local_applied_sync_seq": self.applied, "limit": 200})
            if r.get("status") == "RESET_REQUIRED":
                b = await self.req({"type": "snapshot_begin"})
                for p in range(b["page_count"]):
                    await self.req({"type": "snapshot_fetch", "snapshot_token": b["snapshot_token"], "page": p})
                await self.req({"type": "snapshot_ack", "snapshot_token": b["snapshot_token"],
                                "manifest_digest": b["manifest_digest"]})
                self.gen, self.applied = b["sync_generation"], b["base_sync_seq"]
                continue
            if r.get("status") not in ("OK", "RECOVERY"):
                raise RuntimeError("sync: %r" % r)
            page = r
            while page["has_more"]:
                page = await self.req({"type": "sync", "cursor": page["next_cursor"], "limit": 200})
            a = await self.req({"type": "ack", "batch_token": r["batch_token"],
                                "acked_sync_seq": r["batch_high_watermark"]})
            if a.get("status") != "OK":
                raise RuntimeError("ack: %r" % a)
            self.gen, self.applied = r["sync_generation"], r["batch_high_watermark"]
            if r["status"] == "OK" and r["user_high_watermark"] <= self.applied:
                return
        raise RuntimeError("sync did not converge")


    async def sync_once(self):
        """One cycle's sync: sync_changes (+ pages) then ack_sync, as pgbench does."""
        r = await self.req({"type": "sync", "sync_generation": self.gen,
                            "local_applied_sync_seq": self.applied, "limit": 200})
        if r.get("status") not in ("OK", "RECOVERY"):
            await self.sync_ack()
            return
        page = r
        while page["has_more"]:
            page = await self.req({"type": "sync", "cursor": page["next_cursor"], "limit": 200})
        a = await self.req({"type": "ack", "batch_token": r["batch_token"],
                            "acked_sync_seq": r["batch_high_watermark"]})
        if a.get("status") != "OK":
            raise RuntimeError("ack: %r" % a)
        self.gen, self.applied = r["sync_generation"], r["batch_high_watermark"]


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100.0 * len(xs)))]


async def pairs(seconds, path, nolat=False):
    st = Stats()
    rows = load_tokens(path)
    devs = [Dev(st, *r) for r in rows]
    for d in devs:
        await d.connect()
        r = await d.hello()
        assert r["type"] == "welcome", r
        await d.sync_ack()
    byconv = {}
    for d in devs:
        byconv.setdefault(d.conv, []).append(d)
    # Throughput: every device loops send -> sync -> ack on its own, the same
    # three calls pgbench makes per transaction; nobody waits for fanout.
    stop = time.monotonic() + seconds
    st.frames_in = st.frames_out = 0

    async def cycle(d):
        n = 0
        while time.monotonic() < stop:
            n += 1
            res = await d.req({"type": "send", "conversation_id": d.conv,
                               "client_msg_id": "b-%d-%d-%d" % (d.user, n, random.randint(0, 1 << 30)),
                               "body": {"t": "x"}})
            assert res["type"] == "send_result", res
            await d.sync_once()
            st.sends += 1

    t0 = time.monotonic()
    await asyncio.gather(*(cycle(d) for d in devs))
    el = time.monotonic() - t0
    print("RESULT pairs devices=%d seconds=%.1f sends_per_s=%.1f frames_per_s=%.1f" %
          (len(devs), el, st.sends / el, (st.frames_in + st.frames_out) / el), flush=True)

    if nolat:
        for d in devs:
            await d.ws.close()
        return
    # Latency: ping-pong in pairs, the partner syncs on the hint; the hint
    # wait is fanout latency (workers), so this loop's rate is not the ratio.
    for d in devs:
        await d.sync_ack()
    lsecs = max(5.0, seconds / 2)
    stop = time.monotonic() + lsecs
    st.sends = 0

    async def ping_pong(a, b):
        n = 0
        while time.monotonic() < stop:
            for s, r in ((a, b), (b, a)):
                r.hint.clear()
                t0 = time.monotonic()
                n += 1
                res = await s.req({"type": "send", "conversation_id": s.conv,
                                   "client_msg_id": "h-%d-%d-%d" % (s.user, n, random.randint(0, 1 << 30)),
                                   "body": {"t": "x"}})
                assert res["type"] == "send_result", res
                try:
                    await asyncio.wait_for(r.hint.wait(), 10)
                except asyncio.TimeoutError:
                    pass          # hint lost/late: the periodic sync covers it
                else:
                    st.lat.append(time.monotonic() - t0)
                await r.sync_ack()
                st.sends += 1

    t0 = time.monotonic()
    await asyncio.gather(*(ping_pong(v[0], v[1]) for v in byconv.values() if len(v) == 2))
    el = time.monotonic() - t0
    print("RESULT hint_loop seconds=%.1f closed_loop_sends_per_s=%.1f "
          "send_to_hint_p50_ms=%.2f send_to_hint_p99_ms=%.2f" %
          (el, st.sends / el, pct(st.lat, 50) * 1000, pct(st.lat, 99) * 1000), flush=True)
    for d in devs:
        await d.ws.close()


async def idle(path, ready_file):
    st = Stats()
    rows = load_tokens(path)
    devs = [Dev(st, *r) for r in rows]
    sem = asyncio.Semaphore(200)

    async def one(d):
        async with sem:
            await d.connect()
            r = await d.hello()
            assert r["type"] == "welcome", r
    await asyncio.gather(*(one(d) for d in devs))
    with open(ready_file, "w") as f:
        f.write("%d\n" % len(devs))
    print("idle: %d sessions open" % len(devs), flush=True)
    done = asyncio.Event()
    asyncio.get_event_loop().add_signal_handler(signal.SIGTERM, done.set)
    await done.wait()
    os._exit(0)


async def storm(path):
    st = Stats()
    rows = load_tokens(path)
    devs = [Dev(st, *r) for r in rows]
    t0 = time.monotonic()

    async def one(d):
        while True:
            try:
                await d.connect()
                r = await d.hello()
            except Exception:
                await asyncio.sleep(random.uniform(0.1, 0.5))
                continue
            if r["type"] == "welcome":
                break
            if r.get("code") in ("RATE_LIMITED", "UNAVAILABLE"):
                st.refusals += 1
                if not isinstance(r.get("retry_after_ms"), int):
                    st.refusals_without_retry += 1
                await d.ws.close()
                await asyncio.sleep(r.get("retry_after_ms", 1000) / 1000 * random.uniform(1, 1.5))
                continue
            raise RuntimeError("hello: %r" % r)
        await d.sync_ack()
    await asyncio.gather(*(one(d) for d in devs))
    el = time.monotonic() - t0
    print("RESULT storm devices=%d all_caught_up_s=%.1f refusals=%d refusals_without_retry_after=%d" %
          (len(devs), el, st.refusals, st.refusals_without_retry), flush=True)
    for d in devs:
        await d.ws.close()


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "pairs":
        asyncio.run(pairs(float(sys.argv[2]), sys.argv[3], len(sys.argv) > 4 and sys.argv[4] == "nolat"))
    elif mode == "idle":
        asyncio.run(idle(sys.argv[2], sys.argv[3]))
    elif mode == "storm":
        asyncio.run(storm(sys.argv[2]))
