#!/usr/bin/env bash
# Fanout cost of the recency column (NOT a test): the workers draining
# NMSG messages to a 200-member group (send_fanout's fixture), with two
# builds of im_sync.so alternating in ONE cluster on the 1.11 catalog:
# BEFORE (a library without recency: its fanout never changes the indexed
# last_activity_at, so the state-row updates stay HOT) and AFTER (this
# tree). Each round reinstalls the library and restarts the server; the
# median events/s per side is printed with the ratio and, per side, the
# share of HOT updates of im.user_conversation.
# Usage: IM_BEFORE_SO=path IM_AFTER_SO=path test/bench/recency_fanout.sh [--fsync-off]
# Knobs: IM_BENCH_ROUNDS (3), IM_BENCH_FAN_MSGS (200).
set -euo pipefail
cd "$(dirname "$0")/../.."
source test/harness/cluster.sh
im_bench_parse_args "$@" || exit 2
ROUNDS=${IM_BENCH_ROUNDS:-3}
NMSG=${IM_BENCH_FAN_MSGS:-200}
: "${IM_BEFORE_SO:?a library built without recency}" "${IM_AFTER_SO:?the library of this tree}"
LIB=$(pg_config --pkglibdir)/im_sync.so
saved=$(mktemp); cp "$LIB" "$saved"

im_bench_cluster_start "im_sync.fanout_paused = on" "im_sync.fanout_workers = 2" >/dev/null || exit 1
# a new file renamed over the old: a running server keeps the one it mapped
swap_lib() { cp "$1" "$LIB.swap" && chmod 755 "$LIB.swap" && mv -f "$LIB.swap" "$LIB"; }
trap 'im_cluster_destroy; swap_lib "$saved"; rm -f "$saved"' EXIT
q() { "$PGBIN/psql" -X -At -v ON_ERROR_STOP=1 -d im_test -c "$1"; }
im_psql -d postgres -c "CREATE DATABASE im_test"
im_psql -d im_test -c "CREATE EXTENSION im_sync CASCADE"
im_psql -d im_test -c "CREATE SCHEMA bench"
echo "recency fanout benchmark: $(im_bench_durability), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"

declare -A RATES HOT
for round in $(seq "$ROUNDS"); do
  for side in before after; do
    so=IM_BEFORE_SO; [ "$side" = after ] && so=IM_AFTER_SO
    swap_lib "${!so}"
    im_cluster_pg_ctl restart >/dev/null
    q "ALTER SYSTEM SET im_sync.fanout_paused = on" >/dev/null; q "SELECT pg_reload_conf()" >/dev/null
    # send_fanout's fixture (fanout_setup.sql), with keys of this round
    q "DROP TABLE IF EXISTS bench.g" >/dev/null
    im_psql -d im_test >/dev/null <<SQL
CREATE TABLE bench.g AS
SELECT im.create_conversation('group', ARRAY(SELECT pg_catalog.generate_series(500001, 500200))::bigint[], 500001) AS conversation_id;
SELECT im.run_fanout();
SELECT pg_catalog.count(*) FROM pg_catalog.generate_series(1, $NMSG) k,
  LATERAL im.send_message(500001 + k % 200, (SELECT conversation_id FROM bench.g),
                          'fan-$round-$side-' || k, '{"text": "fanout benchmark"}'::jsonb) m;
VACUUM ANALYZE;
SQL
    G="(SELECT conversation_id FROM bench.g)"
    sleep 1
    u0=$(q "SELECT n_tup_upd || ' ' || n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = 'im.user_conversation'::regclass")
    t0=$(date +%s.%N)
    q "ALTER SYSTEM SET im_sync.fanout_paused = off" >/dev/null; q "SELECT pg_reload_conf()" >/dev/null
    q "DO \$\$ BEGIN FOR i IN 1..24000 LOOP
         EXIT WHEN NOT EXISTS (SELECT 1 FROM im.outbox WHERE state = 'pending' AND conversation_id = $G);
         PERFORM pg_catalog.pg_sleep(0.005); END LOOP; END \$\$" >/dev/null
    t1=$(date +%s.%N)
    q "ALTER SYSTEM SET im_sync.fanout_paused = on" >/dev/null; q "SELECT pg_reload_conf()" >/dev/null
    sleep 1
    rows=$(q "SELECT count(*) FROM im.inbox WHERE conversation_id = $G AND msg_seq > 1")
    u1=$(q "SELECT pg_stat_force_next_flush(); SELECT n_tup_upd || ' ' || n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = 'im.user_conversation'::regclass" | tail -1)
    rate=$(awk -v n="$rows" -v a="$t0" -v b="$t1" 'BEGIN { printf "%.0f", n / (b - a) }')
    hot=$(awk -v a="$u0" -v b="$u1" 'BEGIN { split(a, x, " "); split(b, y, " "); d = y[1] - x[1];
                                         printf "%.2f", (d > 0 ? (y[2] - x[2]) / d : 0) }')
    RATES[$side]="${RATES[$side]:-} $rate"; HOT[$side]="${HOT[$side]:-} $hot"
    echo "round $round $side: $rows events, $rate events/s, HOT share of state-row updates $hot"
  done
done
median() { tr ' ' '\n' | grep . | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
b=$(echo "${RATES[before]}" | median); a=$(echo "${RATES[after]}" | median)
echo "median events/s: before $b, after $a, ratio $(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f", a / b }')"
echo "HOT shares: before${HOT[before]}, after${HOT[after]}"
