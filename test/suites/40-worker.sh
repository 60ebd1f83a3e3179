#!/usr/bin/env bash
# Fanout background workers in the harness's preloaded cluster (database
# im_test, workers started paused): wake-up, draining, hint format and
# chunking, poison item -> dead letter without a crash, SIGTERM restart.
# The checks live in test/worker/worker_check.py.
set -euo pipefail
cd "$(dirname "$0")/../.."
source test/cluster.sh
# The distribution's python has psycopg2 (python3-psycopg2 in test/deps.txt).
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
exec "$PY" test/worker/worker_check.py
