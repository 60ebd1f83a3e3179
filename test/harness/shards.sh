#!/usr/bin/env bash
# test/harness/shards.sh — a throwaway sharded installation for tests:
#   test/harness/shards.sh up [N]        N node clusters (default 3) and one router
#                                cluster on free ports; prints the router's
#                                conninfo as its LAST line
#   test/harness/shards.sh down          stops everything `up` started
#   test/harness/shards.sh resubscribe SRC DST  the repair path of a lost slot (below)
#   test/harness/shards.sh standby NODE  a synchronous streaming standby for NODE, and
#                                NODE's conninfo rewritten everywhere to the
#                                multi-host form (host=a,b port=p1,p2
#                                target_session_attrs=read-write)
#   test/harness/shards.sh reattach NODE the operator step after NODE failed over to its
#                                standby: every subscription to and from NODE
#                                re-created (resubscribe both ways)
#   test/harness/shards.sh set NAME VAL  one setting on every node (ALTER ROLE ALL IN
#                                DATABASE … SET, then reload): session settings
#                                do not cross PL/Proxy
#   test/harness/shards.sh reset NAME    undoes `set NAME` on every node
# State lives in $IM_SHARDS_DIR (default: a temp dir `up` prints; pass the same
# IM_SHARDS_DIR to `down`/`set`): `nodes` (one line per node: name, conninfo),
# `router` (the router's conninfo), `clusters` (one data dir per cluster: the
# nodes', the router's, then any standbys'), `standbys` (NODE, data dir, port).
# Database name on every cluster: $IM_SHARDS_DB (default im).
# Each node preloads im_sync with wal_level = logical; buckets round robin
# (bucket b -> node (b % N) + 1); between every pair of nodes a publication
# im_to_<dest> (publish = 'insert', row filters on the destination) and a
# subscription im_<source>_to_<dest> on the destination.  If im_sync_router is installed, the router
# database gets it and im_router.configure(...) with the same map.
set -euo pipefail
IM_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$IM_ROOT/test/harness/cluster.sh"

DB=${IM_SHARDS_DB:-im}
# WAL a slot may hold back before PostgreSQL invalidates it (then the
# subscription stops with "requested WAL segment has already been removed"
# and reconcile reports the slot as lost; repair: extension/doc/sharding.md,
# "Failure behaviour and repair").
SLOT_KEEP=${IM_SHARDS_SLOT_KEEP:-1GB}
ROLES="im_gateway im_app im_relay im_dba"

shards_psql() {  # shards_psql CONNINFO SQL...
  local conn=$1; shift
  local args=()
  for sql in "$@"; do args+=(-c "$sql"); done
  "$PGBIN/psql" -X -q -At -v ON_ERROR_STOP=1 -d "$conn" "${args[@]}"
}

# start one cluster; echoes "tmpdir port"
shards_start_cluster() {
  local peers=$1; shift
  im_cluster_start \
    "wal_level = logical" \
    "max_replication_slots = $((peers + 4))" \
    "max_wal_senders = $((peers + 6))" \
    "max_logical_replication_workers = $((peers + 4))" \
    "max_worker_processes = $((peers + 20))" \
    "max_slot_wal_keep_size = $SLOT_KEEP" \
    "wal_sender_timeout = 30s" \
    "im_sync.database = '$DB'" \
    "im_sync.fanout_workers = 2" \
    "$@" >&2 || return 1
  echo "$IM_TMP $PGPORT"
}

shards_roles() {  # roles the tests use, on every cluster
  local conn=$1
  for r in $ROLES; do
    shards_psql "$conn" "DO \$\$BEGIN CREATE ROLE $r LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END\$\$"
  done
}

