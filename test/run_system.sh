#!/usr/bin/env bash
# make run: a throwaway cluster with fanout workers running, a demo database
# (two users, two devices each, one direct conversation, device tokens) and
# im_gateway on a free port.  Ctrl-C (or SIGTERM) stops the gateway and the
# cluster and removes the temp directory.
#   IM_RUN_EXIT_AFTER_SETUP=1  set everything up, check /healthz, tear down, exit
set -uo pipefail
cd "$(dirname "$0")/.."
source test/cluster.sh

DB=im_demo
gw_pid=""
cleanup() {
  trap - INT TERM EXIT
  if [ -n "$gw_pid" ] && kill -0 "$gw_pid" 2>/dev/null; then
    kill -TERM "$gw_pid"; wait "$gw_pid" 2>/dev/null
  fi
  im_cluster_destroy
}
trap cleanup EXIT
trap 'exit 130' INT TERM

[ -x gateway/im_gateway ] || { echo "gateway/im_gateway not built: run make"; exit 1; }
im_cluster_start "im_sync.database = '$DB'" "im_sync.fanout_paused = off" "im_sync.fanout_workers = 1" || exit 1
im_createdb "$DB" || exit 1

# Demo data: users 1 (alice) and 2 (bob), devices phone and desktop each.
im_psql -d "$DB" -At >/dev/null <<'SQL' || exit 1
SELECT im.register_device(1, 'phone');
SELECT im.register_device(1, 'desktop');
SELECT im.register_device(2, 'phone');
SELECT im.register_device(2, 'desktop');
SELECT im.direct_conversation(1, 2);
SQL
conv=$(im_psql -d "$DB" -At -c "SELECT im.direct_conversation(1, 2)")
tok() { im_psql -d "$DB" -At -c "SELECT im.issue_device_token($1, '$2', '1 day')"; }
t1p=$(tok 1 phone); t1d=$(tok 1 desktop); t2p=$(tok 2 phone); t2d=$(tok 2 desktop)

port=$(im_free_port)
./gateway/im_gateway --listen 127.0.0.1:"$port" \
    --db "host=$PGHOST port=$PGPORT user=$PGUSER dbname=$DB" >"$IM_TMP/gateway.log" 2>&1 &
gw_pid=$!
for _ in $(seq 50); do
  curl -fs "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break
  sleep 0.2
done

cat <<EOF

im_sync is running.
  database : psql -h $PGHOST -p $PGPORT -U $PGUSER $DB
  gateway  : ws://127.0.0.1:$port/   (subprotocol im-sync.v1; /healthz, /metrics)
  log      : $IM_TMP/gateway.log
  conversation $conv between user 1 (alice) and user 2 (bob)

Connect as alice's phone (python3-websockets' interactive client), then paste the lines:
  /usr/bin/python3 -m websockets ws://127.0.0.1:$port/
  {"type":"hello","token":"$t1p"}
  {"type":"send","id":1,"conversation_id":$conv,"client_msg_id":"demo-1","body":{"text":"hello bob"}}

Bob's desktop, in another terminal:
  /usr/bin/python3 -m websockets ws://127.0.0.1:$port/
  {"type":"hello","token":"$t2d"}
  {"type":"sync","id":1,"sync_generation":1,"local_applied_sync_seq":0}
  (a new device gets RESET_REQUIRED: {"type":"snapshot_begin"} first, or sync with the generation it reports)

Other tokens: alice desktop $t1d
              bob phone     $t2p
Ctrl-C stops the gateway and the cluster.
EOF

# ---- issue 13: the web page and the command-line client
# A group of both users too, so the page shows a list; URLs carry each
# device's token in the fragment (never sent to the server by the browser).
group=$(im_psql -d "$DB" -At -c "SELECT im.create_conversation('group', ARRAY[1, 2]::bigint[], 1)")
web="http://127.0.0.1:$port/web/"
frag() { printf '#token=%s' "$(printf '%s' "$1" | sed 's/+/%2B/g; s/\//%2F/g; s/=/%3D/g')"; }
cat <<EOF

Web page (one browser profile or private window per device; group $group too):
  alice phone   : $web$(frag "$t1p")
  alice desktop : $web$(frag "$t1d")
  bob phone     : $web$(frag "$t2p")
  bob desktop   : $web$(frag "$t2d")
Command line (Node >= 20, after make deps):
  node gateway/web/im_sync_cli.mjs --url ws://127.0.0.1:$port/ --token "$t2p" follow
  node gateway/web/im_sync_cli.mjs --url ws://127.0.0.1:$port/ --token "$t1d" send $conv "hello bob"
EOF
# ---- end issue 13

if [ -n "${IM_RUN_EXIT_AFTER_SETUP:-}" ]; then
  code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/healthz")
  echo "healthz: $code"
  [ "$code" = 200 ] || { cat "$IM_TMP/gateway.log"; exit 1; }
  page=$(curl -s -o /dev/null -w '%{http_code}' "$web")   # issue 13
  echo "web page: $page"
  [ "$page" = 200 ] || exit 1
  exit 0
fi
wait "$gw_pid"
