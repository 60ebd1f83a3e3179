"""check_runbook.py — the runbook's commands, run (suite 85-runbook).

extension/doc/runbook.md marks each command of its "Before you start" and
"A user says a message is missing" sections so it can be run here:

    <!-- runbook-step: NAME [case=CASE] [needs=WHAT] [fix=cause] -->
    ```sql            (or ```sh)
    …the command, with psql variables (:message_id, :'trace_id', …)…
    ```
    <!-- prints: REGEX -->            must match the output (every case)
    <!-- prints[CASE]: REGEX -->      must match in that case only
    <!-- prints-not[CASE]: REGEX -->  must not match
    <!-- prints[+WHAT]: REGEX -->      only where WHAT (see needs=) is installed

A REGEX is Python's, searched in the whole output (re.MULTILINE); a
:name in it stands for the scenario's value of that variable.  SQL runs
through psql (aligned output, as an operator sees it) with the variables
set by -v; a sh step runs in bash with the same values in the environment
(TRACE_ID, MESSAGE_ID, …) and PGDATA, PGDATABASE set.

The scenario: a group conversation in which a message's item is
quarantined for one member (a second membership period of that member,
inserted with the exclusion constraint bypassed, as a restore without it
would leave: the one way fanout meets a user it cannot decide), and another
group in which a message becomes a dead letter the poison way (a trigger on
im.inbox raising for it, im_sync.fanout_max_attempts = 2).  Each case runs
the section's steps in document order (steps of the other case left out),
including its repair; a step marked fix=cause runs after the test removed
the cause (the poison trigger), as the runbook tells the operator to.  At
the end im.reconcile() must be empty.

needs= names what a step relies on beyond the single-node basics:
needs=trace_message (the function), needs=trace_id (the trace_id columns
and send_message's trace_id argument), needs=trace_log (the fanout's log
lines about an item carry trace_id=; probed on the dead letter's lines).
Each is part of the catalog the runbook documents, so a step whose part
is missing fails (it is not skipped).

The test fails when a step errors, a pattern does not match, a step has no
pattern at all, one of the five anchors the alert rules point at is
missing, or (when extension/monitoring/im_sync_alerts.yml is there; IM_ALERTS
names another copy) a rule's runbook link is no heading or an alert is not
named in the Alerts section.  IM_RUNBOOK checks another copy of the runbook
(a changed pattern must make the test fail); IM_RUNBOOK_VERBOSE=1 prints
every step's output.
"""
import hashlib
import hmac
import os
import re
import subprocess
import sys
import time

import psycopg2

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RUNBOOK = os.environ.get("IM_RUNBOOK", os.path.join(ROOT, "extension", "doc", "runbook.md"))
ALERTS = os.environ.get("IM_ALERTS", os.path.join(ROOT, "extension", "monitoring", "im_sync_alerts.yml"))
DB = os.environ.get("PGDATABASE", "im_runbook")
PGBIN = os.environ.get("PGBIN") or subprocess.run(["pg_config", "--bindir"], capture_output=True,
                                                  text=True).stdout.strip()
VERBOSE = bool(os.environ.get("IM_RUNBOOK_VERBOSE"))  # print every step's output
# the sections whose marked steps run, in this order
SECTIONS = ("Before you start", "A user says a message is missing")
# the headings the alert rules' runbook annotations point at (runbook.md#…)
ANCHORS = {
    "a-user-says-a-message-is-missing": "A user says a message is missing",
    "a-device-keeps-resyncing": "A device keeps resyncing",
    "pushes-stopped": "Pushes stopped",
    "one-node-is-behind": "One node is behind",
    "alerts": "Alerts",
}
CASES = ("quarantined", "dead_letter")

failures = []


def say(msg):
    print(msg, flush=True)


def fail(msg):
    say(f"    FAIL  {msg}")
    failures.append(msg)


# ---- the markdown --------------------------------------------------------

STEP_RE = re.compile(r"^<!--\s*runbook-step:\s*([\w.-]+)((?:\s+[\w-]+=[\w.-]+)*)\s*-->\s*$")
PRINTS_RE = re.compile(r"^<!--\s*prints(-not)?(?:\[([\w,+]+)\])?:\s?(.*?)\s*-->\s*$")
FENCE_RE = re.compile(r"^```(\w+)\s*$")


