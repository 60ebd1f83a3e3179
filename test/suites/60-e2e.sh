#!/usr/bin/env bash
# 60-e2e: im_gateway end to end through python3-websockets against the
# harness cluster (database im_test); a --log-format json gateway for trace
# ids, the request log and promtool on /metrics (test_trace.py).  Fanout workers are switched on for
# the suite and paused again at the end.  Also checks that SIGTERM drains
# and exits 0.
set -uo pipefail
cd "$(dirname "$0")/../.."
source test/harness/cluster.sh
export PGDATABASE=im_test IM_E2E_DB=im_test PGBIN

make -s -C gateway im_gateway || exit 1
im_psql -d im_test -c "ALTER SYSTEM SET im_sync.fanout_paused = off" -c "SELECT pg_reload_conf()" >/dev/null || exit 1
port=$(im_free_port)
log="$IM_TMP/gateway-e2e.log"
# the log's user/device hashes are checked against this key at the end
logkey="$IM_TMP/gateway-log.key"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$logkey"
./gateway/im_gateway --listen 127.0.0.1:"$port" --max-frame 65536 --hello-timeout 2 --pool 4 --log-key "$logkey" \
    --db "host=$PGHOST port=$PGPORT user=$PGUSER dbname=im_test" >"$log" 2>&1 &
gw=$!
cleanup() {
  kill -0 "$gw" 2>/dev/null && kill -KILL "$gw"
  im_psql -d im_test -c "ALTER SYSTEM RESET im_sync.fanout_paused" -c "SELECT pg_reload_conf()" >/dev/null 2>&1
}
trap cleanup EXIT
for _ in $(seq 50); do
  curl -fs "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break
  sleep 0.2
done
export IM_GW_URL="ws://127.0.0.1:$port/" IM_E2E_MAX_FRAME=65536
rc=0
py="${IM_PYTHON:-/usr/bin/python3}"
"$py" test/e2e/test_gateway.py ${IM_E2E_TESTS:-} || rc=1
# data-path hardening; IM_E2E_SCRIPTS picks some
for t in ${IM_E2E_SCRIPTS:-body_roundtrip notify_spoof metrics_cache int_range large_replies relations hello_order hello_forged_claims}; do
  "$py" test/e2e/test_$t.py || rc=1
done

# a gateway with a short statement timeout and a small reply queue (items 4
# and 7), without --log-key (a random key per process), connected as a role
# with only the gateway's grants (item 6: no conversation_members)
im_psql -d im_test -f test/e2e/gateway_grants.sql >/dev/null || rc=1
port3=$(im_free_port)
./gateway/im_gateway --listen 127.0.0.1:"$port3" --pool 2 --statement-timeout 1000 --max-queue 100000 \
    --db "host=$PGHOST port=$PGPORT user=im_gateway_e2e dbname=im_test" >"$IM_TMP/gateway-small.log" 2>&1 &
gw3=$!
for _ in $(seq 50); do curl -fs "http://127.0.0.1:$port3/healthz" >/dev/null 2>&1 && break; sleep 0.2; done
IM_GW_URL="ws://127.0.0.1:$port3/" "$py" test/e2e/test_small_gateway.py || rc=1
# suspension (contract §17): live sessions on this gateway and the first close 4005 within 5 s
IM_GW_URL="ws://127.0.0.1:$port/" IM_GW_URL2="ws://127.0.0.1:$port3/" "$py" test/e2e/test_suspension.py || rc=1
# reactions, pins, replies: react, pin and reply with the gateway role's grants only
IM_GW_URL="ws://127.0.0.1:$port3/" "$py" test/e2e/test_relations.py || rc=1
# recency pages and conversation pins, with the gateway role's grants only
IM_GW_URL="ws://127.0.0.1:$port3/" "$py" test/e2e/test_recent.py || rc=1
# read receipts on and off, with the gateway role's grants only
IM_GW_URL="ws://127.0.0.1:$port3/" "$py" test/e2e/test_read_receipts.py || rc=1
# roles, mutes, removals (contract §17), with the gateway role's grants only
IM_GW_URL="ws://127.0.0.1:$port3/" "$py" test/e2e/test_roles.py || rc=1
IM_GW_URL="ws://127.0.0.1:$port3/" "$py" test/e2e/test_gateway.py scenario shared_log supersede revoke http || rc=1
if grep -q 'permission denied\|members_lookup_failed' "$IM_TMP/gateway-small.log"; then
  echo "the gateway role lacks a grant:"; grep 'permission denied\|members_lookup_failed' "$IM_TMP/gateway-small.log" | head -3; rc=1
