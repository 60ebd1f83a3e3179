"""transfer_check.py <shards-dir> — node-level transfer checks of sharding
against `test/harness/shards.sh up 3` (the 70-shards suite runs it):

  baseline      conversations on all three nodes, members spread over the
                three, sends on every node at once (two or three conversation
                nodes fan out to the same users concurrently); drained: every
                user's log on its node holds exactly the positions the
                conversation node's periods give it, once, each conversation
                in msg_seq order, sync_seq gap-free (reconcile)
  disabled      a subscription disabled while its source sends, then enabled
  replay        every transfer to one node delivered a second time (its rows
                re-inserted on the sources): nothing changes, all acked again
  stop          immediate stop of one node during a send storm on the other
                two, restart: nothing acknowledged lost or doubled
  slot_limit    a slot reaching max_slot_wal_keep_size: detected by
                reconcile, repaired by `test/harness/shards.sh resubscribe`
  poison        a transfer that fails to apply is quarantined and holds the
                later ones of its conversation (other conversations flow);
                after the cause is gone it is retried, all apply in order
  key_reuse     one sender reuses a client_msg_id in conversations on all
                three nodes (contract §15): the user node holding copies of
                two delivers all three; each node keeps (sender, key) IS409
  prune         maintenance prunes applied transfer records and acks; a
                replay after pruning changes nothing; a transfer sent before
                the pruning horizon and never applied is quarantined

Each drill ends with every node's im.reconcile() empty.  Waits are bounded
polls (never timed assertions)."""
import json
import re
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import psycopg2  # noqa: E402
from checklib import ShardsDir, check, failures, wait_for  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SHARDS = os.path.join(HERE, "..", "harness", "shards.sh")
DIR = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("IM_SHARDS_DIR")
if not DIR:
    sys.exit("usage: transfer_check.py <shards-dir>")
SHARDS_DIR = ShardsDir(DIR)
NODES = SHARDS_DIR.nodes  # (name, conninfo)
CLUSTERS = SHARDS_DIR.clusters
N = len(NODES)
NAMES = [n for n, _ in NODES]
CONN = dict(NODES)


def node_of(id_):
    return NAMES[(id_ % 64) % N]


def connect(node):
    c = psycopg2.connect(CONN[node])
    c.autocommit = True
    return c


class Node:
    def __init__(self, name):
        self.name = name
        self.c = None

    def q(self, sql, args=None):
        for attempt in range(2):
            try:
                if self.c is None or self.c.closed:
                    self.c = connect(self.name)
                cur = self.c.cursor()
                cur.execute(sql, args)
                return cur.fetchall() if cur.description else None
            except psycopg2.OperationalError:
                self.c = None
                if attempt:
                    raise

    def q1(self, sql, args=None):
        r = self.q(sql, args)
        return r[0][0] if r else None


node = {n: Node(n) for n in NAMES}


def pending_all():
    return [tuple(node[n].q("SELECT * FROM im.shard_pending()")[0]) for n in NAMES]


def drain(timeout=120):
    """run_fanout on every node until shard_pending is 0 everywhere."""
    def done():
        for n in NAMES:
            node[n].q("SELECT im.run_fanout()")
        return all(p == (0, 0, 0) for p in pending_all())
    return wait_for(done, timeout, step=0.2)


def reconcile_empty(what):
    rows = {n: node[n].q("SELECT check_name, severity, conversation_id, user_id, detail::text FROM im.reconcile()")
            for n in NAMES}
    bad = {n: r for n, r in rows.items() if r}
    check(not bad, f"{what}: every node's reconcile is empty", str(bad)[:600])


# ---- the world: users spread over the nodes, conversations on every node
USERS = list(range(3000, 3030))          # 30 users, 10 per node (bucket % 3)
CONVS = {n: [] for n in NAMES}           # conversation ids by owning node
SENT = []                                # (conversation, client_msg_id) acknowledged
LATE = set()                             # (conversation, msg_seq) delivered late on purpose (poison)
sent_lock = threading.Lock()


def members_for(i):
    # 7 members from all three nodes, overlapping between conversations
    return sorted({USERS[(i * 3 + k * 4) % len(USERS)] for k in range(7)})


def setup():
    for n in NAMES:
        for i in range(4):
            c = node[n].q1("SELECT im.create_conversation('group', %s)", (members_for(i + 4 * NAMES.index(n)),))
            check(node_of(c) == n, f"conversation {c} created on {n} carries a bucket of {n}")
            CONVS[n].append(c)
    # a remote member leaves one conversation and joins again: a new period
    c0 = CONVS[NAMES[0]][0]
    m = [u for u in members_for(0) if node_of(u) != NAMES[0]][0]
    node[NAMES[0]].q("SELECT * FROM im.leave_conversation(%s, %s)", (c0, m))
    node[NAMES[0]].q("SELECT * FROM im.join_conversation(%s, %s)", (c0, m))


def members_of(n, conv):
    return [r[0] for r in node[n].q(
        "SELECT DISTINCT user_id FROM im.membership_period WHERE conversation_id = %s AND leave_seq IS NULL", (conv,))]


