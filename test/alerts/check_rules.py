#!/usr/bin/env python3
"""check_rules.py — what promtool does not check about the shipped alert rules.

  check_rules.py check RULES TESTS
      every alerting rule has for:, severity page|ticket, a summary, a
      description and a runbook pointing at a section of
      extension/doc/runbook.md (its headings, when the file is there); the
      unit tests load RULES, name only alerts that exist (a misspelled name
      in a not-firing case would pass for nothing), and give every alert at
      least one case where it fires and one where it does not.
  check_rules.py mutate RULES TESTS
      proves each alert's tests can fail: for every alert, its expression is
      replaced by one that never fires and then by one that always fires,
      and `promtool test rules` on that alert's cases must fail both times
      (slow: two promtool runs per alert; not part of the suite).
  check_rules.py shorten RULES OUT DURATION
      writes a copy of RULES with every `for:` set to DURATION (the
      end-to-end test's copy; the shipped values stay).
"""
import copy
import os
import re
import subprocess
import sys
import tempfile

import yaml

SEVERITIES = {"page", "ticket"}
RUNBOOK = "extension/doc/runbook.md"
ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def alerting_rules(rules):
    for g in rules.get("groups") or []:
        for r in g.get("rules") or []:
            if "alert" in r:
                yield g, r


def slug(heading):
    """GitHub's anchor of a Markdown heading."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def runbook_anchors(path=os.path.join(ROOT, RUNBOOK)):
    """The anchors of the runbook's headings (not of # lines in code blocks), or None."""
    if not os.path.exists(path):
        return None
    anchors, fenced = set(), False
    for line in open(path, encoding="utf-8"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m and not fenced:
            anchors.add(slug(m.group(1)))
    return anchors


def check(rules_path, tests_path):
    errors = []
    rules = yaml.safe_load(open(rules_path))
    tests = yaml.safe_load(open(tests_path))
    anchors = runbook_anchors()
    names = []
    for g, r in alerting_rules(rules):
        a = r["alert"]
        names.append(a)
        if "for" not in r:
            errors.append(f"{a}: no for: (one bad scrape would alert)")
        sev = (r.get("labels") or {}).get("severity")
        if sev not in SEVERITIES:
            errors.append(f"{a}: severity {sev!r}, not one of {sorted(SEVERITIES)}")
        ann = r.get("annotations") or {}
        for k in ("summary", "description", "runbook"):
            if not ann.get(k):
                errors.append(f"{a}: no {k} annotation")
        rb = ann.get("runbook", "")
        if not rb.startswith(RUNBOOK + "#"):
            errors.append(f"{a}: runbook {rb!r} is not a section of {RUNBOOK}")
        elif anchors is not None and rb.split("#", 1)[1] not in anchors:
            errors.append(f"{a}: {RUNBOOK} has no section #{rb.split('#', 1)[1]}")
    if len(set(names)) != len(names):
        errors.append("an alert name is used twice")
    if not names:
        errors.append(f"{rules_path}: no alerting rules")

    here = os.path.dirname(os.path.abspath(tests_path))
    loaded = [os.path.normpath(os.path.join(here, f)) for f in tests.get("rule_files") or []]
    if os.path.normpath(os.path.abspath(rules_path)) not in loaded:
        errors.append(f"{tests_path}: rule_files {tests.get('rule_files')} does not load {rules_path}")
    fires, quiet = set(), set()
    for t in tests.get("tests") or []:
        for c in t.get("alert_rule_test") or []:
            a = c.get("alertname")
            if a not in names:
                errors.append(f"test {t.get('name')!r}: alert {a!r} is not in {rules_path}")
            (fires if c.get("exp_alerts") else quiet).add(a)
    for a in names:
        if a not in fires:
            errors.append(f"{a}: no test case where it fires")
        if a not in quiet:
            errors.append(f"{a}: no test case where it does not fire")
    for e in errors:
        print("FAIL", e)
    if anchors is None:
        print(f"note: {RUNBOOK} is not in this tree; runbook anchors not checked")
    print(f"{len(names)} alerts, each with a firing and a not-firing test case" if not errors
          else f"{len(errors)} problem(s)")
    return not errors


def promtool_test(rules, tests, alert, rules_path, tests_path):
    """promtool test rules on the cases of one alert, against a rules document."""
    sub = copy.deepcopy(tests)
    keep = []
    for t in sub["tests"]:
        cases = [c for c in t.get("alert_rule_test") or [] if c.get("alertname") == alert]
        if cases:
            t["alert_rule_test"] = cases
            keep.append(t)
    sub["tests"] = keep
    with tempfile.TemporaryDirectory() as d:
        rp = os.path.join(d, os.path.basename(rules_path))
        yaml.safe_dump(rules, open(rp, "w"), sort_keys=False)
        sub["rule_files"] = [os.path.basename(rules_path)]
        tp = os.path.join(d, "tests.yml")
        yaml.safe_dump(sub, open(tp, "w"), sort_keys=False)
        return subprocess.run(["promtool", "test", "rules", tp], capture_output=True, text=True).returncode == 0


def mutate(rules_path, tests_path):
    rules = yaml.safe_load(open(rules_path))
    tests = yaml.safe_load(open(tests_path))
    ok = True
    for a in [r["alert"] for _, r in alerting_rules(rules)]:
        if not promtool_test(rules, tests, a, rules_path, tests_path):
            print(f"FAIL {a}: its tests fail on the shipped rules")
            ok = False
            continue
        for kind, expr in (("never fires", "vector(1) > 2"), ("always fires", "vector(1)")):
            m = copy.deepcopy(rules)
            for _, r in alerting_rules(m):
                if r["alert"] == a:
                    r["expr"] = expr
            failed = not promtool_test(m, tests, a, rules_path, tests_path)
            print(f"{'ok  ' if failed else 'FAIL'} {a}: with an expression that {kind} its tests "
                  f"{'fail' if failed else 'still pass'}")
            ok = ok and failed
    return ok


def shorten(rules_path, out, duration):
    rules = yaml.safe_load(open(rules_path))
    n = 0
    for _, r in alerting_rules(rules):
        if "for" in r:
            r["for"] = duration
            n += 1
    yaml.safe_dump(rules, open(out, "w"), sort_keys=False)
    print(f"{out}: {n} for: durations set to {duration}")
    return n > 0


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "check" and len(sys.argv) == 4:
        sys.exit(0 if check(sys.argv[2], sys.argv[3]) else 1)
    if cmd == "mutate" and len(sys.argv) == 4:
        sys.exit(0 if mutate(sys.argv[2], sys.argv[3]) else 1)
    if cmd == "shorten" and len(sys.argv) == 5:
        sys.exit(0 if shorten(sys.argv[2], sys.argv[3], sys.argv[4]) else 1)
    print(__doc__, file=sys.stderr)
    sys.exit(2)
