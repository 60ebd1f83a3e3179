#!/usr/bin/env bash
# make check: runs every test suite (test/suites/*.sh, in name order) against
# one throwaway cluster with im_sync preloaded, then stops it.
#   IM_SUITES=regress,isolation   run only suites whose name contains one of these
#   IM_KEEP=1                      keep the temp directory (logs, diffs)
set -uo pipefail
cd "$(dirname "$0")/../.."
source test/harness/cluster.sh

# Workers paused by default so pg_regress output is deterministic; suites
# that need them running switch fanout_paused off with ALTER SYSTEM + reload.
im_cluster_start "im_sync.fanout_paused = on" "im_sync.fanout_workers = 2" || exit 1
trap im_cluster_destroy EXIT
im_psql -d postgres -c "CREATE DATABASE im_test" && im_psql -d im_test -c "CREATE EXTENSION im_sync CASCADE"

passed=0; failed=0; failed_names=()
for suite in test/suites/*.sh; do
  name=$(basename "$suite" .sh)
  if [ -n "${IM_SUITES:-}" ]; then
    match=""; IFS=, read -ra want <<<"$IM_SUITES"
    for w in "${want[@]}"; do [[ "$name" == *"$w"* ]] && match=1; done
    [ -n "$match" ] || continue
  fi
  echo "=== suite $name"
  start=$(date +%s)
  if bash "$suite"; then
    passed=$((passed + 1)); echo "=== suite $name: ok ($(( $(date +%s) - start ))s)"
  else
    failed=$((failed + 1)); failed_names+=("$name"); echo "=== suite $name: FAILED ($(( $(date +%s) - start ))s)"
  fi
  # A suite may have restarted or crashed the server: make sure it is up.
  $IM_AS_SERVER "$PGBIN/pg_ctl" -D "$PGDATA" status >/dev/null 2>&1 || im_cluster_pg_ctl start
done

if [ $failed -gt 0 ]; then
  echo "failed suites: ${failed_names[*]} (server log: $IM_TMP/server.log; rerun with IM_KEEP=1 to keep it)"
  echo "--- crashes and restarts in the server log:"
  grep -E "terminated by signal|was terminated|PANIC|all server processes terminated" "$IM_TMP/server.log" | tail -n 20
  echo "--- last lines of the server log:"
  tail -n 30 "$IM_TMP/server.log"
fi
echo "suites: $passed passed, $failed failed"
[ $failed -eq 0 ] && [ $passed -gt 0 ]