def section_lines(text, title):
    lines = text.splitlines()
    start = None
    for i, line in enumerate(lines):
        if start is None and line.strip() == f"## {title}":
            start = i + 1
        elif start is not None and line.startswith("## "):
            return lines[start:i], start
    if start is None:
        return None, 0
    return lines[start:], start


def parse_steps(lines, offset):
    """The marked steps of a section: name, attrs, lang, code, patterns."""
    steps = []
    i = 0
    while i < len(lines):
        m = STEP_RE.match(lines[i].strip())
        if not m:
            if "runbook-step" in lines[i]:
                fail(f"line {offset + i + 1}: malformed step marker: {lines[i].strip()}")
            elif PRINTS_RE.match(lines[i].strip()):
                fail(f"line {offset + i + 1}: a prints marker that follows no step")
            i += 1
            continue
        name, attr_text = m.group(1), m.group(2)
        attrs = dict(a.split("=", 1) for a in attr_text.split())
        lineno = offset + i + 1
        i += 1
        while i < len(lines) and not lines[i].strip():
            i += 1
        f = FENCE_RE.match(lines[i].strip()) if i < len(lines) else None
        if not f or f.group(1) not in ("sql", "sh"):
            fail(f"line {lineno}: step {name} is not followed by a ```sql or ```sh block")
            continue
        lang = f.group(1)
        i += 1
        code = []
        while i < len(lines) and lines[i].strip() != "```":
            code.append(lines[i])
            i += 1
        i += 1
        patterns = []
        while i < len(lines):
            s = lines[i].strip()
            p = PRINTS_RE.match(s)
            if p:
                cases = tuple(p.group(2).split(",")) if p.group(2) else None
                patterns.append((bool(p.group(1)), cases, p.group(3)))
            elif s and not s.startswith("<!--"):
                break
            elif s.startswith("<!--") and STEP_RE.match(s):
                break
            i += 1
        steps.append({"name": name, "attrs": attrs, "lang": lang, "code": "\n".join(code) + "\n",
                      "patterns": patterns, "line": lineno})
    return steps


def github_anchor(heading):
    a = heading.strip().lower()
    a = re.sub(r"[^\w\- ]", "", a)
    return a.replace(" ", "-")


def check_anchors(text):
    headings = {github_anchor(m.group(1)) for m in re.finditer(r"^##+ (.+)$", text, re.M)}
    for anchor, title in ANCHORS.items():
        if anchor not in headings:
            fail(f"the heading '## {title}' (anchor #{anchor}) is missing")
    if not os.path.exists(ALERTS):
        say(f"--- alert rules: {os.path.relpath(ALERTS, ROOT)} not present; their annotations not checked")
        return
    rules = open(ALERTS).read()
    links = re.findall(r"runbook\.md#([\w-]+)", rules)
    alerts_text, _ = section_lines(text, "Alerts")
    names = re.findall(r"^\s*-?\s*alert:\s*(\S+)", rules, re.M)
    for anchor in sorted(set(links)):
        if anchor not in headings:
            fail(f"an alert rule points at runbook.md#{anchor}, which is no heading")
    for n in sorted(set(names)):
        if alerts_text is None or not any(f"`{n}`" in line for line in alerts_text):
            fail(f"alert {n} of the rules is not in the runbook's Alerts section")
    say(f"--- alert rules: {len(set(names))} alerts, {len(set(links))} runbook anchors, checked")


# ---- the database ----------------------------------------------------------

def connect():
    conn = psycopg2.connect(dbname=DB)
    conn.autocommit = True
    return conn


def q(conn, sql, args=None):
    with conn.cursor() as cur:
        cur.execute(sql, args)
        return cur.fetchall() if cur.description else []


def q1(conn, sql, args=None):
    rows = q(conn, sql, args)
    return rows[0][0] if rows else None


