#!/usr/bin/env bash
# test/router/router_check.sh — the router extension's check:
# brings up a sharded installation (test/harness/shards.sh up 3: three nodes and a
# router with im_sync_router configured), runs test/router/router_check.py
# and then test/router/router_security.py (what a plain login role can reach
# through the router) against it, and stops everything, pass or fail.  The entry point
# of the router part of the 70-shards suite.  Needs im_sync and
# im_sync_router installed in the PostgreSQL that pg_config names.
set -euo pipefail
cd "$(dirname "$0")/../.."
export IM_SHARDS_SH=${IM_SHARDS_SH:-test/harness/shards.sh}
SHARDS=$IM_SHARDS_SH
export IM_SHARDS_DIR=${IM_SHARDS_DIR:-$(mktemp -d /tmp/im_router_check.XXXXXX)}
chmod 755 "$IM_SHARDS_DIR"
cleanup() { bash "$SHARDS" down >/dev/null 2>&1 || true; }
trap cleanup EXIT
router=$(bash "$SHARDS" up 3 | tail -n 1)
[ -n "$router" ] || { echo "router_check: shards did not come up" >&2; exit 1; }
# The distribution's python has psycopg2 (python3-psycopg2 in test/harness/deps.txt).
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
rc=0
"$PY" test/router/router_check.py "$router" "$IM_SHARDS_DIR" || rc=1
"$PY" test/router/router_security.py "$router" "$IM_SHARDS_DIR" || rc=1
exit $rc
