#!/usr/bin/env bash
# 66-browser: the web page (gateway/web/) in Debian's chromium, headless,
# driven by puppeteer-core from the lockfile (nothing downloaded at run
# time), against a gateway on the harness database im_test.  Screenshots:
# $IM_TMP/client/screenshots (kept with IM_KEEP=1).
set -uo pipefail
cd "$(dirname "$0")/../.."
source test/harness/cluster.sh
bash test/harness/install_node_deps.sh || exit 1
command -v chromium >/dev/null || { echo "chromium is missing (test/harness/deps.txt; make deps installs it)"; exit 1; }
make -s -C gateway im_gateway || exit 1
im_psql -d im_test -c "ALTER SYSTEM SET im_sync.fanout_paused = off" -c "SELECT pg_reload_conf()" >/dev/null || exit 1
cleanup() { im_psql -d im_test -c "ALTER SYSTEM RESET im_sync.fanout_paused" -c "SELECT pg_reload_conf()" >/dev/null 2>&1; }
trap cleanup EXIT
mkdir -p "$IM_TMP/client"
export IM_CLIENT_TMP="$IM_TMP/client" IM_CLIENT_DB=im_test PGBIN IM_GATEWAY_BIN="$PWD/gateway/im_gateway" IM_CHROMIUM="$(command -v chromium)"
timeout 300 node --test --test-concurrency=1 test/client/browser.test.mjs
