#!/usr/bin/env bash
# gateway_bench.sh — benchmark of im_gateway (not a test; prints figures).
# Load generator: test/bench/gateway/im_load (C, libwebsockets client, one
# event loop; built here).  Every part has a timeout and any failure of the
# load generator ends the run with its message and exit status 1.
#  1. N devices (pairs sharing a direct conversation) through the gateway,
#     each looping send -> sync -> ack on its own: sends/s, frames/s, and
#     send-to-partner's-hint p50/p99 at that saturation.  Round 1 then runs
#     the same cycles paced at RATE sends/s in total, partners syncing on
#     hints: send-to-hint p50/p99 at a moderate rate.
#  2. pgbench making the same calls per transaction (send_message,
#     sync_changes, ack_sync; prepared, as the gateway prepares them; the
#     generation/applied seq carried from one sync to the next as the gateway
#     client does) over POOL connections = the gateway's --pool; ratio.
#     1 and 2 alternate ROUNDS times and the median ratio is reported: the
#     2-core machine is shared, and alternating short rounds keeps a load
#     spike elsewhere from landing on one side only.  The CPU shares of the
#     load generator and the gateway are printed per round.
#  3. IDLE idle authenticated sessions from source addresses 127.0.0.2, …
#     (PER_SRC each): gateway RSS growth per session, and send-to-hint
#     latency of one active pair (PROBE_RATE sends/s) while they are open.
#  4. reconnect storm of STORM devices (the first STORM idle devices, after
#     the idle sessions closed): time until all caught up (hello, sync, ack),
#     refusals and whether every refusal carried retry_after_ms.
# Fairness: the gateway side is a closed loop per device (N in flight over
# POOL DB connections, so the pool stays busy); pgbench is a closed loop per
# connection.
#   BENCH_DEVICES=40 BENCH_SECONDS=10 BENCH_ROUNDS=5 BENCH_POOL=4 BENCH_RATE=200
#   BENCH_IDLE=100000 BENCH_PER_SRC=4000 BENCH_PROBE_RATE=20 BENCH_STORM=10000
#   BENCH_PAIRS=1 (0: skip parts 1-2); BENCH_GW_ARGS adds gateway options
set -uo pipefail
cd "$(dirname "$0")/../.."
source test/cluster.sh
im_bench_parse_args "$@" || exit 2
N=${BENCH_DEVICES:-40}; SECS=${BENCH_SECONDS:-10}; POOL=${BENCH_POOL:-4}; ROUNDS=${BENCH_ROUNDS:-5}
RATE=${BENCH_RATE:-200}; PROBE_RATE=${BENCH_PROBE_RATE:-20}
IDLE=${BENCH_IDLE:-100000}; PER_SRC=${BENCH_PER_SRC:-4000}; STORM=${BENCH_STORM:-10000}; PAIRS=${BENCH_PAIRS:-1}
NIDLE=$(( IDLE > STORM ? IDLE : STORM ))   # users 200001.. serve both parts
LOAD=test/bench/gateway/im_load
make -s -C test/bench/gateway >/dev/null || { echo "cannot build $LOAD"; exit 1; }

# one descriptor per session on both sides (+ the pool, listeners, files):
# as root the hard limit can be raised up to fs.nr_open
want_fds=$(( 2 * NIDLE + 4096 ))
if [ "$(ulimit -Hn)" != unlimited ] && [ "$(ulimit -Hn)" -lt "$want_fds" ]; then
  ulimit -Hn "$(( want_fds < $(cat /proc/sys/fs/nr_open) ? want_fds : $(cat /proc/sys/fs/nr_open) ))" 2>/dev/null
fi
ulimit -n "$(ulimit -Hn)" 2>/dev/null
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt $(( NIDLE + 1024 )) ]; then
  echo "ulimit -n $(ulimit -n) is below the $NIDLE sessions (not root?): lower BENCH_IDLE/BENCH_STORM"; exit 1
fi

DB=im_bench
gw=""; idle_pid=""
cleanup() {
  [ -n "$idle_pid" ] && kill "$idle_pid" 2>/dev/null && wait "$idle_pid" 2>/dev/null
  [ -n "$gw" ] && kill -TERM "$gw" 2>/dev/null && wait "$gw" 2>/dev/null
  im_cluster_destroy
}
trap cleanup EXIT
trap 'exit 1' INT TERM
im_bench_cluster_start "im_sync.database = '$DB'" "im_sync.fanout_paused = off" "im_sync.fanout_workers = 2" \
  "max_connections = 400" || exit 1
