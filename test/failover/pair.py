"""pair.py — a PostgreSQL primary and its streaming standby on free ports in
one temp directory, plus the client processes (the gateway, later the push
relay) that reach them through one multi-host conninfo.

The servers run as the `postgres` OS user when we are root (PostgreSQL
refuses root), like test/harness/cluster.sh.  Every process this module signals is
one it started: a node's postmaster pid comes from its own postmaster.pid,
and after a `kill -9` of a postmaster only the children of that very pid
are waited for.

Replication is PostgreSQL's own: pg_basebackup -R with a physical
replication slot, synchronous or not by synchronous_standby_names on the
primary; an old primary comes back as the new primary's standby with
pg_rewind (wal_log_hints = on), as extension/doc/operations.md describes.
"""
import os
import subprocess
import sys

import psycopg2

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
from checklib import free_port, kill9_postmaster, wait_until  # noqa: E402

PGBIN = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True).stdout.strip()
AS_SERVER = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# the gateway under test (IM_FAILOVER_GATEWAY: another build, e.g. to see a check fail)
GATEWAY = os.environ.get("IM_FAILOVER_GATEWAY", os.path.join(ROOT, "gateway", "im_gateway"))
# The push relay follows the primary like the gateway; failover.py
# starts a stub push gateway and sets PUSH_URL before the clients start
RELAY = os.path.join(ROOT, "gateway", "im_push_relay")
RELAY_KEY = os.path.join(ROOT, "test", "push", "relay_key.pem")
RELAY_PUB = os.path.join(ROOT, "test", "push", "relay_pub.pem")
PUSH_URL = None
DB = "im_test"


def run(cmd, **kw):
    return subprocess.run(AS_SERVER + cmd, check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, **kw)


# What every node runs with: the harness's settings (test/harness/cluster.sh) plus
# streaming replication; the log prefix names the backend type (%b), so a
# fanout worker's lines read "im_sync fanout worker ERROR: ...".  fsync is off in the suite like the other suites
# (a throwaway cluster; `kill -9` and `-m immediate` lose no page the OS
# has) and on in the benchmark (IM_PAIR_FSYNC=on: production durability).
NODE_CONF = """
listen_addresses = '127.0.0.1'
max_connections = 100
shared_buffers = 64MB
max_worker_processes = 16
fsync = @FSYNC@
synchronous_commit = on
full_page_writes = on
shared_preload_libraries = 'im_sync'
im_sync.database = 'im_test'
im_sync.fanout_workers = 2
log_line_prefix = '%m [%p] %b %q%a '
log_min_messages = warning
wal_level = replica
max_wal_senders = 5
max_replication_slots = 5
hot_standby = on
wal_log_hints = on
wal_keep_size = 256MB
im_sync.push_public_key_file = '@PUSH_PUB@'
im_sync.push_delay = 0
im_sync.push_min_interval = 0
"""


class Node:
    def __init__(self, base, name):
        self.name = name
        self.dir = os.path.join(base, name)
        self.data = os.path.join(self.dir, "data")
        self.log = os.path.join(self.dir, "server.log")
        self.port = free_port()
        os.makedirs(self.dir)
        if AS_SERVER:
            subprocess.run(["chown", "postgres", self.dir], check=True)

    def pg_ctl(self, *args):
        run([os.path.join(PGBIN, "pg_ctl"), "-D", self.data, "-l", self.log, "-w", "-t", "90", *args])

    def write_conf(self, extra=""):
        """Our settings after whatever initdb/pg_basebackup wrote (the last one wins)."""
        conf = NODE_CONF.replace("@FSYNC@", os.environ.get("IM_PAIR_FSYNC", "off")).replace("@PUSH_PUB@", RELAY_PUB) + "port = %d\nunix_socket_directories = '%s'\n%s\n" % (self.port, self.dir, extra)
        run(["sh", "-c", "cat >> '%s/postgresql.conf'" % self.data], input=conf)

    def dsn(self, db=DB):
        return "host=127.0.0.1 port=%d user=postgres dbname=%s connect_timeout=3" % (self.port, db)

    def connect(self, db=DB):
        c = psycopg2.connect(self.dsn(db))
        c.autocommit = True
        return c

    def q(self, sql, args=None, db=DB):
        c = self.connect(db)
        try:
            with c.cursor() as cur:
                cur.execute(sql, args)
                return cur.fetchall() if cur.description else []
        finally:
            c.close()

    def in_recovery(self):
        return self.q("SELECT pg_catalog.pg_is_in_recovery()")[0][0]

    def stop_immediate(self):
        """pg_ctl -m immediate: every process quits at once, no checkpoint."""
        self.pg_ctl("-m", "immediate", "stop")

    def kill9_postmaster(self, grace=10):
        """kill -9 of this node's postmaster, as a machine crash
        (checklib.kill9_postmaster); the number of children that had to be
        killed too."""
        return kill9_postmaster(self.data, grace)

    def wait_ready(self, timeout=90, primary=None):
        """Until the node answers (and, when primary is given, is or is not in recovery)."""
        def ready():
            try:
                return self.in_recovery() != primary if primary is not None else self.q("SELECT 1") == [(1,)]
            except psycopg2.Error:
                return False
        wait_until("%s ready" % self.name, ready, timeout)


