#!/usr/bin/env python3
"""Sharding: offline push across nodes.  A message from a user
on node1 to offline users on node2 and node3 is fanned out there through
the transfers, queued as push jobs on the recipients' nodes, which NOTIFY
im_sync_push on themselves; the relay, connected to the router, listens
on every node (test_node_listen.py shows a node's wake-up alone starting a
claim; here --poll 2 also covers a job whose push_delay outlasts the
NOTIFY: the nodes' long-running fanout workers keep their own settings),
claims through the router
(claim_push_jobs: a total over the nodes), sends to the stub push gateway
and completes each job through the router (complete_push_job routes by
the job id's bucket).  The message is sent with a trace id (contract §21):
each recipient's node keeps it on the push job, the router's
claim_push_jobs hands it to the relay, and the relay's line about each
job's delivery names it.

Run by test/suites/70-shards.sh (libpq's environment names the router,
IM_SHARDS_DIR is test/harness/shards.sh's).  Settings go to every node through
`test/harness/shards.sh set`.  Every wait has a deadline.
"""
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from imgw import register, sql, wait_until as wait_for  # noqa: E402

TMP = os.environ.get("IM_TMP", "/tmp")
PUB = os.path.join(ROOT, "test", "push", "relay_pub.pem")
KEY = os.path.join(ROOT, "test", "push", "relay_key.pem")
ROUTER = os.environ["IM_ROUTER_DSN"]
PROCS = []


def shards_set(name, value):
    subprocess.run(["bash", os.path.join(ROOT, "test", "harness", "shards.sh"), "set", name, value], check=True,
                   stdout=subprocess.DEVNULL)


def nnodes():
    with open(os.path.join(os.environ["IM_SHARDS_DIR"], "nodes")) as f:
        return len([line for line in f if line.strip()])


def user_on(node, n, base):
    """A user id whose bucket (id % 64) is on node k (bucket b on node b % n + 1)."""
    return next(u for u in range(base, base + 64) if u % 64 % n + 1 == node)


def main():
    n = nnodes()
    shards_set("im_sync.push_public_key_file", PUB)
    shards_set("im_sync.push_delay", "0")
    shards_set("im_sync.push_min_interval", "0")
    stub_out = os.path.join(TMP, "push-stub-shards.out")
    PROCS.append(subprocess.Popen([sys.executable, os.path.join(HERE, "push_stub.py"), "--port", "0"],
                                  stdout=open(stub_out, "w"), stderr=subprocess.STDOUT))
    port = wait_for("the stub push gateway", lambda: next(
        (line.split()[2] for line in open(stub_out) if "listening" in line), None), 30)
    stub = "http://127.0.0.1:%s" % port
    relay_log = os.path.join(TMP, "push-relay-shards.log")
    PROCS.append(subprocess.Popen([os.path.join(ROOT, "gateway", "im_push_relay"), "--db", ROUTER, "--key", KEY,
                                   "--url", stub + "/_matrix/push/v1/notify", "--poll", "2",
                                   "--relay-id", "shards"],
                                  stdout=open(relay_log, "w"), stderr=subprocess.STDOUT))
    log = lambda: open(relay_log).read()  # noqa: E731
    wait_for("the relay listening on every node", lambda: log().count("event=node_listen_ready") >= n)

    base = random.randint(10**6, 10**7) * 64
    sender, r2, r3 = user_on(1, n, base), user_on(2, n, base + 64), user_on(3 if n >= 3 else 2, n, base + 128)
    keys = {}
    for u in (sender, r2, r3):
        register(u, "phone")
    for u in (r2, r3):
        keys[u] = "ok-shards-%d" % u
        sql("SELECT im.register_push_target(%s, 'phone', 'fcm', 'app', %s)", u, keys[u])
    conv = sql("SELECT im.create_conversation('group', %s::bigint[], %s)", [sender, r2, r3], sender)[0][0]
    trace = "push-shards-%d" % base
    sql("SELECT * FROM im.send_message(%s, %s, 'push-shards', %s::jsonb, trace_id => %s)", sender, conv,
        json.dumps({"text": "to the other nodes"}), trace)
    # the nodes' fanout workers carry it (no run_fanout: the wait below is on the push itself)

    def received():
        reqs = json.load(urllib.request.urlopen(stub + "/_stub/requests", timeout=10))
        return [r for r in reqs if any(k in json.dumps(r) for k in keys.values())]
    wait_for("pushes for both recipients", lambda: all(
        any(k in json.dumps(r) for r in received()) for k in keys.values()))
    print("ok   the stub received a push for each recipient (users on node2 and node%d)" % (3 if n >= 3 else 2))
    wait_for("both jobs completed through the router", lambda: log().count("state=delivered") >= 2)
    print("ok   both jobs completed through the router (complete_push_job routed by id)")
    # the trace id reached the relay with each job: both jobs' delivery
    # lines name it (the trace id is this test's own: no other job's line
    # can; without it the lines say trace_id=- and the wait runs out)
    def traced():
        return [ln for ln in log().splitlines()
                if (" trace_id=%s " % trace) in ln and "event=completed" in ln and "state=delivered" in ln]
    wait_for("both jobs' delivery lines with the message's trace id", lambda: len(traced()) >= 2)
    assert len({ln.split(" job=")[1].split()[0] for ln in traced()}) == 2, traced()
    print("ok   each job claimed through the router carries the message's trace id to the relay's lines")
    return 0


if __name__ == "__main__":
    rc = 1
    try:
        rc = main()
    except Exception:
        import traceback
        traceback.print_exc()
        p = os.path.join(TMP, "push-relay-shards.log")
        if os.path.exists(p):
            print("--- relay log\n" + "".join(open(p).readlines()[-20:]))
    finally:
        for p in PROCS:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
    print("push shards: %s" % ("ok" if rc == 0 else "FAILED"))
    sys.exit(rc)