im_createdb "$DB" || exit 1
export PGDATABASE=$DB
im_bench_durability

# users: pairs 1..N (gateway), 100001.. (pgbench), 200001.. (idle + storm)
t_setup=$(date +%s)
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
tokens 1 "$N" >"$IM_TMP/pairs.txt" || exit 1
tokens 200001 $((200000 + NIDLE)) >"$IM_TMP/all.txt" || exit 1
head -n "$IDLE" "$IM_TMP/all.txt" >"$IM_TMP/idle.txt"
head -n "$STORM" "$IM_TMP/all.txt" >"$IM_TMP/storm.txt"
echo "setup: $N pair devices, $NIDLE idle/storm devices and their tokens in $(( $(date +%s) - t_setup )) s"

# Limits chosen for the benchmark: no per-session frame limit in the way of
# a closed loop (3+ frames per cycle), connection caps above the idle count
# (every session's address is one of a few loopback addresses).
GW_LIMITS=(--pool "$POOL" --rate 1000000 --burst 1000000
           --max-connections $(( NIDLE + N + 1000 )) --max-unauth-per-ip $(( NIDLE + N + 1000 )))
port=$(im_free_port)
./gateway/im_gateway --listen 127.0.0.1:"$port" "${GW_LIMITS[@]}" ${BENCH_GW_ARGS:-} \
   --db "host=$PGHOST port=$PGPORT user=$PGUSER dbname=$DB" 2>"$IM_TMP/gateway.log" &
gw=$!
export IM_GW_URL="ws://127.0.0.1:$port/"
for _ in $(seq 50); do curl -fs "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.2; done
curl -fs "http://127.0.0.1:$port/healthz" >/dev/null || { echo "gateway not healthy"; tail "$IM_TMP/gateway.log"; exit 1; }
echo "gateway: ${GW_LIMITS[*]} ${BENCH_GW_ARGS:-} (other limits: defaults, see gateway/README.md)"
echo "descriptors: ulimit -n $(ulimit -n) (gateway and load generator each); fs.nr_open $(cat /proc/sys/fs/nr_open);" \
     "net.core.somaxconn $(cat /proc/sys/net/core/somaxconn); ephemeral ports $(tr '\t' '-' </proc/sys/net/ipv4/ip_local_port_range) per source address"

# CPU seconds (user+sys) of a process, and of the whole machine, to see
# who is saturated: a client near 100% of a core means it throttles the run.
cpu_of() { awk '{print ($14 + $15) / 100}' /proc/"$1"/stat 2>/dev/null || echo 0; }
cpu_all() { awk '/^cpu / {print ($2 + $3 + $4 + $7 + $8) / 100; exit}' /proc/stat; }
share() { awk -v a="$1" -v b="$2" -v t0="$3" -v t1="$4" 'BEGIN{ if (t1 > t0) printf "%.0f", 100*(b-a)/(t1-t0); else print 0 }'; }
now() { date +%s.%N; }
median() { tr ' ' '\n' | grep . | sort -n | awk '{v[NR]=$1} END{ if (NR) print v[int((NR+1)/2)]; else print "n/a" }'; }
# the load generator in the background (lp); watch_load LIMIT waits for it,
# sampling its CPU seconds (l1), and ends it after LIMIT s (rc 124) even
# though it has a timeout on every wait of its own
start_load() { "$LOAD" "$@" & lp=$!; l1=0; }
watch_load() {
  local end=$(( $(date +%s) + $1 ))
  while kill -0 "$lp" 2>/dev/null; do
    l1=$(cpu_of "$lp"); sleep 0.2
    if [ "$(date +%s)" -gt "$end" ]; then kill -TERM "$lp"; sleep 2; kill -KILL "$lp" 2>/dev/null; wait "$lp"; rc=124; return; fi
  done
  wait "$lp"; rc=$?
}

# Per transaction exactly the gateway cycle's three calls, prepared (the
# gateway prepares its statements too).  The client's conversation,
# generation and applied seq are looked up once (first transaction) and then
# carried from one sync to the next, as the gateway client does.  The body
# has the shape of the load generator's ({"t": send time in µs}).
cat >"$IM_TMP/bench.sql" <<'SQL'
\set u 100001 + :client_id
\set r random(1, 2000000000)
\if :conv = 0
SELECT p.conv, d.sync_generation AS gen, d.server_acked_sync_seq AS applied
  FROM public.bench_pairs p, im.device_session(:u, 'bench', 0) d WHERE p.u = :u \gset
