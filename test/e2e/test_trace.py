#!/usr/bin/env python3
"""Trace ids, the JSON request log and /metrics (contract §21).

Against a gateway started with --log-format json (IM_GW_LOG: its log file):
a frame's trace_id comes back in its reply (results, pong, welcome, errors),
a frame without one gets a W3C trace-id, a bad trace_id is INVALID_ARGUMENT
and writes nothing, a write's trace id is stored with its event, and each
request has one JSON log line with every field, and one trace id is followed
from a frame to the event, a failing item's server log line (IM_SERVER_LOG)
and im.trace_message.  /metrics after that traffic
passes `promtool check metrics` (IM_PROMTOOL, default /usr/bin/promtool).
Without IM_GW_LOG the log checks are skipped (the wss:// run)."""
import asyncio
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from imgw import Client, free_port, new_user_ids, register, run_tests, sql, token, wait_until  # noqa: E402
from gwmetrics import scrape  # noqa: E402
import psycopg2  # noqa: E402
import urllib.request  # noqa: E402

W3C = re.compile(r"^[0-9a-f]{32}$")
LOG = os.environ.get("IM_GW_LOG")
PROMTOOL = os.environ.get("IM_PROMTOOL", "/usr/bin/promtool")
BODY_MARK = "TRACE-BODY-%d" % os.getpid()
TOKENS = []


def generated(tid):
    return bool(W3C.match(tid or "")) and tid != "0" * 32


async def pair():
    a, b = new_user_ids(2)
    for u in (a, b):
        register(u, "t1")
    TOKENS.extend([token(a, "t1"), token(b, "t1")])
    conv = sql("SELECT im.create_conversation('group', %s::bigint[], %s)", [a, b], a)[0][0]
    ca = await Client.login(a, "t1")
    return a, b, conv, ca


def log_requests():
    """Every line of the JSON log parsed; the request lines by trace id."""
    lines = [json.loads(line) for line in open(LOG, encoding="utf-8") if line.strip()]
    by_trace = {}
    for rec in lines:
        if rec.get("event") == "request":
            by_trace.setdefault(rec["trace_id"], []).append(rec)
    return lines, by_trace


async def test_trace_ids_in_replies():
    a, b, conv, ca = await pair()
    assert generated(ca.welcome.get("trace_id")), ca.welcome
    # given: echoed, on results, pong and errors alike
    r = await ca.req({"type": "ping", "trace_id": "ping-1_A"})
    assert r == {"type": "pong", "id": r["id"], "trace_id": "ping-1_A"}, r
    r = await ca.req({"type": "conversations", "trace_id": "x" * 64})
    assert r["type"] == "conversations_result" and r["trace_id"] == "x" * 64, r
    r = await ca.req({"type": "fetch_messages", "conversation_id": conv, "after_seq": 0, "trace_id": "fm"})
    assert r["type"] == "fetch_messages_result" and r["trace_id"] == "fm", r
    r = await ca.req({"type": "recall", "conversation_id": conv, "client_msg_id": "nope",
                      "target_message_id": 1, "trace_id": "err-1"})
    assert r["type"] == "error" and r["trace_id"] == "err-1", r
    r = await ca.req({"type": "send", "conversation_id": conv, "client_msg_id": "m",
                      "body": {"text": BODY_MARK}, "user_id": b, "trace_id": "forbidden-1"})
    assert r["type"] == "error" and r["code"] == "FORBIDDEN" and r["trace_id"] == "forbidden-1", r
    # absent or null: a new W3C trace-id each time
    seen = set()
    for f in ({"type": "ping"}, {"type": "ping", "trace_id": None}, {"type": "conversations"},
              {"type": "no_such_type"}, {"type": "fetch_messages", "conversation_id": conv}):
        r = await ca.req(f)
        assert generated(r.get("trace_id")), (f, r)
        seen.add(r["trace_id"])
    assert len(seen) == 5, seen
    # a frame that could not be read at all still gets one
    await ca.send_raw("{not json")
    r = await ca.next_frame()
    assert r["code"] == "BAD_FRAME" and generated(r.get("trace_id")), r
    await ca.close()


