#!/usr/bin/env bash
# gateway_bench.sh — benchmark of im_gateway (not a test; prints figures).
#  1. N devices (pairs sharing a direct conversation) through the gateway,
#     each looping send -> sync -> ack on its own: sends/s, frames/s.
#     Then (first round only) a ping-pong where the partner syncs on the
#     hint: send-to-hint p50/p99 — fanout latency, kept out of the ratio.
#  2. pgbench making the same calls per transaction (send_message,
#     sync_changes, ack_sync; prepared, as the gateway prepares them; the
#     generation/applied seq carried from one sync to the next as the gateway
#     client does) over POOL connections = the gateway's --pool; ratio.
#     1 and 2 alternate ROUNDS times and the median ratio is reported: the
#     2-core machine is shared, and alternating short rounds keeps a load
#     spike elsewhere from landing on one side only.
#  3. IDLE idle authenticated sessions: gateway RSS growth and MemAvailable
#     drop per connection (the latter includes the python client).
#  4. reconnect storm of STORM devices: time until all caught up (hello,
#     sync, ack), refusals and whether every refusal carried retry_after_ms.
# Fairness: the gateway side is a closed loop per device (40 in flight over
# POOL DB connections, so the pool stays busy); pgbench is a closed loop per
# connection.  The Python client (python3-websockets) shares the cores; its
# CPU share is printed (about a quarter of one core in the runs so far, so it
# does not throttle the gateway and no C load generator was needed).
#   BENCH_DEVICES=40 BENCH_SECONDS=10 BENCH_ROUNDS=3 BENCH_POOL=4
#   BENCH_IDLE=10000 BENCH_STORM=5000 BENCH_PAIRS=1 (0: skip parts 1-2)
set -uo pipefail
cd "$(dirname "$0")/../.."
source test/cluster.sh
im_bench_parse_args "$@" || exit 2
PY=${IM_PYTHON:-/usr/bin/python3}
N=${BENCH_DEVICES:-40}; SECS=${BENCH_SECONDS:-10}; POOL=${BENCH_POOL:-4}; ROUNDS=${BENCH_ROUNDS:-3}
IDLE=${BENCH_IDLE:-10000}; STORM=${BENCH_STORM:-5000}; PAIRS=${BENCH_PAIRS:-1}
NIDLE=$(( IDLE > STORM ? IDLE : STORM ))   # users 200001.. serve both parts
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
DB=im_bench
gw=""; idle_pid=""
cleanup() {
  [ -n "$idle_pid" ] && kill "$idle_pid" 2>/dev/null
  [ -n "$gw" ] && kill -TERM "$gw" 2>/dev/null && wait "$gw" 2>/dev/null
  im_cluster_destroy
}
trap cleanup EXIT
im_bench_cluster_start "im_sync.database = '$DB'" "im_sync.fanout_paused = off" "im_sync.fanout_workers = 2" \
  "max_connections = 400" || exit 1
im_createdb "$DB" || exit 1
export PGDATABASE=$DB
im_bench_durability
echo "ulimit -n: $(ulimit -n)"

# users: pairs 1..N (gateway), 100001.. (pgbench), 200001.. (idle + storm)
im_psql -q <<SQL || exit 1
CREATE TABLE public.bench_pairs(u bigint PRIMARY KEY, conv bigint);
DO \$\$
DECLARE u bigint; b record; conv bigint;
BEGIN
  FOR u IN SELECT g FROM generate_series(1, $N) g
           UNION ALL SELECT 100000 + g FROM generate_series(1, 2 * $POOL) g
           UNION ALL SELECT 200000 + g FROM generate_series(1, $NIDLE) g LOOP
    PERFORM im.register_device(u, 'bench');
    IF u < 200000 OR u <= 200000 + $STORM THEN
      SELECT * INTO b FROM im.begin_snapshot(u, 'bench');
      PERFORM im.ack_snapshot(u, 'bench', b.snapshot_token, b.manifest_digest);
    END IF;
    IF u < 200000 AND u % 2 = 1 THEN
      conv := im.direct_conversation(u, u + 1);
      INSERT INTO public.bench_pairs VALUES (u, conv), (u + 1, conv);
    END IF;
  END LOOP;
