#!/usr/bin/env python3
"""router_check.py — the router extension (im_sync_router) against a running
sharded installation (test/harness/shards.sh up 3): the map, every routed function at
least once, multi-node calls (message_status/message_facts merge,
conversation_list heads, run_fanout waiting for transfers, claim_push_jobs'
total, refresh_presence split, rotate/retire on every node, metrics labels,
reconcile), node errors with their SQLSTATE and message and PL/Proxy's
prefixes stripped, and a stopped node: 08006 for what it owns, everything
else still answered, head_stale, and all of it back after a restart.

Usage: router_check.py ROUTER_CONNINFO SHARDS_DIR
(test/router/router_check.sh brings the installation up and down.)

Every figure is read through the router's API; the nodes are touched only to
stage faults (a stopped node, a disabled subscription, a raising function)
and to read the trace ids that writes through the router left in their
im.event and im.outbox rows (contract §21)."""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
from checklib import ShardsDir, check, connect, failures, queries, section, wait_for  # noqa: E402

import psycopg2  # noqa: E402
import psycopg2.extras  # noqa: E402

ROUTER, SHARDS_DIR = sys.argv[1], sys.argv[2]
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PUBKEY = os.path.join(ROOT, "test", "push", "relay_pub.pem")


R = connect(ROUTER)
q, q1 = queries(lambda: R)    # R is replaced below (a new PL/Proxy session)


def error_of(sql, args=None, conn=None):
    """(sqlstate, message, detail, hint) of the call's error, or None."""
    try:
        q(sql, args, conn)
    except psycopg2.Error as e:
        d = e.diag
        return (e.pgcode, d.message_primary, d.message_detail, d.message_hint)
    return None


def expect_error(what, state, sql, args=None, message_prefix=None):
    err = error_of(sql, args)
    ok = err is not None and err[0] == state and "PL/Proxy" not in err[1] \
        and "REMOTE" not in err[1] and not (err[2] or "").startswith("Remote ")
    if ok and message_prefix is not None:
        ok = err[1].startswith(message_prefix)
    check(ok, f"{what}: {state}", f"got {err}")
    return err


# ------------------------------------------------------------------ the map
shards = ShardsDir(SHARDS_DIR)
nodes = shards.nodes  # (name, conninfo)
node_dir = dict(zip(shards.names, shards.clusters))
bucket_node = dict(q("SELECT bucket, node_name FROM im_router.bucket"))
names = sorted({n for n, _ in nodes})

check(sorted(r[0] for r in q("SELECT node_name FROM im.shard_nodes()")) == names,
      "shard_nodes lists every node")
check(dict(q("SELECT node_name, conninfo FROM im.shard_nodes()")) == dict(nodes),
      "shard_nodes gives the conninfos of the map")
check(len(bucket_node) == 64 and set(bucket_node.values()) == set(names), "64 buckets over the nodes")
opts = q1("SELECT srvoptions FROM pg_foreign_server WHERE srvname = 'im_sync'")
parts = {o.split("=", 1)[0]: o.split("=", 1)[1] for o in opts if o.startswith("p")}
check("query_timeout=0" in opts, "query_timeout off by default (sharding.md: statement_timeout on the router's roles)")
check(sorted(parts) == sorted(f"p{b}" for b in range(64)), "server im_sync has partitions p0..p63")
check(all("user=" not in v and "connect_timeout='2'" in v for v in parts.values()),
      "partitions carry connect_timeout and no user (PL/Proxy connects as the caller)")
check(len({v for v in parts.values()}) == len(names), "partitions of one node share one conninfo")
v0 = q1("SELECT im_router.cluster_version()")
arr_n = [n for n, _ in nodes]
arr_c = [c for _, c in nodes]
arr_b = [bucket_node[b] for b in range(64)]
q("SELECT im_router.configure(%s, %s, %s)", (arr_n, arr_c, arr_b))
check(q1("SELECT im_router.cluster_version()") == v0 + 1, "configure bumps the cluster version")
expect_error("configure with 63 buckets", "22023",
             "SELECT im_router.configure(%s, %s, %s)", (arr_n, arr_c, arr_b[:63]))
expect_error("configure naming an unknown node", "22023",
             "SELECT im_router.configure(%s, %s, %s)", (arr_n, arr_c, ["nodeX"] + arr_b[1:]))
expect_error("configure with a negative query_timeout", "22023",
             "SELECT im_router.configure(%s, %s, %s, 2, -1)", (arr_n, arr_c, arr_b))
expect_error("configure with a URI conninfo", "22023",
             "SELECT im_router.configure(%s, %s, %s)", (arr_n, ["postgresql://h/im"] * len(arr_n), arr_b))
check(q1("SELECT im_router.cluster_version()") == v0 + 1, "a refused configure changes nothing")
q("CREATE USER MAPPING IF NOT EXISTS FOR im_dba SERVER im_sync OPTIONS (user 'im_dba')")
q("SELECT im_router.configure(%s, %s, %s)", (arr_n, arr_c, arr_b))
check(q1("SELECT count(*) FROM pg_user_mappings WHERE srvname = 'im_sync' AND usename = 'im_dba'") == 1,
      "configure keeps the user mappings the DBA added")
q("DROP USER MAPPING FOR im_dba SERVER im_sync")
# a moved bucket reaches this session's next call (PL/Proxy re-reads the
# changed server): the node that does not own the user answers IS421
moved = list(arr_b)
moved[1000 % 64] = next(n for n in arr_n if n != arr_b[1000 % 64])
q("SELECT im_router.configure(%s, %s, %s)", (arr_n, arr_c, moved))
expect_error("a call routed by a map that moved the user's bucket", "IS421",
             "SELECT * FROM im.register_device(1000, 'map-probe')")
q("SELECT im_router.configure(%s, %s, %s)", (arr_n, arr_c, arr_b))
check(q("SELECT state FROM im.register_device(1000, 'map-probe')") == [("NEW",)],
      "the map restored, the same session reaches the owner again")
q("SELECT im.revoke_device(1000, 'map-probe')")


def users_on(node, count, start=1000):
    out, u = [], start
    while len(out) < count:
        if bucket_node[u % 64] == node:
            out.append(u)
        u += 1
    return out


# users: two on each node
U = {n: users_on(n, 2) for n in names}
a, b, c = U[names[0]][0], U[names[1]][0], U[names[-1]][0]
a2 = U[names[0]][1]


# ------------------------------------------------------ conversations (§2)
@section
def conversations_2():
    global g, groups, m1, reply, rc, gen, acked, au, batches, sc, toks, k2
    g = q1("SELECT im.create_conversation('group', %s, %s)", ([a, b, c], a))
    d1 = q1("SELECT im.direct_conversation(%s, %s)", (a, b))
    d2 = q1("SELECT im.direct_conversation(%s, %s)", (b, a))
    d3 = q1("SELECT im.create_conversation('direct', %s)", ([b, a],))
    check(d1 == d2 == d3, "direct_conversation and create_conversation('direct') resolve the pair to one id")
    check(d1 % 64 == (a + b) % 64, "a direct conversation has the pair bucket")
    groups = [q1("SELECT im.create_conversation('group', %s, %s)", ([a, b, c], a)) for _ in range(6)]
    check(len({bucket_node[x % 64] for x in groups}) == len(names), "new groups spread over every node")
    jr = q("SELECT * FROM im.join_conversation(%s, %s)", (g, a2))
    check(jr and jr[0][2] is True, "join_conversation on the conversation node")
    check(sorted(r[0] for r in q("SELECT * FROM im.conversation_members(%s)", (g,))) == sorted([a, b, c, a2]),
          "conversation_members")
    check(sorted(r[0] for r in q("SELECT * FROM im.members_among(%s, %s)", (g, [a, 999999]))) == [a],
          "members_among")
    lv = q("SELECT * FROM im.leave_conversation(%s, %s)", (g, a2))
    check(lv and lv[0][1] >= 1, "leave_conversation")


