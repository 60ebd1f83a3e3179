#!/usr/bin/env bash
# make run: a throwaway cluster with fanout workers running, a demo database
# (two users, two devices each, one direct conversation, device tokens) and
# im_gateway on a free port.  Ctrl-C (or SIGTERM) stops the gateway and the
# cluster and removes the temp directory.
#   IM_RUN_EXIT_AFTER_SETUP=1  set everything up, check /healthz, tear down, exit
#   SHARDS=N (make run SHARDS=3)  N nodes and a router (test/harness/shards.sh
#     up N): the gateway and the relay name the router, the demo data is made
#     through it, so alice (1) and bob (2) live on different nodes
set -uo pipefail
cd "$(dirname "$0")/../.."
source test/harness/cluster.sh

DB=im_demo
SHARDS=${SHARDS:-}
gw_pid=""
push_pids=()   # push: the stub push gateway and the relay
cleanup() {
  trap - INT TERM EXIT
  for p in "${push_pids[@]}"; do kill -TERM "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  if [ -n "$gw_pid" ] && kill -0 "$gw_pid" 2>/dev/null; then
    kill -TERM "$gw_pid"; wait "$gw_pid" 2>/dev/null
  fi
  if [ -n "$SHARDS" ]; then
    [ -n "${IM_SHARDS_DIR:-}" ] && bash test/harness/shards.sh down >/dev/null 2>&1
    [ -n "${IM_TMP:-}" ] && [ -z "${IM_KEEP:-}" ] && rm -rf "$IM_TMP"
  else
    im_cluster_destroy
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

[ -x gateway/im_gateway ] || { echo "gateway/im_gateway not built: run make"; exit 1; }
if [ -n "$SHARDS" ]; then
  # sharding: N node clusters and a router cluster (test/harness/shards.sh), the
  # router's conninfo on the last line of its output
  [ -f test/harness/shards.sh ] || { echo "SHARDS=$SHARDS: test/harness/shards.sh is missing"; exit 1; }
  IM_TMP=$(mktemp -d /tmp/im_sync_run.XXXXXX); chmod 755 "$IM_TMP"
  export IM_TMP IM_SHARDS_DIR="$IM_TMP/shards" IM_SHARDS_DB=$DB
  bash test/harness/shards.sh up "$SHARDS" >"$IM_TMP/shards-up.log" 2>&1 \
    || { echo "test/harness/shards.sh up $SHARDS failed:"; tail -n 30 "$IM_TMP/shards-up.log"; exit 1; }
  DSN=$(tail -n 1 "$IM_TMP/shards-up.log")
  run_psql() { im_psql -d "$DSN" "$@"; }
  # settings go to every node (they do not cross PL/Proxy)
  set_setting() { bash test/harness/shards.sh set "$1" "$2" >/dev/null; }
else
  im_cluster_start "im_sync.database = '$DB'" "im_sync.fanout_paused = off" "im_sync.fanout_workers = 1" || exit 1
  im_createdb "$DB" || exit 1
  DSN="host=$PGHOST port=$PGPORT user=$PGUSER dbname=$DB"
  run_psql() { im_psql -d "$DB" "$@"; }
  set_setting() {
    im_psql -d postgres -c "ALTER SYSTEM SET $1 = '$2'" -c "SELECT pg_reload_conf()" >/dev/null
  }
fi

# Demo data: users 1 (alice) and 2 (bob), devices phone and desktop each.
run_psql -At >/dev/null <<'SQL' || exit 1
SELECT im.register_device(1, 'phone');
SELECT im.register_device(1, 'desktop');
SELECT im.register_device(2, 'phone');
SELECT im.register_device(2, 'desktop');
SELECT im.direct_conversation(1, 2);
SQL
conv=$(run_psql -At -c "SELECT im.direct_conversation(1, 2)")
tok() { run_psql -At -c "SELECT im.issue_device_token($1, '$2', '1 day')"; }
t1p=$(tok 1 phone); t1d=$(tok 1 desktop); t2p=$(tok 2 phone); t2d=$(tok 2 desktop)

port=$(im_free_port)
./gateway/im_gateway --listen 127.0.0.1:"$port" \
    --db "$DSN" >"$IM_TMP/gateway.log" 2>&1 &
gw_pid=$!
for _ in $(seq 50); do
  curl -fs "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break
  sleep 0.2
done

# ---- offline push: a stub push gateway (test/e2e/push_stub.py)
# beside im_push_relay; bob's phone has a push target (the test key pair in
# test/push), so a message to bob while his phone is offline reaches the
# stub about im_sync.push_delay (3 s) later.
[ -x gateway/im_push_relay ] || { echo "gateway/im_push_relay not built: run make"; exit 1; }
set_setting im_sync.push_public_key_file "$PWD/test/push/relay_pub.pem" || exit 1
/usr/bin/python3 test/e2e/push_stub.py --port 0 --log "$IM_TMP/push-stub.jsonl" >"$IM_TMP/push-stub.out" 2>&1 &
push_pids+=($!)
for _ in $(seq 50); do grep -q listening "$IM_TMP/push-stub.out" 2>/dev/null && break; sleep 0.1; done
stub_port=$(awk '/listening/ {print $3}' "$IM_TMP/push-stub.out")
[ -n "$stub_port" ] || { echo "the stub push gateway did not start"; cat "$IM_TMP/push-stub.out"; exit 1; }
run_psql -At -c "SELECT im.register_push_target(2, 'phone', 'fcm', 'im.demo', 'demo-token-bob-phone')" >/dev/null || exit 1
./gateway/im_push_relay --db "$DSN" --key test/push/relay_key.pem \
    --url "http://127.0.0.1:$stub_port/_matrix/push/v1/notify" --relay-id demo-relay >"$IM_TMP/push-relay.log" 2>&1 &
push_pids+=($!)
push_info="  push     : bob's phone is offline, so messages to bob are pushed to a stub push gateway:
             http://127.0.0.1:$stub_port/  (what it received; JSON at /_stub/requests)
             relay log $IM_TMP/push-relay.log"
# ---- end of offline push

if [ -n "$SHARDS" ]; then
  dbinfo="psql \"$DSN\"   (the router; $SHARDS nodes: $(awk '{printf "%s%s", sep, $1; sep=", "}' "$IM_SHARDS_DIR/nodes" 2>/dev/null), conninfos in $IM_SHARDS_DIR/nodes)"
else
  dbinfo="psql -h $PGHOST -p $PGPORT -U $PGUSER $DB"
fi
# A group of both users too, so the page shows a list; URLs carry each
# device's token in the fragment (never sent to the server by the browser).
group=$(run_psql -At -c "SELECT im.create_conversation('group', ARRAY[1, 2]::bigint[], 1)")
web="http://127.0.0.1:$port/web/"
frag() { printf '#token=%s' "$(printf '%s' "$1" | sed 's/+/%2B/g; s/\//%2F/g; s/=/%3D/g')"; }
# The page first (what a person opens), then the command line and raw frames.
cat <<EOF

im_sync is running. Open the web page as a device (one browser profile or
private window each; alice is user 1, bob user 2; conversations $conv and $group):
  alice phone   : $web$(frag "$t1p")
  alice desktop : $web$(frag "$t1d")
  bob phone     : $web$(frag "$t2p")
  bob desktop   : $web$(frag "$t2d")

Command line (Node >= 20, after make deps):
  node gateway/cli/im_sync_cli.mjs --url ws://127.0.0.1:$port/ --token "$t2p" follow
  node gateway/cli/im_sync_cli.mjs --url ws://127.0.0.1:$port/ --token "$t1d" send $conv "hello bob"
Raw frames (python3-websockets' interactive client; paste the lines):
  /usr/bin/python3 -m websockets ws://127.0.0.1:$port/
  {"type":"hello","token":"$t1p"}
  {"type":"send","id":1,"conversation_id":$conv,"client_msg_id":"demo-1","body":{"text":"hello bob"}}
  (a new device's sync gets RESET_REQUIRED: send {"type":"snapshot_begin"} first)
  other tokens: alice desktop $t1d
                bob phone     $t2p
                bob desktop   $t2d

  database : $dbinfo
  gateway  : ws://127.0.0.1:$port/   (subprotocol im-sync.v1; /healthz, /metrics); log $IM_TMP/gateway.log
  alerts   : rules $PWD/extension/monitoring/im_sync_alerts.yml; scrape /metrics
             (extension/monitoring/prometheus.example.yml)
$push_info
Ctrl-C stops the gateway and the cluster${SHARDS:+s}.
EOF

if [ -n "${IM_RUN_EXIT_AFTER_SETUP:-}" ]; then
  code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/healthz")
  echo "healthz: $code"
  [ "$code" = 200 ] || { cat "$IM_TMP/gateway.log"; exit 1; }
  # push: a message to bob reaches the stub push gateway
  run_psql -At -c "SELECT msg_seq FROM im.send_message(1, $conv, 'run-push', '{\"text\": \"hi bob\"}')" >/dev/null
  for _ in $(seq 100); do
    [ "$(curl -s "http://127.0.0.1:$stub_port/_stub/requests" | grep -c demo-token-bob-phone)" -gt 0 ] && break
    sleep 0.1
  done
  curl -s "http://127.0.0.1:$stub_port/_stub/requests" | grep -q demo-token-bob-phone \
    || { echo "push: the stub push gateway received nothing"; cat "$IM_TMP/push-relay.log"; exit 1; }
  echo "push: the stub push gateway received bob's push"
  page=$(curl -s -o /dev/null -w '%{http_code}' "$web")   # the web page
  echo "web page: $page"
  [ "$page" = 200 ] || exit 1
  exit 0
fi
wait "$gw_pid"
