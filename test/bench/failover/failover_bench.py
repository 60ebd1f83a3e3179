"""failover_bench.py — the failover benchmark (NOT a test); run by
test/bench/failover.sh.

A primary and a streaming standby at production durability (fsync,
synchronous_commit, full_page_writes on; test/failover/pair.py), then:

  1. send tx/s (pgbench, test/bench/send_fanout/send.sql on its 1,000
     two-member conversations, workers paused: the send path alone) with
     the standby asynchronous (synchronous_standby_names = '', a commit
     waits for the local flush only) and synchronous
     (synchronous_standby_names = the standby: it also waits for the
     standby's flush; remote_write and remote_apply as well), alternating
     short runs per mode in one run, medians, ratios against asynchronous;
  2. failover time: devices sending through the gateway on the multi-host
     conninfo, the primary's postmaster killed with kill -9 and the standby
     promoted at once (pg_ctl promote); the time from the death to the first
     successful send, and from the promotion to it; the old primary comes
     back with pg_rewind between rounds.
"""
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "failover"))
os.environ.setdefault("IM_PAIR_FSYNC", "on")
import pair as pairmod  # noqa: E402
from pair import Pair, PGBIN  # noqa: E402
from storm import Device, Stats, storm  # noqa: E402

ROUNDS = int(os.environ.get("IM_BENCH_ROUNDS", "3"))
TR = int(os.environ.get("IM_BENCH_ROUND_T", "4"))
FAILOVERS = int(os.environ.get("IM_BENCH_FAILOVERS", "3"))
SEND_DIR = os.path.join(HERE, "..", "send_fanout")


def pgbench(node, clients):
    out = subprocess.run([os.path.join(PGBIN, "pgbench"), "-n", "-h", "127.0.0.1", "-p", str(node.port),
                          "-U", "postgres", "-d", "im_test", "-f", os.path.join(SEND_DIR, "send.sql"),
                          "-c", str(clients), "-j", "2", "-T", str(TR), "-D", "set=2", "-D", "nconv=1000"],
                         capture_output=True, text=True)
    for line in out.stdout.splitlines():
        if line.startswith("tps = "):
            return float(line.split()[2])
    sys.stderr.write(out.stderr)
    return 0.0


def set_mode(pair, mode):
    """mode: async, or a synchronous_commit level with the standby named."""
    p = pair.primary
    p.q("ALTER SYSTEM SET synchronous_standby_names = %s", ("" if mode == "async" else pair.standby.name,))
    p.q("ALTER SYSTEM SET synchronous_commit = %s", ("on" if mode == "async" else mode,))
    p.q("SELECT pg_catalog.pg_reload_conf()")
    want = "async" if mode == "async" else "sync"
    deadline = time.time() + 30
    while not p.q("SELECT 1 FROM pg_catalog.pg_stat_replication WHERE sync_state = %s", (want,)):
        if time.time() > deadline:
            raise AssertionError("standby not %s" % want)
        time.sleep(0.1)
    time.sleep(0.5)


def send_rates(pair):
    modes = ["async", "on", "remote_write", "remote_apply"]
    p = pair.primary
    p.q("ALTER SYSTEM SET im_sync.fanout_paused = on")
    p.q("SELECT pg_catalog.pg_reload_conf()")
    subprocess.run([os.path.join(PGBIN, "psql"), "-X", "-q", "-h", "127.0.0.1", "-p", str(p.port), "-U",
                    "postgres", "-d", "im_test", "-v", "ON_ERROR_STOP=1", "-f", os.path.join(SEND_DIR, "setup.sql")],
                   check=True, stdout=subprocess.DEVNULL)
    for clients in (1, 8):
        got = {m: [] for m in modes}
        for _ in range(ROUNDS):
            for m in modes:
                set_mode(pair, m)
                got[m].append(pgbench(p, clients))
        base = statistics.median(got["async"])
        print("send tx/s, %d client%s (median of %d %ds runs per mode, alternating):"
              % (clients, "" if clients == 1 else "s", ROUNDS, TR))
        for m in modes:
            med = statistics.median(got[m])
            label = {"async": "asynchronous standby (synchronous_standby_names = '')",
                     "on": "synchronous standby, synchronous_commit = on",
                     "remote_write": "synchronous standby, synchronous_commit = remote_write",
                     "remote_apply": "synchronous standby, synchronous_commit = remote_apply"}[m]
            print("  %-58s %8.0f tx/s  %.2fx  (runs %s)" % (label, med, med / base if base else 0,
                                                           ", ".join("%.0f" % v for v in got[m])))
        sys.stdout.flush()
    set_mode(pair, "on")
    p.q("ALTER SYSTEM SET im_sync.fanout_paused = off")
    p.q("SELECT pg_catalog.pg_reload_conf()")