# ------------------------------------------------- devices and snapshots (§5, §6)
@section
def devices_and_snapshots_5_6():
    global g, groups, m1, reply, rc, gen, acked, au, batches, sc, toks, k2
    # each device is activated the way a client does: snapshot, its pages, ACK
    gen, acked = {}, {}
    for u in (a, b, c):
        rd = q("SELECT * FROM im.register_device(%s, 'dev1')", (u,))
        check(rd and rd[0][1] == "NEW", f"register_device on {bucket_node[u % 64]}", f"{rd}")
        bs = q("SELECT * FROM im.begin_snapshot(%s, 'dev1')", (u,))
        check(bs and bs[0][0] == "READY", "begin_snapshot", f"{bs}")
        for page in range(bs[0][5]):
            fs = q("SELECT * FROM im.fetch_snapshot(%s, 'dev1', %s, %s)", (u, bs[0][4], page))
            check(fs and fs[0][1] == page, f"fetch_snapshot page {page}", f"{fs}")
        asn = q("SELECT * FROM im.ack_snapshot(%s, 'dev1', %s, %s)", (u, bs[0][4], bs[0][6]))
        check(asn and asn[0][0] == "OK", "ack_snapshot", f"{asn}")
        gen[u], acked[u] = bs[0][2], asn[0][1]


# ----------------------------------------------------------- sending (§3)
@section
def sending_3():
    global g, groups, m1, reply, rc, gen, acked, au, batches, sc, toks, k2
    m1 = q("SELECT * FROM im.send_message(%s, %s, 'k1', '{\"text\":\"hello\"}')", (a, g))[0]
    again = q("SELECT * FROM im.send_message(sender_id => %s, conversation_id => %s, client_msg_id => 'k1', "
              "body => '{\"text\":\"hello\"}')", (a, g))[0]
    check(m1[2] is True and again[:2] == m1[:2] and again[2] is False,
          "send_message is idempotent through the router (named arguments too)")
    check(bucket_node[m1[0] % 64] == bucket_node[g % 64], "a message id carries its conversation's bucket")
    reply = q("SELECT * FROM im.send_message(%s, %s, 'k2', '{\"text\":\"re\"}', 'text', %s)", (b, g, m1[0]))[0]
    ed = q("SELECT * FROM im.edit_message(%s, %s, 'k3', %s, '{\"text\":\"hello!\"}')", (a, g, m1[0]))[0]
    re_ = q("SELECT * FROM im.react(%s, %s, %s, 'x', true, 'k4')", (c, g, m1[0]))[0]
    pn = q("SELECT * FROM im.pin_message(%s, %s, %s, true, 'k5')", (b, g, m1[0]))[0]
    rc = q("SELECT * FROM im.recall_message(%s, %s, 'k6', %s)", (b, g, reply[0]))[0]
    check(all(x[2] is True for x in (reply, ed, re_, pn, rc)), "reply, edit, react, pin and recall")
    check(q1("SELECT im.set_conversation_mode(%s, 'fanout')", (g,)) == "fanout", "set_conversation_mode")


# --------------------------------------------------------- fanout (§4, §5)
@section
def fanout_4_5():
    global g, groups, m1, reply, rc, gen, acked, au, batches, sc, toks, k2
    total = q1("SELECT im.run_fanout()")
    # the nodes' workers may have done it all already: the count can be 0;
    # what counts is that nothing is pending anywhere once it returns
    left = q("SELECT * FROM im_router.all_pending() WHERE outbox_pending + transfers_unacked + inbound_unapplied > 0")
    check(total is not None and total >= 0 and left == [], "run_fanout returns once every node is drained",
          f"{total} {left}")
    batches = {}
    for u in (a, b, c):
        rows = q("SELECT * FROM im.sync_changes(%s, 'dev1', %s, %s)", (u, gen[u], acked[u]))
        ids = [e.get("message_id") for e in (rows[0][6] or [])] if rows else []
        check(rows and rows[0][0] == "OK" and (u == a or m1[0] in ids),
              f"user on {bucket_node[u % 64]} syncs the message sent on {bucket_node[g % 64]}", f"{rows}")
        batches[u] = rows[0]
    sc = batches[b]

    ack = q("SELECT * FROM im.ack_sync(%s, 'dev1', %s, %s)", (b, sc[2], sc[4]))
    check(ack and ack[0][0] == "OK", "ack_sync", f"{ack}")
    tok = q1("SELECT im.issue_device_token(%s, 'dev1')", (c,))
    au = q("SELECT * FROM im.authenticate(%s)", (tok,))
    check(au and au[0][0] == c and au[0][1] == "dev1", "authenticate finds the user's node from the token")
    ds = q("SELECT * FROM im.device_session(%s, 'dev1', %s)", (c, au[0][2]))
    check(ds and ds[0][4] is True, "device_session")
    fm = q("SELECT * FROM im.fetch_messages(%s, %s, 0)", (b, g))
    check(fm and any(e.get("message_id") == m1[0] for e in fm[0][0]), "fetch_messages on the conversation node")


# ---------------------------------------- read state and message status (§7, §16)
@section
def read_state_and_message_status_7_16():
    global g, groups, m1, reply, rc, gen, acked, au, batches, sc, toks, k2
    ms = q("SELECT * FROM im.message_status(%s)", (m1[0],))
    check(sorted({r[0] for r in ms}) == sorted([a, b, c]) and all(r[2] for r in ms),
          "message_status merges every node's devices of the users who see it (sender included)", f"{ms}")
    check(ms == sorted(ms, key=lambda r: (r[0], r[1] or "")), "message_status in (user, device) order")
    synced_b = [r for r in ms if r[0] == b]
    check(synced_b and synced_b[0][4] is True, "message_status: the device ACK comes from the user's node",
          f"{synced_b}")