async def test_bad_trace_id_writes_nothing():
    a, b, conv, ca = await pair()
    bad = ["", "y" * 65, "has space", "dot.ted", "é", "semi;colon", 7, True, ["a"], {"a": "b"}]
    for i, t in enumerate(bad):
        cmid = "bad-trace-%d" % i
        r = await ca.req({"type": "send", "conversation_id": conv, "client_msg_id": cmid,
                          "body": {"text": BODY_MARK}, "trace_id": t})
        assert r["type"] == "error" and r["code"] == "INVALID_ARGUMENT", (t, r)
        assert generated(r.get("trace_id")), (t, r)
        assert sql("SELECT count(*) FROM im.event WHERE conversation_id = %s AND client_msg_id = %s",
                   conv, cmid)[0][0] == 0, t
    r = await ca.req({"type": "read", "conversation_id": conv, "read_to_seq": 1, "trace_id": "no good"})
    assert r["code"] == "INVALID_ARGUMENT", r
    # the conversation holds only what create_conversation put there
    assert sql("SELECT count(*) FROM im.event WHERE conversation_id = %s AND sender_id = %s "
               "AND kind = 'message'", conv, a)[0][0] == 0
    # a hello with a bad trace id is not a valid hello
    c = await Client.open("bad-hello")
    await c.ws.send(json.dumps({"type": "hello", "token": token(a, "t1"), "trace_id": "bad hello"}))
    code, frames = await c.wait_closed()
    assert code == 4001 and frames and frames[0]["code"] == "NOT_AUTHENTICATED", (code, frames)
    assert generated(frames[0].get("trace_id")), frames
    await ca.close()


def event_trace_column():
    return bool(sql("SELECT 1 FROM pg_attribute WHERE attrelid = 'im.event'::regclass "
                    "AND attname = 'trace_id' AND NOT attisdropped"))


async def test_writes_store_trace_id():
    a, b, conv, ca = await pair()
    r = await ca.req({"type": "send", "conversation_id": conv, "client_msg_id": "s1",
                      "body": {"text": BODY_MARK}, "trace_id": "send-trace-1"})
    assert r["type"] == "send_result" and r["trace_id"] == "send-trace-1", r
    mid = r["message_id"]
    r2 = await ca.req({"type": "send", "conversation_id": conv, "client_msg_id": "s2",
                       "body": {"text": BODY_MARK}})
    assert r2["type"] == "send_result" and generated(r2["trace_id"]), r2
    # every write takes the trace id: each answers without an error
    writes = [
        {"type": "edit", "conversation_id": conv, "client_msg_id": "e1", "target_message_id": mid,
         "body": {"text": BODY_MARK + "-edited"}, "trace_id": "edit-trace"},
        {"type": "react", "conversation_id": conv, "client_msg_id": "r1", "target_message_id": mid,
         "reaction": "+1", "present": True, "trace_id": "react-trace"},
        {"type": "pin", "conversation_id": conv, "client_msg_id": "p1", "target_message_id": mid,
         "pinned": True, "trace_id": "pin-trace"},
        {"type": "read", "conversation_id": conv, "read_to_seq": r["msg_seq"], "trace_id": "read-trace"},
        {"type": "delete_for_me", "conversation_id": conv, "message_id": r2["message_id"],
         "trace_id": "dfm-trace"},
        {"type": "recall", "conversation_id": conv, "client_msg_id": "c1", "target_message_id": mid,
         "trace_id": "recall-trace"},
    ]
    for w in writes:
        rep = await ca.req(w)
        assert rep["type"] == w["type"] + "_result" and rep["trace_id"] == w["trace_id"], (w, rep)
    rows = await ca.req({"type": "conversations", "trace_id": "list"})
    mine = [x for x in rows["rows"] if x["conversation_id"] == conv]
    if mine and mine[0].get("dirty_version") is not None:
        rep = await ca.req({"type": "clear_dirty", "conversation_id": conv,
                            "observed_version": mine[0]["dirty_version"],
                            "saved_last_msg_seq": mine[0].get("last_msg_seq") or 0, "trace_id": "cd-trace"})
        assert rep["type"] in ("clear_dirty_result", "error") and rep["trace_id"] == "cd-trace", rep
        assert rep.get("code") not in ("INTERNAL", "BAD_FRAME"), rep
    # the event rows hold the trace ids
    assert event_trace_column(), "im.event has no trace_id column"
    got = dict(sql("SELECT client_msg_id, trace_id FROM im.event WHERE conversation_id = %s "
                   "AND client_msg_id IS NOT NULL", conv))
    assert got.get("s1") == "send-trace-1", got
    assert got.get("s2") == r2["trace_id"], got
    for cmid, tid in (("e1", "edit-trace"), ("r1", "react-trace"), ("p1", "pin-trace"), ("c1", "recall-trace")):
        assert got.get(cmid) == tid, (cmid, got)
    if LOG:
        _, by_trace = log_requests()
        rec = by_trace["send-trace-1"][0]
        assert rec["type"] == "send" and rec["conversation_id"] == conv and rec["result"] == "ok", rec
        assert rec["msg_seq"] == r["msg_seq"], rec
    await ca.close()


