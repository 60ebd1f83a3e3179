"""gateway_deadlines.py — the gateway never hangs on a database that does
not answer (failover); run by failover.py on the pair before the
storm, each case with a gateway of its own:

  1. connect deadline: the conninfo's first host accepts TCP and never
     answers (a listening socket nobody serves); libpq ignores
     connect_timeout in non-blocking connects, so without the gateway's own
     deadline and host rotation it would wait there for ever.  The gateway
     must reach the primary, the second host.
  2. reply deadline: the pool's backends are frozen (SIGSTOP, processes of
     our own primary found by application_name) mid-session; a request must
     be answered UNAVAILABLE with retry_after_ms (statement timeout + grace),
     and after SIGCONT the gateway serves again.
  3. read-only server: a gateway whose conninfo reaches only the standby
     (target_session_attrs=any given on purpose): hello is answered
     UNAVAILABLE with retry_after_ms, not INTERNAL.
"""
import asyncio
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pair as pairmod
from storm import HANG_S
from imgw import Client


def start_gateway(base, name, conninfo, *extra):
    port = pairmod.free_port()
    log = open(os.path.join(base, name + ".log"), "w")
    proc = subprocess.Popen([pairmod.GATEWAY, "--listen",
                             "127.0.0.1:%d" % port, "--pool", "2", *extra, "--db", conninfo],
                            stdout=log, stderr=subprocess.STDOUT)
    return proc, port, log


stop_gateway = pairmod.stop_process


def healthy(port):
    try:
        urllib.request.urlopen("http://127.0.0.1:%d/healthz" % port, timeout=2)
        return True
    except (urllib.error.URLError, OSError):
        return False


def wait_healthy(port, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if healthy(port):
            return True
        time.sleep(0.2)
    return False


def run(pair, devices_tokens, check):
    base = pair.base
    p, s = pair.primary, pair.standby
    user, dev, tok = devices_tokens[0]

    # 1. a silent first host
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    sport = silent.getsockname()[1]
    proc, port, log = start_gateway(base, "gateway-silent-host",
                                    "host=127.0.0.1,127.0.0.1 port=%d,%d user=postgres dbname=im_test "
                                    "connect_timeout=2" % (sport, p.port))
    try:
        check(wait_healthy(port), "a first host that accepts TCP and never answers: the gateway times the "
              "attempt out (connect_timeout) and reaches the next host")
    finally:
        stop_gateway(proc, log)
        silent.close()
    text = open(os.path.join(base, "gateway-silent-host.log")).read()
    check("connect timeout" in text, "the gateway logged the connect timeout")

    # 2. frozen backends mid-session
    proc, port, log = start_gateway(base, "gateway-frozen", p.dsn().replace(" connect_timeout=3", ""),
                                    "--statement-timeout", "1000")
    frozen = []
    try:
        check(wait_healthy(port), "gateway on the primary is up")

        async def frozen_case():
            c = await Client.open("frozen", url="ws://127.0.0.1:%d/" % port)
            w = await c.req({"type": "hello", "token": tok})
            assert w["type"] == "welcome", w
            r = await c.req({"type": "conversations"})
            assert r["type"] == "conversations_result", r
            pids = [r[0] for r in p.q("SELECT pid FROM pg_catalog.pg_stat_activity "
                                      "WHERE application_name = 'im_gateway'")]
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
                frozen.append(pid)
            try:
                r = await c.req({"type": "conversations"}, timeout=HANG_S)
            except TimeoutError:
                r = None
            check(r is not None and r.get("code") == "UNAVAILABLE" and (r.get("retry_after_ms") or 0) > 0,
                  "a request on a frozen backend is answered UNAVAILABLE with retry_after_ms (%d backends "
                  "frozen), got %r" % (len(pids), r))
            for pid in frozen:
                os.kill(pid, signal.SIGCONT)
            frozen.clear()
            deadline = time.time() + 30
            while True:
                r = await c.req({"type": "conversations"})
                if r["type"] == "conversations_result" or time.time() > deadline:
                    break
                await asyncio.sleep(r.get("retry_after_ms", 500) / 1000)
            check(r["type"] == "conversations_result", "after the backends wake the gateway serves again")
            await c.close()

        asyncio.run(frozen_case())
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
        stop_gateway(proc, log)

    # 3. only the standby, target_session_attrs=any on purpose
    proc, port, log = start_gateway(base, "gateway-standby-only",
                                    s.dsn().replace(" connect_timeout=3", "") + " target_session_attrs=any")
    try:
        wait_healthy(port, timeout=10)   # a read-only server answers SELECT 1: it may say healthy

        async def standby_case():
            c = await Client.open("standby-only", url="ws://127.0.0.1:%d/" % port)
            r = await c.req({"type": "hello", "token": tok})
            check(r.get("type") == "error" and r.get("code") == "UNAVAILABLE" and (r.get("retry_after_ms") or 0) > 0,
                  "a read-only server: hello answered UNAVAILABLE with retry_after_ms, got %r" % r)

        asyncio.run(standby_case())
    finally:
        stop_gateway(proc, log)