# ------------------------------------------------- trace_message (§21)
@section
def trace_message_21():
    global g, groups, m1, reply, rc, gen, acked, au, batches, sc, toks, k2
    # the trace id as the conversation node stores it; the users' copies
    # on the other nodes do not carry it: the router fills it in
    conv_node = bucket_node[g % 64]
    nc = connect(dict(nodes)[conv_node])
    q("UPDATE im.event SET trace_id = 'trace-router-1' WHERE message_id = %s", (m1[0],), conn=nc)
    nc.close()
    tr = q("SELECT stage, at, user_id, detail FROM im.trace_message(%s)", (m1[0],))
    acc = [r for r in tr if r[0] == "accepted"]
    check(len(acc) == 1 and acc[0][2] is None and acc[0][3]["node"] == conv_node
          and acc[0][3]["msg_seq"] == m1[1], "trace_message: accepted from the conversation node", f"{acc}")
    fan = {r[2]: r for r in tr if r[0] == "fanout" and r[2] is not None}
    check(sorted(fan) == sorted([a, b, c])
          and all(fan[u][1] is not None and fan[u][3]["node"] == bucket_node[u % 64]
                  and fan[u][3]["sync_seq"] >= 1 for u in fan),
          "trace_message: fanout of each recipient from that recipient's node, with its sync_seq", f"{fan}")
    syn = [r for r in tr if r[0] == "synced" and r[2] == b]
    check(len(syn) == 1 and syn[0][3]["node"] == bucket_node[b % 64]
          and syn[0][3]["sync_seq"] == fan[b][3]["sync_seq"],
          "trace_message: synced from the ACK on the user's node", f"{syn}")
    check(all(r[3].get("trace_id") == "trace-router-1" for r in tr),
          "trace_message: every row carries the trace id", f"{[r[3].get('trace_id') for r in tr]}")
    timed = [r[1] for r in tr if r[1] is not None]
    check(timed == sorted(timed) and all(r[1] is None for r in tr[len(timed):]),
          "trace_message: in time order, rows without a time last")
    expect_error("trace_message of an unknown message", "P0002",
                 "SELECT * FROM im.trace_message(%s)", (64 * 10**9 + 1,))


# -------------------------------------- trace ids through the router (§21)
@section
def trace_ids_through_the_router_21():
    # send, react and report_read with a trace id through the router: each
    # write's node keeps it with what it wrote (the conversation node's
    # event and outbox item, the reader's node's outbox item), nothing set
    # by hand; trace_message through the router shows it on every row
    gt = q1("SELECT im.create_conversation('group', %s, %s)", ([a, b, c], a))
    conv_node = bucket_node[gt % 64]
    sent = q("SELECT * FROM im.send_message(%s, %s, 'kt1', '{\"text\":\"traced\"}', 'text', NULL, "
             "'trace-router-send')", (a, gt))[0]
    reacted = q("SELECT * FROM im.react(%s, %s, %s, 'y', true, 'kt2', 'trace-router-react')",
                (b, gt, sent[0]))[0]
    check(sent[2] is True and reacted[2] is True, "send_message and react with a trace id", f"{sent} {reacted}")
    nc = connect(dict(nodes)[conv_node])
    want = {sent[0]: "trace-router-send", reacted[0]: "trace-router-react"}
    ev = dict(q("SELECT message_id, trace_id FROM im.event WHERE message_id = ANY(%s)",
                (list(want),), conn=nc))
    check(ev == want, "send_message, react: the conversation node's im.event rows hold the trace ids", f"{ev}")
    ob = dict(q("SELECT source_event_id, trace_id FROM im.outbox WHERE source_event_id = ANY(%s)",
                (list(want),), conn=nc))
    check(ob == want, "send_message, react: the conversation node's im.outbox items hold the trace ids", f"{ob}")
    nc.close()
    q1("SELECT im.run_fanout()")
    # the reader on another node than the conversation's: report_read is
    # routed by the user, and its item is queued on the user's node
    reader = next(u for u in (b, c) if bucket_node[u % 64] != conv_node)
    rr = q("SELECT * FROM im.report_read(%s, %s, %s, 'trace-router-read')", (reader, gt, sent[1]))
    check(rr and rr[0][0] == sent[1], "report_read with a trace id", f"{rr}")
    rn = connect(dict(nodes)[bucket_node[reader % 64]])
    rd = q("SELECT o.trace_id FROM im.outbox o JOIN im.private_event pe ON pe.private_event_id = o.source_event_id "
           " WHERE pe.user_id = %s AND pe.conversation_id = %s AND pe.kind = 'read_cursor'", (reader, gt), conn=rn)
    check(rd == [("trace-router-read",)], "report_read: the reader's node's im.outbox item holds the trace id",
          f"{rd}")
    rn.close()
    tr = q("SELECT stage, at, user_id, detail FROM im.trace_message(%s)", (sent[0],))
    stages = {(r[0], r[2]) for r in tr}
    check({("accepted", None), ("fanout", a), ("fanout", b), ("fanout", c), ("read", reader)} <= stages,
          "trace_message of the traced message: accepted, each recipient's fanout, the read", f"{sorted(stages, key=str)}")
    check(all(r[3].get("trace_id") == "trace-router-send" for r in tr),
          "trace_message: every row carries the trace id given to send_message",
          f"{[(r[0], r[2], r[3].get('trace_id')) for r in tr]}")


# ------------------------------------- roles, mutes, removals (§17)
@section
def roles_mutes_removals_17():
    # the four functions through the router on the conversation's node (the
    # writer orders them with the sends); a muted member's send is IS403
    # with its message; a removal is a leave with removed_by, a ban keeps
    # the user out until unban; conversation_list ends my_role, muted_until
    gr = q1("SELECT im.create_conversation('group', %s, %s)", ([a, b, c], a))
    r = q("SELECT * FROM im.set_member_role(%s, %s, %s, 'admin', 'rk-role')", (a, gr, b))
    check(r and r[0][2] is True, "set_member_role through the router", f"{r}")
    r2 = q("SELECT * FROM im.set_member_role(%s, %s, %s, 'admin', 'rk-role')", (a, gr, b))
    check(r2 and r2[0][:2] == r[0][:2] and r2[0][2] is False, "set_member_role: a replay answers the original")
    m = q("SELECT * FROM im.mute_member(%s, %s, %s, 'infinity', 'rk-mute')", (b, gr, c))
    check(m and m[0][2] is True, "mute_member by an admin through the router", f"{m}")
    expect_error("a muted member's send", "IS403",
                 "SELECT * FROM im.send_message(%s, %s, 'rk-s1', '{\"text\":\"x\"}')", (c, gr), "member muted")
    expect_error("an admin mutes the owner", "42501",
                 "SELECT * FROM im.mute_member(%s, %s, %s, NULL, 'rk-m2')", (b, gr, a))
    rm = q("SELECT * FROM im.remove_member(%s, %s, %s, true, 'rk-rm')", (a, gr, c))
    check(rm and rm[0][2] is True, "remove_member through the router", f"{rm}")
    expect_error("a banned user joins", "42501", "SELECT * FROM im.join_conversation(%s, %s)", (gr, c))
    check(q1("SELECT unbanned FROM im.unban_member(%s, %s, %s)", (a, gr, c)) is True, "unban_member through the router")
    q("SELECT im.run_fanout()")
    pos = q("SELECT * FROM im.fetch_messages(%s, %s, 0)", (a, gr))[0][0]
    leaves = [p for p in pos if p["kind"] == "leave"]
    check(leaves and leaves[-1]["body"] == {"user_id": c, "removed_by": a, "banned": True},
          "the removal is a leave with removed_by and banned", f"{leaves}")
    check({p["kind"] for p in pos} >= {"role", "mute"}, "role and mute positions in fetch_messages")
    cl = q("SELECT conversation_id, head_stale, my_role, muted_until FROM im.conversation_list(%s)", (a,))
    check(any(r[0] == gr and r[1] is False and r[2] == "owner" and r[3] is None for r in cl),
          "conversation_list through the router: my_role, muted_until", f"{cl}")
    # b's node has a copy of b's period from before the role change: the
    # role comes from the conversation's node
    mb = q("SELECT * FROM im.mute_member(%s, %s, %s, 'infinity', 'rk-mute-b')", (a, gr, b))
    cl_b = {r[0]: r[1:] for r in q("SELECT conversation_id, my_role, muted_until FROM im.conversation_list(%s)", (b,))}
    check(mb and gr in cl_b and cl_b[gr][0] == "admin" and cl_b[gr][1] is not None,
          "conversation_list of a member on another node: the role and mute now in force", f"{cl_b.get(gr)}")
    # the user node's copy of b's period follows the role and mute positions
    # its transfers carry: recent_conversations (answered there) says the same
    q("SELECT im.run_fanout()")
    rc_b = {r[0]: r[1:] for r in q("SELECT conversation_id, my_role, muted_until FROM im.recent_conversations(%s, 100)", (b,))}
    check(gr in rc_b and rc_b[gr][0] == "admin" and rc_b[gr][1] is not None,
          "recent_conversations of a member on another node: the role and mute now in force", f"{rc_b.get(gr)}")
    q("SELECT * FROM im.mute_member(%s, %s, %s, NULL, 'rk-unmute-b')", (a, gr, b))
    q("SELECT im.run_fanout()")
    rc_b = {r[0]: r[1:] for r in q("SELECT conversation_id, my_role, muted_until FROM im.recent_conversations(%s, 100)", (b,))}
    check(gr in rc_b and rc_b[gr][1] is None, "recent_conversations on the user node: unmuted", f"{rc_b.get(gr)}")