async def test_json_log_lines():
    if not LOG:
        print("  (no IM_GW_LOG: skipped)")
        return
    a, b, conv, ca = await pair()
    r = await ca.req({"type": "sync", "sync_generation": ca.welcome["sync_generation"],
                      "local_applied_sync_seq": ca.welcome["server_acked_sync_seq"], "trace_id": "log-sync"})
    assert r["type"] == "sync_result", r
    if r.get("batch_token"):
        await ca.req({"type": "ack", "batch_token": r["batch_token"],
                      "acked_sync_seq": r["batch_high_watermark"], "trace_id": "log-ack"})
    await ca.req({"type": "fetch_messages", "conversation_id": conv, "after_seq": 0, "trace_id": "log-fetch"})
    await ca.req({"type": "no_such_type", "trace_id": "log-bad"})
    await ca.req({"type": "send", "conversation_id": conv, "client_msg_id": "x", "body": {"text": BODY_MARK},
                  "trace_id": "bad trace"})
    await ca.req({"type": "ping", "trace_id": "log-ping"})
    lines, by_trace = log_requests()
    assert all("ts" in x and "level" in x for x in lines), "a JSON log line without ts/level"
    want = {"ts", "trace_id", "user", "device", "type", "conversation_id", "result", "latency_ms"}
    reqs = [x for x in lines if x.get("event") == "request"]
    assert reqs, "no request lines"
    for rec in reqs:
        missing = want - set(rec)
        assert not missing, (missing, rec)
        assert isinstance(rec["latency_ms"], (int, float)) and rec["latency_ms"] >= 0, rec
        assert rec["result"] == "ok" or re.match(r"^[A-Z_]+$|^closed$", rec["result"]), rec
    hello = [x for x in by_trace.get(ca.welcome["trace_id"], []) if x["type"] == "hello"]
    assert hello and hello[0]["result"] == "ok" and hello[0]["user"].startswith("h:"), hello
    s = by_trace["log-sync"][0]
    assert s["type"] == "sync" and s["result"] == "ok" and s["conversation_id"] is None, s
    assert s["user"] == hello[0]["user"] and s["device"] == hello[0]["device"], (s, hello)
    f = by_trace["log-fetch"][0]
    assert f["type"] == "fetch_messages" and f["conversation_id"] == conv, f
    assert by_trace["log-bad"][0]["type"] == "invalid" and by_trace["log-bad"][0]["result"] == "BAD_FRAME"
    assert by_trace["log-ping"][0]["type"] == "ping"
    inv = [x for x in reqs if x["type"] == "send" and x["result"] == "INVALID_ARGUMENT"
           and x["user"] == hello[0]["user"]]
    assert inv and generated(inv[-1]["trace_id"]), inv
    if "log-ack" in by_trace:
        assert by_trace["log-ack"][0]["sync_seq"] == r["batch_high_watermark"], by_trace["log-ack"]
    # no body or token in any line
    text = open(LOG, encoding="utf-8").read()
    assert BODY_MARK not in text, "a body reached the log"
    for t in TOKENS:
        assert t not in text, "a token reached the log"
    await ca.close()


