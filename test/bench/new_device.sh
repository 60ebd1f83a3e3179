#!/usr/bin/env bash
# new_device.sh — the web page opened as a new device (not a test, prints
# figures; contract §20).  Its own throwaway cluster at production
# durability (--fsync-off: the old variant), a gateway, then
# test/bench/new_device.mjs: BENCH_CONVS (200) conversations of
# BENCH_MSGS (500) messages seeded through SQL and fanned out; then
# BENCH_ROUNDS (3) new devices of that user, each a fresh browser context
# in headless chromium: the ms from navigation until the conversation list
# shows its first item, all conversations and the ready state; the frames
# the page sent and the bytes it received by type; the top conversation
# opened (its last historyPage positions shown).  It exits non-zero if a
# round fetched history of a conversation it did not open or more than
# historyPage positions of the one it did (the suite's assertions, at size).
set -uo pipefail
cd "$(dirname "$0")/../.."
source test/harness/cluster.sh
im_bench_parse_args "$@" || exit 2
bash test/harness/install_node_deps.sh || exit 1
command -v chromium >/dev/null || { echo "chromium is missing (test/harness/deps.txt; make deps installs it)"; exit 1; }
make -s -C gateway im_gateway || exit 1
im_bench_cluster_start "im_sync.fanout_workers = 2" "im_sync.fanout_paused = off" || exit 1
trap im_cluster_destroy EXIT
im_createdb im_test || exit 1
im_bench_durability
echo "machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $(chromium --version 2>/dev/null)"
mkdir -p "$IM_TMP/client"
export IM_CLIENT_TMP="$IM_TMP/client" IM_CLIENT_DB=im_test PGBIN IM_GATEWAY_BIN="$PWD/gateway/im_gateway" IM_CHROMIUM="$(command -v chromium)"
timeout 1800 node test/bench/new_device.mjs
