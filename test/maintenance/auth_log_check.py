#!/usr/bin/env python3
"""Failed authentications are counted, and summarized in the log.

Run by test/suites/45-maintenance.sh against database im_test with the
server log's path as argument.  300 failed im.authenticate calls, each its
own top-level statement (as the gateway makes them): im_auth_failures_total
grows by 300, while the server log gains no per-failure line (neither the
error nor a LOG line) and at most one summary line per started minute.
"""
import sys
import time

import psycopg2

N = 300
log_path = sys.argv[1]
failures = []


def check(ok, what, detail=""):
    print(("ok   " if ok else "FAIL ") + what + (f" ({detail})" if detail and not ok else ""))
    if not ok:
        failures.append(what)


def log_lines(pattern):
    with open(log_path, errors="replace") as f:
        return sum(1 for line in f if pattern in line)


PER_FAILURE = ("device token authentication failed", "authentication failed for device",
               "im_sync: authentication failed:")
SUMMARY = "failed device authentications"

db = psycopg2.connect(dbname="im_test")
db.autocommit = True
cur = db.cursor()
cur.execute("SELECT value FROM im.metrics() WHERE name = 'im_auth_failures_total'")
before = cur.fetchone()[0]
lines_before = {p: log_lines(p) for p in PER_FAILURE + (SUMMARY,)}
codes = set()
start = time.time()
for i in range(N):
    try:
        cur.execute("SELECT * FROM im.authenticate(%s)", (f"not-a-token-{i}",))
    except psycopg2.Error as e:
        codes.add(e.pgcode)
elapsed = time.time() - start
cur.execute("SELECT value FROM im.metrics() WHERE name = 'im_auth_failures_total'")
after = cur.fetchone()[0]
time.sleep(0.5)  # let the server's stderr reach the file
new = {p: log_lines(p) - lines_before[p] for p in lines_before}

check(codes == {"28000"}, "every failed authentication is 28000", str(codes))
check(after - before == N, f"the metric counted all {N} failures", f"{after - before}")
check(all(new[p] == 0 for p in PER_FAILURE), "no per-failure line in the server log", str(new))
check(new[SUMMARY] <= 2 + int(elapsed // 60), "at most one summary line per minute",
      f"{new[SUMMARY]} lines in {elapsed:.0f} s")
check(log_lines(SUMMARY) >= 1, "failures are summarized in the log")
sys.exit(1 if failures else 0)