cmd_up() {
  local n=${1:-3}
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "usage: $0 up [N>=1]" >&2; exit 2; }
  local dir=${IM_SHARDS_DIR:-$(mktemp -d /tmp/im_shards.XXXXXX)}
  mkdir -p "$dir"; chmod 755 "$dir"
  : >"$dir/nodes"; : >"$dir/clusters"
  local names=() conns=()
  for i in $(seq 1 "$n"); do
    read -r tmp port < <(shards_start_cluster "$n")
    [ -n "${port:-}" ] || { echo "shards: node$i did not start" >&2; exit 1; }
    echo "$tmp" >>"$dir/clusters"
    local conn="host=127.0.0.1 port=$port dbname=$DB user=postgres"
    names+=("node$i"); conns+=("$conn")
    echo "node$i $conn" >>"$dir/nodes"
    shards_psql "host=127.0.0.1 port=$port dbname=postgres user=postgres" "CREATE DATABASE $DB"
    shards_psql "$conn" "CREATE EXTENSION im_sync CASCADE"
    shards_roles "$conn"
  done
  # the map: bucket b -> node (b % N) + 1, the same on every node
  local map="ARRAY[" sep=""
  for b in $(seq 0 63); do map+="${sep}'node$(( b % n + 1 ))'"; sep=","; done
  map+="]::text[]"
  for i in $(seq 0 $((n - 1))); do
    shards_psql "${conns[$i]}" "SELECT im.shard_configure('${names[$i]}', $map)"
  done
  # publications on every node, one per destination; then subscriptions
  for i in $(seq 0 $((n - 1))); do
    for j in $(seq 0 $((n - 1))); do
      [ "$i" = "$j" ] && continue
      shards_psql "${conns[$i]}" "CREATE PUBLICATION im_to_${names[$j]}
        FOR TABLE im.transfer_out WHERE (dest_node = '${names[$j]}'),
                  im.transfer_ack WHERE (source_node = '${names[$j]}')
        WITH (publish = 'insert')"
    done
  done
  for i in $(seq 0 $((n - 1))); do
    for j in $(seq 0 $((n - 1))); do
      [ "$i" = "$j" ] && continue
      # the slot on the source takes the subscription's name: unique per pair
      shards_psql "${conns[$i]}" "CREATE SUBSCRIPTION im_${names[$j]}_to_${names[$i]}
        CONNECTION '${conns[$j]}' PUBLICATION im_to_${names[$i]}
        WITH (copy_data = false)"
    done
  done
  # the router
  read -r tmp port < <(shards_start_cluster "$n" "shared_preload_libraries = ''")
  echo "$tmp" >>"$dir/clusters"
  local rconn="host=127.0.0.1 port=$port dbname=$DB user=postgres"
  shards_psql "host=127.0.0.1 port=$port dbname=postgres user=postgres" "CREATE DATABASE $DB"
  shards_roles "$rconn"
  echo "$rconn" >"$dir/router"
  if [ -f "$("$PGBIN/pg_config" --sharedir)/extension/im_sync_router.control" ] ||
     [ -f "$(pg_config --sharedir)/extension/im_sync_router.control" ]; then
    local arr_names="ARRAY[" arr_conns="ARRAY[" s=""
    for i in $(seq 0 $((n - 1))); do
      arr_names+="$s'${names[$i]}'"; arr_conns+="$s'${conns[$i]}'"; s=","
    done
    arr_names+="]::text[]"; arr_conns+="]::text[]"
    shards_psql "$rconn" "CREATE EXTENSION im_sync_router CASCADE" \
      "SELECT im_router.configure($arr_names, $arr_conns, $map)"
  else
    echo "shards: im_sync_router is not installed; the router database is empty" >&2
  fi
  echo "shards: $n nodes up, state in $dir (IM_SHARDS_DIR=$dir $0 down stops them)" >&2
  echo "$rconn"
}

shards_dir() {
  [ -n "${IM_SHARDS_DIR:-}" ] && [ -f "$IM_SHARDS_DIR/clusters" ] || {
    echo "shards: set IM_SHARDS_DIR to the directory \`up\` printed" >&2; exit 2; }
  echo "$IM_SHARDS_DIR"
}

cmd_down() {
  local dir; dir=$(shards_dir)
  while read -r tmp; do
    [ -n "$tmp" ] || continue
    PGDATA=$tmp/data IM_TMP=$tmp
    if [ "$(id -u)" = 0 ]; then IM_AS_SERVER="runuser -u postgres --"; else IM_AS_SERVER=""; fi
    [ -f "$PGDATA/postmaster.pid" ] && im_cluster_pg_ctl -m fast stop || true
    [ -z "${IM_KEEP:-}" ] && rm -rf "$tmp"
  done <"$dir/clusters"
  [ -z "${IM_KEEP:-}" ] && rm -rf "$dir"
  echo "shards: stopped" >&2
}

cmd_set() {
  local name=${1:?usage: $0 set NAME VALUE} value=${2?usage: $0 set NAME VALUE}
  [[ "$name" =~ ^[a-z_][a-z0-9_.]*$ ]] || { echo "shards: bad setting name $name" >&2; exit 2; }
  local dir; dir=$(shards_dir)
  while read -r node conn; do
    shards_psql "$conn" "ALTER ROLE ALL IN DATABASE $DB SET $name = '$value'" "SELECT pg_reload_conf()" >/dev/null
  done <"$dir/nodes"
}

