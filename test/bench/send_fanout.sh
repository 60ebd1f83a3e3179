#!/usr/bin/env bash
# Send/fanout benchmark (issue item 8; NOT a test).  Starts its own
# throwaway cluster (2 fanout workers, im_sync.database = im_test) and
# prints ratios measured in this run:
#   - im.send_message tx/s vs the floor (setup.sql,
#     floor_send.sql): one bare data-modifying statement that row-locks and
#     increments the head, inserts the message row (primary key
#     (conversation_id, msg_seq), unique message_id, unique (sender_id,
#     client_msg_id)) and one outbox row (primary key only); 1 and 8
#     clients; one hot conversation (50 members) and 1,000 two-member
#     conversations; workers paused (send path alone);
#   - backend CPU microseconds per transaction of both sides (one session,
#     IM_BENCH_CPU_TX transactions after a warm-up, utime + stime of its
#     own backend from /proc/self/stat): the figure the machine's load does
#     not move, printed with its ratio beside tx/s;
#   - WAL records, bytes and full-page images per transaction of both
#     sides (pg_stat_wal deltas over IM_BENCH_WAL_TX transactions, 1 client);
#   - the same sends with the workers on (sustained send + fanout): send
#     tx/s and inbox events/s the workers wrote meanwhile, backlog left;
#   - fanout inbox events/s (the workers draining messages to a 200-member
#     group) vs a bare INSERT ... SELECT of the same rows.
# Goals printed beside: send >= 0.95x floor at 1 client and >= 0.9x at 8
# clients, fanout >= 0.6x floor.
# Knobs: IM_BENCH_T (seconds per pgbench run, 6), IM_BENCH_ROUNDS (send
# runs per side, median kept, 5), IM_BENCH_FAN_MSGS (200), IM_BENCH_WAL_TX
# (2000), IM_BENCH_CPU_TX (1000), IM_BENCH_CPU_ROUNDS (5, medians kept),
# IM_BENCH_SEND_ONLY=1 (only the paused send runs, CPU and WAL),
# IM_BENCH_CPU_ONLY=1 (only the CPU figure), IM_BENCH_TRACED=1 (every send
# passes a 32-hex trace id, as the gateway does: send_traced.sql).
# About 3-4 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
source test/harness/cluster.sh
im_bench_parse_args "$@" || exit 2
T=${IM_BENCH_T:-6}
ROUNDS=${IM_BENCH_ROUNDS:-5}
TR=${IM_BENCH_ROUND_T:-3}   # seconds per alternating send run
NMSG=${IM_BENCH_FAN_MSGS:-200}
WAL_TX=${IM_BENCH_WAL_TX:-2000}
SEND_ONLY=${IM_BENCH_SEND_ONLY:-}
CPU_ONLY=${IM_BENCH_CPU_ONLY:-}
CPU_TX=${IM_BENCH_CPU_TX:-1000}
CPU_ROUNDS=${IM_BENCH_CPU_ROUNDS:-5}
[ -n "$CPU_ONLY" ] && SEND_ONLY=1
NCONV_MANY=1000
D=test/bench/send_fanout
SEND=$D/send.sql
[ -n "${IM_BENCH_TRACED:-}" ] && SEND=$D/send_traced.sql

im_bench_cluster_start "im_sync.fanout_paused = on" "im_sync.fanout_workers = 2" >/dev/null || exit 1
trap im_cluster_destroy EXIT
im_psql -d postgres -c "CREATE DATABASE im_test"
im_psql -d im_test -c "CREATE EXTENSION im_sync CASCADE"
im_psql -d im_test -f $D/setup.sql >/dev/null

# tps DB SCRIPT CLIENTS SET NCONV -> transactions per second (excluding connections)
tps() {
  "$PGBIN/pgbench" -n -d "$1" -f "$2" -c "$3" -j 2 -T "${TT:-$T}" -D set="$4" -D nconv="$5" 2>"$IM_TMP/pgbench.err" \
    | awk '/^tps = / { print $3; exit }' | grep . || { cat "$IM_TMP/pgbench.err" >&2; echo 0; }
}
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
q() { im_psql -d "$1" -At -c "$2"; }
paused() { q im_test "ALTER SYSTEM SET im_sync.fanout_paused = $1" >/dev/null; q im_test "SELECT pg_catalog.pg_reload_conf()" >/dev/null; sleep 1.5; }

