#!/usr/bin/env bash
# Failover benchmark (NOT a test): a primary and a streaming
# standby at production durability, send tx/s with the standby
# asynchronous vs synchronous (synchronous_commit on, remote_write,
# remote_apply) in one run, and the failover time (kill -9 of the primary's
# postmaster, pg_ctl promote at once) to the first successful send through
# the gateway on a multi-host conninfo.  test/bench/failover/failover_bench.py.
# Knobs: IM_BENCH_ROUNDS (3 runs per mode, medians), IM_BENCH_ROUND_T
# (4 s per run), IM_BENCH_FAILOVERS (3).  --fsync-off runs without fsync.
# About 2 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
source test/harness/cluster.sh
im_bench_parse_args "$@" || exit 2
make -s -C gateway im_gateway
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
IM_PAIR_FSYNC=$IM_BENCH_FSYNC "$PY" test/bench/failover/failover_bench.py
