#!/usr/bin/env bash
# Fault drills (design doc §19.4): test/drills/NN-*.py in name order against
# the harness cluster.  The drills kill backends and workers of THIS cluster
# only ($PGDATA) and restart it; they need the fanout workers, which live in
# im_sync.database = im_test, so im_test is recreated first (earlier suites
# may have left dead letters there on purpose).  Settings are restored at
# the end (ALTER SYSTEM RESET, fanout paused) for later suites.
set -uo pipefail
cd "$(dirname "$0")/../.."
source test/harness/cluster.sh
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
im_psql -d postgres -c "DROP DATABASE IF EXISTS im_test WITH (FORCE)" -c "CREATE DATABASE im_test" \
  && im_psql -d im_test -c "SET client_min_messages = warning" -c "CREATE EXTENSION im_sync CASCADE" || exit 1
passed=0; failed=0
for d in test/drills/[0-9]*.py; do
  if (cd test/drills && "$PY" "$(basename "$d")"); then passed=$((passed + 1)); else failed=$((failed + 1)); echo "drill $(basename "$d") FAILED"; fi
done
im_psql -d postgres -c "ALTER SYSTEM RESET ALL" -c "ALTER SYSTEM SET im_sync.fanout_paused = on" -c "SELECT pg_reload_conf()" >/dev/null
echo "drills: $passed passed, $failed failed"
[ $failed -eq 0 ]
