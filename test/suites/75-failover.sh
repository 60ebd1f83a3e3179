#!/usr/bin/env bash
# 75-failover: a primary and a streaming standby of their own
# (not the harness cluster), the gateway on a multi-host conninfo, a
# send/sync/ack storm through it, pg_ctl -m immediate / kill -9 of the
# primary, promotion, three modes checked through the API
# (test/failover/failover.py; the pair and the client processes that follow
# the primary — the gateway and the push relay — are in test/failover/pair.py).
set -uo pipefail
cd "$(dirname "$0")/../.."
source test/harness/cluster.sh
make -s -C gateway im_gateway im_push_relay || exit 1
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
"$PY" test/failover/failover.py