# reset NAME: undo `set` on every node (ALTER ROLE ALL IN DATABASE … RESET):
# a harness that changed a setting gives the next one the defaults back
cmd_reset() {
  local name=${1:?usage: $0 reset NAME}
  [[ "$name" =~ ^[a-z_][a-z0-9_.]*$ ]] || { echo "shards: bad setting name $name" >&2; exit 2; }
  local dir; dir=$(shards_dir)
  while read -r node conn; do
    shards_psql "$conn" "ALTER ROLE ALL IN DATABASE $DB RESET $name" "SELECT pg_reload_conf()" >/dev/null
  done <"$dir/nodes"
}

# The repair path of a lost slot (max_slot_wal_keep_size reached) or of any
# broken SRC -> DST channel: drop DST's subscription and SRC's slot, subscribe
# again with copy_data = true.  Nothing is lost: SRC keeps every transfer row
# until DST's applied record comes back, the initial copy carries them all
# again, and DST's exact-key filter drops those it has (re-sending their acks).
cmd_resubscribe() {
  local src=${1:?usage: $0 resubscribe SRC DST} dst=${2:?usage: $0 resubscribe SRC DST}
  local dir; dir=$(shards_dir)
  local sconn dconn
  sconn=$(awk -v n="$src" '$1 == n { $1 = ""; sub(/^ /, ""); print }' "$dir/nodes")
  dconn=$(awk -v n="$dst" '$1 == n { $1 = ""; sub(/^ /, ""); print }' "$dir/nodes")
  [ -n "$sconn" ] && [ -n "$dconn" ] || { echo "shards: unknown node $src or $dst" >&2; exit 2; }
  local sub="im_${src}_to_${dst}"
  shards_psql "$dconn" "ALTER SUBSCRIPTION $sub DISABLE" "ALTER SUBSCRIPTION $sub SET (slot_name = NONE)" \
    "DROP SUBSCRIPTION $sub"
  # the disabled subscription's worker lets go of the slot a moment later
  local i
  for i in $(seq 300); do
    [ "$(shards_psql "$sconn" "SELECT count(*) FROM pg_catalog.pg_replication_slots
        WHERE slot_name = '$sub' AND active")" = 0 ] && break
    sleep 0.1
  done
  shards_psql "$sconn" "SELECT pg_catalog.pg_drop_replication_slot(slot_name) FROM pg_catalog.pg_replication_slots
    WHERE slot_name = '$sub'" >/dev/null
  shards_psql "$dconn" "CREATE SUBSCRIPTION $sub CONNECTION '$sconn' PUBLICATION im_to_${dst} WITH (copy_data = true)"
}

node_conninfo() {  # node_conninfo DIR NODE
  awk -v n="$2" '$1 == n { $1 = ""; sub(/^ /, ""); print }' "$1/nodes"
}

as_server() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

# The router's map again from the `nodes` file (conninfos) and its own
# bucket table (placement unchanged): configure bumps the cluster version.
router_reconfigure() {
  local dir=$1 names="ARRAY[" conns="ARRAY[" s="" node conn
  while read -r node conn; do
    names+="$s'$node'"; conns+="$s'$conn'"; s=","
  done <"$dir/nodes"
  names+="]::text[]"; conns+="]::text[]"
  shards_psql "$(cat "$dir/router")" "SELECT im_router.configure($names, $conns,
    (SELECT array_agg(node_name ORDER BY bucket) FROM im_router.bucket))" >/dev/null
}

