"""checklib.py — what the Python check scripts under test/ share (the
worker, maintenance, router and shard checks, the failover pair, the e2e
helpers): ok/FAIL lines that are collected, one autocommit session with
query helpers, bounded polling for a condition (never a timed assertion),
a free TCP port, and the kill -9 of a postmaster."""
import os
import signal
import socket
import subprocess
import time

import psycopg2

failures = []


def check(ok, what, detail=""):
    print(("ok   " if ok else "FAIL ") + what + (f" ({detail})" if detail and not ok else ""), flush=True)
    if not ok:
        failures.append(what)
    return ok


def section(fn):
    """A decorator that runs fn now: an exception in it is one FAIL line, and
    the script's next section still runs."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - a broken section must not hide the others
        check(False, f"section {fn.__name__} ran to its end", f"{type(e).__name__}: {e}")
    return fn


def connect(dbname="im_test", **kw):
    """An autocommit connection; dbname is a database name or, holding an
    '=', a whole conninfo (as libpq reads dbname)."""
    c = psycopg2.connect(dbname, **kw) if "=" in dbname else psycopg2.connect(dbname=dbname, **kw)
    c.autocommit = True
    return c


def queries(default):
    """q (all rows, or None for a command) and q1 (the first value) that run
    on the connection default (or the one a function default returns, for a
    script that replaces it) unless conn= names another one."""
    def q(sql, args=None, conn=None):
        cur = (conn or (default() if callable(default) else default)).cursor()
        cur.execute(sql, args)
        return cur.fetchall() if cur.description else None

    def q1(sql, args=None, conn=None):
        rows = q(sql, args, conn)
        return rows[0][0] if rows else None
    return q, q1


def q_on(conn, sql, args=None):
    """All rows of sql on conn as dicts (column name -> value), or None for a
    command: the shard checks, which talk to several connections at once."""
    import psycopg2.extras
    with conn.cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cur:
        cur.execute(sql, args)
        return cur.fetchall() if cur.description else None


def q1_on(conn, sql, args=None):
    """The first value of sql's first row on conn, or None."""
    rows = q_on(conn, sql, args)
    return list(rows[0].values())[0] if rows else None


class Session:
    """One autocommit connection: q (all rows, or None for a command),
    row (the first row) and q1 (the first value)."""

    def __init__(self, dbname="im_test", **kw):
        self.db = connect(dbname, **kw)
        self.cur = self.db.cursor()

    def q(self, sql, args=None):
        self.cur.execute(sql, args)
        return self.cur.fetchall() if self.cur.description else None

    def row(self, sql, args=None):
        rows = self.q(sql, args)
        return rows[0] if rows else None

    def q1(self, sql, args=None):
        r = self.row(sql, args)
        return r[0] if r else None

    def set_system(self, name, value):
        """ALTER SYSTEM SET name = value (RESET when value is None), then a
        reload, so every process of the server sees it."""
        if value is None:
            self.q(f"ALTER SYSTEM RESET {name}")
        else:
            self.q(f"ALTER SYSTEM SET {name} = %s", (value,))
        self.q("SELECT pg_catalog.pg_reload_conf()")


class ShardsDir:
    """What test/harness/shards.sh wrote in its directory: nodes, (name, conninfo)
    in its order (names and conn alike), clusters (a directory per cluster:
    the nodes' first, in the same order) and standbys (node -> (its data
    directory, its port))."""

    def __init__(self, path):
        def lines(name):
            try:
                with open(os.path.join(path, name)) as f:
                    return [line.strip() for line in f if line.strip()]
            except FileNotFoundError:
                return []
        self.nodes = [tuple(line.split(" ", 1)) for line in lines("nodes")]
        self.names = [n for n, _ in self.nodes]
        self.conn = dict(self.nodes)
        self.clusters = lines("clusters")
        self.standbys = {s[0]: (s[1], s[2]) for s in (line.split() for line in lines("standbys"))}

    def data_dir(self, node):
        """The data directory of node's first cluster (its primary at the start)."""
        return os.path.join(dict(zip(self.names, self.clusters))[node], "data")


def wait_for(pred, timeout, step=0.1):
    """pred() until it is true or timeout seconds passed; its last value."""
    end = time.time() + timeout
    while time.time() < end:
        v = pred()
        if v:
            return v
        time.sleep(step)
    return pred()


def wait_until(what, pred, timeout=60, step=0.1):
    """pred() until it is true (returned), or AssertionError naming what
    after timeout seconds: a bounded wait, never a timed assertion."""
    deadline = time.time() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.time() > deadline:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(step)


def free_port(host="127.0.0.1"):
    """A TCP port free on host right now (the kernel's pick), for a server
    the test starts itself; "0.0.0.0" for a --listen 0.0.0.0 (a port free on
    127.0.0.1 may be bound on another loopback address by a load generator)."""
    s = socket.socket()
    s.bind((host, 0))
    p = s.getsockname()[1]
    s.close()
    return p


def running(pid):
    """pid exists and is not a zombie waiting to be reaped."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def kill9_postmaster(datadir, grace=10):
    """kill -9 of the postmaster of datadir alone; its children notice the
    postmaster's death and exit by themselves.  One still busy after `grace`
    seconds (a checkpointer in a long fsync, say) is SIGKILLed too, as the
    machine crash this stands for would: an orphan would hold the data
    directory and its shared memory.  Only children of that very postmaster
    pid are signalled.  Returns how many children had to be killed (the
    failover, standby and ack-window drills share this one)."""
    with open(os.path.join(datadir, "postmaster.pid")) as f:
        pid = int(f.readline())
    kids = [int(p) for p in subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)],
                                           capture_output=True, text=True).stdout.split()]
    os.kill(pid, signal.SIGKILL)
    if wait_for(lambda: not [k for k in kids if running(k)], grace):
        return 0
    alive = [k for k in kids if running(k)]
    for k in alive:
        try:
            os.kill(k, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_for(lambda: not [k for k in alive if running(k)], 30, step=0.05)
    return len(alive)