def activate(conn, user, device):
    q(conn, "SELECT im.register_device(%s, %s)", (user, device))
    tok, digest = q(conn, "SELECT snapshot_token, manifest_digest FROM im.begin_snapshot(%s, %s)",
                    (user, device))[0]
    q(conn, "SELECT im.ack_snapshot(%s, %s, %s, %s)", (user, device, tok, digest))


def send(conn, sender, conv, key, body, trace_id, with_trace):
    if with_trace:
        return q(conn, "SELECT message_id FROM im.send_message(%s, %s, %s, %s, trace_id => %s)",
                 (sender, conv, key, body, trace_id))[0][0]
    return q(conn, "SELECT message_id FROM im.send_message(%s, %s, %s, %s)", (sender, conv, key, body))[0][0]


def drain(conn):
    for _ in range(50):
        if q1(conn, "SELECT im.run_fanout()") == 0:
            return


ALICE, BOB, CAROL = 8101, 8102, 8103


def setup(conn, have):
    """The two cases; returns {case: psql variables}."""
    with_trace = have["trace_id"]
    q(conn, "SET client_min_messages = warning")
    for u, d in ((ALICE, "laptop"), (BOB, "phone"), (CAROL, "tablet")):
        activate(conn, u, d)
    scen = {}

    # quarantined: bob gets a second period over the group's positions, as
    # a restore without the exclusion constraint would leave it
    g1 = q1(conn, "SELECT im.create_conversation('group', ARRAY[%s, %s, %s]::bigint[], %s)",
            (ALICE, BOB, CAROL, ALICE))
    send(conn, ALICE, g1, "rb-hello", '{"text": "hello"}', "rb-hello-0001", with_trace)
    drain(conn)
    created = q1(conn, "SELECT message_id FROM im.event WHERE conversation_id = %s AND kind = 'create'", (g1,))
    q(conn, "ALTER TABLE im.membership_period DROP CONSTRAINT membership_period_no_overlap")
    bad = q1(conn, "INSERT INTO im.membership_period (conversation_id, user_id, join_seq, leave_seq, "
                   "join_event_id, leave_event_id) SELECT %s, %s, c.head_msg_seq + 1, 1000000, %s, %s "
                   "FROM im.conversation c WHERE c.conversation_id = %s "
                   "RETURNING membership_period_id", (g1, BOB, created, created, g1))
    m1 = send(conn, ALICE, g1, "rb-lost", '{"text": "see you at 5"}', "rb-quarantine-0001", with_trace)
    drain(conn)
    ob1 = q1(conn, "SELECT outbox_id FROM im.outbox WHERE source_event_id = %s", (m1,))
    if q1(conn, "SELECT count(*) FROM im.fanout_quarantine WHERE outbox_id = %s AND user_id = %s",
          (ob1, BOB)) != 1:
        fail("scenario: the item was not quarantined for bob")
    scen["quarantined"] = {"conversation_id": g1, "user_id": BOB, "sender_id": ALICE, "message_id": m1,
                           "outbox_id": ob1, "bad_period_id": bad, "trace_id": "rb-quarantine-0001"}

    # dead letter: a trigger on im.inbox fails every attempt of one item
    g2 = q1(conn, "SELECT im.create_conversation('group', ARRAY[%s, %s, %s]::bigint[], %s)",
            (ALICE, BOB, CAROL, ALICE))
    drain(conn)
    m2 = send(conn, ALICE, g2, "rb-poison", '{"text": "the report"}', "rb-deadletter-0001", with_trace)
    q(conn, f"""CREATE FUNCTION public.runbook_poison() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN IF NEW.source_event_id = {m2} THEN RAISE EXCEPTION 'runbook: poison item'; END IF;
        RETURN NEW; END $$""")
    q(conn, "CREATE TRIGGER runbook_poison BEFORE INSERT ON im.inbox FOR EACH ROW "
            "EXECUTE FUNCTION public.runbook_poison()")
    later = send(conn, ALICE, g2, "rb-after", '{"text": "and after"}', "rb-after-0001", with_trace)
    q(conn, "SET im_sync.fanout_max_attempts = 2")
    for _ in range(6):
        q(conn, "UPDATE im.outbox SET next_attempt_at = now() WHERE state = 'pending'")
        q(conn, "SELECT im.run_fanout()")
    ob2 = q1(conn, "SELECT outbox_id FROM im.outbox WHERE source_event_id = %s", (m2,))
    if q1(conn, "SELECT state FROM im.outbox WHERE outbox_id = %s", (ob2,)) != "dead":
        fail("scenario: the poison item is not a dead letter")
    if q1(conn, "SELECT count(*) FROM im.inbox WHERE source_event_id = %s", (later,)) != 3:
        fail("scenario: the conversation did not move on past the dead letter")
    scen["dead_letter"] = {"conversation_id": g2, "user_id": BOB, "sender_id": ALICE, "message_id": m2,
                           "outbox_id": ob2, "trace_id": "rb-deadletter-0001"}
    return scen


