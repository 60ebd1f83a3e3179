#!/usr/bin/env bash
# Maintenance in the harness's preloaded cluster:
#   - a simulated month of traffic with only maintenance running ends with
#     reconcile() clean and every table bounded by its retention, and the
#     same traffic without maintenance does not (test/maintenance/simulated_month.py);
#   - the first fanout worker collects inbox GC in committed chunks and runs
#     the rest of maintenance on its own (test/maintenance/worker_maintenance_check.py);
#   - many failed authentications: every one counted, at most one summary
#     line per minute in the server log (test/maintenance/auth_log_check.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
source test/harness/cluster.sh
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
rc=0
im_createdb im_month
"$PY" test/maintenance/simulated_month.py im_month || rc=1
im_createdb im_month_control
"$PY" test/maintenance/simulated_month.py im_month_control --no-maintenance || rc=1
im_psql -d postgres -c "DROP DATABASE im_month" -c "DROP DATABASE im_month_control" || rc=1
"$PY" test/maintenance/worker_maintenance_check.py || rc=1
"$PY" test/maintenance/auth_log_check.py "$IM_TMP/server.log" || rc=1
exit $rc
