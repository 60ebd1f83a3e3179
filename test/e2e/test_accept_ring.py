#!/usr/bin/env python3
"""Connections waiting before lws' handshake (gateway/server/accept.c) are bounded
per peer address, by the connection cap and by their age.

  test_idle_flood_from_one_address: 3,000 raw TCP sockets from 127.0.0.2
    that never send a byte.  The gateway keeps at most --max-unauth-per-ip
    of them (waiting for a handshake place or inside the handshake) and
    closes the rest at accept; a real device from 127.0.0.1 gets `welcome`
    within 2 s, and every idle socket is closed by the gateway within 15 s
    of being opened.
  test_waiting_connections_count_against_max_connections: with
    --max-connections 300, 1,000 idle sockets (per-address cap out of the
    way): the gateway never holds more than --max-connections connections
    plus its 256 handshake places; the rest are closed at accept.
  test_waiting_connections_expire: 7,500 idle sockets from 30 addresses
    (250 each, under the per-address cap) fill the ring faster than it is
    handed to lws (64 every 50 ms while the 256 handshake places are taken):
    the ones that waited 5 s are closed (im_gateway_accepts_expired_total)
    and the ring empties.

Each test runs a gateway of its own.  The test process raises its
descriptor limit to the hard limit and needs room for the sockets (the
gateway does the same for its own).

Environment: libpq's (PGHOST/PGPORT/PGUSER), IM_E2E_DB, IM_GW_BIN (default
gateway/im_gateway).
"""
import asyncio
import http.client
import os
import resource
import select
import socket
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from imgw import DB, Client, free_port, new_user_ids, register, run_tests  # noqa: E402

GW_BIN = os.environ.get("IM_GW_BIN") or os.path.join(HERE, "..", "..", "gateway", "im_gateway")
FLOOD_FROM = "127.0.0.2"
IM_MAX_HANDSHAKES = 256            # gateway/server/accept.h


