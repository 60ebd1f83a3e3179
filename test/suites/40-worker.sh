#!/usr/bin/env bash
# Fanout background workers in the harness's preloaded cluster (database
# im_test, workers started paused): wake-up, draining, hint format and
# chunking, poison item -> dead letter without a crash, SIGTERM restart
# (test/worker/worker_check.py); the owner switch contains a compromised
# owner role: the workers act as it and stop while it has members
# (test/worker/owner_check.py); then two extra throwaway clusters: not
# preloaded, and fanout_workers = 0 (test/worker/no_preload_check.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
source test/harness/cluster.sh
# The distribution's python has psycopg2 (python3-psycopg2 in test/harness/deps.txt).
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
rc=0
"$PY" test/worker/worker_check.py || rc=1
"$PY" test/worker/owner_check.py || rc=1
bash test/worker/no_preload_check.sh || rc=1
exit $rc
