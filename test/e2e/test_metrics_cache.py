#!/usr/bin/env python3
"""/metrics: unauthenticated scrapes do not each run
im.metrics().  30 scrapes, 15 at once and 15 one after another, cost at
most a couple of im.metrics() calls, counted by PostgreSQL itself
(pg_stat_user_functions with track_functions = 'all'); a scrape more than
5 s after the last refresh gets fresh figures (a new call)."""
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from imgw import run_tests, pg, sql  # noqa: E402
from gwmetrics import metric, scrape  # noqa: E402

MAX_CALLS = 2


def admin(*statements):
    c = pg()        # autocommit, outside any "with" block (ALTER SYSTEM)
    for q in statements:
        c.cursor().execute(q)
    c.close()


def calls():
    r = sql("SELECT calls FROM pg_stat_user_functions WHERE schemaname = 'im' AND funcname = 'metrics'")
    return r[0][0] if r else 0


def settled_calls():
    """Function statistics reach shared memory when a backend flushes them
    (at most about a second after the call, when it goes idle): read until
    two readings a flush interval apart agree."""
    last = calls()
    for _ in range(20):
        time.sleep(1.2)
        now = calls()
        if now == last:
            return now
        last = now
    return last


def test_metrics_cache():
    admin("ALTER SYSTEM SET track_functions = 'all'", "SELECT pg_reload_conf()")
    try:
        # the pool's backends see the reload before their next statement;
        # this scrape (and the wait past the cache age) makes sure of it
        scrape()
        time.sleep(5.5)
        scrape()
        base = settled_calls()
        r0 = metric("im_gateway_metrics_refreshes_total")
        time.sleep(5.5)         # the cache is stale: the first scrape refreshes it
        errors = []
        bodies = []

        def one():
            try:
                bodies.append(scrape())
            except Exception as e:      # noqa: BLE001
                errors.append(e)
        threads = [threading.Thread(target=one) for _ in range(15)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for _ in range(15):
            one()
        assert not errors, errors
        assert len(bodies) == 30 and all("im_gateway_connections" in b for b in bodies)
        refreshes = max(metric("im_gateway_metrics_refreshes_total", text=b) for b in bodies) - r0
        n = settled_calls() - base
        print("  30 scrapes -> %d im.metrics() calls (gateway: %d refreshes)" % (n, refreshes), flush=True)
        assert 1 <= n <= MAX_CALLS, "30 scrapes ran im.metrics() %d times" % n
        assert 1 <= refreshes <= MAX_CALLS, refreshes
        # older than 5 s: refreshed
        time.sleep(5.5)
        scrape()
        assert metric("im_gateway_metrics_refreshes_total") - r0 >= refreshes + 1
    finally:
        admin("ALTER SYSTEM RESET track_functions", "SELECT pg_reload_conf()")


if __name__ == "__main__":
    sys.exit(run_tests([test_metrics_cache], "test_metrics_cache"))