fi
kill -TERM "$gw3"; wait "$gw3"
"$py" test/e2e/check_log_hashes.py "$IM_TMP/gateway-small.log" || rc=1

# trace ids, the JSON request log and a promtool-checked /metrics (contract
# §21): a gateway with --log-format json, its log read by the test while
# it runs, then checked line by line as JSON for hashes, bodies and tokens
portj=$(im_free_port)
logj="$IM_TMP/gateway-json.log"
./gateway/im_gateway --listen 127.0.0.1:"$portj" --pool 2 --log-format json --log-key "$logkey" \
    --db "host=$PGHOST port=$PGPORT user=$PGUSER dbname=im_test" >"$logj" 2>&1 &
gwj=$!
for _ in $(seq 50); do curl -fs "http://127.0.0.1:$portj/healthz" >/dev/null 2>&1 && break; sleep 0.2; done
IM_GW_URL="ws://127.0.0.1:$portj/" IM_GW_LOG="$logj" IM_SERVER_LOG="$IM_TMP/server.log" IM_GW_BIN=./gateway/im_gateway "$py" test/e2e/test_trace.py || rc=1
kill -TERM "$gwj"; wait "$gwj" || { echo "json gateway exit status $? after SIGTERM"; rc=1; }
if grep -v '^{' "$logj" | grep -q .; then echo "non-JSON lines in the JSON log:"; grep -v '^{' "$logj" | head -3; rc=1; fi
if grep -Eq 'token=|"token"|"text"|hello bob|RAAAA|TRACE-BODY' "$logj"; then echo "JSON log leaks tokens or bodies"; rc=1; fi
"$py" test/e2e/check_log_hashes.py "$logj" "$logkey" || rc=1

# reconnect-storm pacing against a second gateway with --max-pending-hello 1
# and --max-waiting-hello 5 (the rest of 30 hellos at once is refused)
port2=$(im_free_port)
./gateway/im_gateway --listen 127.0.0.1:"$port2" --max-pending-hello 1 --max-waiting-hello 5 --pool 2 \
    --db "host=$PGHOST port=$PGPORT user=$PGUSER dbname=im_test" >"$IM_TMP/gateway-pacing.log" 2>&1 &
gw2=$!
for _ in $(seq 50); do curl -fs "http://127.0.0.1:$port2/healthz" >/dev/null 2>&1 && break; sleep 0.2; done
IM_GW_URL="ws://127.0.0.1:$port2/" "${IM_PYTHON:-/usr/bin/python3}" test/e2e/test_hello_pacing.py || { echo "FAIL hello pacing"; rc=1; }
kill -TERM "$gw2"; wait "$gw2"

# offline push: im_push_relay, the stub push gateway, presence
# through a gateway of its own, in a database of its own (test/e2e/test_push.py)
make -s -C gateway im_push_relay || rc=1
# the relay's secret wiping, Retry-After parsing and scheme limits (gateway/relay/test_push_relay.c)
make -s -C gateway relay-test || rc=1
IM_TMP="$IM_TMP" PGBIN="$PGBIN" "$py" test/e2e/test_push.py ${IM_PUSH_TESTS:-} || rc=1

# SIGTERM: drain and exit 0
kill -TERM "$gw"
for _ in $(seq 100); do kill -0 "$gw" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$gw" 2>/dev/null; then echo "gateway did not exit on SIGTERM"; rc=1
else wait "$gw"; st=$?; [ $st -eq 0 ] || { echo "gateway exit status $st after SIGTERM"; rc=1; }; fi
# logs are single key=value lines and never hold tokens or bodies
if grep -v '^ts=' "$log" | grep -q .; then echo "unstructured log lines:"; grep -v '^ts=' "$log" | head; rc=1; fi
if grep -Eq 'token=|"text"|hello bob|RAAAA' "$log"; then echo "log leaks tokens or bodies"; rc=1; fi
# user and device ids only as hashes keyed with --log-key (log privacy)
"$py" test/e2e/check_log_hashes.py "$log" "$logkey" || rc=1
[ $rc -eq 0 ] || tail -n 30 "$log"
exit $rc
