#!/usr/bin/env bash
# 85-runbook: the commands of extension/doc/runbook.md's "A user says a
# message is missing" run against a scenario (a quarantined item, a dead
# letter) and must print what the runbook says they print
# (test/runbook/check_runbook.py).  Its own cluster, because the database's
# lines are read from PostgreSQL's jsonlog (logging_collector), which the
# harness cluster does not run; fanout by im.run_fanout (no workers), so the
# scenario's failures happen in the test's own sessions.
#   IM_RUNBOOK=FILE   check another copy of the runbook (to see the test fail)
set -uo pipefail
cd "$(dirname "$0")/../.."
source test/harness/cluster.sh
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
trap im_cluster_destroy EXIT
im_cluster_start "im_sync.database = 'im_runbook'" "im_sync.fanout_workers = 0" \
  "logging_collector = on" "log_destination = 'jsonlog'" "log_directory = 'log'" || exit 1
PGOPTIONS="-c client_min_messages=warning" im_createdb im_runbook || exit 1
export PGBIN PGDATABASE=im_runbook
"$PY" test/runbook/check_runbook.py
