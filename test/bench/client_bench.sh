#!/usr/bin/env bash
# client_bench.sh — benchmark of the reference client (not a test,
# prints figures).  Its own throwaway cluster at production durability
# (--fsync-off: the old variant), a gateway, then test/bench/client_bench.mjs:
#  1. catch-up of BENCH_EVENTS (10,000) events by the Node client with file
#     storage (every batch fdatasync'ed before its ACK) vs the raw sync
#     frames through the same gateway, alternating BENCH_ROUNDS (3) times,
#     median ratio;
#  2. send on one page -> display on the other in headless chromium, p50/p99
#     over BENCH_MESSAGES (100) messages.
set -uo pipefail
cd "$(dirname "$0")/../.."
source test/harness/cluster.sh
im_bench_parse_args "$@" || exit 2
bash test/harness/install_node_deps.sh || exit 1
make -s -C gateway im_gateway || exit 1
im_bench_cluster_start "im_sync.fanout_workers = 2" "im_sync.fanout_paused = off" || exit 1
trap im_cluster_destroy EXIT
im_createdb im_test || exit 1
im_bench_durability
mkdir -p "$IM_TMP/client"
export IM_CLIENT_TMP="$IM_TMP/client" IM_CLIENT_DB=im_test PGBIN IM_GATEWAY_BIN="$PWD/gateway/im_gateway"
timeout 900 node test/bench/client_bench.mjs