def send(n, conv, sender, tag, text=None):
    cid = f"{tag}-{conv}-{time.time_ns()}"
    node[n].q("SELECT * FROM im.send_message(%s, %s, %s, %s)",
              (sender, conv, cid, json.dumps({"text": text or tag})))
    with sent_lock:
        SENT.append((conv, cid))
    return cid


def send_round(tag, count, nodes=None):
    """count messages into every conversation of the given nodes, one thread
    per node, so several conversation nodes fan out to the same users at once."""
    errors = []

    def run(n):
        try:
            sess = Node(n)
            for k in range(count):
                for conv in CONVS[n]:
                    ms = members_of(n, conv)
                    cid = f"{tag}-{conv}-{k}"
                    sess.q("SELECT * FROM im.send_message(%s, %s, %s, %s)",
                           (ms[k % len(ms)], conv, cid, json.dumps({"text": tag, "k": k})))
                    with sent_lock:
                        SENT.append((conv, cid))
                sess.q("SELECT im.run_fanout()")
        except psycopg2.Error as e:
            errors.append(f"{n}: {str(e).splitlines()[0]}")
    ts = [threading.Thread(target=run, args=(n,)) for n in (nodes or NAMES)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return errors


EXPECTED_SQL = """
SELECT p.user_id, e.conversation_id, e.msg_seq FROM im.event e
LEFT JOIN im.event t ON t.message_id = e.target_message_id
JOIN im.membership_period p ON p.conversation_id = e.conversation_id
 AND ((p.join_seq <= COALESCE(t.msg_seq, e.msg_seq)
       AND (p.leave_seq IS NULL OR p.leave_seq >= COALESCE(t.msg_seq, e.msg_seq)))
      OR (e.kind = 'leave' AND p.leave_event_id = e.message_id))
WHERE e.conversation_id = ANY(%s)"""


def verify(what, late=frozenset()):
    """every user's received positions (its node) = the conversation nodes' periods"""
    expected = set()
    for n in NAMES:
        for row in node[n].q(EXPECTED_SQL, (CONVS[n],)):
            expected.add(tuple(row))
    got = []
    by_node = {n: [u for u in USERS if node_of(u) == n] for n in NAMES}
    allconvs = [c for n in NAMES for c in CONVS[n]]
    out_of_order = 0
    for n, users in by_node.items():
        rows = node[n].q("SELECT user_id, conversation_id, msg_seq FROM im.shard_received_positions(%s)", (users,))
        last = {}
        for u, c, s in rows:
            if c not in allconvs:
                continue
            got.append((u, c, s))
            if (u, c) in last and s < last[(u, c)] and (c, s) not in late and (c, s) not in LATE:
                out_of_order += 1
            last[(u, c)] = max(s, last.get((u, c), 0))
    gotset = set(got)
    check(len(got) == len(gotset), f"{what}: no position twice in any log", f"{len(got) - len(gotset)} doubled")
    missing = expected - gotset
    extra = gotset - expected
    check(not missing, f"{what}: every position the periods give reached its user's node",
          f"{len(missing)} missing, e.g. {sorted(missing)[:5]}")
    check(not extra, f"{what}: no position beyond the periods", f"{len(extra)} extra, e.g. {sorted(extra)[:5]}")
    check(out_of_order == 0, f"{what}: each conversation in msg_seq order in every log", f"{out_of_order}")
    # nothing acknowledged was lost: every acked send is a position of its conversation
    # (a sender may reuse a client_msg_id in another node's conversation, and
    # a node holds copies of those: the key is (conversation, client_msg_id))
    acked = {}
    for conv, cid in SENT:
        acked.setdefault(node_of(conv), []).append((conv, cid))
    lost = 0
    for n, keys in acked.items():
        have = node[n].q1("SELECT count(*) FROM im.event e JOIN unnest(%s::bigint[], %s::text[]) k(c, id)"
                          " ON e.conversation_id = k.c AND e.client_msg_id = k.id",
                          ([c for c, _ in keys], [i for _, i in keys]))
        lost += len(keys) - have
    check(lost == 0, f"{what}: every acknowledged send is stored once on its conversation node", f"{lost} lost")


def facts(conv_node, message_id):
    """message_audience on the conversation node + shard_message_facts on
    every user's node: {user: in_sync_scope}"""
    audience = [r[0] for r in node[conv_node].q("SELECT user_id FROM im.message_audience(%s)", (message_id,))]
    out = {}
    for n in NAMES:
        mine = [u for u in audience if node_of(u) == n]
        if mine:
            for u, accepted, in_scope, synced, read in node[n].q(
                    "SELECT * FROM im.shard_message_facts(%s, %s)", (message_id, mine)):
                out[u] = in_scope
    return audience, out


def metric(n, name, labels=None):
    """The value of one series of im.metrics() (labels: a dict, None for none)."""
    return node[n].q1("SELECT value FROM im.metrics() WHERE name = %s AND labels IS NOT DISTINCT FROM %s::jsonb",
                      (name, None if labels is None else json.dumps(labels)))


def sub_name(src, dst):
    return f"im_{src}_to_{dst}"


def on_sub(dst, src, action):
    name = sub_name(src, dst)
    node[dst].q(f"ALTER SUBSCRIPTION {name} {action}")
    if action == "DISABLE":
        # the apply worker stops at its next look at the catalog: wait for it
        check(wait_for(lambda: node[dst].q1("SELECT count(*) FROM pg_stat_subscription "
                                            "WHERE subname = %s AND pid IS NOT NULL", (name,)) == 0, 60),
              f"subscription {name} stopped")


def server(i, *args):
    data = os.path.join(CLUSTERS[i], "data")
    cmd = ["pg_ctl", "-D", data, "-l", os.path.join(CLUSTERS[i], "server.log"), "-w", "-t", "60"] + list(args)
    if os.getuid() == 0:
        cmd = ["runuser", "-u", "postgres", "--"] + cmd
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


# ---------------------------------------------------------------- drills
def drill_fanout_plan():
    """The transfer write's plan stays cheap: with no statistics on the
    one-row im.shard_config its estimate once passed jit_optimize_above_cost
    and every fanout batch with remote recipients spent ~1.5 s compiling
    (the router's slow model steps).  auto_explain shows the plans of the
    statements run_fanout runs, as NOTICEs to this session."""
    a = NAMES[0]
    c = connect(a)
    cur = c.cursor()
    for sql in ("LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
                "SET auto_explain.log_nested_statements = on", "SET auto_explain.log_level = notice",
                "SET client_min_messages = notice", "SET jit = on"):
        cur.execute(sql)
    conv = next(cv for cv in CONVS[a] if any(node_of(u) != a for u in members_of(a, cv)))
    ms = members_of(a, conv)
    cur.execute("SELECT * FROM im.send_message(%s, %s, %s, %s)",
                (ms[0], conv, f"plan-{conv}-{time.time_ns()}", json.dumps({"text": "plan"})))
    # a worker may take the item first: send again until this session wrote a transfer
    def wrote():
        c.notices.clear()
        cur.execute("SELECT * FROM im.send_message(%s, %s, %s, %s)",
                    (ms[0], conv, f"plan-{conv}-{time.time_ns()}", json.dumps({"text": "plan"})))
        cur.execute("SELECT im.run_fanout()")
        return [n for n in c.notices if "Insert on transfer_out" in n]
    plans = wait_for(wrote, 60, step=0)
    check(plans, "fanout_plan: run_fanout wrote a transfer in this session (auto_explain saw it)")
    # the estimate grows with the data (4.9e8 before cfg's LIMIT 1, 1.5e5
    # after the other harnesses even with it): JIT must be off whatever it is
    costs = [float(m.group(1)) for p in plans for m in [re.search(r"Insert on transfer_out .*?cost=[0-9.]+\.\.([0-9.]+)", p)] if m]
    print(f"     transfer write plan costs {costs}", flush=True)
    check(costs and not any("JIT:" in p for p in plans),
          "fanout_plan: the transfer write is never JIT-compiled (jit = on in this session)",
          f"costs {costs}; " + (plans or [""])[0][:1200])
    c.close()
    check(drain(), "fanout_plan: drained", str(pending_all()))


def drill_ack_before_visible():
    """An ack may reach the source before the transfer it acknowledges is
    visible there (logical decoding sends a transaction once its commit
    record is flushed, before the committer leaves the proc array).  It was
    dropped, and the transfer stayed unacked forever (the model test's
    "node1: 1 transfer unacked").  Made real here: the transfer row's
    transaction is held open while its ack arrives.  The row's destination
    is a name no publication carries, so nothing leaves the node."""
    a = NAMES[0]
    t = connect(a)
    t.autocommit = False
    cur = t.cursor()
    cur.execute("""INSERT INTO im.transfer_out (source_node, dest_node, outbox_id, conversation_id, msg_seq,
                                               source_event_id, payload)
                   VALUES (%s, 'nodeack', 0, 0, 0, 0, '{}') RETURNING transfer_id""", (a,))
    tid = cur.fetchone()[0]
    # the ack, as the apply worker inserts it: a superuser session in the
    # replica role plays the apply worker (transfer_trust.c; a plain
    # session's insert is refused)
    node[a].q("SET session_replication_role = replica")
    node[a].q("INSERT INTO im.transfer_ack (source_node, transfer_id, applied_by) VALUES (%s, %s, 'nodeack')",
              (a, tid))
    # the same ack once more (a replay): never a unique-key conflict
    node[a].q("INSERT INTO im.transfer_ack (source_node, transfer_id, applied_by) VALUES (%s, %s, 'nodeack')",
              (a, tid))
    node[a].q("RESET session_replication_role")
    t.commit()
    t.close()
    # the next apply pass settles it (this run_fanout's, or a worker's when
    # a worker holds the applier's lock)
    left = wait_for(lambda: node[a].q1("SELECT CASE WHEN im.run_fanout() >= 0 THEN count(*) END"
                                       " FROM im.transfer_out WHERE transfer_id = %s", (tid,)) == 0, 30)
    check(left, "ack_before_visible: an ack that arrived before its transfer was visible still settles it",
          f"{tid} still in im.transfer_out")
    check(wait_for(lambda: node[a].q1("SELECT im.run_fanout() >= 0 AND count(*) = 0 FROM im.transfer_ack "
                                      "WHERE source_node = %s AND applied_by = 'nodeack'", (a,)), 30),
          "ack_before_visible: the held ack is gone once matched")
    check(drain(), "ack_before_visible: drained", str(pending_all()))


def drill_baseline():
    errors = send_round("base", 3)
    check(not errors, "baseline: concurrent sends on all nodes succeed", str(errors[:2]))
    # relations cross nodes too: an edit, a recall (the target's copies become
    # tombstones) and a reaction in one conversation of every node
    recalled = []
    for n in NAMES:
        conv = CONVS[n][0]
        msgs = node[n].q("SELECT message_id, msg_seq, sender_id FROM im.event WHERE conversation_id = %s "
                         "AND kind = 'message' ORDER BY msg_seq LIMIT 3", (conv,))
        (m1, s1, u1), (m2, s2, u2), (m3, s3, u3) = msgs
        node[n].q("SELECT * FROM im.edit_message(%s, %s, %s, %s, %s)", (u1, conv, f"ed-{conv}", m1, '{"text": "edited"}'))
        node[n].q("SELECT * FROM im.recall_message(%s, %s, %s, %s)", (u2, conv, f"rc-{conv}", m2))
        reactor = next(u for u in members_of(n, conv) if u != u3)
        node[n].q("SELECT * FROM im.react(%s, %s, %s, 'ok', true, %s)", (reactor, conv, m3, f"re-{conv}"))
        recalled.append(m2)
    check(drain(), "baseline: drained (shard_pending 0 on every node)", str(pending_all()))
    for n in NAMES:
        bad = node[n].q1("SELECT count(*) FROM im.event WHERE message_id = ANY(%s) "
                         "AND (NOT recalled OR body IS NOT NULL)", (recalled,))
        held = node[n].q1("SELECT count(*) FROM im.event WHERE message_id = ANY(%s)", (recalled,))
        check(held > 0 and bad == 0, f"baseline: on {n} every copy of a recalled message is a tombstone",
              f"{bad} of {held}")
    verify("baseline")
    # the concurrency item: users fed by two or three conversation nodes at
    # once have one gap-free sync_seq sequence (1..head, each number once)
    multi = 0
    for n in NAMES:
        users = [u for u in USERS if node_of(u) == n]
        for u, sources, cnt, distinct, top, head in node[n].q("""
              SELECT i.user_id, count(DISTINCT i.conversation_id %% 64 %% 3), count(*),
                     count(DISTINCT i.sync_seq), max(i.sync_seq), h.high_watermark
              FROM im.inbox i JOIN im.user_head h USING (user_id)
              WHERE i.user_id = ANY(%s) GROUP BY i.user_id, h.high_watermark""", (users,)):
            if sources >= 2:
                multi += 1
                check(cnt == distinct == top == head,
                      f"baseline: user {u} (fed by {sources} conversation nodes) has sync_seq 1..{head} gap-free",
                      f"{cnt} rows, {distinct} distinct, max {top}, head {head}")
    check(multi >= 10, f"baseline: {multi} users were fed by several conversation nodes at once")
    reconcile_empty("baseline")


def drill_disabled():
    a, b = NAMES[0], NAMES[1]
    on_sub(b, a, "DISABLE")
    before = node[a].q1("SELECT count(*) FROM im.transfer_out WHERE dest_node = %s", (b,))
    send_round("dis", 3, nodes=[a])
    # a worker may hold a batch: wait until the node's own outbox is drained
    wait_for(lambda: node[a].q1("SELECT im.run_fanout() >= 0 AND outbox_pending = 0 FROM im.shard_pending()"), 60)
    held = node[a].q1("SELECT count(*) FROM im.transfer_out WHERE dest_node = %s", (b,))
    check(held > before, f"disabled: {a}'s transfers to {b} wait while the subscription is disabled", f"{held}")
    check(metric(a, "im_shard_transfers_unacked") >= held, "disabled: im.metrics shows the unacked transfers")
    conv = next(c for c in CONVS[a] if any(node_of(u) == b for u in members_of(a, c)))
    mid = node[a].q1("SELECT message_id FROM im.event WHERE conversation_id = %s AND kind = 'message' "
                     "ORDER BY msg_seq DESC LIMIT 1", (conv,))
    audience, scope = facts(a, mid)
    check(set(scope) == set(audience), "disabled: every user of the audience has facts on its node")
    check(all(not v for u, v in scope.items() if node_of(u) == b) and
          all(v for u, v in scope.items() if node_of(u) == a),
          f"disabled: in_sync_scope false on {b} until applied there, true on {a}", str(scope))
    check(not node[b].q("SELECT 1 FROM im.reconcile() WHERE severity = 'critical'"),
          "disabled: nothing critical meanwhile")
    on_sub(b, a, "ENABLE")
    check(drain(), "disabled: drained after enabling", str(pending_all()))
    audience, scope = facts(a, mid)
    check(scope and all(scope.values()), "disabled: in_sync_scope true everywhere once applied", str(scope))
    verify("disabled")
    reconcile_empty("disabled")


# What a replay must not change: every user's log but its receipts, which
# the readers' ACKs on other nodes keep producing meanwhile (contract §20;
# cumulative, so one more changes nothing a device shows).
LOG_SIZE_SQL = "SELECT count(*) FROM im.inbox WHERE kind <> 'receipt'"


def drill_replay():
    d = NAMES[2]
    srcs = [n for n in NAMES if n != d]
    for s in srcs:
        on_sub(d, s, "DISABLE")
    send_round("rep", 3, nodes=srcs)
    # one run_fanout is not enough: a worker may hold a batch (SKIP LOCKED),
    # so the transfers were written only after the capture below (it once
    # captured none): wait until each source's outbox is drained
    for s in srcs:
        check(wait_for(lambda: node[s].q1("SELECT im.run_fanout() >= 0 AND outbox_pending = 0 FROM im.shard_pending()"),
                       60), f"replay: {s}'s outbox drained")
    saved = {s: node[s].q1("SELECT COALESCE(jsonb_agg(to_jsonb(t)), '[]') FROM im.transfer_out t WHERE dest_node = %s",
                           (d,)) for s in srcs}
    nsaved = sum(len(v) for v in saved.values())
    check(nsaved > 0, f"replay: {nsaved} transfers to {d} captured on their sources")
    for s in srcs:
        on_sub(d, s, "ENABLE")
    check(drain(), "replay: first delivery drained", str(pending_all()))
    head_before = node[d].q1(LOG_SIZE_SQL)
    dup_before = node[d].q1("SELECT coalesce(sum(duplicates), 0) FROM im.transfer_in")
    for s in srcs:   # every transfer a second time: the rows again on the source
        node[s].q("INSERT INTO im.transfer_out SELECT * FROM jsonb_populate_recordset(NULL::im.transfer_out, %s)",
                  (json.dumps(saved[s]),))
    check(drain(), "replay: second delivery drained and acknowledged again", str(pending_all()))
    dups = node[d].q1("SELECT coalesce(sum(duplicates), 0) FROM im.transfer_in") - dup_before
    check(dups == nsaved, f"replay: {d} recognised every replayed transfer as a duplicate", f"{dups} of {nsaved}")
    check(node[d].q1(LOG_SIZE_SQL) == head_before, "replay: no log moved")
    verify("replay")
    reconcile_empty("replay")


def drill_stop():
    victim = NAMES[2]
    others = [n for n in NAMES if n != victim]
    stop = threading.Event()
    errors = []
    refused = []

    def storm(n):
        sess = Node(n)
        k = 0
        while not stop.is_set():
            for conv in CONVS[n]:
                ms = members_of(n, conv)
                cid = f"storm-{conv}-{k}"
                try:
                    sess.q("SELECT * FROM im.send_message(%s, %s, %s, %s)",
                           (ms[k % len(ms)], conv, cid, json.dumps({"text": "storm"})))
                    with sent_lock:
                        SENT.append((conv, cid))
                except psycopg2.Error as e:
                    errors.append(f"{n}: {str(e).splitlines()[0]}")
            k += 1
    ts = [threading.Thread(target=storm, args=(n,)) for n in others]
    for t in ts:
        t.start()
    wait_for(lambda: len(SENT) > 0 and False, 1.0)   # let the storm start
    server(NAMES.index(victim), "-m", "immediate", "stop")
    mark = len(SENT)
    # the stopped node's own conversations fail fast; the others' sends go on
    try:
        psycopg2.connect(CONN[victim], connect_timeout=2).close()
    except psycopg2.OperationalError:
        refused.append(victim)
    wait_for(lambda: len(SENT) > mark + 20, 30)
    check(len(SENT) > mark, "stop: sends to conversations on the other nodes succeed while one node is down",
          f"{len(SENT) - mark}")
    check(refused == [victim], f"stop: {victim} refuses connections while down")
    server(NAMES.index(victim), "start")
    node[victim].c = None
    stop.set()
    for t in ts:
        t.join()
    check(not errors, "stop: no send on the running nodes failed", str(errors[:2]))
    check(drain(180), "stop: drained after the restart", str(pending_all()))
    verify("stop")
    reconcile_empty("stop")


def drill_slot_limit():
    a, b = NAMES[0], NAMES[1]
    slot = sub_name(a, b)
    # small enough to reach quickly here; other slots of the node may reach it
    # too if their subscriber lags (each is detected and repaired the same way)
    node[a].q("ALTER SYSTEM SET max_slot_wal_keep_size = '32MB'")
    node[a].q("SELECT pg_reload_conf()")
    on_sub(b, a, "DISABLE")
    before = node[a].q1("SELECT count(*) FROM im.transfer_out WHERE dest_node = %s", (b,))
    send_round("slot", 2, nodes=[a])
    # One run_fanout is not enough: a worker may hold a batch (SKIP LOCKED) or
    # a batch may have backed off (lock timeout), so the items' transfers
    # would be written only after the check below (the race that once failed
    # it).  Wait until a's outbox is drained and the transfers to b exist.
    check(wait_for(lambda: node[a].q1("SELECT im.run_fanout() >= 0 AND outbox_pending = 0 FROM im.shard_pending()"),
                   60), f"slot_limit: {a}'s outbox drained")
    held = node[a].q1("SELECT count(*) FROM im.transfer_out WHERE dest_node = %s", (b,))
    check(held > before, f"slot_limit: {a} holds transfers for {b} before its slot is lost", f"{before} -> {held}")
    node[a].q("CREATE TABLE IF NOT EXISTS public.wal_filler (x text)")

    def lost():
        node[a].q("INSERT INTO public.wal_filler SELECT repeat('x', 1000) FROM generate_series(1, 5000)")
        node[a].q("SELECT pg_switch_wal()")
        node[a].q("CHECKPOINT")
        return node[a].q1("SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s", (slot,)) == "lost"
    check(wait_for(lost, 120, step=0.2), f"slot_limit: slot {slot} lost its WAL (max_slot_wal_keep_size)")
    names = [r[0] for r in node[a].q("SELECT check_name FROM im.reconcile()")]
    check("replication_slot_lost" in names, f"slot_limit: {a}'s reconcile reports the lost slot", str(names))
    check(metric(a, "im_shard_slot_lost", {"slot": slot}) == 1, "slot_limit: im.metrics shows the lost slot")
    check(metric(a, "im_replication_slot_retained_bytes", {"slot": slot}) == 0,
          "slot_limit: the lost slot retains no WAL (im_replication_slot_retained_bytes)")
    check(node[a].q1("SELECT count(*) FROM im.transfer_out WHERE dest_node = %s", (b,)) >= held,
          "slot_limit: the transfers it held are still there, unacknowledged")
    check(node[a].q1("SELECT transfers_unacked FROM im.shard_pending()") >= held,
          "slot_limit: shard_pending counts them")
    node[a].q("DROP TABLE public.wal_filler")
    node[a].q("ALTER SYSTEM RESET max_slot_wal_keep_size")
    node[a].q("SELECT pg_reload_conf()")
    # the documented repair, for every slot reconcile reports lost
    env = dict(os.environ, IM_SHARDS_DIR=DIR)
    for (detail,) in node[a].q("SELECT detail FROM im.reconcile() WHERE check_name = 'replication_slot_lost'"):
        _, src, _, dst = detail["slot_name"].split("_")
        subprocess.run(["bash", SHARDS, "resubscribe", src, dst], check=True, env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    check(drain(), "slot_limit: drained after `shards.sh resubscribe`", str(pending_all()))
    verify("slot_limit")
    reconcile_empty("slot_limit")


def drill_poison():
    """A transfer that fails to apply on its destination is quarantined there
    with its error and retried with fanout's backoff; like a failing outbox
    item on one node it holds the later transfers of ITS conversation on that
    node (they wait, pending and acknowledged, never applied out of msg_seq
    order), while other conversations and the subscription flow.  Once the
    cause is gone and it is retried, it and the held ones apply in order."""
    a, b = NAMES[0], NAMES[1]
    node[b].q("""CREATE FUNCTION public.refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN IF NEW.body->>'text' = 'poison' THEN RAISE EXCEPTION 'poison message %', NEW.message_id; END IF;
      RETURN NEW; END $$""")
    node[b].q("CREATE TRIGGER refuse_poison BEFORE INSERT ON im.event FOR EACH ROW EXECUTE FUNCTION public.refuse_poison()")
    with_b = [c for c in CONVS[a] if any(node_of(u) == b for u in members_of(a, c))]
    conv, other = with_b[0], with_b[1]
    ms = members_of(a, conv)
    send(a, conv, ms[0], "poison", "poison")
    poison_seq = node[a].q1("SELECT head_msg_seq FROM im.conversation WHERE conversation_id = %s", (conv,))
    for k in range(3):
        send(a, conv, ms[k % len(ms)], "after-poison")
    other_ms = members_of(a, other)
    for k in range(2):
        send(a, other, other_ms[k % len(other_ms)], "beside-poison")
    other_head = node[a].q1("SELECT head_msg_seq FROM im.conversation WHERE conversation_id = %s", (other,))
    check(drain(), "poison: everything else drained (the poison one and those it holds are acknowledged)",
          str(pending_all()))
    q = node[b].q("SELECT check_name, detail->>'error', (detail->>'holds')::int, detail ? 'next_attempt_at' "
                  "FROM im.reconcile() WHERE check_name IN ('transfer_quarantined', 'transfer_dead')")
    check(len(q) == 1 and q[0][0] == "transfer_quarantined" and "poison message" in (q[0][1] or "")
          and q[0][2] == 3 and q[0][3],
          f"poison: {b}'s reconcile shows it with its error, retried, holding the 3 later transfers", str(q))
    later = node[b].q1("SELECT count(*) FROM im.inbox WHERE conversation_id = %s AND msg_seq > %s",
                       (conv, poison_seq))
    check(later == 0, f"poison: the later positions of its conversation wait on {b}", f"{later} delivered")
    beside = node[b].q1("SELECT count(*) FROM im.inbox WHERE conversation_id = %s AND msg_seq = %s",
                        (other, other_head))
    check(beside > 0, "poison: another conversation's transfers flowed meanwhile")
    node[b].q("DROP TRIGGER refuse_poison ON im.event")
    node[b].q("DROP FUNCTION public.refuse_poison()")
    for src, tid in node[b].q("SELECT source_node, transfer_id FROM im.transfer_in WHERE state = 'quarantined'"):
        node[b].q("SELECT im.shard_retry_quarantined(%s, %s)", (src, tid))
    check(drain(), "poison: retried after the cause was removed", str(pending_all()))
    # no LATE entry: since 1.7 the held positions follow it in msg_seq order
    verify("poison")
    reconcile_empty("poison")


def drill_key_reuse():
    """Contract §15: the idempotency key of a sharded installation is
    (sender, conversation, client_msg_id), so one sender may reuse a
    client_msg_id in conversations on different nodes.  A user node holding
    copies of both (and a conversation of its own where the sender reuses
    the key once more) must deliver all of them: copies never take part in
    the sender's key there (a known sharding gap: the second copy
    collided and was quarantined).  On each conversation node the key stays
    (sender, client_msg_id): a retry answers the original, another request
    IS409."""
    a, b, c = NAMES
    # users 3100.. on node c: the sender and a recipient; one member on a and b
    extra = [u for u in range(3100, 3164) if node_of(u) == c][:2] + \
            [next(u for u in range(3100, 3164) if node_of(u) == x) for x in (a, b)]
    sender, reader = extra[0], extra[1]
    USERS.extend(extra)
    key = f"reuse-{time.time_ns()}"
    convs = {}
    for n in (a, b, c):
        conv = node[n].q1("SELECT im.create_conversation('group', %s)", (sorted(extra),))
        check(node_of(conv) == n, f"key_reuse: conversation {conv} on {n}")
        CONVS[n].append(conv)
        convs[n] = conv
    ids = {}
    for n in (a, b):
        r = node[n].q("SELECT message_id, created FROM im.send_message(%s, %s, %s, %s)",
                      (sender, convs[n], key, json.dumps({"text": f"same key on {n}"})))
        check(r[0][1], f"key_reuse: the send with the reused key in {n}'s conversation is created")
        ids[n] = r[0][0]
        with sent_lock:
            SENT.append((convs[n], key))
    check(drain(), "key_reuse: drained (both copies applied on the user node)", str(pending_all()))
    # the user node's own conversation: the key once more, after the copies
    try:
        r = node[c].q("SELECT message_id, created FROM im.send_message(%s, %s, %s, %s)",
                      (sender, convs[c], key, json.dumps({"text": f"same key on {c}"})))
    except psycopg2.Error as e:
        r = [(None, False, f"{e.pgcode}: {str(e).splitlines()[0]}")]
    check(r[0][1] and r[0][0] not in ids.values(),
          f"key_reuse: on {c}, which holds both copies, the same key in its own conversation is a new message",
          str(r))
    ids[c] = r[0][0]
    with sent_lock:
        SENT.append((convs[c], key))
    check(drain(), "key_reuse: drained", str(pending_all()))
    for n in (a, b, c):
        try:
            again = node[n].q("SELECT message_id, created FROM im.send_message(%s, %s, %s, %s)",
                              (sender, convs[n], key, json.dumps({"text": f"same key on {n}"})))
        except psycopg2.Error as e:
            again = [f"{e.pgcode}: {str(e).splitlines()[0]}"]
        check(again[0] == (ids.get(n), False), f"key_reuse: on {n} a retry answers the original", str(again))
        try:
            node[n].q("SELECT * FROM im.send_message(%s, %s, %s, %s)",
                      (sender, convs[n], key, json.dumps({"text": "another request"})))
            check(False, f"key_reuse: on {n} another request with the key is IS409")
        except psycopg2.Error as e:
            check(e.pgcode == "IS409", f"key_reuse: on {n} another request with the key is IS409", e.pgcode)
    held = node[c].q1("SELECT count(*) FROM im.event WHERE message_id = ANY(%s)", (list(ids.values()),))
    check(held == 3, f"key_reuse: {c} holds its message and both copies", f"{held}")
    for u in (sender, reader):
        got = node[c].q1("SELECT count(*) FROM im.shard_received_positions(%s) WHERE conversation_id = ANY(%s)"
                         " AND (conversation_id, msg_seq) IN (SELECT conversation_id, msg_seq FROM im.event"
                         "  WHERE message_id = ANY(%s))", ([u], list(convs.values()), list(ids.values())))
        check(got == 3, f"key_reuse: user {u} on {c} received all three messages", f"{got}")
    verify("key_reuse")
    reconcile_empty("key_reuse")


def drill_prune():
    """A known sharding gap: maintenance prunes im.transfer_ack (a
    destination's own acks, once every logical slot confirmed them) and
    applied im.transfer_in rows (ack gone, older than
    im_sync.transfer_retention, 0 here), and a replay of the pruned
    transfers still changes nothing: judged by the outbox item of their
    event, dropped as duplicates.  A transfer new to the destination but
    sent before the pruning horizon is quarantined, never dropped unseen."""
    d = NAMES[2]
    srcs = [n for n in NAMES if n != d]
    node[d].q("ALTER SYSTEM SET im_sync.transfer_retention = 0")
    # no periodic maintenance round on d during the drill: one may prune the
    # confirmed acks before they are counted (only gc_inbox below runs it)
    node[d].q("ALTER SYSTEM SET im_sync.maintenance_interval = 0")
    node[d].q("SELECT pg_reload_conf()")
    for s in srcs:
        on_sub(d, s, "DISABLE")
    send_round("prune", 2, nodes=srcs)
    for s in srcs:
        wait_for(lambda: node[s].q1("SELECT im.run_fanout() >= 0 AND outbox_pending = 0 FROM im.shard_pending()"), 60)
    saved = {s: node[s].q1("SELECT COALESCE(jsonb_agg(to_jsonb(t)), '[]') FROM im.transfer_out t WHERE dest_node = %s",
                           (d,)) for s in srcs}
    keys = [(s, t["transfer_id"]) for s in srcs for t in saved[s]]
    check(keys, f"prune: {len(keys)} transfers to {d} captured on their sources")
    for s in srcs:
        on_sub(d, s, "ENABLE")
    check(drain(), "prune: delivered and acknowledged", str(pending_all()))
    srcarr, idarr = [k[0] for k in keys], [k[1] for k in keys]
    held_sql = ("SELECT (SELECT count(*) FROM im.transfer_in t JOIN unnest(%s::text[], %s::bigint[]) k(s, i)"
                "        ON t.source_node = k.s AND t.transfer_id = k.i),"
                "       (SELECT count(*) FROM im.transfer_ack a JOIN unnest(%s::text[], %s::bigint[]) k(s, i)"
                "        ON a.source_node = k.s AND a.transfer_id = k.i)")
    before = tuple(node[d].q(held_sql, (srcarr, idarr, srcarr, idarr))[0])
    check(before == (len(keys), len(keys)), f"prune: {d} holds their records and acks before maintenance", str(before))

    def pruned():
        node[d].q("SELECT count(*) FROM im.gc_inbox()")   # gc_inbox runs maintenance after its chunk
        return tuple(node[d].q(held_sql, (srcarr, idarr, srcarr, idarr))[0]) == (0, 0)
    check(wait_for(pruned, 60, step=0.3), "prune: maintenance removed the applied records and their acks",
          str(tuple(node[d].q(held_sql, (srcarr, idarr, srcarr, idarr))[0])))
    check(node[d].q1("SELECT count(*) FROM im.maintenance_state WHERE name LIKE 'transfer_in_pruned_before:%%'") >= 1,
          "prune: the sources' pruning horizons are recorded")
    head_before = node[d].q1(LOG_SIZE_SQL)
    for s in srcs:   # every pruned transfer a second time
        node[s].q("INSERT INTO im.transfer_out SELECT * FROM jsonb_populate_recordset(NULL::im.transfer_out, %s)",
                  (json.dumps(saved[s]),))
    check(drain(), "prune: the replay drained and was acknowledged again", str(pending_all()))
    judged = node[d].q("SELECT state, count(*), sum(duplicates) FROM im.transfer_in t"
                       " JOIN unnest(%s::text[], %s::bigint[]) k(s, i) ON t.source_node = k.s AND t.transfer_id = k.i"
                       " GROUP BY state", (srcarr, idarr))
    check(judged == [("applied", len(keys), len(keys))],
          "prune: every replayed transfer was recognised as a duplicate after its record was pruned", str(judged))
    check(node[d].q1(LOG_SIZE_SQL) == head_before, "prune: no log moved")
    verify("prune")
    reconcile_empty("prune")
    # new to d, but sent before the horizon, and no outbox item of its event: quarantined
    a = srcs[0]
    tid = node[a].q1("""INSERT INTO im.transfer_out (source_node, dest_node, outbox_id, conversation_id, msg_seq,
                                                    source_event_id, payload, created_at)
                        VALUES (%s, %s, 0, %s, 1, 0, '{}', now() - interval '1 day') RETURNING transfer_id""",
                     (a, d, CONVS[a][0]))
    check(wait_for(lambda: node[d].q1("SELECT state FROM im.transfer_in WHERE source_node = %s AND transfer_id = %s",
                                      (a, tid)) == "quarantined", 30),
          "prune: a transfer sent before the horizon that this node never applied is quarantined")
    q = node[d].q("SELECT detail->>'error' FROM im.reconcile() WHERE check_name = 'transfer_quarantined'")
    check(len(q) == 1 and "pruning horizon" in (q[0][0] or ""), "prune: reconcile shows it with the reason", str(q))
    node[d].q("DELETE FROM im.transfer_in WHERE source_node = %s AND transfer_id = %s", (a, tid))
    check(drain(), "prune: its ack went back to the source", str(pending_all()))
    node[d].q("ALTER SYSTEM RESET im_sync.transfer_retention")
    node[d].q("ALTER SYSTEM RESET im_sync.maintenance_interval")
    node[d].q("SELECT pg_reload_conf()")
    reconcile_empty("prune (end)")


DRILLS = [("ack_before_visible", drill_ack_before_visible), ("fanout_plan", drill_fanout_plan), ("baseline", drill_baseline), ("disabled", drill_disabled), ("replay", drill_replay),
          ("stop", drill_stop), ("slot_limit", drill_slot_limit), ("poison", drill_poison),
          ("key_reuse", drill_key_reuse), ("prune", drill_prune)]

if __name__ == "__main__":
    check(N == 3, f"three nodes ({NAMES})")
    setup()
    want = set(os.environ.get("IM_SHARD_DRILLS", ",".join(d for d, _ in DRILLS)).split(","))
    for name, fn in DRILLS:
        if name in want:
            print(f"--- {name}", flush=True)
            start = time.time()
            fn()
            print(f"--- {name}: {time.time() - start:.1f}s", flush=True)
    print(f"transfer_check: {len(failures)} failed" if failures else "transfer_check: all ok", flush=True)
    sys.exit(1 if failures else 0)
