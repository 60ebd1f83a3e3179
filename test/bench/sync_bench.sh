#!/usr/bin/env bash
# Sync benchmark (not a test): catch-up throughput vs. a bare range SELECT,
# ACK throughput, and one page on a 10x longer log.  Starts its own
# throwaway cluster (fanout workers off: the bench runs fanout itself) and
# stops it.  Knobs: IM_BENCH_EVENTS (20000), IM_BENCH_LONG_FACTOR (10),
# IM_BENCH_REPEAT (5).
set -euo pipefail
cd "$(dirname "$0")/../.."
source test/harness/cluster.sh
im_bench_parse_args "$@" || exit 2
im_bench_cluster_start "im_sync.fanout_paused = on" "im_sync.fanout_workers = 0" >/dev/null || exit 1
trap im_cluster_destroy EXIT
im_createdb im_bench
echo "sync benchmark: $(im_bench_durability)"
IM_BENCH_DSN="host=$PGHOST port=$PGPORT user=$PGUSER dbname=im_bench" /usr/bin/python3 test/bench/sync/sync_bench.py
