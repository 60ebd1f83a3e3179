#!/usr/bin/env bash
# test/bench/shards.sh — three nodes vs one node in the same run:
# sends/s and fanout events/s through the router (all nodes share this
# machine's cores, so the ratio is an overhead, not a speed-up), cross-node
# delivery lag p50/p99 at a fixed moderate rate, and WAL and transfer bytes
# per delivered event.  Each side is a `test/harness/shards.sh up N` installation at
# production durability (fsync = on, synchronous_commit = on,
# full_page_writes = on; --fsync-off runs the old variant); the workload is
# test/bench/shards_bench.py.  IM_CLIENTS (4), IM_SECONDS (10), IM_MEMBERS
# (6), IM_GROUPS (60), IM_BATCH (600), IM_RATE (40), IM_LAG_SECONDS (10).
set -uo pipefail
cd "$(dirname "$0")/../.."
source test/harness/cluster.sh
im_bench_parse_args "$@" || exit 2
export IM_FSYNC=$IM_BENCH_FSYNC
results=$(mktemp)
dirs=()
cleanup() {
  for d in "${dirs[@]}"; do IM_SHARDS_DIR=$d bash test/harness/shards.sh down >/dev/null 2>&1 || true; done
  rm -f "$results"
}
trap cleanup EXIT
for n in 1 3; do
  d=$(mktemp -d /tmp/im_shards_bench.XXXXXX); chmod 755 "$d"; dirs+=("$d")
  IM_SHARDS_DIR=$d bash test/harness/shards.sh up "$n" >"$d/up.log" 2>&1 || { tail -n 20 "$d/up.log"; exit 1; }
  /usr/bin/python3 test/bench/shards_bench.py "$d" "nodes=$n" | tee -a "$results" || exit 1
  IM_SHARDS_DIR=$d bash test/harness/shards.sh down >/dev/null 2>&1 || true
done
val() { sed -n "s/^RESULT nodes=$1 .*$2=\([0-9.]*\).*/\1/p" "$results" | head -n 1; }
for k in sends_per_s fanout_events_per_s; do
  one=$(val 1 "$k"); three=$(val 3 "$k")
  awk -v k="$k" -v a="$one" -v b="$three" \
    'BEGIN { printf "RATIO %s: 3 nodes %s vs 1 node %s = %.2fx (same 2 cores: an overhead ratio)\n", k, b, a, (a > 0 ? b / a : 0) }'
done
echo "lag: 1 node p50 $(val 1 lag_ms_p50) ms p99 $(val 1 lag_ms_p99) ms; 3 nodes p50 $(val 3 lag_ms_p50) ms p99 $(val 3 lag_ms_p99) ms"
echo "bytes per delivered event: WAL 1 node $(val 1 wal_bytes_per_event), 3 nodes $(val 3 wal_bytes_per_event); transfer (decoded for slots) 3 nodes $(val 3 transfer_bytes_per_event)"
