#!/usr/bin/env bash
# 62-e2e-transport: im_gateway transport hardening.
#  1. test/e2e/test_transport.py against a gateway with shrunk keepalive and
#     caps, plus one with an Origin allow-list (caps, 503, 403, pings/1001,
#     NOT_AUTHENTICATED before welcome, refused hellos that keep the epoch,
#     plain --listen refused off loopback);
#  2. test/e2e/test_preauth_memory.py: 500 unauthenticated sockets behind a
#     locked device row, gateway RSS growth bounded; test/e2e/test_accept_ring.py:
#     idle sockets before the upgrade bounded per address, by the connection
#     cap and in time;
#  3. part of test/e2e/test_gateway.py and test/e2e/test_trace.py once more
#     over wss:// and https://, with a certificate made here by openssl req.
set -uo pipefail
cd "$(dirname "$0")/../.."
source test/harness/cluster.sh
export PGDATABASE=im_test IM_E2E_DB=im_test PGBIN
PY=${IM_PYTHON:-/usr/bin/python3}
GW=${IM_GATEWAY_BIN:-./gateway/im_gateway}
DBI="host=$PGHOST port=$PGPORT user=$PGUSER dbname=im_test"

# im_gateway_faults: the test build with db_hello_batch.c's fault hook
make -s -C gateway im_gateway im_gateway_faults || exit 1
im_psql -d im_test -c "ALTER SYSTEM SET im_sync.fanout_paused = off" -c "SELECT pg_reload_conf()" >/dev/null || exit 1
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && kill -KILL "$p"; done
  im_psql -d im_test -c "ALTER SYSTEM RESET im_sync.fanout_paused" -c "SELECT pg_reload_conf()" >/dev/null 2>&1
}
trap cleanup EXIT

# self-signed certificate for 127.0.0.1 / localhost
cert="$IM_TMP/gw-cert.pem" key="$IM_TMP/gw-key.pem"
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=127.0.0.1" \
    -addext "subjectAltName=IP:127.0.0.1,DNS:localhost" \
    -keyout "$key" -out "$cert" >"$IM_TMP/openssl.log" 2>&1 || { cat "$IM_TMP/openssl.log"; exit 1; }

# start_gw NAME SCHEME ARGS...: sets port_NAME and pid_NAME
start_gw() {
  local name=$1 scheme=$2 port; shift 2
  port=$(im_free_port)
  "$GW" --listen 127.0.0.1:"$port" --db "$DBI" "$@" >"$IM_TMP/gateway-$name.log" 2>&1 &
  local pid=$!
  pids+=("$pid")
  for _ in $(seq 50); do
    curl -fsk "$scheme://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break
    sleep 0.2
  done
  printf -v "port_$name" %s "$port"
  printf -v "pid_$name" %s "$pid"
}

rc=0
start_gw t http --ping-interval 1 --idle-timeout 3 --max-unauth-per-ip 3 --max-connections 10 \
    --max-conn-per-user 2 --hello-rate-device 0.01 --hello-timeout 30 --pool 4
start_gw o http --allowed-origin https://app.example --allowed-origin http://other.example:8443 --pool 2
IM_GW_URL="ws://127.0.0.1:$port_t/" IM_GW_ORIGIN_URL="ws://127.0.0.1:$port_o/" IM_GW_BIN="$GW" IM_GW_DB="$DBI" \
  IM_GW_CERT="$cert" IM_GW_KEY="$key" "$PY" test/e2e/test_transport.py ${IM_E2E_TESTS:-} || rc=1

start_gw m http --max-unauth-per-ip 1000 --max-pending-hello 1000 --hello-timeout 120 --pool 4
IM_GW_URL="ws://127.0.0.1:$port_m/" IM_GW_PID="$pid_m" "$PY" test/e2e/test_preauth_memory.py || rc=1

# connections before their upgrade: per-address cap, connection cap, 5 s
# wait (gateways of its own; 3,000-7,500 idle sockets from 127.0.0.x)
IM_GW_BIN="$GW" "$PY" test/e2e/test_accept_ring.py || rc=1

start_gw s https --tls-cert "$cert" --tls-key "$key" --max-frame 65536 --hello-timeout 2 --pool 4
IM_GW_URL="wss://127.0.0.1:$port_s/" IM_GW_CA="$cert" IM_E2E_MAX_FRAME=65536 \
  "$PY" test/e2e/test_gateway.py scenario_2_1 first_frame bad_frames supersede http_endpoints || rc=1
# trace ids in replies and /metrics through promtool, over wss:// and https://
IM_GW_URL="wss://127.0.0.1:$port_s/" IM_GW_CA="$cert" \
  "$PY" test/e2e/test_trace.py trace_ids_in_replies bad_trace_id promtool || rc=1
# plain ws:// on the TLS port is not served
if curl -fs "http://127.0.0.1:$port_s/healthz" >/dev/null 2>&1; then echo "FAIL plain http answered on the TLS port"; rc=1; fi

for n in t o m s; do
  p="pid_$n"
  kill -TERM "${!p}"; wait "${!p}" || { echo "gateway $n exit status $? after SIGTERM"; rc=1; }
  if grep -Eq 'token=|hello bob|RAAAA' "$IM_TMP/gateway-$n.log"; then echo "gateway $n log leaks tokens"; rc=1; fi
done
[ $rc -eq 0 ] || for n in t o m s; do echo "--- gateway-$n.log"; tail -n 15 "$IM_TMP/gateway-$n.log"; done
exit $rc