echo "send_fanout benchmark: PostgreSQL $(q postgres 'SHOW server_version'), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at start"
im_bench_durability
echo "(send: median of $ROUNDS ${TR}s runs per side, order alternating, after one untimed run per side; workers on: one ${T}s run)"
echo

if [ -z "$SEND_ONLY" ]; then
# 1. Workers on first, so no paused-run backlog is counted as their work.
declare -A ON_TPS ON_EV ON_BACKLOG ON_LEFT
paused off
for set in 1 2; do
  nconv=$([ $set = 1 ] && echo 1 || echo $NCONV_MANY)
  ev0=$(q im_test "SELECT pg_catalog.count(*) FROM im.inbox")
  ts0=$(date +%s.%N)
  ON_TPS[$set]=$(tps im_test $SEND 8 $set $nconv)
  ON_BACKLOG[$set]=$(q im_test "SELECT pg_catalog.count(*) FROM im.outbox WHERE state = 'pending'")
  # Let the workers catch up (at most 30 s): their rate is measured over
  # the run plus the catch-up, since a batch's events land at its commit.
  for _ in $(seq 1 60); do
    [ "$(q im_test "SELECT pg_catalog.count(*) FROM im.outbox WHERE state = 'pending'")" = 0 ] && break
    sleep 0.5
  done
  ts1=$(date +%s.%N)
  ev1=$(q im_test "SELECT pg_catalog.count(*) FROM im.inbox")
  left=$(q im_test "SELECT pg_catalog.count(*) FROM im.outbox WHERE state = 'pending'")
  ON_EV[$set]=$(awk -v a="$ev0" -v b="$ev1" -v t0="$ts0" -v t1="$ts1" 'BEGIN { printf "%.0f", (b - a) / (t1 - t0) }')
  ON_LEFT[$set]=$left
done
paused on

# 2. Fanout by the workers (batches of worker.c's size) of NMSG messages
# to a 200-member group vs the floor: the same inbox rows in one bare
# INSERT ... SELECT.
im_psql -d im_test -v nmsg="$NMSG" -f $D/fanout_setup.sql >/dev/null
rows=$(q im_test "SELECT $NMSG * 200")
t0=$(date +%s.%N); im_psql -d im_test -f $D/fanout_floor.sql >/dev/null; t1=$(date +%s.%N)
floor_rows=$(q im_test "SELECT pg_catalog.count(*) FROM bench.inbox")
t2=$(date +%s.%N)
q im_test "ALTER SYSTEM SET im_sync.fanout_paused = off" >/dev/null; q im_test "SELECT pg_catalog.pg_reload_conf()" >/dev/null
G="(SELECT conversation_id FROM bench.g)"
# Wait in one session (a psql process every 50 ms would take CPU from the
# workers being measured); READ COMMITTED: each check sees new commits.
q im_test "DO \$\$ BEGIN FOR i IN 1..12000 LOOP
             EXIT WHEN NOT EXISTS (SELECT 1 FROM im.outbox WHERE state = 'pending' AND conversation_id = $G);
             PERFORM pg_catalog.pg_sleep(0.005); END LOOP; END \$\$" >/dev/null
t3=$(date +%s.%N)
paused on
fan_rows=$(q im_test "SELECT pg_catalog.count(*) FROM im.inbox WHERE conversation_id = $G AND msg_seq > 1")
fan_rate=$(awk -v n="$fan_rows" -v a="$t2" -v b="$t3" 'BEGIN { printf "%.0f", n / (b - a) }')
floor_rate=$(awk -v n="$floor_rows" -v a="$t0" -v b="$t1" 'BEGIN { printf "%.0f", n / (b - a) }')
fi

