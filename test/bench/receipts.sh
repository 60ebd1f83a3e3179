#!/usr/bin/env bash
# Receipt overhead benchmark (not a test): ACK and read report calls/s on a
# 1.10 catalog (no receipts) and a 1.11 catalog (receipts queued), same
# cluster and library, alternating rounds (test/bench/receipts/receipts_bench.py).
# fsync on unless --fsync-off.  Knobs: IM_BENCH_MESSAGES (5000),
# IM_BENCH_CALLS (500), IM_BENCH_REPEAT (9).
set -euo pipefail
cd "$(dirname "$0")/../.."
source test/harness/cluster.sh
im_bench_parse_args "$@" || exit 2
im_bench_cluster_start "im_sync.fanout_paused = on" "im_sync.fanout_workers = 0" >/dev/null || exit 1
trap im_cluster_destroy EXIT
for db in im_bench_before im_bench_after; do
  "$PGBIN/psql" -X -q -d postgres -c "CREATE DATABASE $db"
done
"$PGBIN/psql" -X -q -d im_bench_before -c "CREATE EXTENSION im_sync VERSION '1.10' CASCADE"
"$PGBIN/psql" -X -q -d im_bench_after -c "CREATE EXTENSION im_sync CASCADE"
echo "receipt overhead benchmark: $(im_bench_durability)"
IM_BENCH_DSN_BASE="host=$PGHOST port=$PGPORT user=$PGUSER" /usr/bin/python3 test/bench/receipts/receipts_bench.py