def test_promtool_check_metrics():
    text = scrape()
    for fam in ("im_gateway_request_duration_seconds_bucket{type=\"send\",le=\"+Inf\"}",
                "im_gateway_sync_page_events_count", "im_gateway_db_up 1"):
        assert fam in text, fam
    p = subprocess.run([PROMTOOL, "check", "metrics"], input=text.encode(), capture_output=True)
    out = (p.stdout + p.stderr).decode()
    assert p.returncode == 0 and not out.strip(), "promtool check metrics:\n" + out
    # each family has exactly one HELP and one TYPE line
    helps = [ln.split()[2] for ln in text.splitlines() if ln.startswith("# HELP ")]
    types = [ln.split()[2] for ln in text.splitlines() if ln.startswith("# TYPE ")]
    assert len(helps) == len(set(helps)) and len(types) == len(set(types)), "repeated HELP/TYPE"
    counts = {}
    for ln in text.splitlines():
        m = re.match(r'^im_gateway_request_duration_seconds_count\{type="(\w+)"\} (\d+)', ln)
        if m:
            counts[m.group(1)] = int(m.group(2))
    assert counts.get("send", 0) >= 1 and counts.get("hello", 0) >= 1 and counts.get("invalid", 0) >= 1, counts


# An im.metrics() with type and labels (contract §21), tricky rows included,
# and one of the older shape (name, value, help), each in a database of its
# own that holds nothing else: /metrics needs only im.metrics().
TYPED = r"""
CREATE FUNCTION im.metrics() RETURNS TABLE(name text, value double precision, help text, type text, labels jsonb)
LANGUAGE sql AS $$ VALUES
 ('im_push_results_total', 3, 'Push results by outcome.', 'counter', '{"result":"delivered"}'::jsonb),
 ('im_outbox_pending', 2, 'Pending items.', 'gauge', NULL),
 ('im_stage_x_seconds_bucket', 1, 'Stage x.', 'histogram', '{"le":"0.5"}'),
 ('im_stage_x_seconds', 2, 'Stage x.', 'histogram', '{"le":"+Inf"}'),
 ('im_stage_x_seconds_sum', 0.7, 'Stage x.', 'histogram', NULL),
 ('im_stage_x_seconds_count', 2, 'Stage x.', 'histogram', NULL),
 ('im_push_results_total', 1, 'Push results by outcome.', 'counter', E'{"result":"we\\"ird\\\\ \\n"}'),
 ('im_lag_seconds', 'Infinity', E'Help with \\ and\na newline.', 'gauge', NULL),
 ('bad name', 1, 'x', 'gauge', NULL),
 ('im_gateway_db_up', 5, 'not the gateway''s', 'gauge', NULL),
 ('im_bad_label', 1, 'x', 'gauge', '{"0x":"a"}'),
 ('im_nested_label', 1, 'x', 'gauge', '{"a":{"b":1}}'),
 ('im_shard_rows', 1, 'Rows by shard.', 'gauge', '{"shard":3}')
$$"""
OLD = r"""
CREATE FUNCTION im.metrics() RETURNS TABLE(name text, value double precision, help text)
LANGUAGE sql AS $$ VALUES ('im_outbox_pending', 2, 'Pending items.'),
 ('im_push_results_total{result="x"}', 1, 'embedded labels: left out') $$"""