# ------------------------------------------------ read state and deletions
@section
def read_state_and_deletions():
    global g, groups, m1, reply, rc, gen, acked, au, batches, sc, toks, k2
    rr = q("SELECT * FROM im.report_read(%s, %s, %s)", (c, g, m1[1]))
    check(rr and rr[0][0] == m1[1], "report_read on the user's node")
    mf = q("SELECT * FROM im.message_facts(%s, %s)", (a, m1[0]))
    check({b, c} <= {r[0] for r in mf} and len(mf) == len({r[0] for r in mf}),
          "message_facts merges every node's recipients, one row per user", f"{mf}")
    check([r for r in mf if r[0] == c][0][4] is True, "message_facts: user_read from the user's node")
    expect_error("message_facts by someone who did not send it", "42501",
                 "SELECT * FROM im.message_facts(%s, %s)", (b, m1[0]))
    expect_error("message_status of an unknown message", "P0002",
                 "SELECT * FROM im.message_status(%s)", (64 * 10**9 + 1,))
    cl = q("SELECT conversation_id, head_msg_seq, head_stale FROM im.conversation_list(%s)", (b,))
    heads = dict(q("SELECT conversation_id, head_msg_seq FROM im.conversation_list(%s)", (a,)))
    check(len(cl) >= 2 and all(r[2] is False for r in cl), "conversation_list: head_stale false when reachable")
    check(heads.get(g) == rc[1] + 1 or heads.get(g) >= rc[1], "conversation_list: authoritative head", f"{heads}")
    # recency and conversation pins (contract §20): the user's node answers
    rec = q("SELECT conversation_id, last_activity_at, conversation_pinned FROM im.recent_conversations(%s)", (c,))
    check(rec and {r[0] for r in rec} == {r[0] for r in q("SELECT conversation_id FROM im.conversation_list(%s)", (c,))},
          "recent_conversations through the router lists the user's conversations", f"{rec}")
    check(any(r[0] == g and r[1] is not None for r in rec), "recent_conversations: activity of a remote conversation")
    pc = q1("SELECT conversation_pinned FROM im.pin_conversation(%s, %s, true)", (c, g))
    top = q("SELECT conversation_id, conversation_pinned FROM im.recent_conversations(%s, 1)", (c,))
    check(pc is True and top == [(g, True)], "pin_conversation on the user's node puts it first", f"{top}")
    check(q1("SELECT conversation_pinned FROM im.pin_conversation(%s, %s, false)", (c, g)) is False,
          "pin_conversation: unpin")
    dl = q1("SELECT im.delete_for_me(%s, %s, %s)", (c, g, m1[0]))
    dl2 = q1("SELECT im.delete_for_me(%s, %s, %s)", (c, g, m1[0]))
    check(dl is True and dl2 is False, "delete_for_me on both nodes, idempotent")
    fm_c = q("SELECT * FROM im.fetch_messages(%s, %s, 0)", (c, g))
    check(not any(e.get("message_id") == m1[0] for e in fm_c[0][0]),
          "fetch_messages on the conversation node honours the remote user's delete_for_me")


# ------------------------------------------------------- more devices
@section
def more_devices():
    global g, groups, m1, reply, rc, gen, acked, au, batches, sc, toks, k2
    q("SELECT * FROM im.register_device(%s, 'dev2')", (b,))
    cd = q("SELECT * FROM im.clear_dirty(%s, %s, 0, 0)", (b, g))
    check(cd is not None and len(cd) == 1, "clear_dirty on the user's node")
    check(q1("SELECT im.revoke_device(%s, 'dev2')", (b,)) is True, "revoke_device")


# -------------------------------------------------------------- push (§13)
@section
def push_13():
    global g, groups, m1, reply, rc, gen, acked, au, batches, sc, toks, k2
    expect_error("register_push_target without the relay key", "55000",
                 "SELECT im.register_push_target(%s, 'dev1', 'fcm', 'app', 'tok-a')", (a,))
    q("SELECT im.set_notify(%s, NULL, NULL, 'full')", (a,))
    check(q1("SELECT im.set_presence(%s, 'dev1', %s, true)", (c, au[0][2])) is True, "set_presence")
    check(q1("SELECT im.refresh_presence(%s, %s, %s)", ([c, a, b], ["dev1"] * 3, [au[0][2], 0, 0])) == 1,
          "refresh_presence split by user, counts summed")
    expect_error("refresh_presence with unequal arrays", "22023",
                 "SELECT im.refresh_presence(%s, %s, %s)", ([c, a], ["dev1"], [1, 2]))
    check(q1("SELECT im.set_presence(%s, 'dev1', %s, false)", (c, au[0][2])) is True, "set_presence offline")
    check(q1("SELECT im.remove_push_target(%s, 'dev1')", (a,)) is False, "remove_push_target")
    check(q("SELECT * FROM im.claim_push_jobs('relay-1', 5)") == [], "claim_push_jobs with no jobs")
    expect_error("claim_push_jobs with max_jobs 0", "22023", "SELECT * FROM im.claim_push_jobs('r', 0)")
    check(q1("SELECT im.complete_push_job(%s, 'relay-1', 'delivered')", (64 * 10**9 + 5,)) == "stale",
          "complete_push_job of a job this relay does not hold: stale, on the job's user node")
    expect_error("complete_push_job with an unknown result", "22023",
                 "SELECT im.complete_push_job(%s, 'relay-1', 'nonsense')", (64 * 10**9 + 5,))


