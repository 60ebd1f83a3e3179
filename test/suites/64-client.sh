#!/usr/bin/env bash
# 64-client: the reference client (gateway/web/im_sync_client.js) under
# `node --test` against gateways it starts itself (so it can kill -9 and
# restart them) and the harness database im_test with fanout workers on.
set -uo pipefail
cd "$(dirname "$0")/../.."
source test/harness/cluster.sh
bash test/harness/install_node_deps.sh || exit 1
make -s -C gateway im_gateway || exit 1
im_psql -d im_test -c "ALTER SYSTEM SET im_sync.fanout_paused = off" -c "SELECT pg_reload_conf()" >/dev/null || exit 1
cleanup() { im_psql -d im_test -c "ALTER SYSTEM RESET im_sync.fanout_paused" -c "SELECT pg_reload_conf()" >/dev/null 2>&1; }
trap cleanup EXIT
mkdir -p "$IM_TMP/client"
export IM_CLIENT_TMP="$IM_TMP/client" IM_CLIENT_DB=im_test PGBIN IM_GATEWAY_BIN="$PWD/gateway/im_gateway"
node --test --test-concurrency=1 ${IM_CLIENT_TEST_ARGS:-} test/client/client.test.mjs test/client/client_view.test.mjs test/client/web_mount.test.mjs