def item_lines_carry_trace(v):
    """Whether the server log's lines about the dead letter's item carry its trace id."""
    logdir = os.path.join(os.environ["PGDATA"], "log")
    needle = f"fanout of outbox item {v['outbox_id']} "
    lines = []
    for _ in range(100):		# the logging collector writes a moment later
        lines = []
        for name in sorted(os.listdir(logdir)) if os.path.isdir(logdir) else ():
            if name.endswith(".json"):
                lines += [l for l in open(os.path.join(logdir, name), errors="replace") if needle in l]
        if any("now a dead letter" in l for l in lines):
            break
        time.sleep(0.1)
    if not lines:
        fail(f"the server log has no line about outbox item {v['outbox_id']} (jsonlog not on?)")
    return any(f"trace_id={v['trace_id']}" in l for l in lines)


def fix_cause(conn, case):
    """What the operator fixes before a fix=cause step."""
    if case == "dead_letter":
        q(conn, "DROP TRIGGER runbook_poison ON im.inbox")
        q(conn, "DROP FUNCTION public.runbook_poison()")


# ---- running the steps -------------------------------------------------------

def run_step(step, vars_):
    env = dict(os.environ, PGDATABASE=DB, PAGER="", PSQL_PAGER="")
    env["PATH"] = PGBIN + os.pathsep + env.get("PATH", "")
    for k, v in vars_.items():
        env[k.upper()] = str(v)
    if step["lang"] == "sql":
        cmd = [os.path.join(PGBIN, "psql"), "-X", "-v", "ON_ERROR_STOP=1", "-P", "pager=off", "-d", DB]
        for k, v in vars_.items():
            cmd += ["-v", f"{k}={v}"]
        cmd += ["-f", "-"]
        p = subprocess.run(cmd, input=step["code"], capture_output=True, text=True, env=env, timeout=60)
    else:
        p = subprocess.run(["bash", "-c", step["code"]], capture_output=True, text=True, env=env, timeout=60)
    return p.returncode, p.stdout + p.stderr


def expand(pattern, vars_):
    return re.sub(r"(?<![:\w]):(\w+)",
                  lambda m: re.escape(str(vars_[m.group(1)])) if m.group(1) in vars_ else m.group(0),
                  pattern)