# --------------------------------------------- push jobs over every node
@section
def push_jobs_over_every_node():
    shards_sh = os.environ.get("IM_SHARDS_SH", os.path.join(ROOT, "test", "harness", "shards.sh"))
    for name, value in (("im_sync.push_public_key_file", PUBKEY), ("im_sync.push_delay", "0"),
                        ("im_sync.push_min_interval", "0")):
        subprocess.run(["bash", shards_sh, "set", name, value], check=True, stdout=subprocess.DEVNULL)
    # ALTER ROLE … SET (shards.sh set) reaches new sessions only; the nodes'
    # fanout workers that apply transfers (and queue push jobs) are old
    # sessions, so the push timing goes to postgresql.auto.conf too (a reload
    # reaches every process)
    for _, conninfo in nodes:
        nc = connect(conninfo)
        q("ALTER SYSTEM SET im_sync.push_delay = 0", conn=nc)
        q("ALTER SYSTEM SET im_sync.push_min_interval = 0", conn=nc)
        q("SELECT pg_reload_conf()", conn=nc)
        nc.close()
    # PL/Proxy keeps its node connections per router session: a new one
    global R
    R.close()
    R = connect(ROUTER)
    # one offline device with a push target for a user on every node
    targets = [U[n][1] for n in names]
    pc = q1("SELECT im.create_conversation('group', %s, %s)", (targets + [a], a))
    for i, u in enumerate(targets):
        q("SELECT * FROM im.register_device(%s, 'p1')", (u,))
        check(q1("SELECT im.register_push_target(%s, 'p1', 'fcm', 'app', %s)", (u, f"tok-{u}")) is not None,
              f"register_push_target on {bucket_node[u % 64]}")
    q("SELECT * FROM im.send_message(%s, %s, 'push-1', '{\"text\":\"ping\"}', 'text', NULL, 'trace-router-push')",
      (a, pc))
    q1("SELECT im.run_fanout()")
    pending = "SELECT coalesce(sum(value), 0) FROM im.metrics() WHERE name = 'im_push_pending'"
    check(wait_for(lambda: q1(pending) == len(targets), 30), "a push job queued on every user node",
          f"{q1(pending)}")
    first = q("SELECT job_id, trace_id FROM im.claim_push_jobs('relay-t', 2)")
    check(len(first) == 2, "claim_push_jobs: max_jobs is a total over the nodes", f"{len(first)}")
    rest = q("SELECT job_id, trace_id FROM im.claim_push_jobs('relay-t', 100)")
    jobs = [j for j, _ in first + rest]
    check([t for _, t in first + rest] == ["trace-router-push"] * len(jobs),
          "claim_push_jobs: every node's job carries its message's trace id", f"{first + rest}")
    check(len(jobs) == len(targets) and len(set(jobs)) == len(jobs),
          "claim_push_jobs hands out every node's jobs, none twice", f"{jobs}")
    check({bucket_node[j % 64] for j in jobs} == set(names), "push jobs come from every user node")
    done = [q1("SELECT im.complete_push_job(%s, 'relay-t', 'delivered', 200)", (j,)) for j in jobs]
    check(done == ["delivered"] * len(jobs), "complete_push_job routes by the job id", f"{done}")


# ---------------------------------------------------- operations (§8)
@section
def operations_8():
    global g, groups, m1, reply, rc, gen, acked, au, batches, sc, toks, k2
    gc = q("SELECT * FROM im.gc_inbox()")
    check(gc is not None, "gc_inbox runs on every node")
    rf = q("SELECT * FROM im.repair_fanout(false, true)")
    check(rf == [], "repair_fanout (dry run) on every node: nothing to requeue on a healthy installation "
          "(a user placed elsewhere is not missing on the conversation node)", f"{rf[:4]}")
    rec = q("SELECT * FROM im.reconcile()")
    check(rec == [], "reconcile is empty on a healthy installation", f"{rec}")
    met = q("SELECT name, value, type, labels FROM im.metrics()")
    for n in names:
        check(any(m[0] == "im_outbox_pending" and m[3] == {"node": n} for m in met),
              f"metrics: im_outbox_pending of {n}")
        check(("im_router_node_up", 1.0, "gauge", {"node": n}) in met, f"metrics: {n} up")
    check(all(m[3] and "node" in m[3] for m in met if m[0] != "im_router_cluster_version"),
          "metrics: every node series carries its node label")
    check(all("{" not in m[0] and m[2] in ("counter", "gauge", "histogram") for m in met),
          "metrics: bare names with a type, labels apart")
    labelled = [m[3] for m in met if m[0] == "im_push_results_total"]
    check(labelled and all(set(x) == {"node", "result"} for x in labelled),
          "metrics: the node label joins existing labels", f"{labelled[:3]}")
    series = [(m[0], json.dumps(m[3], sort_keys=True)) for m in met]
    check(len(series) == len(set(series)), "metrics: one row per series (name, labels)")
    check(q1("SELECT im.set_extension_owner(%s)", ("postgres",)) is not None, "set_extension_owner on every node")

    # tokens: one key id everywhere, retired everywhere
    toks = {u: q1("SELECT im.issue_device_token(%s, 'dev1')", (u,)) for u in (a, b, c)}
    k1 = q1("SELECT im.rotate_token_key()")
    k2 = q1("SELECT im.rotate_token_key()")
    check(k2 == k1 + 1, "rotate_token_key: the same new key id on every node", f"{k1} {k2}")
    new_toks = {u: q1("SELECT im.issue_device_token(%s, 'dev1')", (u,)) for u in (a, b, c)}
    expect_error("retire_token_key of the newest key", "22023", "SELECT im.retire_token_key(%s)", (k2,))
    retired = [q1("SELECT im.retire_token_key(%s)", (k,)) for k in range(1, k2)]
    check(any(retired), "retire_token_key retires the older keys")
    check(q1("SELECT bool_or(im.retire_token_key(k)) FROM generate_series(1, %s) k", (k2 - 1,)) is False,
          "retire_token_key twice: false")
    for u in (a, b, c):
        expect_error(f"a token of a retired key on {bucket_node[u % 64]}", "28000",
                     "SELECT * FROM im.authenticate(%s)", (toks[u],))
        check(q("SELECT user_id FROM im.authenticate(%s)", (new_toks[u],)) == [(u,)],
              f"a token of the new key works on {bucket_node[u % 64]}")


# ------------------------------------------- account standing (§17)
@section
def account_standing_17():
    """suspend_user and reinstate_user through the router write on every
    node: the user's node refuses its calls and its authenticate, the
    conversation node (another node) refuses its sends, device_session says
    suspended; reinstated, both work again."""
    s = users_on(names[1], 1, start=7000)[0]
    other = users_on(names[0], 1, start=7000)[0]
    q("SELECT * FROM im.register_device(%s, 'dev1')", (s,))
    tok = q1("SELECT im.issue_device_token(%s, 'dev1')", (s,))
    epoch = q1("SELECT connection_epoch FROM im.authenticate(%s)", (tok,))
    conv = None
    for _ in range(64):
        x = q1("SELECT im.create_conversation('group', %s, %s)", ([s, other], other))
        if bucket_node[x % 64] != bucket_node[s % 64]:
            conv = x
            break
    check(conv is not None, "a group of the user on another node")
    res = q("SELECT * FROM im.suspend_user('router-check', %s, NULL, 'router')", (s,))
    check(res == [(True, 1)], "suspend_user through the router: suspended, one device told", f"{res}")
    check(q("SELECT account_state FROM im.device_session(%s, 'dev1', %s)", (s, epoch)) == [("suspended",)],
          "device_session through the router: account_state suspended")
    expect_error("authenticate of a suspended user", "IS403",
                 "SELECT * FROM im.authenticate(%s)", (tok,), message_prefix="account suspended")
    expect_error("sync_changes of a suspended user (the user's node)", "IS403",
                 "SELECT * FROM im.sync_changes(%s, 'dev1', 1, 0)", (s,))
    expect_error("a send of a suspended user (the conversation's node)", "IS403",
                 "SELECT * FROM im.send_message(%s, %s, 'susp-1', '{\"text\": \"x\"}')", (s, conv))
    check(q("SELECT * FROM im.reinstate_user('router-check', %s)", (s,)) == [(True,)],
          "reinstate_user through the router")
    check(q("SELECT * FROM im.reinstate_user('router-check', %s)", (s,)) == [(False,)],
          "reinstate_user again: false")
    check(q("SELECT created FROM im.send_message(%s, %s, 'susp-2', '{\"text\": \"y\"}')", (s, conv)) == [(True,)],
          "reinstated: the send is accepted")
    check(q("SELECT user_id FROM im.authenticate(%s)", (tok,)) == [(s,)], "reinstated: authenticate works")