class Pair:
    """nodes[0] starts as the primary; `primary` and `standby` follow promotions."""

    def __init__(self, base):
        self.base = base
        self.nodes = [Node(base, "a"), Node(base, "b")]
        self.primary, self.standby = self.nodes
        self.clients = []

    # ---- building ----
    def init_primary(self):
        p = self.primary
        run([os.path.join(PGBIN, "initdb"), "-D", p.data, "-A", "trust", "-U", "postgres", "-E", "UTF8",
             "--locale=C.UTF-8"])
        # replication connections from 127.0.0.1 (initdb's trust lines cover "replication" locally)
        p.write_conf()
        p.pg_ctl("start")
        p.q("CREATE DATABASE im_test", db="postgres")
        p.q("SET client_min_messages = warning; CREATE EXTENSION im_sync CASCADE")
        # the workers started before im_test existed and failed to connect
        # (FATAL, restart): log checks start after the setup
        self.log_checked_from = {p.name: os.path.getsize(p.log), self.standby.name: 0}

    def slot_name(self, node):
        return "standby_" + node.name

    def attach_standby_by_basebackup(self):
        """A fresh standby: a slot on the primary, pg_basebackup -R -S."""
        p, s = self.primary, self.standby
        p.q("SELECT pg_catalog.pg_create_physical_replication_slot(%s)", (self.slot_name(s),))
        run([os.path.join(PGBIN, "pg_basebackup"), "-h", "127.0.0.1", "-p", str(p.port), "-U", "postgres",
             "-D", s.data, "-R", "-S", self.slot_name(s), "-X", "stream", "-c", "fast"])
        s.write_conf("cluster_name = '%s'" % s.name)
        s.pg_ctl("start")
        s.wait_ready(primary=False)
        self.wait_streaming()

    def attach_old_primary_by_rewind(self):
        """The old primary (now `standby`, stopped or killed) rewound onto
        the new primary's timeline and started as its standby."""
        p, s = self.primary, self.standby
        slot = self.slot_name(s)
        if not p.q("SELECT 1 FROM pg_catalog.pg_replication_slots WHERE slot_name = %s", (slot,)):
            p.q("SELECT pg_catalog.pg_create_physical_replication_slot(%s)", (slot,))
        # pg_rewind reads the source's timeline from its control file, which
        # names the new timeline only after the promotion's checkpoint: without
        # this it may find "no rewind required" and the node then cannot follow
        p.q("CHECKPOINT")
        pidfile = os.path.join(s.data, "postmaster.pid")
        if os.path.exists(pidfile):  # a kill -9ed postmaster leaves it; pg_rewind's crash recovery needs it gone
            run(["rm", "-f", pidfile])
        out = run([os.path.join(PGBIN, "pg_rewind"), "-D", s.data, "-R",
                   "--source-server=" + p.dsn("postgres").replace(" connect_timeout=3", "")]).stdout
        with open(os.path.join(self.base, "pg_rewind.log"), "a") as f:
            f.write(out)
        s.write_conf("cluster_name = '%s'" % s.name)
        # pg_rewind copied the source's postgresql.auto.conf (it may name the
        # source's own old slot); this line, after -R's, wins
        run(["sh", "-c", "echo \"primary_slot_name = '%s'\" >> '%s/postgresql.auto.conf'" % (slot, s.data)])
        s.pg_ctl("start")
        s.wait_ready(primary=False)
        self.wait_streaming()

    def wait_streaming(self, timeout=60):
        wait_until("standby %s streaming" % self.standby.name,
                   lambda: self.primary.q("SELECT 1 FROM pg_catalog.pg_stat_replication WHERE state = 'streaming' "
                                          "AND application_name = %s", (self.standby.name,)), timeout)

    # ---- modes ----
    def set_synchronous(self, on):
        """synchronous_standby_names names the standby: a commit returns
        only once the standby has flushed it (synchronous_commit = on)."""
        value = self.standby.name if on else ""
        self.primary.q("ALTER SYSTEM SET synchronous_standby_names = %s", (value,))
        self.primary.q("SELECT pg_catalog.pg_reload_conf()")
        want = "sync" if on else "async"
        wait_until("standby " + want,
                   lambda: self.primary.q("SELECT 1 FROM pg_catalog.pg_stat_replication WHERE sync_state = %s "
                                          "AND application_name = %s", (want, self.standby.name)), 30)

    def wait_standby_caught_up(self, timeout=60):
        """Until the standby has replayed the primary's current WAL position."""
        lsn = self.primary.q("SELECT pg_catalog.pg_current_wal_lsn()::text")[0][0]
        wait_until("the standby's replay up to " + lsn,
                   lambda: self.standby.q("SELECT pg_catalog.pg_last_wal_replay_lsn() >= %s::pg_lsn", (lsn,))[0][0],
                   timeout, step=0.05)

    def cut_replication(self):
        """The standby stops streaming (primary_conninfo emptied, reload):
        an asynchronous standby that falls behind."""
        self.standby.q("ALTER SYSTEM SET primary_conninfo = ''")
        self.standby.q("SELECT pg_catalog.pg_reload_conf()")
        wait_until("replication stopped",
                   lambda: not self.primary.q("SELECT 1 FROM pg_catalog.pg_stat_replication "
                                              "WHERE application_name = %s", (self.standby.name,)), 30)

    def promote(self):
        """pg_ctl promote on the standby; the roles swap."""
        self.standby.pg_ctl("promote")
        self.standby.wait_ready(primary=True)
        self.primary, self.standby = self.standby, self.primary
        # the old primary's slot on the new primary is created when it comes back
        # (attach_old_primary_by_rewind); a promoted standby has no slots.

    # ---- the processes that follow the primary ----
    def conninfo(self):
        """Both nodes, the writable one wins: what every client process gets."""
        return ("host=%s port=%s user=postgres dbname=%s target_session_attrs=read-write connect_timeout=2"
                % (",".join("127.0.0.1" for _ in self.nodes), ",".join(str(n.port) for n in self.nodes), DB))

    def start_clients(self):
        """The client processes on the multi-host conninfo (client_processes below)."""
        for name, argv in client_processes(self):
            log = open(os.path.join(self.base, name + ".log"), "w")
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
            self.clients.append((name, proc, log))

    def stop_all(self):
        for name, proc, log in self.clients:
            stop_process(proc, log)
        for n in self.nodes:
            if os.path.exists(os.path.join(n.data, "postmaster.pid")):
                try:
                    n.pg_ctl("-m", "immediate", "stop")
                except subprocess.CalledProcessError:
                    pass


def stop_process(proc, log):
    """SIGTERM (the gateway drains), SIGKILL after 10 s; closes its log."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
    log.close()


GATEWAY_PORT = free_port()


def client_processes(pair):
    """(name, argv) of every process that must follow the primary: the
    gateway and (with a stub push gateway) the push relay, both on
    pair.conninfo()."""
    procs = [
        ("gateway", [GATEWAY, "--listen", "127.0.0.1:%d" % GATEWAY_PORT,
                     "--pool", "4", "--rate", "10000", "--burst", "10000", "--db", pair.conninfo()]),
    ]
    if PUSH_URL:
        procs.append(("relay", [RELAY, "--db", pair.conninfo(), "--url", PUSH_URL, "--relay-id", "failover",
                                "--key", RELAY_KEY, "--lease", "3", "--poll", "1", "--timeout", "1500"]))
    return procs