# 0. Backend CPU per transaction, load-independent: one psql session per
# side, both sides at once, each runs a warm-up (plans prepared, caches filled), reads its backend's utime +
# stime (/proc/self/stat, clock ticks), runs CPU_TX transactions of the
# side's pgbench script (the same random draws for both sides, simple
# protocol and one transaction per statement as pgbench) and reads again.
# Waiting for the commit's fsync costs no CPU, so other sessions' load and
# the disk do not move this figure (CPU contention does a little: caches).
cpu_stmts() {  # SCRIPT SET NCONV COUNT SEED -> COUNT statements, variables substituted
  awk -v set="$2" -v nconv="$3" -v n="$4" -v seed="$5" '
    /^\\/ || /^--/ { next } { body = body $0 "\n" }
    END { srand(seed); for (k = 0; k < n; k++) {
            s = body; i = 1 + int(rand() * nconv); r = int(rand() * 1000001)
            gsub(/:set/, set, s); gsub(/:nconv/, nconv, s); gsub(/:i/, i, s); gsub(/:r/, r, s)
            printf "%s", s } }' "$1"
}
cpu_us_per_tx() {  # SCRIPT SET NCONV -> backend CPU microseconds per transaction: "user+sys user"
  local stat="SELECT pg_catalog.pg_read_file('/proc/self/stat');"
  { echo '\o /dev/null'; cpu_stmts "$1" "$2" "$3" 200 7
    echo '\o'; echo "$stat"; echo '\o /dev/null'; cpu_stmts "$1" "$2" "$3" "$CPU_TX" 11
    echo '\o'; echo "$stat"; } \
    | im_psql -d im_test -At -f - \
    | awk -v n="$CPU_TX" -v hz="$(getconf CLK_TCK)" '
        /\) / { sub(/^.*\) /, ""); split($0, f, " "); k++; u[k] = f[12]; t[k] = f[12] + f[13] }   # fields 14, 15 of stat
        END { printf "%.0f %.0f", (t[2] - t[1]) * 1000000 / hz / n, (u[2] - u[1]) * 1000000 / hz / n }'
}
declare -A CPU
for set in 1 2; do
  nconv=$([ $set = 1 ] && echo 1 || echo $NCONV_MANY)
  a=(); f=(); r=(); ru=()
  for _ in $(seq 1 "$CPU_ROUNDS"); do
    # both sides at the same time (no lock in common): whatever else runs
    # on the machine then slows both alike
    cpu_us_per_tx $SEND $set $nconv >"$IM_TMP/cpu.api" & cpu_us_per_tx $D/floor_send.sql $set $nconv >"$IM_TMP/cpu.floor"
    wait; x=$(cat "$IM_TMP/cpu.api"); y=$(cat "$IM_TMP/cpu.floor")
    a+=("$x"); f+=("$y")
    r+=("$(ratio "${x%% *}" "${y%% *}")"); ru+=("$(ratio "${x##* }" "${y##* }")")
  done
  # medians of user+sys and of user alone; the ratio is the median of the
  # rounds' ratios (a change of the machine's load between rounds cancels)
  CPU[$set,API]=$(median "${a[@]%% *}"); CPU[$set,API_user]=$(median "${a[@]##* }")
  CPU[$set,floor]=$(median "${f[@]%% *}"); CPU[$set,floor_user]=$(median "${f[@]##* }")
  CPU[$set,ratio]=$(median "${r[@]}"); CPU[$set,ratio_user]=$(median "${ru[@]}")
done
cpu_report() {
  printf '%-44s %10s %10s %7s   %s\n' "backend CPU per tx ($CPU_ROUNDS x $CPU_TX tx, 1 session)" "API us" "floor us" "ratio" \
    "user-mode only: API us, floor us, ratio (sys: commit's WAL write + fsync, client I/O)"
  for set in 1 2; do
    name=$([ $set = 1 ] && echo "hot conversation (50 members)" || echo "$NCONV_MANY two-member conversations")
    printf '%-44s %10s %10s %7s   %s %s %s\n' "$name" "${CPU[$set,API]}" "${CPU[$set,floor]}" \
      "${CPU[$set,ratio]}x" "${CPU[$set,API_user]}" "${CPU[$set,floor_user]}" "${CPU[$set,ratio_user]}x"
  done
  echo
}
[ -n "$CPU_ONLY" ] && { cpu_report; exit 0; }

# 3. Send path alone: API vs floor in ROUNDS alternating runs each, the
# median of each kept, so a burst of load elsewhere on the machine hits
# both sides alike.  Each set starts with one untimed run per side (WAL
# segments created, caches filled), and the rounds alternate which side
# goes first (API-floor, floor-API, ...): the rate still climbs while a
# run's WAL segments are new, and a fixed order gave that climb to the
# side that always ran second.
declare -A API FLOOR
for set in 1 2; do
  nconv=$([ $set = 1 ] && echo 1 || echo $NCONV_MANY)
  TT=$TR tps im_test $SEND 8 $set $nconv >/dev/null
  TT=$TR tps im_test $D/floor_send.sql 8 $set $nconv >/dev/null
  for c in 1 8; do
    a=(); f=()
    for r in $(seq 1 "$ROUNDS"); do
      if [ $((r % 2)) = 1 ]; then
        a+=("$(TT=$TR tps im_test $SEND $c $set $nconv)")
        f+=("$(TT=$TR tps im_test $D/floor_send.sql $c $set $nconv)")
      else
        f+=("$(TT=$TR tps im_test $D/floor_send.sql $c $set $nconv)")
        a+=("$(TT=$TR tps im_test $SEND $c $set $nconv)")
      fi
    done
    API[$set,$c]=$(median "${a[@]}")
    FLOOR[$set,$c]=$(median "${f[@]}")
  done
done

# 4. WAL per transaction, 1 client, a fixed number of transactions per
# side: pg_stat_wal deltas (a backend flushes its WAL counters when it
# exits, so each pgbench run is over before the second reading).
wal_now() { q im_test "SELECT wal_records || ' ' || wal_bytes || ' ' || wal_fpi FROM pg_catalog.pg_stat_wal"; }
declare -A WAL
for set in 1 2; do
  nconv=$([ $set = 1 ] && echo 1 || echo $NCONV_MANY)
  for side in API floor; do
    script=$([ $side = API ] && echo $SEND || echo $D/floor_send.sql)
    q im_test CHECKPOINT >/dev/null
    w0=$(wal_now)
    "$PGBIN/pgbench" -n -d im_test -f "$script" -c 1 -t "$WAL_TX" -D set=$set -D nconv=$nconv >/dev/null 2>"$IM_TMP/pgbench.err" \
      || { cat "$IM_TMP/pgbench.err" >&2; exit 1; }
    sleep 0.5
    w1=$(wal_now)
    WAL[$set,$side]=$(awk -v a="$w0" -v b="$w1" -v n="$WAL_TX" 'BEGIN { split(a, x, " "); split(b, y, " ");
      printf "%.1f %.0f %.2f", (y[1] - x[1]) / n, (y[2] - x[2]) / n, (y[3] - x[3]) / n }')
  done
done

printf '%-44s %10s %10s %7s %s\n' "send (workers paused)" "API tx/s" "floor tx/s" "ratio" "goal"
for set in 1 2; do
  name=$([ $set = 1 ] && echo "hot conversation (50 members)" || echo "$NCONV_MANY two-member conversations")
  for c in 1 8; do
    printf '%-44s %10.0f %10.0f %7s %s\n' "$name, $c client(s)" "${API[$set,$c]}" "${FLOOR[$set,$c]}" \
      "$(ratio "${API[$set,$c]}" "${FLOOR[$set,$c]}")x" "$([ $c = 1 ] && echo '>= 0.95x' || echo '>= 0.9x')"
  done
done
echo
cpu_report
printf '%-44s %10s %10s %10s\n' "WAL per transaction (1 client, $WAL_TX tx)" "records" "bytes" "FPIs"
for set in 1 2; do
  name=$([ $set = 1 ] && echo "hot conversation" || echo "$NCONV_MANY two-member conversations")
  for side in API floor; do
    printf '%-44s %10s %10s %10s\n' "$name, $side" ${WAL[$set,$side]}
  done
done
echo
[ -n "$SEND_ONLY" ] && exit 0
printf '%-44s %10s %10s %7s %s\n' "send + fanout (workers on, 8 clients)" "API tx/s" "floor tx/s" "ratio" "workers: inbox events/s over run + catch-up; backlog"
for set in 1 2; do
  name=$([ $set = 1 ] && echo "hot conversation (50 members)" || echo "$NCONV_MANY two-member conversations")
  printf '%-44s %10.0f %10.0f %7s %s\n' "$name" "${ON_TPS[$set]}" "${FLOOR[$set,8]}" \
    "$(ratio "${ON_TPS[$set]}" "${FLOOR[$set,8]}")x" "${ON_EV[$set]} ev/s; ${ON_BACKLOG[$set]} items pending after the run, ${ON_LEFT[$set]} after catch-up"
done
echo
printf '%-44s %10s %10s %7s %s\n' "fanout, 200-member group, $NMSG messages" "events/s" "floor ev/s" "ratio" "goal"
printf '%-44s %10s %10s %7s %s\n' "fanout workers ($fan_rows events of $rows)" "$fan_rate" "$floor_rate" \
  "$(ratio "$fan_rate" "$floor_rate")x" ">= 0.6x (floor wrote $floor_rows rows)"