def main():
    text = open(RUNBOOK).read()
    say(f"--- runbook: {os.path.relpath(RUNBOOK, ROOT) if RUNBOOK.startswith(ROOT) else RUNBOOK}")
    check_anchors(text)
    steps = []
    for title in SECTIONS:
        lines, offset = section_lines(text, title)
        if lines is None:
            fail(f"no section '## {title}'")
            continue
        found = parse_steps(lines, offset)
        say(f"--- {len(found)} marked steps in '{title}'")
        steps += found
    if not any(s["name"] for s in steps):
        fail("no marked steps")
        return finish(0, 0)
    for s in steps:
        if not s["patterns"]:
            fail(f"step {s['name']} (line {s['line']}) says nothing it prints")
        for case in s["attrs"].get("case", "").split(",") if "case" in s["attrs"] else ():
            if case not in CASES:
                fail(f"step {s['name']}: unknown case {case}")

    conn = connect()
    have = {
        "trace_message": q1(conn, "SELECT to_regprocedure('im.trace_message(bigint)') IS NOT NULL"),
        # the columns, and send_message's trailing trace_id argument that fills them
        "trace_id": q1(conn, "SELECT count(*) = 2 FROM pg_attribute WHERE attname = 'trace_id' "
                             "AND attrelid IN ('im.event'::regclass, 'im.outbox'::regclass) "
                             "AND NOT attisdropped")
                    and q1(conn, "SELECT bool_or('trace_id' = ANY (proargnames)) FROM pg_proc "
                                 "WHERE oid = 'im.send_message'::regproc"),
    }
    scen = setup(conn, have)
    # the fanout's log lines name the item's trace id: probed
    # on the dead letter's own lines, which the scenario just wrote
    have["trace_log"] = have["trace_id"] and item_lines_carry_trace(scen["dead_letter"])
    # the gateway's --log-key and the user's hash with it (gateway/doc/README.md "Logs")
    key_file = os.path.join(os.environ.get("IM_TMP", "/tmp"), "runbook-log.key")
    key = b"0123456789abcdef0123456789abcdef"
    with open(key_file, "wb") as f:
        f.write(key + b"\n")
    for v in scen.values():
        v["log_key_file"] = key_file
        v["user_hash"] = "h:" + hmac.new(key, b"u:%d" % v["user_id"], hashlib.sha256).hexdigest()[:16]
    ran = skipped = 0
    for case in CASES:
        vars_ = scen[case]
        say(f"--- case {case}: " + ", ".join(f"{k}={v}" for k, v in vars_.items()))
        for s in steps:
            cases = s["attrs"].get("case")
            if cases and case not in cases.split(","):
                continue
            need = s["attrs"].get("needs")
            if need and not have.get(need, False):
                what = {"trace_message": "im.trace_message",
                        "trace_id": "trace ids (im.event.trace_id, send_message's trace_id)",
                        "trace_log": "trace_id= in the fanout's log lines"}.get(need, need)
                fail(f"{case}: step {s['name']} (line {s['line']}) needs {what}, which is not installed")
                skipped += 1
                continue
            if s["attrs"].get("fix") == "cause":
                fix_cause(conn, case)
            rc, out = run_step(s, vars_)
            ran += 1
            bad = []
            if rc != 0:
                bad.append(f"exit status {rc}")
            for negated, tokens, pattern in s["patterns"]:
                pcases = [t for t in tokens or () if not t.startswith("+")]
                pneeds = [t[1:] for t in tokens or () if t.startswith("+")]
                if pcases and case not in pcases:
                    continue
                if not all(have.get(n, False) for n in pneeds):
                    continue
                found = re.search(expand(pattern, vars_), out, re.M) is not None
                if found == negated:
                    bad.append(("prints unexpectedly: " if negated else "does not print: ") + pattern)
            if bad:
                fail(f"{case}: step {s['name']} (line {s['line']}): " + "; ".join(bad))
                say("      output:\n" + "\n".join("      | " + l for l in out.rstrip().splitlines()[:40]))
            else:
                say(f"    ok    {s['name']}")
                if VERBOSE:
                    say("\n".join("      | " + l for l in out.rstrip().splitlines()))
    left = q(conn, "SELECT check_name, conversation_id, user_id, detail::text FROM im.reconcile()")
    for r in left:
        say(f"    reconcile: {r}")
    if left:
        fail(f"im.reconcile() is not empty after the repairs ({len(left)} rows)")
    else:
        say("    ok    im.reconcile() is empty after the repairs")
    for case in CASES:
        v = scen[case]
        n = q1(conn, "SELECT count(*) FROM im.inbox WHERE source_event_id = %s", (v["message_id"],))
        if n != 3:
            fail(f"{case}: the message is in {n} logs after the repair, not 3")
    conn.close()
    return finish(ran, skipped)


def finish(ran, skipped):
    if failures:
        say(f"=== runbook: FAILED ({len(failures)} problems; {ran} steps run, {skipped} not runnable)")
        return 1
    say(f"=== runbook: {ran} steps run; every step printed what the runbook says")
    return 0


if __name__ == "__main__":
    sys.exit(main())