# ------------------------------------- the cross-node §18.3 check (item 5)
@section
def cross_node_reconcile():
    """The router's reconcile compares what the conversation node's periods
    say each member may receive with what the member's node has: an event
    deleted behind the API's back on the user node (and the item the node's
    own audit would have checked it by) is fanout_missing, an event given to
    a non-member fanout_extra, each named by the user's node; restored,
    reconcile is empty again.  The rows are put back exactly as they were."""
    global g, groups, m1, reply, rc, gen, acked, au, batches, sc, toks, k2
    q1("SELECT im.run_fanout()")
    conv_node = bucket_node[g % 64]
    member = next(u for u in (a, b, c) if bucket_node[u % 64] != conv_node)
    user_node = bucket_node[member % 64]
    un = connect(dict(nodes)[user_node])
    saved = q("""WITH i AS (DELETE FROM im.inbox WHERE user_id = %s AND source_event_id = %s RETURNING *),
                      o AS (DELETE FROM im.outbox WHERE source_event_id = %s RETURNING *)
                 SELECT (SELECT jsonb_agg(to_jsonb(i)) FROM i), (SELECT jsonb_agg(to_jsonb(o)) FROM o)""",
              (member, m1[0], m1[0]), conn=un)[0]
    check(saved[0] and len(saved[0]) == 1 and saved[1] and len(saved[1]) == 1,
          f"staged: {member}'s event {m1[0]} and its item deleted on {user_node}", f"{saved}")
    rec = q("SELECT check_name, user_id, (detail->>'source_event_id')::bigint, detail->>'conversation_node', "
            "node_name FROM im.reconcile()")
    check(("fanout_missing", member, m1[0], conv_node, user_node) in rec,
          "reconcile: an event missing on the user node is fanout_missing from the conversation node's periods",
          f"{rec}")
    # bounded: im_router.reconcile_positions (the newest N processed positions
    # of each conversation node) = 0 checks none
    q("SET im_router.reconcile_positions = 0")
    rec0 = q("SELECT check_name, user_id FROM im.reconcile()")
    q("RESET im_router.reconcile_positions")
    check(("fanout_missing", member) not in rec0, "reconcile_positions bounds the cross-node check", f"{rec0}")
    q("""INSERT INTO im.outbox SELECT * FROM jsonb_populate_recordset(NULL::im.outbox, %s);
         INSERT INTO im.inbox SELECT * FROM jsonb_populate_recordset(NULL::im.inbox, %s)""",
      (psycopg2.extras.Json(saved[1]), psycopg2.extras.Json(saved[0])), conn=un)
    rec = q("SELECT * FROM im.reconcile()")
    check(rec == [], "reconcile empty once the event is back", f"{rec}")

    # an event for a non-member (a user of another node that never joined g)
    outsider = users_on(user_node, 3)[2]
    item = q("""WITH o AS (DELETE FROM im.outbox WHERE source_event_id = %s RETURNING *)
                SELECT jsonb_agg(to_jsonb(o)) FROM o""", (m1[0],), conn=un)[0][0]
    had_head = q1("SELECT count(*) FROM im.user_head WHERE user_id = %s", (outsider,), conn=un)
    q("""INSERT INTO im.user_head (user_id, high_watermark) VALUES (%s, 0) ON CONFLICT DO NOTHING;
         UPDATE im.user_head SET high_watermark = high_watermark + 1 WHERE user_id = %s;
         INSERT INTO im.inbox (user_id, sync_seq, source_event_id, delivery_scope, conversation_id, msg_seq, kind)
         SELECT %s, h.high_watermark, %s, 1, %s, %s, 'message' FROM im.user_head h WHERE h.user_id = %s""",
      (outsider, outsider, outsider, m1[0], g, m1[1], outsider), conn=un)
    rec = q("SELECT check_name, severity, user_id, (detail->>'source_event_id')::bigint, node_name "
            "FROM im.reconcile()")
    check(("fanout_extra", "critical", outsider, m1[0], user_node) in rec,
          "reconcile: an event no period calls for is fanout_extra (critical)", f"{rec}")
    q("""DELETE FROM im.inbox WHERE user_id = %s AND source_event_id = %s;
         UPDATE im.user_head SET high_watermark = high_watermark - 1 WHERE user_id = %s;
         INSERT INTO im.outbox SELECT * FROM jsonb_populate_recordset(NULL::im.outbox, %s)""",
      (outsider, m1[0], outsider, psycopg2.extras.Json(item)), conn=un)
    if not had_head:
        q("DELETE FROM im.user_head WHERE user_id = %s", (outsider,), conn=un)
    rec = q("SELECT * FROM im.reconcile()")
    check(rec == [], "reconcile empty after the cross-node checks", f"{rec}")
    un.close()