async def failovers(pair):
    p = pair.primary
    users = [9000, 9001]
    conv = p.q("SELECT im.create_conversation('group', %s)", (users,))[0][0]
    stats = Stats()
    devices = []
    for u in users:
        p.q("SELECT * FROM im.register_device(%s, 'bench')", (u,))
        tok = p.q("SELECT im.issue_device_token(%s, 'bench', '2 hours')", (u,))[0][0]
        devices.append(Device("ws://127.0.0.1:%d/" % pairmod.GATEWAY_PORT, u, "bench", tok, conv, stats))
    pair.start_clients()
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            import urllib.request
            urllib.request.urlopen("http://127.0.0.1:%d/healthz" % pairmod.GATEWAY_PORT, timeout=2)
            break
        except Exception:
            time.sleep(0.2)
    for d in devices:
        await d.catch_up()
    results = []
    for k in range(FAILOVERS):
        if k > 0:
            await asyncio.to_thread(pair.attach_old_primary_by_rewind)
            await asyncio.to_thread(set_mode, pair, "on")
        stats = Stats()
        for d in devices:
            d.stats = stats
        stop = asyncio.Event()
        task = asyncio.ensure_future(storm(devices, stop, stats))
        await asyncio.sleep(2)
        await asyncio.to_thread(pair.primary.kill9_postmaster)
        stats.death = time.monotonic()
        await asyncio.to_thread(pair.promote)
        t_promoted = time.monotonic()
        deadline = time.monotonic() + 60
        while stats.first_send_after is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        stop.set()
        fails = await task
        if stats.first_send_after is None or fails:
            print("failover %d: no successful send after the promotion (%r)" % (k + 1, fails))
            continue
        results.append((stats.first_send_after - stats.death, stats.first_send_after - t_promoted,
                        t_promoted - stats.death))
        print("failover %d (kill -9 of the primary's postmaster, pg_ctl promote at once): death -> first "
              "successful send %.2f s (promotion took %.2f s, promotion -> first send %.2f s)"
              % (k + 1, results[-1][0], results[-1][2], results[-1][1]))
        sys.stdout.flush()
    if results:
        print("failover time, median of %d: death -> first successful send %.2f s, promotion -> first send "
              "%.2f s" % (len(results), statistics.median(r[0] for r in results),
                          statistics.median(r[1] for r in results)))


def main():
    base = tempfile.mkdtemp(prefix="im_failover_bench.")
    os.chmod(base, 0o755)
    pair = Pair(base)
    try:
        pair.init_primary()
        pair.attach_standby_by_basebackup()
        v = pair.primary.q("SELECT current_setting('server_version'), current_setting('fsync'), "
                           "current_setting('full_page_writes'), current_setting('wal_sync_method')")[0]
        print("failover benchmark: PostgreSQL %s, %d cores, load average %s at start"
              % (v[0], os.cpu_count(), " ".join(open("/proc/loadavg").read().split()[:3])))
        print("durability: fsync = %s, full_page_writes = %s, wal_sync_method = %s; standby on the same "
              "machine (its flush is a local fsync, not a network round trip)" % (v[1], v[2], v[3]))
        print()
        send_rates(pair)
        print()
        asyncio.run(failovers(pair))
    finally:
        pair.stop_all()
        if not os.environ.get("IM_KEEP"):
            import shutil
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