# standby NODE: pg_basebackup -R with a physical slot, started as NODE's
# streaming standby and made synchronous (synchronous_standby_names on NODE
# names it), so every commit NODE acknowledged is on it.  Then NODE's
# conninfo becomes host=<primary>,<standby> port=<p1>,<p2>
# target_session_attrs=read-write in the `nodes` file, the router's map and
# the other nodes' subscriptions to NODE: after a promotion they all reach
# the new primary without being reconfigured.  What a promotion loses is
# the logical slots on NODE (PostgreSQL 15 does not carry them to a
# standby): `reattach NODE` is the operator step after it.
cmd_standby() {
  local node=${1:?usage: $0 standby NODE}
  local dir; dir=$(shards_dir)
  local conn; conn=$(node_conninfo "$dir" "$node")
  [ -n "$conn" ] || { echo "shards: unknown node $node" >&2; exit 2; }
  [[ "$conn" != *target_session_attrs* ]] || { echo "shards: $node has a standby already" >&2; exit 2; }
  local port=${conn##*port=}; port=${port%% *}
  local stmp sport name="${node}_standby" slot="standby_${node}"
  stmp=$(mktemp -d /tmp/im_sync.XXXXXX); chmod 755 "$stmp"
  [ "$(id -u)" = 0 ] && chown postgres "$stmp"
  sport=$(im_free_port)
  shards_psql "$conn" "SELECT pg_catalog.pg_create_physical_replication_slot('$slot')" >/dev/null
  as_server "$PGBIN/pg_basebackup" -h 127.0.0.1 -p "$port" -U postgres -D "$stmp/data" -R -S "$slot" \
    -X stream -c fast >"$stmp/basebackup.log" 2>&1 || { cat "$stmp/basebackup.log" >&2; exit 1; }
  printf "port = %s\nunix_socket_directories = '%s'\ncluster_name = '%s'\n" "$sport" "$stmp" "$name" |
    as_server sh -c "cat >> '$stmp/data/postgresql.conf'"
  as_server "$PGBIN/pg_ctl" -D "$stmp/data" -l "$stmp/server.log" -w -t 60 start >/dev/null ||
    { cat "$stmp/server.log" >&2; exit 1; }
  echo "$stmp" >>"$dir/clusters"
  echo "$node $stmp/data $sport" >>"$dir/standbys"
  shards_psql "$conn" "ALTER SYSTEM SET synchronous_standby_names = '$name'" "SELECT pg_catalog.pg_reload_conf()" >/dev/null
  local i
  for i in $(seq 600); do
    [ "$(shards_psql "$conn" "SELECT count(*) FROM pg_catalog.pg_stat_replication
        WHERE application_name = '$name' AND state = 'streaming' AND sync_state = 'sync'")" = 1 ] && break
    [ "$i" = 600 ] && { echo "shards: $name is not a synchronous standby" >&2; exit 1; }
    sleep 0.1
  done
  local multi="host=127.0.0.1,127.0.0.1 port=$port,$sport dbname=$DB user=postgres target_session_attrs=read-write"
  awk -v n="$node" -v c="$multi" '$1 == n { print n " " c; next } { print }' "$dir/nodes" >"$dir/nodes.new"
  mv "$dir/nodes.new" "$dir/nodes"
  local other oconn
  while read -r other oconn; do
    [ "$other" = "$node" ] && continue
    shards_psql "$oconn" "ALTER SUBSCRIPTION im_${node}_to_${other} CONNECTION '$multi'"
  done <"$dir/nodes"
  router_reconfigure "$dir"
  echo "shards: $name on port $sport streams from $node (synchronous); $node is now $multi" >&2
}

# reattach NODE, after NODE's standby was promoted.  The promoted standby
# has every table and subscription of NODE but none of NODE's logical
# slots, and its subscriptions' origins may stand behind what the old
# primary had confirmed to the sources (the apply workers commit without
# waiting for the standby).  So, with every other node X: resubscribe NODE X
# (a new slot on the new primary; the initial copy re-sends every transfer
# NODE has not seen acknowledged) and resubscribe X NODE (the same for
# what X sends NODE).  The exact-key filter drops every copy already
# applied, so nothing is applied twice; a transfer stays on its source until
# acknowledged, so nothing is lost.
cmd_reattach() {
  local node=${1:?usage: $0 reattach NODE}
  local dir; dir=$(shards_dir)
  [ -n "$(node_conninfo "$dir" "$node")" ] || { echo "shards: unknown node $node" >&2; exit 2; }
  local other
  for other in $(awk -v n="$node" '$1 != n { print $1 }' "$dir/nodes"); do
    cmd_resubscribe "$node" "$other"
    cmd_resubscribe "$other" "$node"
  done
}

case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  resubscribe) shift; cmd_resubscribe "$@" ;;
  standby) shift; cmd_standby "$@" ;;
  reattach) shift; cmd_reattach "$@" ;;
  down) cmd_down ;;
  set) shift; cmd_set "$@" ;;
  reset) shift; cmd_reset "$@" ;;
  *) echo "usage: $0 up [N] | down | set NAME VALUE | reset NAME | resubscribe SRC DST | standby NODE | reattach NODE" >&2; exit 2 ;;
esac