# ------------------------------------------------------------ node errors
@section
def node_errors():
    global g, groups, m1, reply, rc, gen, acked, au, batches, sc, toks, k2
    expect_error("bad argument", "22023", "SELECT * FROM im.send_message(%s, %s, '', '{}')", (a, g),
                 "client_msg_id must be")
    expect_error("not a member", "42501", "SELECT * FROM im.send_message(%s, %s, 'z1', '{}')", (a2, g))
    expect_error("unknown conversation", "P0002", "SELECT * FROM im.send_message(%s, %s, 'z2', '{}')",
                 (a, g + 64 * 1000), "conversation ")
    err = expect_error("reused client_msg_id", "IS409",
                       "SELECT * FROM im.send_message(%s, %s, 'k1', '{\"text\":\"other\"}')", (a, g))
    check(err and err[2] and err[2].startswith("The key was first used") and err[3] and err[3].startswith("Use a new"),
          "detail and hint arrive without 'Remote detail:'/'Remote hint:'", f"{err}")
    expect_error("bad token", "28000", "SELECT * FROM im.authenticate('AAAA')", None, "device token")
    expect_error("NULL routing key", "22023", "SELECT * FROM im.register_device(NULL, 'dev1')")

    # every SQLSTATE the API uses, raised by a node function through PL/Proxy
    # and rethrown the way the generated wrappers do (im_router.rethrow)
    for _, conninfo in nodes:
        nc = connect(conninfo)
        q("""CREATE OR REPLACE FUNCTION public.im_router_test_raise(state text) RETURNS int
             LANGUAGE plpgsql AS $$ BEGIN
               RAISE EXCEPTION 'raised % on purpose', state USING ERRCODE = state,
                     DETAIL = 'Detail of ' || state || '.', HINT = 'Hint of ' || state || '.';
             END $$""", conn=nc)
        q("GRANT EXECUTE ON FUNCTION public.im_router_test_raise(text) TO PUBLIC", conn=nc)
        nc.close()
    q("""CREATE OR REPLACE FUNCTION public.im_router_test_raise(part int, state text) RETURNS int
         LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON part; SELECT public.im_router_test_raise(state); $$""")
    q("""CREATE OR REPLACE FUNCTION public.im_router_test_call(part int, state text) RETURNS int
         LANGUAGE plpgsql AS $$
         DECLARE s text; m text; d text; h text;
         BEGIN RETURN public.im_router_test_raise(part, state);
         EXCEPTION WHEN OTHERS OR query_canceled THEN
           GET STACKED DIAGNOSTICS s = RETURNED_SQLSTATE, m = MESSAGE_TEXT, d = PG_EXCEPTION_DETAIL, h = PG_EXCEPTION_HINT;
           PERFORM im_router.rethrow(s, m, d, h);
         END $$""")
    # one piece rewrites errors: the generated im.* wrappers call
    # im_router.rethrow, no multi-node implementation in im_router does
    # (create_api_wrapper holds the wrappers' text, so it names the call)
    check(q("SELECT p.proname FROM pg_proc p WHERE p.pronamespace = 'im_router'::regnamespace "
            "AND p.proname <> 'create_api_wrapper' "
            "AND p.prosrc ~ 'PERFORM im_router\\.rethrow'") == [],
          "no im_router function rewrites errors itself (the generated wrappers do)")
    check(q1("SELECT count(*) FROM pg_proc p WHERE p.pronamespace = 'im'::regnamespace "
             "AND p.prolang = (SELECT oid FROM pg_language WHERE lanname = 'plpgsql') "
             "AND p.prosrc !~ 'PERFORM im_router.rethrow'") == 0,
          "every plpgsql im.* wrapper rethrows through im_router.rethrow")
    raw = error_of("SELECT public.im_router_test_raise(0, '40001')")
    check(raw and raw[0] == "40001" and raw[1].startswith("public.im_router_test_raise(2): [")
          and "] REMOTE ERROR: raised 40001 on purpose" in raw[1] and raw[2] == "Remote detail: Detail of 40001.",
          "PL/Proxy 2.10's prefix is '<function>(<nargs>): [<db>] REMOTE ERROR: ' (the one stripped)", f"{raw}")
    for state in ("22023", "42501", "P0002", "IS409", "28000", "55000", "40001", "40P01"):
        err = error_of("SELECT public.im_router_test_call(%s, %s)", (1, state))
        check(err == (state, f"raised {state} on purpose", f"Detail of {state}.", f"Hint of {state}."),
              f"{state} keeps its SQLSTATE, message, detail and hint", f"{err}")
    # a node's own 57014: PL/Proxy 2.10 takes it for a local cancel and may
    # wait for a cancel answer that never comes; the router session's
    # statement_timeout ends that wait, and the caller gets 57014 either way
    q("SET statement_timeout = '3s'")
    err = error_of("SELECT public.im_router_test_call(%s, %s)", (1, "57014"))
    q("RESET statement_timeout")
    check(err is not None and err[0] == "57014" and "PL/Proxy" not in err[1] and "REMOTE" not in err[1],
          "a node's 57014 reaches the caller as 57014", f"{err}")


# ------------------------------------------------------- roles and commits
@section
def roles_and_commits():
    # the application role: granted send_message on the router and on every
    # node (extension/doc/sharding.md, "Roles through the router"); the nodes see the calling role, not the router's owner
    grant = ("GRANT USAGE ON SCHEMA im TO im_app; "
             "GRANT EXECUTE ON FUNCTION im.send_message(bigint, bigint, text, jsonb, text, bigint, text) TO im_app")
    q(grant)
    for _, conninfo in nodes:
        nc = connect(conninfo)
        q(grant, conn=nc)
        nc.close()
    app = connect(ROUTER.replace("user=postgres", "") + " user=im_app")
    sm = q("SELECT * FROM im.send_message(%s, %s, 'app-1', '{\"text\":\"as app\"}')", (a, g), conn=app)
    check(sm and sm[0][2] is True, "the application role sends through the router")
    err = error_of("SELECT * FROM im.metrics()", conn=app)
    check(err and err[0] == "42501", "a function not granted on the router: 42501", f"{err}")
    # im_router.* is callable by anyone here; the node refuses it (REMOTE …
    # 42501) because it runs as im_app there, not as the router's owner
    err = error_of("SELECT * FROM im_router.gc_inbox()", conn=app)
    check(err is not None and err[0] == "42501" and "REMOTE ERROR" in err[1],
          "the routing functions reach a node as the caller, whose grants there decide", f"{err}")
    # autocommit on the node: a rolled-back router transaction undoes nothing
    app.autocommit = False
    cur = app.cursor()
    cur.execute("SELECT * FROM im.send_message(%s, %s, 'app-2', '{\"text\":\"rolled back?\"}')", (a, g))
    first = cur.fetchall()
    app.rollback()
    app.autocommit = True
    again = q("SELECT * FROM im.send_message(%s, %s, 'app-2', '{\"text\":\"rolled back?\"}')", (a, g), conn=app)
    check(first[0][2] is True and again[0][:2] == first[0][:2] and again[0][2] is False,
          "a call through the router commits on its node when it returns (ROLLBACK undoes nothing)")
    app.close()


# ----------------------------------- run_fanout waits for the transfers
@section
def run_fanout_waits_for_the_transfers():
    global g, groups, m1, reply, rc, gen, acked, au, batches, sc, toks, k2
    sub_node = bucket_node[c % 64]
    src_node = bucket_node[g % 64]
    if sub_node != src_node:
        sub = f"im_{src_node}_to_{sub_node}"
        dest = connect(dict(nodes)[sub_node])
        q(f"ALTER SUBSCRIPTION {sub} DISABLE", conn=dest)
        mw = q("SELECT * FROM im.send_message(%s, %s, 'kw', '{\"text\":\"wait\"}')", (a, g))[0]
        q("SET im_router.run_fanout_timeout = '2s'")
        err = expect_error("run_fanout while a subscription is disabled", "55000", "SELECT im.run_fanout()")
        check(err and sub_node in err[1] or src_node in (err or ("", ""))[1],
              "run_fanout's error names the node still pending", f"{err}")
        q(f"ALTER SUBSCRIPTION {sub} ENABLE", conn=dest)
        q("SET im_router.run_fanout_timeout = '60s'")
        q1("SELECT im.run_fanout()")
        rows = q("SELECT events FROM im.sync_changes(%s, 'dev1', %s, %s, 1000)", (c, gen[c], acked[c]))
        got = [e.get("message_id") for e in (rows[0][0] or [])]
        check(mw[0] in got, "after run_fanout returns, the destination has applied the transfer")
        dest.close()


# ------------------------------------------------------------ a silent host
SILENT_LISTENER = """
import socket, sys, time
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(64)            # the kernel completes handshakes; nobody accepts or reads
print(s.getsockname()[1], flush=True)
sys.stdin.read()        # until the test closes our stdin
"""