\endif
SELECT message_id FROM im.send_message(:u, :conv, 'pgb-' || :client_id || '-' || :r, '{"t":1764590000000000}');
SELECT sync_generation AS gen, batch_token AS bt, batch_high_watermark AS applied
  FROM im.sync_changes(:u, 'bench', :gen, :applied, 200) \gset
SELECT status FROM im.ack_sync(:u, 'bench', :bt, :applied);
SQL

if [ "$PAIRS" != 0 ]; then
ratios=""; lat99=""
for round in $(seq "$ROUNDS"); do
echo "== 1. round $round/$ROUNDS gateway: $N devices, $SECS s, pool $POOL$([ "$round" = 1 ] && echo ", then paced at $RATE sends/s for $SECS s")"
rate_args=(); [ "$round" = 1 ] && rate_args=(--rate "$RATE" --rate-seconds "$SECS")
g0=$(cpu_of "$gw"); m0=$(cpu_all); w0=$(now)
start_load pairs "$IM_TMP/pairs.txt" "$SECS" "${rate_args[@]}" >"$IM_TMP/pairs.out" 2>&1
watch_load $(( 3 * SECS + 90 ))
g1=$(cpu_of "$gw"); m1=$(cpu_all); w1=$(now)
cat "$IM_TMP/pairs.out"
[ "$rc" = 0 ] || { echo "load generator failed (exit $rc$([ "$rc" = 124 ] && echo ": time limit"))"; exit 1; }
echo "CPU over the whole client run (connect, loop$([ "$round" = 1 ] && echo ", paced")): load generator $(share 0 "$l1" "$w0" "$w1")% of a core, gateway $(share "$g0" "$g1" "$w0" "$w1")%, machine $(share "$m0" "$m1" "$w0" "$w1")% (of $(nproc)00%)"
gw_rate=$(sed -n 's/^RESULT pairs .*sends_per_s=\([0-9.]*\).*/\1/p' "$IM_TMP/pairs.out")
lat99="$lat99 $(sed -n 's/^RESULT pairs .*send_to_hint_p99_ms=\([0-9.]*\).*/\1/p' "$IM_TMP/pairs.out")"

echo "== 2. round $round/$ROUNDS pgbench: same calls, $POOL connections, $SECS s"
m0=$(cpu_all); w0=$(now)
pgb=$(timeout -k 5 $(( SECS + 60 )) "$PGBIN/pgbench" -n -M prepared -D conv=0 -c "$POOL" -j 2 -T "$SECS" -f "$IM_TMP/bench.sql" "$DB" 2>&1) || { echo "$pgb"; exit 1; }
m1=$(cpu_all); w1=$(now)
pg_rate=$(echo "$pgb" | sed -n 's/^tps = \([0-9.]*\).*/\1/p' | head -1)
echo "$pgb" | grep -E '^(number of failed|latency average)' | tr '\n' ' '; echo "machine $(share "$m0" "$m1" "$w0" "$w1")%"
r=$(awk -v a="$gw_rate" -v b="$pg_rate" 'BEGIN{ if (b > 0) printf "%.2f", a / b; else print "0" }')
echo "round $round: gateway $gw_rate sends/s, pgbench $pg_rate tps, ratio $r"
ratios="$ratios $r"
done
echo "RESULT ratio gateway/pgbench per round:$ratios median $(echo "$ratios" | median) (goal >= 0.85)"
echo "RESULT send-to-hint p99 at saturation per round (ms):$lat99 median $(echo "$lat99" | median)"
fi

if [ "$IDLE" -gt 0 ]; then
echo "== 3. $IDLE idle sessions from $(( (IDLE + PER_SRC - 1) / PER_SRC )) source addresses (127.0.0.2 …, $PER_SRC each)"
rss() { awk '/VmRSS/ {print $2}' /proc/"$gw"/status; }
avail() { awk '/MemAvailable/ {print $2}' /proc/meminfo; }
conns() { curl -s --max-time 10 "http://127.0.0.1:$port/metrics" | awk '$1 == "im_gateway_connections" {print $2}'; }
r0=$(rss); a0=$(avail); w0=$(now); g0=$(cpu_of "$gw")
rm -f "$IM_TMP/idle.ready"
start_load idle "$IM_TMP/idle.txt" --per-src "$PER_SRC" --ready "$IM_TMP/idle.ready" --max-seconds 600 \
  --probe "$IM_TMP/pairs.txt" --rate "$PROBE_RATE" --rate-seconds "$SECS" --hold 900 >"$IM_TMP/idle.out" 2>&1 </dev/null
