#!/usr/bin/env bash
# Second throwaway clusters for the worker suite:
#   1. im_sync NOT preloaded: no shared memory, no workers.  Sends (which
#      ask for a commit-time wake-up) and im.run_fanout still work, and the
#      shared counters read 0 instead of failing.
#   2. preloaded with im_sync.fanout_workers = 0: no worker starts.
# Runs in its own shell so the harness cluster's PG* variables stay intact.
set -uo pipefail
cd "$(dirname "$0")/../.."
source test/harness/cluster.sh
fail=0
check() { if [ "$2" = "$3" ]; then echo "ok   $1"; else echo "FAIL $1 (got '$2', want '$3')"; fail=1; fi; }

scenario() {   # scenario NAME CONF-LINES...
  local name=$1; shift
  (
    im_cluster_start "$@" >/dev/null || { echo "FAIL $name: cluster did not start"; exit 1; }
    trap im_cluster_destroy EXIT
    im_psql -d postgres -c "CREATE DATABASE im_test" >/dev/null
    im_psql -d im_test -c "CREATE EXTENSION im_sync CASCADE" >/dev/null 2>&1
    sleep 1
    workers=$(im_psql -d im_test -At -c "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'im_sync fanout worker'")
    check "$name: no fanout worker runs" "$workers" 0
    conv=$(im_psql -d im_test -At -c "SELECT im.create_conversation('group', ARRAY[1,2,3]::bigint[], 1)")
    sent=$(im_psql -d im_test -At -c "SELECT created FROM im.send_message(1, $conv, 'np-1', '{\"t\": 1}')")
    check "$name: send_message works (commit-time wake-up is harmless)" "$sent" t
    done_items=$(im_psql -d im_test -At -c "SELECT im.run_fanout()")
    check "$name: im.run_fanout delivers" "$done_items" 2
    unread=$(im_psql -d im_test -At -c "SELECT unread_count FROM im.user_conversation WHERE user_id = 2 AND conversation_id = $conv")
    check "$name: the receiver's unread count" "$unread" 1
    im_psql -d im_test -c "SELECT * FROM im.authenticate('not-a-token')" >/dev/null 2>&1
    echo "$name: im_auth_failures_total = $(im_psql -d im_test -At -c "SELECT value FROM im.metrics() WHERE name = 'im_auth_failures_total'")"
    [ "$name" = "not preloaded" ] && check "$name: shared counters read 0 without shared memory" \
      "$(im_psql -d im_test -At -c "SELECT value FROM im.metrics() WHERE name = 'im_auth_failures_total'")" 0
    exit $fail
  ) || fail=1
}

scenario "not preloaded" "shared_preload_libraries = ''"
scenario "fanout_workers = 0" "im_sync.fanout_workers = 0"
exit $fail
