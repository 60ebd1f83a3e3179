#!/usr/bin/env bash
# 35-alerts: the shipped Prometheus alert rules (extension/monitoring/).
#   1. promtool check rules, strict: lint errors fatal, any warning fails,
#      and promtool must report as many rules as the file has (a missing
#      file can exit 0);
#   2. test/alerts/check_rules.py check: labels, annotations, runbook links,
#      and every alert's unit tests fire once and stay quiet once;
#   3. promtool test rules on extension/monitoring/im_sync_alerts_test.yml,
#      and promtool check config on prometheus.example.yml;
#      check_rules.py mutate: each alert's tests must fail with a rule that
#      never fires and with one that always fires (~10 s; IM_ALERTS_MUTATE=0
#      skips it);
#   4. end to end: a cluster of its own (its fanout worker on im_alerts, so
#      other suites' dead letters in im_test cannot fire the alert), a real
#      gateway, a real Prometheus on a free loopback port scraping it every
#      second with a copy of the rules whose for: is 2 s;
#      test/alerts/e2e_dead_letter.py makes a dead letter, sees the alert fire
#      through /api/v1/alerts and resolve after repair.
set -uo pipefail
cd "$(dirname "$0")/../.."
source test/harness/cluster.sh
py="${IM_PYTHON:-/usr/bin/python3}"
rules=extension/monitoring/im_sync_alerts.yml
tests=extension/monitoring/im_sync_alerts_test.yml
command -v promtool >/dev/null && command -v prometheus >/dev/null \
  || { echo "promtool/prometheus missing: install the Debian package prometheus (test/harness/install_deps.sh)"; exit 1; }
rc=0

# ---- 1. the rules are valid, and all of them were read
[ -s "$rules" ] || { echo "FAIL $rules is missing or empty"; exit 1; }
want=$(grep -c '^ *- alert: ' "$rules")
[ "$want" -gt 0 ] || { echo "FAIL $rules has no alert"; exit 1; }
out=$(promtool check rules --lint=all --lint-fatal "$rules" 2>&1); st=$?
echo "$out"
if [ $st -ne 0 ]; then echo "FAIL promtool check rules exited $st"; rc=1; fi
if grep -qiE 'warn|error' <<<"$out"; then echo "FAIL promtool check rules warned"; rc=1; fi
grep -q "SUCCESS: $want rules found" <<<"$out" \
  || { echo "FAIL promtool did not report the file's $want rules"; rc=1; }

# ---- 2. what promtool does not check
"$py" test/alerts/check_rules.py check "$rules" "$tests" || rc=1

# ---- 3. the unit tests (paths in the test file are relative to it) and the example config
out=$(cd extension/monitoring && promtool test rules "$(basename "$tests")" 2>&1); st=$?
echo "$out"
if [ $st -ne 0 ] || ! grep -q SUCCESS <<<"$out" || grep -qiE 'warn' <<<"$out"; then
  echo "FAIL promtool test rules"; rc=1
fi
out=$(cd extension/monitoring && promtool check config --lint=all --lint-fatal prometheus.example.yml 2>&1); st=$?
if [ $st -ne 0 ] || grep -qiE 'warn' <<<"$out" || ! grep -q "SUCCESS: $want rules found" <<<"$out"; then
  echo "$out"; echo "FAIL promtool check config prometheus.example.yml"; rc=1
fi
if [ "${IM_ALERTS_MUTATE:-1}" != 0 ]; then
  "$py" test/alerts/check_rules.py mutate "$rules" "$tests" || rc=1
fi

# ---- 4. end to end
make -s -C gateway im_gateway || exit 1
# a cluster of this suite's own (this process's PGHOST/PGPORT/PGDATA/IM_TMP
# now name it; the harness cluster is left alone)
im_cluster_start "im_sync.database = 'im_alerts'" "im_sync.fanout_workers = 1" "im_sync.fanout_paused = off" || exit 1
gw=""; prom=""
cleanup() {
  [ -n "$prom" ] && kill -0 "$prom" 2>/dev/null && { kill -TERM "$prom"; wait "$prom" 2>/dev/null; }
  [ -n "$gw" ] && kill -0 "$gw" 2>/dev/null && { kill -TERM "$gw"; wait "$gw" 2>/dev/null; }
  im_cluster_destroy
}
trap cleanup EXIT
im_createdb im_alerts || exit 1
gwport=$(im_free_port)
./gateway/im_gateway --listen 127.0.0.1:"$gwport" --pool 2 \
    --db "host=$PGHOST port=$PGPORT user=$PGUSER dbname=im_alerts" >"$IM_TMP/gateway.log" 2>&1 &
gw=$!
for _ in $(seq 100); do curl -fs "http://127.0.0.1:$gwport/healthz" >/dev/null 2>&1 && break; sleep 0.1; done

"$py" test/alerts/check_rules.py shorten "$rules" "$IM_TMP/im_sync_alerts.yml" 2s || exit 1
promport=$(im_free_port)
cat >"$IM_TMP/prometheus.yml" <<EOF_CONF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - im_sync_alerts.yml
scrape_configs:
  - job_name: im_gateway
    static_configs:
      - targets: ['127.0.0.1:$gwport']
EOF_CONF
promtool check config "$IM_TMP/prometheus.yml" >/dev/null || { echo "FAIL the test's Prometheus config"; exit 1; }
# loopback only; Prometheus may run as root
prometheus --config.file="$IM_TMP/prometheus.yml" --storage.tsdb.path="$IM_TMP/tsdb" \
    --web.listen-address=127.0.0.1:"$promport" --log.level=warn >"$IM_TMP/prometheus.log" 2>&1 &
prom=$!
for _ in $(seq 300); do
  curl -fs "http://127.0.0.1:$promport/-/ready" >/dev/null 2>&1 && break
  kill -0 "$prom" 2>/dev/null || break
  sleep 0.1
done
curl -fs "http://127.0.0.1:$promport/-/ready" >/dev/null 2>&1 \
  || { echo "FAIL Prometheus did not become ready"; cat "$IM_TMP/prometheus.log"; exit 1; }
IM_PROM_URL="http://127.0.0.1:$promport" IM_ALERTS_DB=im_alerts "$py" test/alerts/e2e_dead_letter.py || {
  rc=1
  echo "--- prometheus log"; tail -n 20 "$IM_TMP/prometheus.log"
  echo "--- gateway log"; tail -n 20 "$IM_TMP/gateway.log"
  echo "--- server log"; tail -n 20 "$IM_TMP/server.log"
}
exit $rc
