#!/usr/bin/env bash
# WAL of one send by record type (NOT a test): im.send_message vs the floor
# of send_fanout.sh (same fixture), 1 client, IM_BENCH_WAL_TX transactions
# per side after a warm-up and a CHECKPOINT, pg_waldump --stats=record over
# each side's LSN range; record types seen in at least 10% of transactions,
# and full-page images by relation (after IM_BENCH_WAL_GROW sends per client
# and side grew the indexes, as the runs before send_fanout.sh's WAL figure).
# Production durability unless --fsync-off.  About a minute.
set -euo pipefail
cd "$(dirname "$0")/../.."
source test/harness/cluster.sh
im_bench_parse_args "$@" || exit 2
N=${IM_BENCH_WAL_TX:-500}
D=test/bench/send_fanout
im_bench_cluster_start "im_sync.fanout_paused = on" "im_sync.fanout_workers = 2" "autovacuum = off" >/dev/null || exit 1
trap im_cluster_destroy EXIT
im_psql -d postgres -c "CREATE DATABASE im_test" >/dev/null
im_psql -d im_test -c "CREATE EXTENSION im_sync CASCADE" >/dev/null 2>&1
im_psql -d im_test -f $D/setup.sql >/dev/null
im_bench_durability
for set in 2 1; do
  nconv=$([ $set = 1 ] && echo 1 || echo 1000)
  name=$([ $set = 1 ] && echo "hot conversation" || echo "1000 two-member conversations")
  for side in send floor_send; do
    # the indexes grown as in send_fanout.sh's runs before its WAL figure
    "$PGBIN/pgbench" -n -d im_test -f $D/$side.sql -c 8 -j 2 -t "${IM_BENCH_WAL_GROW:-2500}" -D set=$set -D nconv=$nconv >/dev/null 2>&1
    "$PGBIN/pgbench" -n -d im_test -f $D/$side.sql -c 1 -t 200 -D set=$set -D nconv=$nconv >/dev/null 2>&1
    im_psql -d im_test -c CHECKPOINT >/dev/null
    a=$(im_psql -d im_test -At -c "SELECT pg_catalog.pg_current_wal_insert_lsn()")
    "$PGBIN/pgbench" -n -d im_test -f $D/$side.sql -c 1 -t "$N" -D set=$set -D nconv=$nconv >/dev/null 2>&1
    b=$(im_psql -d im_test -At -c "SELECT pg_catalog.pg_current_wal_insert_lsn()")
    echo "== $name, $([ $side = send ] && echo API || echo floor): per transaction ($N)"
    "$PGBIN/pg_waldump" -p "$PGDATA/pg_wal" -s "$a" -e "$b" --stats=record 2>/dev/null \
      | awk -v n="$N" '{ gsub(/[()%\[\]]/, " "); $0 = $0 }
                       $1 != "Total" && $2 ~ /^[0-9]+$/ && $2 > n / 10 { printf "  %-28s %6.2f records %7.1f bytes with FPIs\n", $1, $2 / n, $8 / n }
                       $1 == "Total" && $2 ~ /^[0-9]+$/ { printf "  %-28s %6.2f records %7.1f bytes with FPIs (FPIs %.1f)\n", "total", $2 / n, $7 / n, $5 / n }'
    # Full-page images by relation: which index's first touch after the
    # checkpoint costs a whole page (the block references marked FPW).
    echo "  full-page images by relation (per transaction):"
    "$PGBIN/pg_waldump" -p "$PGDATA/pg_wal" -s "$a" -e "$b" 2>/dev/null \
      | grep -o 'rel [0-9/]* \(fork [a-z]* \)\?blk [0-9]* FPW' | awk '{ split($2, r, "/"); print r[3] }' \
      | sort | uniq -c | sort -rn | head -n 6 \
      | while read -r count node; do
          printf "    %-36s %6.3f\n" "$(im_psql -d im_test -At -c "SELECT COALESCE((SELECT relname FROM pg_catalog.pg_class WHERE relfilenode = $node), 'relfilenode $node')")" \
            "$(awk -v c="$count" -v n="$N" 'BEGIN { print c / n }')"
        done
  done
done