idle_pid=$lp
while [ ! -f "$IM_TMP/idle.ready" ] && kill -0 "$idle_pid" 2>/dev/null; do sleep 0.5; done
[ -f "$IM_TMP/idle.ready" ] || { cat "$IM_TMP/idle.out"; wait "$idle_pid"; echo "idle sessions failed (exit $?)"; idle_pid=""; exit 1; }
w1=$(now); g1=$(cpu_of "$gw")
sleep 2
r1=$(rss); a1=$(avail)
crss=$(awk '/VmRSS/ {print $2}' /proc/"$idle_pid"/status 2>/dev/null || echo 0)
echo "open sessions (gateway metric): $(conns); gateway CPU while connecting: $(share "$g0" "$g1" "$w0" "$w1")% of a core"
# the probe's paced phase runs now, the idle sessions still open
for _ in $(seq $(( 2 * SECS + 120 ))); do
  grep -q '^RESULT paced' "$IM_TMP/idle.out" && break; kill -0 "$idle_pid" 2>/dev/null || break; sleep 0.5
done
r2=$(rss)
cat "$IM_TMP/idle.out"
grep -q '^RESULT paced' "$IM_TMP/idle.out" || { echo "idle probe failed"; exit 1; }
echo "RESULT idle sessions=$IDLE gateway_rss_kib=$r0..$r1 gateway_rss_per_session_kib=$(awk -v a="$r0" -v b="$r1" -v n="$IDLE" 'BEGIN{printf "%.2f", (b-a)/n}') (goal <= 4)" \
     "after_probe_per_session_kib=$(awk -v a="$r0" -v b="$r2" -v n="$IDLE" 'BEGIN{printf "%.2f", (b-a)/n}')" \
     "memavailable_drop_minus_client_per_session_kib=$(awk -v a="$a0" -v b="$a1" -v c="$crss" -v n="$IDLE" 'BEGIN{printf "%.2f", (a-b-c)/n}')" \
     "client_rss_per_session_kib=$(awk -v c="$crss" -v n="$IDLE" 'BEGIN{printf "%.2f", c/n}')"
echo "RESULT idle hint p99 while open: $(sed -n 's/^RESULT paced .*send_to_hint_p99_ms=\([0-9.]*\).*/\1/p' "$IM_TMP/idle.out") ms (goal <= 100)"
echo "bounds: sessions per process by ulimit -n $(ulimit -n) (--max-connections $(( NIDLE + N + 1000 ))); client ports by $(( (IDLE + PER_SRC - 1) / PER_SRC )) source addresses x $PER_SRC; memory: $(( a1 / 1024 )) MiB still available; PostgreSQL max_connections not involved (sessions share --pool $POOL)"
kill "$idle_pid" 2>/dev/null; wait "$idle_pid" 2>/dev/null; idle_pid=""
# the gateway sees every close before the storm starts
for _ in $(seq 60); do [ "$(conns)" = 0 ] && break; sleep 0.5; done
echo "open sessions after the idle client ended: $(conns)"
fi

if [ "$STORM" -gt 0 ]; then
echo "== 4. reconnect storm: $STORM devices at once, from $(( (STORM + PER_SRC - 1) / PER_SRC )) source addresses"
g0=$(cpu_of "$gw"); m0=$(cpu_all); w0=$(now)
start_load storm "$IM_TMP/storm.txt" --per-src "$PER_SRC" --max-seconds 150 >"$IM_TMP/storm.out" 2>&1
watch_load 200
g1=$(cpu_of "$gw"); m1=$(cpu_all); w1=$(now)
cat "$IM_TMP/storm.out"
[ "$rc" = 0 ] || { echo "storm failed (exit $rc$([ "$rc" = 124 ] && echo ": time limit"))"; exit 1; }
echo "CPU during storm: load generator $(share 0 "$l1" "$w0" "$w1")% of a core, gateway $(share "$g0" "$g1" "$w0" "$w1")%, machine $(share "$m0" "$m1" "$w0" "$w1")% (of $(nproc)00%)"
echo "RESULT storm goal: all caught up <= 10 s, every refusal with retry_after_ms; bound: 3 database calls per device (hello = authenticate transaction, sync, ack) over --pool $POOL, hellos paced by --max-pending-hello"
fi
curl -s --max-time 10 "http://127.0.0.1:$port/metrics" | grep -E '^im_gateway_(refusals_total|upgrades_refused_total|pool_waits_total|db_seconds_count|db_seconds_sum|hints_sent_total|hints_coalesced_total)'
exit 0
