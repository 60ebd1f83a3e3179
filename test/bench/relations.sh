#!/usr/bin/env bash
# Reactions, pins and replies benchmark (NOT a test).  Starts its
# own throwaway cluster at production durability (im_bench_cluster_start),
# workers paused (the append path alone), and prints in one run:
#   - send_message with reply_to_message_id vs without, im.react vs
#     send_message and im.pin_message vs send_message: tx/s, the median of
#     IM_BENCH_ROUNDS (3) alternating IM_BENCH_ROUND_T (3) s runs per kind,
#     1 and 8 clients, one hot group (50 members) and 2000 small groups;
#   - per-transaction costs that do not depend on load: WAL bytes and
#     statements per call, from IM_BENCH_WAL_TX (2000) calls of each kind
#     by one client.
# Goal printed beside: each about the cost of a send (ratio >= 0.8x).
# About 2-3 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
source test/harness/cluster.sh
im_bench_parse_args "$@" || exit 2
ROUNDS=${IM_BENCH_ROUNDS:-3}
TR=${IM_BENCH_ROUND_T:-3}
NWAL=${IM_BENCH_WAL_TX:-2000}
D=test/bench/relations

im_bench_cluster_start "im_sync.fanout_paused = on" "im_sync.fanout_workers = 1" \
  "shared_preload_libraries = 'im_sync,pg_stat_statements'" "pg_stat_statements.track = all" >/dev/null || exit 1
trap im_cluster_destroy EXIT
im_psql -d postgres -c "CREATE DATABASE im_test"
im_psql -d im_test -c "CREATE EXTENSION im_sync CASCADE"
im_psql -d im_test -c "CREATE EXTENSION pg_stat_statements" 2>/dev/null || true
im_psql -d im_test -f $D/setup.sql >/dev/null

tps() {
  "$PGBIN/pgbench" -n -d im_test -f "$1" -c "$2" -j 2 -T "$TR" -D set="$3" -D nconv="$4" 2>"$IM_TMP/pgbench.err" \
    | awk '/^tps = / { print $3; exit }' | grep . || { cat "$IM_TMP/pgbench.err" >&2; echo 0; }
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
q() { im_psql -d im_test -At -c "$1"; }

echo "relations benchmark: PostgreSQL $(q 'SHOW server_version'), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at start"
im_bench_durability
echo "(tx/s: median of $ROUNDS alternating ${TR}s runs per kind; workers paused: the append path alone)"
echo

KINDS="send reply react pin"
declare -A TPS
for set in 1 2; do
  nconv=$([ $set = 1 ] && echo 1 || echo 2000)
  for c in 1 8; do
    declare -A runs=()
    for _ in $(seq 1 "$ROUNDS"); do
      for k in $KINDS; do runs[$k]="${runs[$k]:-} $(tps $D/$k.sql $c $set $nconv)"; done
    done
    for k in $KINDS; do TPS[$k,$set,$c]=$(median ${runs[$k]}); done
    unset runs
  done
done

printf '%-36s %9s %9s %9s %9s %8s %8s %8s %s\n' "tx/s (workers paused)" send reply react pin \
  "reply/s" "react/s" "pin/s" "goal"
for set in 1 2; do
  name=$([ $set = 1 ] && echo "hot group (50)" || echo "2000 small groups (5)")
  for c in 1 8; do
    s=${TPS[send,$set,$c]}
    printf '%-36s %9.0f %9.0f %9.0f %9.0f %7sx %7sx %7sx %s\n' "$name, $c client(s)" "$s" \
      "${TPS[reply,$set,$c]}" "${TPS[react,$set,$c]}" "${TPS[pin,$set,$c]}" \
      "$(ratio "${TPS[reply,$set,$c]}" "$s")" "$(ratio "${TPS[react,$set,$c]}" "$s")" \
      "$(ratio "${TPS[pin,$set,$c]}" "$s")" ">= 0.8x"
  done
done

# Per call, load-independent: WAL records, full-page images and bytes
# (pg_stat_wal, reset after a CHECKPOINT, over NWAL calls by one client,
# small groups) and the statements each call runs, nested ones included
# (pg_stat_statements with track = all).
echo
printf '%-36s %12s %12s %12s %12s\n' "per call (one client, small groups)" "WAL records" "WAL FPIs" "WAL bytes" "statements"
for k in $KINDS; do
  q "CHECKPOINT" >/dev/null
  q "SELECT pg_catalog.pg_stat_reset_shared('wal')" >/dev/null
  q "SELECT public.pg_stat_statements_reset()" >/dev/null 2>&1 || true
  "$PGBIN/pgbench" -n -d im_test -f $D/$k.sql -c 1 -t "$NWAL" -D set=2 -D nconv=2000 >/dev/null 2>"$IM_TMP/pgbench.err" \
    || { cat "$IM_TMP/pgbench.err" >&2; exit 1; }
  read -r rec fpi bytes < <(q "SELECT round(wal_records::numeric / $NWAL, 1), round(wal_fpi::numeric / $NWAL, 2),
                                      round(wal_bytes / $NWAL) FROM pg_catalog.pg_stat_wal" | tr '|' ' ')
  st=$(q "SELECT round(sum(calls)::numeric / $NWAL, 1) FROM public.pg_stat_statements
          WHERE query NOT LIKE '%pg_stat_statements%' AND query NOT LIKE 'SELECT m.msg_seq%'" 2>/dev/null || echo n/a)
  printf '%-36s %12s %12s %12s %12s\n' "$k" "$rec" "$fpi" "$bytes" "${st:-n/a}"
done