def metrics_of(function_sql):
    """/metrics of a gateway (IM_GW_BIN) on a database holding only function_sql."""
    db = "im_trace_metrics_%d" % os.getpid()
    admin = psycopg2.connect(dbname="postgres")
    admin.autocommit = True
    admin.cursor().execute("DROP DATABASE IF EXISTS %s" % db)
    admin.cursor().execute("CREATE DATABASE %s" % db)
    gw = None
    try:
        c = psycopg2.connect(dbname=db)
        c.autocommit = True
        c.cursor().execute("CREATE SCHEMA im")
        c.cursor().execute(function_sql)
        c.close()
        port = free_port()
        gw = subprocess.Popen([os.environ["IM_GW_BIN"], "--listen", "127.0.0.1:%d" % port, "--pool", "1",
                               "--db", "host=%s port=%s user=%s dbname=%s" % (
                                   os.environ.get("PGHOST", "127.0.0.1"), os.environ.get("PGPORT", "5432"),
                                   os.environ.get("PGUSER", "postgres"), db)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = "http://127.0.0.1:%d/metrics" % port

        def up():
            try:
                return "im_gateway_db_up 1" in urllib.request.urlopen(url, timeout=5).read().decode()
            except OSError:
                return False
        wait_until("gateway up", up, timeout=30)
        # the first answer may predate the im.metrics() call: wait for its rows
        wait_until("im.metrics() rows", lambda: "im_outbox_pending" in
                   urllib.request.urlopen(url, timeout=5).read().decode(), timeout=30)
        return urllib.request.urlopen(url, timeout=5).read().decode()
    finally:
        if gw:
            gw.terminate()
            gw.wait()
        admin.cursor().execute("DROP DATABASE IF EXISTS %s" % db)
        admin.close()


def promtool_ok(text):
    p = subprocess.run([PROMTOOL, "check", "metrics"], input=text.encode(), capture_output=True)
    out = (p.stdout + p.stderr).decode()
    assert p.returncode == 0 and not out.strip(), "promtool check metrics:\n" + out


def test_metrics_families():
    if not os.environ.get("IM_GW_BIN"):
        print("  (no IM_GW_BIN: skipped)")
        return
    text = metrics_of(TYPED)
    promtool_ok(text)
    tail = text[text.index("# HELP im_push_results_total"):]
    assert tail.startswith(
        "# HELP im_push_results_total Push results by outcome.\n"
        "# TYPE im_push_results_total counter\n"
        "im_push_results_total{result=\"delivered\"} 3\n"
        "im_push_results_total{result=\"we\\\"ird\\\\ \\n\"} 1\n"
        "# HELP im_outbox_pending Pending items.\n"
        "# TYPE im_outbox_pending gauge\n"
        "im_outbox_pending 2\n"
        "# HELP im_stage_x_seconds Stage x.\n"
        "# TYPE im_stage_x_seconds histogram\n"
        "im_stage_x_seconds_bucket{le=\"0.5\"} 1\n"
        "im_stage_x_seconds_bucket{le=\"+Inf\"} 2\n"
        "im_stage_x_seconds_sum 0.7\n"
        "im_stage_x_seconds_count 2\n"
        "# HELP im_lag_seconds Help with \\\\ and\\na newline.\n"
        "# TYPE im_lag_seconds gauge\n"
        "im_lag_seconds +Inf\n"
        "# HELP im_shard_rows Rows by shard.\n"
        "# TYPE im_shard_rows gauge\n"
        "im_shard_rows{shard=\"3\"} 1\n"), tail
    assert "bad name" not in text and "im_bad_label" not in text and "im_nested_label" not in text
    assert "im_gateway_db_up 5" not in text
    old = metrics_of(OLD)
    promtool_ok(old)
    assert "# HELP im_outbox_pending Pending items.\nim_outbox_pending 2\n" in old, old[-400:]
    assert "embedded labels" not in old


SERVER_LOG = os.environ.get("IM_SERVER_LOG")


async def test_trace_chain():
    """One trace id from a client frame to every place contract §21 names:
    the gateway's JSON line, the event, the worker's line about the item
    when its fanout fails (a trigger refuses the recipients' inbox rows for
    this one event), and im.trace_message's rows once it is repaired."""
    if not (LOG and SERVER_LOG):
        print("  (no IM_GW_LOG / IM_SERVER_LOG: skipped)")
        return
    tid = "chain-%d" % os.getpid()
    a, b, conv, ca = await pair()
    sql("CREATE OR REPLACE FUNCTION public.im_test_refuse_traced() RETURNS trigger LANGUAGE plpgsql AS $f$ "
        "BEGIN IF (SELECT e.trace_id FROM im.event e WHERE e.message_id = NEW.source_event_id) = '%s' "
        "THEN RAISE EXCEPTION 'refused for the trace test'; END IF; RETURN NEW; END $f$" % tid)
    sql("CREATE TRIGGER im_test_refuse_traced BEFORE INSERT ON im.inbox "
        "FOR EACH ROW EXECUTE FUNCTION public.im_test_refuse_traced()")
    try:
        r = await ca.req({"type": "send", "conversation_id": conv, "client_msg_id": "chain",
                          "body": {"text": BODY_MARK}, "trace_id": tid})
        assert r["type"] == "send_result" and r["trace_id"] == tid, r
        mid = r["message_id"]
        # the event and its outbox item keep it
        assert sql("SELECT e.trace_id, o.trace_id FROM im.event e JOIN im.outbox o ON o.source_event_id = e.message_id "
                   "WHERE e.message_id = %s", mid) == [(tid, tid)]
        # the gateway's request line
        _, by_trace = log_requests()
        rec = by_trace[tid][0]
        assert rec["type"] == "send" and rec["result"] == "ok" and rec["conversation_id"] == conv, rec
        # the worker's line about the failing item names its stage and the trace id
        wait_until("a server log line with stage=fanout trace_id=%s" % tid,
                   lambda: ("stage=fanout trace_id=%s" % tid) in open(SERVER_LOG, errors="replace").read())
        line = [x for x in open(SERVER_LOG, errors="replace") if "trace_id=%s" % tid in x][0]
        assert BODY_MARK not in line, line
    finally:
        sql("DROP TRIGGER IF EXISTS im_test_refuse_traced ON im.inbox")
        sql("DROP FUNCTION IF EXISTS public.im_test_refuse_traced()")
    # repaired: the retry comes now rather than after its backoff
    sql("UPDATE im.outbox SET next_attempt_at = now() WHERE source_event_id = %s AND state = 'pending'", mid)
    wait_until("the repaired item fanned out",
               lambda: sql("SELECT state FROM im.outbox WHERE source_event_id = %s", mid)[0][0] == "done")
    rows = sql("SELECT stage, user_id, detail->>'trace_id' FROM im.trace_message(%s)", mid)
    stages = [x[0] for x in rows]
    assert stages[0] == "accepted" and rows[0][2] == tid, rows
    fanned = sorted(x[1] for x in rows if x[0] == "fanout")
    assert fanned == sorted([a, b]), rows
    assert all(x[2] == tid for x in rows), rows
    await ca.close()


if __name__ == "__main__":
    sys.exit(run_tests([test_trace_ids_in_replies, test_bad_trace_id_writes_nothing,
                        test_writes_store_trace_id, test_json_log_lines, test_promtool_check_metrics,
                        test_metrics_families, test_trace_chain],
                       label="trace"))