@section
def a_silent_host():
    """connect_timeout against a host that accepts TCP but never answers the
    startup packet: a call routed there ends with 08006 (no deadline is
    asserted beyond a generous one), and calls for the other nodes answer
    meanwhile; reconcile names it node_unreachable."""
    import threading
    listener = subprocess.Popen([sys.executable, "-c", SILENT_LISTENER], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
    port = int(listener.stdout.readline())
    silent_bucket = 5
    victim = silent_bucket + 64 * 100
    moved = list(arr_b)
    moved[silent_bucket] = "silent"
    try:
        q("SELECT im_router.configure(%s, %s, %s)",
          (arr_n + ["silent"], arr_c + [f"host=127.0.0.1 port={port} dbname=im"], moved))
        outcome = {}

        def call_silent():
            conn = connect(ROUTER)
            outcome["error"] = error_of("SELECT * FROM im.register_device(%s, 'dev1')", (victim,), conn)
            conn.close()

        t = threading.Thread(target=call_silent)
        t.start()
        other = connect(ROUTER)
        answered = all(q("SELECT state FROM im.register_device(%s, 'silent-probe')", (U[n][0],), conn=other)
                       for n in names)
        check(answered and t.is_alive(),
              "calls for the other nodes answer while a call to the silent host is pending")
        t.join(60)
        err = outcome.get("error")
        check(not t.is_alive() and err is not None and err[0] == "08006"
              and err[1].startswith("im_sync node unreachable"),
              "a call routed to a silent host ends with 08006 (connect_timeout)", f"{err}")
        rec = q("SELECT check_name, node_name FROM im.reconcile() WHERE node_name = 'silent'", conn=other)
        check(rec == [("node_unreachable", "silent")], "reconcile: the silent host is node_unreachable", f"{rec}")
        for n in names:
            q("SELECT im.revoke_device(%s, 'silent-probe')", (U[n][0],), conn=other)
        other.close()
    finally:
        q("SELECT im_router.configure(%s, %s, %s)", (arr_n, arr_c, arr_b))
        listener.stdin.close()
        listener.wait(10)
# ------------------------------------- an ex-member's conversation_list (§15)
@section
def ex_member_mode():
    """A known sharding gap: a mode switch of a group with no member
    left on a node reached no copy there, so the ex-member's row showed the
    mode in force when it left.  On one node conversation_list reads the
    conversation row itself — the current mode, like the authoritative head
    — for every user who has or had a period; through the router the same:
    mode and head come from the conversation's node."""
    home, away = names[0], names[1]
    ex = users_on(away, 1, start=5000)[0]
    stay = users_on(home, 2, start=5000)
    conv = next(x for x in (q1("SELECT im.create_conversation('group', %s, %s)", (stay + [ex], stay[0]))
                            for _ in range(3 * len(names))) if bucket_node[x % 64] == home)
    q("SELECT * FROM im.send_message(%s, %s, %s, '{\"text\":\"before\"}')", (stay[0], conv, f"exm1-{conv}"))
    q1("SELECT im.run_fanout()")
    q("SELECT * FROM im.leave_conversation(%s, %s)", (conv, ex))
    q1("SELECT im.run_fanout()")
    row = {r[0]: r[1:] for r in q("SELECT conversation_id, mode, head_msg_seq FROM im.conversation_list(%s)", (ex,))}
    old = row.get(conv, (None,))[0]
    new = "shared_log" if old == "fanout" else "fanout"
    check(q1("SELECT im.set_conversation_mode(%s, %s)", (conv, new)) == new,
          f"ex_member_mode: the group on {home} switched to {new} after the member on {away} left")
    q("SELECT * FROM im.send_message(%s, %s, %s, '{\"text\":\"after\"}')", (stay[0], conv, f"exm2-{conv}"))
    q1("SELECT im.run_fanout()")
    member = {r[0]: r[1:] for r in q("SELECT conversation_id, mode, head_msg_seq, head_stale"
                                     " FROM im.conversation_list(%s)", (stay[1],))}
    exrow = {r[0]: r[1:] for r in q("SELECT conversation_id, mode, head_msg_seq, head_stale"
                                    " FROM im.conversation_list(%s)", (ex,))}
    check(conv in exrow, "ex_member_mode: the ex-member still lists the group (it had a period)")
    check(exrow.get(conv) == member.get(conv) and (exrow.get(conv) or (None,))[0] == new,
          "ex_member_mode: the ex-member's row shows the mode and head in force now, as a member's does "
          "(one node's answer)", f"ex-member {exrow.get(conv)}, member {member.get(conv)}")


# ----------------------------------------------------------- a stopped node
@section
def a_stopped_node():
    global g, groups, m1, reply, rc, gen, acked, au, batches, sc, toks, k2
    down = names[-1]
    owner_user = U[down][0]
    up_user = U[names[0]][0]
    conv_down = [x for x in groups if bucket_node[x % 64] == down][0]
    conv_up = [x for x in groups if bucket_node[x % 64] == names[0]][0]
    listed = [r[0] for r in q("SELECT conversation_id FROM im.conversation_list(%s)", (up_user,))]
    pgbin = subprocess.check_output(["pg_config", "--bindir"], text=True).strip()
    as_server = ["runuser", "-u", "postgres", "--"] if os.getuid() == 0 else []
    datadir = os.path.join(node_dir[down], "data")
    subprocess.run(as_server + [f"{pgbin}/pg_ctl", "-D", datadir, "-m", "immediate", "-w", "stop"],
                   check=True, stdout=subprocess.DEVNULL)
    expect_error(f"register_device for a user of stopped {down}", "08006",
                 "SELECT * FROM im.register_device(%s, 'dev9')", (owner_user,), "im_sync node unreachable")
    expect_error(f"send to a conversation on stopped {down}", "08006",
                 "SELECT * FROM im.send_message(%s, %s, 'd1', '{}')", (up_user, conv_down))
    sd = q("SELECT * FROM im.send_message(%s, %s, 'd2', '{\"text\":\"still\"}')", (up_user, conv_up))
    check(sd and sd[0][2] is True, "a send to a conversation elsewhere succeeds while a node is down")
    check(q("SELECT * FROM im.register_device(%s, 'dev9')", (up_user,)) is not None,
          "calls for users elsewhere succeed while a node is down")
    cl = q("SELECT conversation_id, head_stale FROM im.conversation_list(%s)", (up_user,))
    stale = dict(cl)
    check(sorted(stale) == sorted(listed) and conv_down in stale and conv_up in stale
          and all(stale[x] is (bucket_node[x % 64] == down) for x in stale),
          "conversation_list: every row still listed, head_stale for the stopped node's conversations only",
          f"{cl}")
    met = q("SELECT name, value, labels FROM im.metrics()")
    check(("im_router_node_up", 0.0, {"node": down}) in met and ("im_router_node_up", 1.0, {"node": names[0]}) in met,
          "metrics: the stopped node is down, the others report")
    rec = q("SELECT check_name, node_name FROM im.reconcile()")
    check(("node_unreachable", down) in rec, "reconcile names the unreachable node", f"{rec}")
    expect_error("run_fanout with a node down", "08006", "SELECT im.run_fanout()")
    subprocess.run(as_server + [f"{pgbin}/pg_ctl", "-D", datadir, "-l", os.path.join(node_dir[down], "server.log"),
                                "-w", "start"], check=True, stdout=subprocess.DEVNULL)
    check(q("SELECT * FROM im.register_device(%s, 'dev9')", (owner_user,)) is not None,
          "the restarted node answers again (the router reconnects)")
    q1("SELECT im.run_fanout()")
    check(wait_for(lambda: q("SELECT * FROM im.reconcile()") == [], 60), "reconcile empty after the restart",
          f"{q('SELECT * FROM im.reconcile()')}")


print(f"router_check: {len(failures)} failure(s)")
sys.exit(1 if failures else 0)
