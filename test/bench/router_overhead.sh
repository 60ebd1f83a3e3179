#!/usr/bin/env bash
# test/bench/router_overhead.sh — what one PL/Proxy hop costs:
# the same call through the router and straight on the node that owns it,
# alternating short pgbench runs (other sessions share the cores) and
# printing medians and router/node ratios.  Not part of make bench (the
# shards benchmark is); run it alone:  bash test/bench/router_overhead.sh
# IM_ROUNDS (5), IM_SECONDS (3), IM_CLIENTS (1).  Production durability.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${IM_ROUNDS:-5}; SECONDS_PER=${IM_SECONDS:-3}; CLIENTS=${IM_CLIENTS:-1}
export IM_FSYNC=on IM_SHARDS_DIR=$(mktemp -d /tmp/im_router_bench.XXXXXX)
chmod 755 "$IM_SHARDS_DIR"
trap 'bash test/harness/shards.sh down >/dev/null 2>&1 || true; rm -rf "$W"' EXIT
W=$(mktemp -d)
router=$(bash test/harness/shards.sh up 3 2>/dev/null | tail -n 1)
PSQL="$(pg_config --bindir)/psql -X -q -At"
PGBENCH="$(pg_config --bindir)/pgbench"
# a group on some node, its sender; the node that owns it
g=$($PSQL -d "$router" -c "SELECT im.create_conversation('group', ARRAY[1000,1001,1002]::bigint[], 1000)")
owner=$($PSQL -d "$router" -c "SELECT node_name FROM im_router.bucket WHERE bucket = $g % 64")
node=$(awk -v n="$owner" '$1 == n { $1 = ""; sub(/^ /, ""); print }' "$IM_SHARDS_DIR/nodes")
cat >"$W/send.sql" <<SQL
\set r random(1, 2000000000)
SELECT * FROM im.send_message(1000, $g, 'bench-' || :client_id || '-' || :r, '{"t":1}');
SQL
echo "SELECT * FROM im.conversation_members($g);" >"$W/members.sql"
$PSQL -d "$router" -c "SELECT 'durability: fsync = ' || current_setting('fsync')" || true
declare -A runs
for r in $(seq 1 "$ROUNDS"); do
  for call in send members; do
    for via in router node; do
      conn=$router; [ "$via" = node ] && conn=$node
      tps=$($PGBENCH -n -T "$SECONDS_PER" -c "$CLIENTS" -f "$W/$call.sql" "$conn" 2>/dev/null \
            | sed -n 's/^tps = \([0-9.]*\).*/\1/p' | head -n 1)
      runs[$call.$via]+="${tps:-0} "
    done
  done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
for call in send members; do
  rt=$(echo "${runs[$call.router]}" | median); nt=$(echo "${runs[$call.node]}" | median)
  awk -v c="$call" -v r="$rt" -v n="$nt" -v k="$CLIENTS" \
    'BEGIN { printf "%-8s clients %d  router %8.1f/s  node %8.1f/s  ratio %.2f\n", c, k, r, n, (n > 0 ? r / n : 0) }'
done
