#!/usr/bin/env bash
# test/shards/standby_check.sh — a node fails over to its standby through a
# multi-host conninfo in the router's map (extension/doc/sharding.md):
# test/harness/shards.sh up 3, test/harness/shards.sh standby node2 (a synchronous streaming
# standby; node2's conninfo becomes host=a,b port=p1,p2
# target_session_attrs=read-write in the map and the subscriptions), then the
# drill of test/shards/standby_check.py (storm, kill -9, promote, reattach,
# nothing lost or doubled, reconcile empty); then test/harness/shards.sh standby node3
# and the drill of test/shards/ack_window_check.py (node3's standby stops
# receiving WAL while node1's transfers are applied on node3, kill -9,
# promote, reattach: nothing the standby lacked was acknowledged, nothing
# lost); everything stopped, pass or fail.  IM_STANDBY_DRILLS=window runs
# only the second one.
set -euo pipefail
cd "$(dirname "$0")/../.."
source test/harness/cluster.sh
export IM_SHARDS_DIR=${IM_SHARDS_DIR:-$(mktemp -d /tmp/im_standby_check.XXXXXX)}
chmod 755 "$IM_SHARDS_DIR"
cleanup() { bash test/harness/shards.sh down >/dev/null 2>&1 || true; }
trap cleanup EXIT
make -s -C gateway im_gateway
router=$(bash test/harness/shards.sh up 3 2>"$IM_SHARDS_DIR.up.log" | tail -n 1)
[ -n "$router" ] || { echo "standby_check: shards did not come up" >&2; cat "$IM_SHARDS_DIR.up.log" >&2; exit 1; }
rm -f "$IM_SHARDS_DIR.up.log"
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
rc=0
if [ "${IM_STANDBY_DRILLS:-all}" != window ]; then
  bash test/harness/shards.sh standby node2
  "$PY" test/shards/standby_check.py "$router" "$IM_SHARDS_DIR" node2 || rc=1
fi
bash test/harness/shards.sh standby node3
"$PY" test/shards/ack_window_check.py "$router" "$IM_SHARDS_DIR" node3 || rc=1
exit $rc