def raise_nofile(need):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < need:
        raise AssertionError("needs %d descriptors, the hard limit (ulimit -Hn) is %d" % (need, hard))
    if soft != resource.RLIM_INFINITY and soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class Gateway:
    def __init__(self, *args):
        self.port = free_port()
        self.url = "ws://127.0.0.1:%d/" % self.port
        self.proc = subprocess.Popen([GW_BIN, "--listen", "127.0.0.1:%d" % self.port, "--pool", "2",
                                      "--db", "dbname=%s" % DB] + list(args),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(100):
            try:
                if urllib.request.urlopen("http://127.0.0.1:%d/healthz" % self.port, timeout=2).status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise AssertionError("gateway did not start")

    def metrics(self):
        """The gateway's counters, over one kept-alive HTTP connection opened
        before any flood (a new one could be refused by the very caps under
        test)."""
        if not getattr(self, "scrape", None):
            self.scrape = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        self.scrape.request("GET", "/metrics")
        body = self.scrape.getresponse().read().decode()
        out = {}
        for line in body.splitlines():
            if line.startswith("im_gateway_") and " " in line:
                k, v = line.split()[:2]
                out[k] = float(v)
        return out

    def accept_queue(self):
        """Connections in the kernel's accept queue of the listen socket
        (/proc/net/tcp: state 0A, rx_queue)."""
        want = "0100007F:%04X" % self.port
        with open("/proc/net/tcp") as f:
            for line in f.readlines()[1:]:
                p = line.split()
                if p[1] == want and p[3] == "0A":
                    return int(p[4].split(":")[1], 16)
        return 0

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def open_idle(port, n, source=FLOOD_FROM):
    """n non-blocking TCP connections from source that send nothing."""
    socks = []
    for _ in range(n):
        k = socket.socket()
        k.setblocking(False)
        k.bind((source, 0))
        try:
            k.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        socks.append(k)
    return socks


class Watch:
    """Which of the sockets the gateway has closed (EOF or reset)."""

    def __init__(self, socks):
        self.poll = select.poll()
        self.by_fd = {}
        for k in socks:
            self.poll.register(k, select.POLLIN)
            self.by_fd[k.fileno()] = k
        self.open = set(self.by_fd)

    def step(self, ms):
        for fd, _ in self.poll.poll(ms):
            if fd not in self.open:
                continue
            try:
                gone = self.by_fd[fd].recv(1) == b""
            except BlockingIOError:
                gone = False
            except OSError:
                gone = True
            if gone:
                self.open.discard(fd)
                self.poll.unregister(fd)

    def until_open_at_most(self, n, deadline):
        while len(self.open) > n and time.monotonic() < deadline:
            self.step(100)
        return len(self.open)


async def accepted_all(gw, deadline):
    while gw.accept_queue() > 0:
        if time.monotonic() > deadline:
            raise AssertionError("the gateway did not take the connections off its accept queue")
        await asyncio.sleep(0.05)


async def test_idle_flood_from_one_address():
    n, cap = 3000, 256              # cap: --max-unauth-per-ip's default
    raise_nofile(n + 256)
    u, = new_user_ids(1)
    register(u, "real")
    gw = Gateway("--hello-timeout", "10")
    socks = []
    try:
        gw.metrics()
        t_open = time.monotonic()
        socks = open_idle(gw.port, n)
        watch = Watch(socks)
        await accepted_all(gw, t_open + 15)
        # the real device, from another address, is not held back behind them
        c = await asyncio.wait_for(Client.login(u, "real", url=gw.url), 2)
        m = gw.metrics()
        held = m["im_gateway_accepts_waiting"] + m["im_gateway_handshakes"]
        print("after welcome: %d waiting, %d in handshake, %d closed at accept"
              % (m["im_gateway_accepts_waiting"], m["im_gateway_handshakes"],
                 m.get("im_gateway_accepts_refused_total", 0)))
        # the flood's own connections beyond the cap were not kept
        assert held <= cap, "the gateway holds %d connections of one address (cap %d)" % (held, cap)
        assert (await c.req({"type": "ping"}))["type"] == "pong"
        left = watch.until_open_at_most(0, t_open + 15)
        assert left == 0, "%d idle sockets still open 15 s after they were opened" % left
        # the device's session is unaffected
        assert (await c.req({"type": "ping"}))["type"] == "pong"
        await c.close()
    finally:
        for k in socks:
            k.close()
        gw.stop()


async def test_waiting_connections_count_against_max_connections():
    n, max_conn = 1000, 300
    raise_nofile(n + 256)
    gw = Gateway("--max-connections", str(max_conn), "--max-unauth-per-ip", "100000")
    socks = []
    try:
        gw.metrics()
        t_open = time.monotonic()
        socks = open_idle(gw.port, n)
        watch = Watch(socks)
        await accepted_all(gw, t_open + 15)
        m = gw.metrics()
        held = m["im_gateway_accepts_waiting"] + m["im_gateway_handshakes"]
        print("%d waiting, %d in handshake, %d closed at accept"
              % (m["im_gateway_accepts_waiting"], m["im_gateway_handshakes"],
                 m.get("im_gateway_accepts_refused_total", 0)))
        assert held <= max_conn + IM_MAX_HANDSHAKES, \
            "the gateway holds %d connections (--max-connections %d)" % (held, max_conn)
        # the ones it did not keep were closed (the client sees them go)
        left = watch.until_open_at_most(max_conn + IM_MAX_HANDSHAKES, t_open + 15)
        assert left <= max_conn + IM_MAX_HANDSHAKES, left
    finally:
        for k in socks:
            k.close()
        gw.stop()


async def test_waiting_connections_expire():
    n_addr, per_addr = 30, 250
    raise_nofile(n_addr * per_addr + 256)
    gw = Gateway()
    socks = []
    try:
        gw.metrics()
        t_open = time.monotonic()
        for a in range(n_addr):
            socks += open_idle(gw.port, per_addr, "127.0.0.%d" % (10 + a))
        await accepted_all(gw, t_open + 30)
        m = gw.metrics()
        print("%d waiting, %d in handshake after the accepts"
              % (m["im_gateway_accepts_waiting"], m["im_gateway_handshakes"]))
        deadline = time.monotonic() + 30
        while m["im_gateway_accepts_waiting"] > 0:
            assert time.monotonic() < deadline, "the ring did not empty: %r" % m
            await asyncio.sleep(0.2)
            m = gw.metrics()
        print("%d expired, %d handed over" % (m["im_gateway_accepts_expired_total"],
                                              m["im_gateway_accepts_kept_back_total"]
                                              - m["im_gateway_accepts_expired_total"]))
        assert m["im_gateway_accepts_expired_total"] > 0, m
        assert m["im_gateway_accepts_refused_total"] == 0, m
    finally:
        for k in socks:
            k.close()
        gw.stop()


if __name__ == "__main__":
    sys.exit(run_tests([test_idle_flood_from_one_address,
                        test_waiting_connections_count_against_max_connections,
                        test_waiting_connections_expire], "accept ring"))