END \$\$;
SQL
tokens() { im_psql -At -F' ' -c "SELECT g, 'bench', coalesce(p.conv, 0), im.issue_device_token(g, 'bench', '1 day')
                                  FROM generate_series($1, $2) g LEFT JOIN public.bench_pairs p ON p.u = g"; }
tokens 1 "$N" >"$IM_TMP/pairs.txt"
tokens 200001 $((200000 + NIDLE)) >"$IM_TMP/all.txt"
head -n "$IDLE" "$IM_TMP/all.txt" >"$IM_TMP/idle.txt"
head -n "$STORM" "$IM_TMP/all.txt" >"$IM_TMP/storm.txt"

port=$(im_free_port)
./gateway/im_gateway --listen 127.0.0.1:"$port" --pool "$POOL" --max-pending-hello 256 --max-unauth-per-ip 100000 \
   --db "host=$PGHOST port=$PGPORT user=$PGUSER dbname=$DB" 2>"$IM_TMP/gateway.log" &
gw=$!
export IM_GW_URL="ws://127.0.0.1:$port/"
for _ in $(seq 50); do curl -fs "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.2; done

# CPU seconds (user+sys) of a process, and of the whole machine, to see
# who is saturated: a client near 100% of a core means it throttles the run.
cpu_of() { awk '{print ($14 + $15) / 100}' /proc/"$1"/stat 2>/dev/null || echo 0; }
cpu_all() { awk '/^cpu / {print ($2 + $3 + $4 + $7 + $8) / 100; exit}' /proc/stat; }

# Per transaction exactly the gateway cycle's three calls, prepared (the
# gateway prepares its statements too).  The client's conversation,
# generation and applied seq are looked up once (first transaction) and then
# carried from one sync to the next, as the gateway client does.
cat >"$IM_TMP/bench.sql" <<'SQL'
\set u 100001 + :client_id
\set r random(1, 2000000000)
\if :conv = 0
SELECT p.conv, d.sync_generation AS gen, d.server_acked_sync_seq AS applied
  FROM public.bench_pairs p, im.device_session(:u, 'bench', 0) d WHERE p.u = :u \gset
\endif
SELECT message_id FROM im.send_message(:u, :conv, 'pgb-' || :client_id || '-' || :r, '{"t":"x"}');
SELECT sync_generation AS gen, batch_token AS bt, batch_high_watermark AS applied
  FROM im.sync_changes(:u, 'bench', :gen, :applied, 200) \gset
SELECT status FROM im.ack_sync(:u, 'bench', :bt, :applied);
SQL

if [ "$PAIRS" != 0 ]; then
ratios=""
for round in $(seq "$ROUNDS"); do
echo "== 1. round $round/$ROUNDS gateway: $N devices, $SECS s, pool $POOL"
g0=$(cpu_of "$gw"); m0=$(cpu_all); w0=$(date +%s.%N)
"$PY" test/bench/gateway/load.py pairs "$SECS" "$IM_TMP/pairs.txt" $([ "$round" = 1 ] || echo nolat) >"$IM_TMP/pairs.out" 2>&1 &
lp=$!
sleep 1; l0=$(cpu_of "$lp"); t0=$(date +%s.%N); l1=$l0; t1=$t0
while kill -0 "$lp" 2>/dev/null; do l1=$(cpu_of "$lp"); t1=$(date +%s.%N); sleep 0.5; done
wait "$lp" || { cat "$IM_TMP/pairs.out"; exit 1; }
g1=$(cpu_of "$gw"); m1=$(cpu_all); w1=$(date +%s.%N)
out=$(cat "$IM_TMP/pairs.out")
echo "$out"
echo "CPU during run: client $(awk -v a="$l0" -v b="$l1" -v t0="$t0" -v t1="$t1" 'BEGIN{printf "%.0f", 100*(b-a)/(t1-t0)}')% of a core, gateway $(awk -v a="$g0" -v b="$g1" -v t0="$w0" -v t1="$w1" 'BEGIN{printf "%.0f", 100*(b-a)/(t1-t0)}')%, machine $(awk -v a="$m0" -v b="$m1" -v t0="$w0" -v t1="$w1" 'BEGIN{printf "%.0f", 100*(b-a)/(t1-t0)}')% (of $(nproc)00%)"
gw_rate=$(echo "$out" | sed -n 's/.*sends_per_s=\([0-9.]*\).*/\1/p' | head -1)

echo "== 2. round $round/$ROUNDS pgbench: same calls, $POOL connections, $SECS s"
pgb=$("$PGBIN/pgbench" -n -M prepared -D conv=0 -c "$POOL" -j 2 -T "$SECS" -f "$IM_TMP/bench.sql" "$DB" 2>&1) || { echo "$pgb"; exit 1; }
pg_rate=$(echo "$pgb" | sed -n 's/^tps = \([0-9.]*\).*/\1/p' | head -1)
echo "$pgb" | grep -E '^(number of failed|latency average)' | tr '\n' ' '; echo
r=$(awk -v a="$gw_rate" -v b="$pg_rate" 'BEGIN{ if (b > 0) printf "%.2f", a / b; else print "0" }')
echo "round $round: gateway $gw_rate sends/s, pgbench $pg_rate tps, ratio $r"
ratios="$ratios $r"
done
echo "RESULT ratio gateway/pgbench per round:$ratios median $(echo $ratios | tr ' ' '\n' | sort -n | awk '{v[NR]=$1} END{print v[int((NR+1)/2)]}') (goal >= 0.7)"
fi

if [ "$IDLE" -gt 0 ]; then
echo "== 3. $IDLE idle sessions"
rss() { awk '/VmRSS/ {print $2}' /proc/"$gw"/status; }
avail() { awk '/MemAvailable/ {print $2}' /proc/meminfo; }
r0=$(rss); a0=$(avail)
"$PY" test/bench/gateway/load.py idle "$IM_TMP/idle.txt" "$IM_TMP/idle.ready" &
idle_pid=$!
for _ in $(seq 600); do [ -f "$IM_TMP/idle.ready" ] && break; kill -0 "$idle_pid" 2>/dev/null || break; sleep 0.5; done
sleep 2
r1=$(rss); a1=$(avail)
crss=$(awk '/VmRSS/ {print $2}' /proc/"$idle_pid"/status 2>/dev/null || echo 0)
conns=$(curl -s "http://127.0.0.1:$port/metrics" | awk '$1 == "im_gateway_connections" {print $2}')
echo "open sessions (gateway metric): $conns"
echo "RESULT idle gateway_rss_per_conn_kib=$(awk -v a="$r0" -v b="$r1" -v n="$IDLE" 'BEGIN{printf "%.2f", (b-a)/n}') memavailable_drop_per_conn_kib=$(awk -v a="$a0" -v b="$a1" -v n="$IDLE" 'BEGIN{printf "%.2f", (a-b)/n}') memavailable_drop_minus_client_per_conn_kib=$(awk -v a="$a0" -v b="$a1" -v c="$crss" -v n="$IDLE" 'BEGIN{printf "%.2f", (a-b-c)/n}') (goal <= 16)"
kill "$idle_pid" 2>/dev/null; wait "$idle_pid" 2>/dev/null; idle_pid=""
sleep 2
fi

if [ "$STORM" -gt 0 ]; then
echo "== 4. reconnect storm: $STORM devices"
g0=$(cpu_of "$gw"); w0=$(date +%s.%N)
"$PY" test/bench/gateway/load.py storm "$IM_TMP/storm.txt" >"$IM_TMP/storm.out" 2>&1 &
lp=$!
while kill -0 "$lp" 2>/dev/null; do l1=$(cpu_of "$lp"); sleep 0.5; done
wait "$lp" || { cat "$IM_TMP/storm.out"; exit 1; }
g1=$(cpu_of "$gw"); w1=$(date +%s.%N)
cat "$IM_TMP/storm.out"
echo "CPU during storm: client $(awk -v b="$l1" -v t0="$w0" -v t1="$w1" 'BEGIN{printf "%.0f", 100*b/(t1-t0)}')% of a core, gateway $(awk -v a="$g0" -v b="$g1" -v t0="$w0" -v t1="$w1" 'BEGIN{printf "%.0f", 100*(b-a)/(t1-t0)}')%"
fi
curl -s "http://127.0.0.1:$port/metrics" | grep -E '^im_gateway_(refusals_total|pool_waits_total|db_seconds_count|db_seconds_sum|hints_sent_total|hints_coalesced_total)'
