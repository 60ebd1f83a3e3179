"""drill_lib.py — shared helpers of the fault drills (design doc §19.4).

Every drill runs against the harness cluster (PGHOST/PGPORT/PGUSER/PGDATA/
IM_TMP from test/harness/run_checks.sh) in database im_test, where the fanout
workers live.  Drills only ever touch processes of $PGDATA: the postmaster
pid comes from $PGDATA/postmaster.pid, backend pids from pg_stat_activity of
that very server.  Each drill prints the injected fault, the invariant it
checks and the outcome, and ends with im.reconcile() = 0 rows.
"""
import os
import signal
import subprocess
import sys
import time

import psycopg2

DB = "im_test"
WORKER_TYPE = "im_sync fanout worker"
PGDATA = os.environ["PGDATA"]
IM_TMP = os.environ["IM_TMP"]
PGBIN = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True).stdout.strip()
AS_SERVER = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

failures = []


def say(msg):
    print(msg, flush=True)


def drill(name, fault, invariant):
    say("")
    say(f"--- drill {name}")
    say(f"    fault:     {fault}")
    say(f"    invariant: {invariant}")


def check(ok, what):
    say(f"    {'ok  ' if ok else 'FAIL'}  {what}")
    if not ok:
        failures.append(what)
    return ok


def skip(name, why):
    say(f"--- drill {name}")
    say(f"    SKIP: {why}")


def connect(db=DB, autocommit=True, timeout=5):
    conn = psycopg2.connect(dbname=db, connect_timeout=timeout)
    conn.autocommit = autocommit
    return conn


def q(sql, args=None, db=DB):
    conn = connect(db)
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return cur.fetchall() if cur.description else []
    finally:
        conn.close()


def q1(sql, args=None, db=DB):
    rows = q(sql, args, db)
    return rows[0][0] if rows else None


def implemented(sql, args=None):
    """False when the call raises 'not implemented yet' (a part not landed)."""
    try:
        q(sql, args)
        return True
    except psycopg2.Error as e:
        if "not implemented" in str(e):
            return False
        raise


def wait_ready(timeout=90):
    """Wait until the server accepts connections to im_test again."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            conn = connect(timeout=2)
            conn.cursor().execute("SELECT 1")
            conn.close()
            return True
        except psycopg2.Error:
            time.sleep(0.2)
    return False


def wait_for(what, cond, timeout=60, step=0.25):
    """Polls cond() until it returns a true value (returned) or the deadline
    passes (a failed check; the last value is returned); says how long it
    took."""
    t0 = time.monotonic()
    while True:
        v = cond()
        if v:
            say(f"    ..    {what} ({time.monotonic() - t0:.1f} s)")
            return v
        if time.monotonic() - t0 > timeout:
            check(False, f"{what}: not within {timeout:.0f} s")
            return v
        time.sleep(step)


def kill9(pid):
    """SIGKILL one backend of OUR server (the pid came from its pg_stat_activity)."""
    os.kill(pid, signal.SIGKILL)


def checkpointer_pid():
    return q1("SELECT pid FROM pg_catalog.pg_stat_activity WHERE backend_type = 'checkpointer'")


def kill9_and_wait_restart(pid, timeout=90):
    """SIGKILL a backend and wait until the postmaster's crash restart is over.

    A connection right after the kill can still reach the old server
    generation (the postmaster has not reaped the child yet) and the next
    one then finds "the database system is in recovery mode".  The restart
    replaces the checkpointer, so wait until it has a new pid."""
    old = checkpointer_pid()
    kill9(pid)
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if checkpointer_pid() not in (None, old):
                return wait_ready(max(1, deadline - time.time()))
        except psycopg2.Error:
            pass
        time.sleep(0.1)
    return False


def pg_ctl(*args):
    subprocess.run(AS_SERVER + [os.path.join(PGBIN, "pg_ctl"), "-D", PGDATA, "-l",
                                os.path.join(IM_TMP, "server.log"), "-w", "-t", "90", *args],
                   check=True, stdout=subprocess.DEVNULL)


def worker_pids():
    return [r[0] for r in q("SELECT pid FROM pg_catalog.pg_stat_activity WHERE backend_type = %s",
                            (WORKER_TYPE,))]


def set_paused(paused):
    q(f"ALTER SYSTEM SET im_sync.fanout_paused = {'on' if paused else 'off'}")
    q("SELECT pg_catalog.pg_reload_conf()")


def restore_settings():
    q("ALTER SYSTEM RESET ALL")
    q("ALTER SYSTEM SET im_sync.fanout_paused = on")
    q("SELECT pg_catalog.pg_reload_conf()")


def pending():
    return q1("SELECT count(*) FROM im.outbox WHERE state = 'pending'")


def wait_drained(timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if pending() == 0:
                return True
        except psycopg2.Error:
            wait_ready()
        time.sleep(0.2)
    return False


def run_fanout_until_drained(max_rounds=100):
    for _ in range(max_rounds):
        if q1("SELECT im.run_fanout()") == 0 and pending() == 0:
            return True
    return pending() == 0


def reconcile_zero():
    rows = q("SELECT check_name, severity, conversation_id, user_id, detail::text FROM im.reconcile()")
    for r in rows[:20]:
        say(f"    reconcile: {r}")
    return check(len(rows) == 0, f"SELECT count(*) FROM im.reconcile() = 0 (got {len(rows)})")


def finish(name):
    if failures:
        say(f"=== {name}: FAILED ({len(failures)}): {failures}")
        sys.exit(1)
    say(f"=== {name}: nothing acknowledged lost; reconcile clean")
    sys.exit(0)
