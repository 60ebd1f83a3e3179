#!/usr/bin/env bash
# gateway_bench.sh — benchmark of im_gateway (not a test; prints figures).
# Load generator: test/bench/gateway/im_load (C, libwebsockets client, one
# event loop; built here).  Every part has a timeout and any failure of the
# load generator ends the run with its message and exit status 1.
#  1. N devices (pairs sharing a direct conversation) through the gateway,
#     each looping send -> sync -> ack on its own: sends/s, frames/s, and
#     send-to-partner's-hint p50/p99 at that saturation.  Round 1 then
#     paces sends at RATE/s in total (the first device of each pair sends,
#     its partner syncs and ACKs on every hint): p50/p99 at a moderate rate.
#     Then a hello floor: pgbench making the gateway's hello transaction
#     over --pool - 1 connections, the floor of parts 3 and 4.
#  2. pgbench making the same calls per transaction (send_message,
#     sync_changes, ack_sync; prepared, as the gateway prepares them; the
#     generation/applied seq carried from one sync to the next as the gateway
#     client does) over POOL connections = the gateway's --pool; ratio.
#     1 and 2 alternate ROUNDS times and the median ratio is reported: the
#     2-core machine is shared, and alternating short rounds keeps a load
#     spike elsewhere from landing on one side only.  The CPU shares of the
#     load generator and the gateway are printed per round.
#  3. IDLE idle authenticated sessions from loopback source addresses
#     (PER_SRC each, so ephemeral ports do not bound them): gateway RSS
#     growth per session, and send-to-hint latency of PROBE_DEVICES active
#     devices (in pairs, PROBE_RATE sends/s) while they are open.  One
#     session is one descriptor on each side: when the descriptor limit (raised to the hard
#     limit; as root with CAP_SYS_RESOURCE the hard limit too) is below
#     IDLE, the sessions are spread over as many gateway processes (and
#     load generator processes) as needed — several gateways may serve one
#     database (contract §10) — and the output says so.
#  4. reconnect storm of STORM devices (the first STORM idle devices, after
#     the idle sessions closed; STORM_PROC per load generator process, all
#     started together): time until all caught up (hello, sync, ack),
#     refusals and whether every refusal carried retry_after_ms.
# The whole run takes ~12 minutes (setup of 100,000 devices ~2 min, part 3
# at most BENCH_IDLE_SECONDS + 1 min, the storm at most 150 s).
# Fairness: the gateway side is a closed loop per device (N in flight over
# POOL DB connections, so the pool stays busy); pgbench is a closed loop per
# connection.
#   BENCH_DEVICES=40 BENCH_SECONDS=10 BENCH_ROUNDS=5 BENCH_POOL=4 BENCH_RATE=200
#   BENCH_IDLE=100000 BENCH_IDLE_SECONDS=240 (time to open them; then the
#   figures are for those up) BENCH_PER_SRC=4000 BENCH_PROBE_DEVICES=4
#   BENCH_PROBE_RATE=20 BENCH_STORM=10000 BENCH_STORM_PROC=1000 (devices per
#   storm process) BENCH_STORM_RUNS=1 (storms in a row, each on a fresh
#   gateway; the median is printed) BENCH_STORM_ONLY=1 (parts 1-3 skipped)
#   BENCH_PAIRS=1 (0: skip parts 1-2); BENCH_GW_ARGS adds gateway options;
#   BENCH_KEEP=DIR keeps the logs and outputs
set -uo pipefail
cd "$(dirname "$0")/../.."
source test/harness/cluster.sh
im_bench_parse_args "$@" || exit 2
N=${BENCH_DEVICES:-40}; SECS=${BENCH_SECONDS:-10}; POOL=${BENCH_POOL:-4}; ROUNDS=${BENCH_ROUNDS:-5}
RATE=${BENCH_RATE:-200}; PROBE_RATE=${BENCH_PROBE_RATE:-20}; PROBE_DEVICES=${BENCH_PROBE_DEVICES:-4}
IDLE=${BENCH_IDLE:-100000}; PER_SRC=${BENCH_PER_SRC:-4000}; IDLE_SECS=${BENCH_IDLE_SECONDS:-240}; STORM=${BENCH_STORM:-10000}; PAIRS=${BENCH_PAIRS:-1}
STORM_PROC=${BENCH_STORM_PROC:-1000}; STORM_RUNS=${BENCH_STORM_RUNS:-1}
# BENCH_STORM_ONLY=1: only the storm (and its hello floor)
[ "${BENCH_STORM_ONLY:-0}" = 1 ] && { PAIRS=0; IDLE=0; }
NIDLE=$(( IDLE > STORM ? IDLE : STORM ))   # users 200001.. serve both parts
LOAD=test/bench/gateway/im_load
make -s -C test/bench/gateway >/dev/null || { echo "cannot build $LOAD"; exit 1; }

# one descriptor per session in the gateway and in the load generator (+ the
# pool, listeners, files): the hard limit can be raised with CAP_SYS_RESOURCE
# (root, outside a restricted container) up to fs.nr_open
want_fds=$(( NIDLE + N + 4096 ))
nr_open=$(cat /proc/sys/fs/nr_open)
hard_note=""
if [ "$(ulimit -Hn)" != unlimited ] && [ "$(ulimit -Hn)" -lt "$want_fds" ]; then
  ulimit -Hn "$(( want_fds < nr_open ? want_fds : nr_open ))" 2>/dev/null ||
    hard_note=" (hard limit $(ulimit -Hn) cannot be raised here: no CAP_SYS_RESOURCE)"
fi
ulimit -n "$(ulimit -Hn)" 2>/dev/null
FDS=$(ulimit -n); [ "$FDS" = unlimited ] && FDS=$nr_open
PER_PROC=$(( FDS - 1000 ))                     # sessions per process, the rest for pool, files
[ "$PER_PROC" -ge $(( STORM + N + 100 )) ] || { echo "ulimit -n $FDS$hard_note is below the storm's $STORM sessions: lower BENCH_STORM"; exit 1; }

DB=im_bench
gw=""; sgw=""; idle_pids=(); idle_gws=(); storm_pids=()
stop_idle() {
  local p
  for p in "${idle_pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${idle_pids[@]}"; do wait "$p" 2>/dev/null; done
  idle_pids=()
}
stop_idle_gateways() {
  local p
  for p in "${idle_gws[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${idle_gws[@]}"; do wait "$p" 2>/dev/null; done
  idle_gws=()
}
cleanup() {
  # BENCH_KEEP=DIR keeps the gateway logs and the load generators' output
  [ -n "${BENCH_KEEP:-}" ] && mkdir -p "$BENCH_KEEP" && cp "$IM_TMP"/*.log "$IM_TMP"/*.out "$BENCH_KEEP"/ 2>/dev/null
  stop_idle
  stop_idle_gateways
  for p in "${storm_pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  [ -n "$sgw" ] && kill -TERM "$sgw" 2>/dev/null && wait "$sgw" 2>/dev/null
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
# a closed loop (3+ frames per cycle), connection caps above the sessions a
# process can hold (every session's address is one of a few loopback
# addresses, so the per-address cap must be as high).
CAP=$(( PER_PROC < NIDLE + N + 100 ? PER_PROC : NIDLE + N + 100 ))
GW_LIMITS=(--pool "$POOL" --rate 1000000 --burst 1000000 --max-connections "$CAP" --max-unauth-per-ip "$CAP")
# start_gateway LOG: a gateway on a free port (sets gw_pid, gw_port)
start_gateway() {
  gw_port=$(im_free_port)
  ./gateway/im_gateway --listen 127.0.0.1:"$gw_port" "${GW_LIMITS[@]}" ${BENCH_GW_ARGS:-} \
     --db "host=$PGHOST port=$PGPORT user=$PGUSER dbname=$DB" 2>"$1" &
  gw_pid=$!
  for _ in $(seq 50); do curl -fs "http://127.0.0.1:$gw_port/healthz" >/dev/null && return 0; sleep 0.2; done
  echo "gateway not healthy"; tail "$1"; return 1
}
start_gateway "$IM_TMP/gateway.log" || exit 1
gw=$gw_pid; port=$gw_port
export IM_GW_URL="ws://127.0.0.1:$port/"
echo "gateway: ${GW_LIMITS[*]} ${BENCH_GW_ARGS:-} (other limits: defaults, see gateway/doc/README.md)"
echo "descriptors: ulimit -n $FDS per process$hard_note; fs.nr_open $nr_open;" \
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

# the workers start after the database exists and first fan out the setup's
# backlog: wait until the outbox is empty, so round 1 is like the others
for _ in $(seq 240); do
  pending=$(im_psql -At -c "SELECT value::bigint FROM im.metrics() WHERE name = 'im_outbox_pending'")
  [ "$pending" = 0 ] && break; sleep 0.5
done
[ "$pending" = 0 ] || echo "NOTE: $pending outbox items still pending after 120 s (fanout workers?)"

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

if [ "$NIDLE" -gt 0 ]; then
# The floor of parts 3 and 4: the gateway's hello transaction made by pgbench
# over the connections hellos may use (--pool - 1), prepared
HCONN=$(( POOL > 1 ? POOL - 1 : 1 ))
awk '{print NR "\t" $4}' "$IM_TMP/all.txt" >"$IM_TMP/tokens.tsv"
im_psql -q -c "CREATE TABLE public.bench_tokens(i int PRIMARY KEY, t text)" -c "\\copy public.bench_tokens FROM '$IM_TMP/tokens.tsv'" || exit 1
# the gateway's hello statement (gateway/server/frame.c): authenticate, device_session, set_presence
HELLO_STMT="SELECT a.user_id, d.state, im.set_presence(a.user_id, a.device_id, a.connection_epoch, true, '90 seconds'::interval)
  FROM im.authenticate((SELECT t FROM public.bench_tokens WHERE i = :i)) a,
       LATERAL im.device_session(a.user_id, a.device_id, a.connection_epoch) d;"
cat >"$IM_TMP/hello.sql" <<SQL
\\set i random(1, $NIDLE)
BEGIN;
$HELLO_STMT
COMMIT;
SQL
# the gateway's batch (gateway/server/db/db_hello_batch.c): 32 hellos a transaction, a
# savepoint each; distinct devices in turn (a device in two batches at once
# would wait for the other's commit, which the gateway's storm never does)
im_psql -q -c "CREATE SEQUENCE public.bench_hello_seq" || exit 1
{ echo 'BEGIN;'
  for _ in $(seq 32); do
    echo "SELECT nextval('public.bench_hello_seq') % $NIDLE + 1 AS i \\gset"
    echo 'SAVEPOINT im_hello;'; echo "$HELLO_STMT"
  done
  echo 'COMMIT;'; } >"$IM_TMP/hello_batch.sql"
# hello_floor_run WHEN: sets hello_floor and hello_batch_floor (the disk's
# flush time, shared with the other load on this machine, moves them: the
# storm measures them again after)
hello_floor_run() {
  pgb=$(timeout -k 5 $(( SECS + 60 )) "$PGBIN/pgbench" -n -M prepared -c "$HCONN" -j 1 -T "$SECS" -f "$IM_TMP/hello.sql" "$DB" 2>&1) || { echo "$pgb"; exit 1; }
  hello_floor=$(echo "$pgb" | sed -n 's/^tps = \([0-9.]*\).*/\1/p' | head -1)
  echo "RESULT hello floor$1: pgbench making the hello transaction (BEGIN; im.authenticate + im.device_session + im.set_presence; COMMIT) over $HCONN connection(s): $hello_floor hellos/s"
  pgb=$(timeout -k 5 $(( SECS + 60 )) "$PGBIN/pgbench" -n -M prepared -c "$HCONN" -j 1 -T "$SECS" -f "$IM_TMP/hello_batch.sql" "$DB" 2>&1) || { echo "$pgb"; exit 1; }
  hello_batch_floor=$(echo "$pgb" | sed -n 's/^tps = \([0-9.]*\).*/\1/p' | head -1 | awk '{printf "%.0f", $1 * 32}')
  echo "RESULT hello batch floor$1: pgbench making the gateway's batch (BEGIN; 32 x (SAVEPOINT; the hello statement); COMMIT) over $HCONN connection(s): $hello_batch_floor hellos/s"
}
hello_floor_run ""
fi

if [ "$IDLE" -gt 0 ]; then
# G gateways (fresh, so their baseline RSS is an idle gateway's), each with
# its share of the sessions from one load generator process; G = 1 unless the
# descriptor limit forces more
G=$(( (IDLE + PER_PROC - 1) / PER_PROC ))
echo "== 3. $IDLE idle sessions on $G gateway process(es) (descriptor limit $FDS per process), $PER_SRC per loopback source address"
rss() { awk '/VmRSS/ {print $2}' /proc/"$1"/status 2>/dev/null || echo 0; }
sum_rss() { local p t=0; for p in "$@"; do t=$(( t + $(rss "$p") )); done; echo $t; }
avail() { awk '/MemAvailable/ {print $2}' /proc/meminfo; }
conns() { curl -s --max-time 10 "http://127.0.0.1:$1/metrics" | awk '$1 == "im_gateway_connections" {print $2}'; }
idle_ports=()
for k in $(seq 0 $(( G - 1 ))); do
  start_gateway "$IM_TMP/gateway-idle-$k.log" || exit 1
  idle_gws+=("$gw_pid"); idle_ports+=("$gw_port")
done
sleep 1
r0=$(sum_rss "${idle_gws[@]}"); w0=$(now)
share_n=$(( (IDLE + G - 1) / G ))
for k in $(seq 0 $(( G - 1 ))); do
  sed -n "$(( k * share_n + 1 )),$(( (k + 1) * share_n ))p" "$IM_TMP/idle.txt" >"$IM_TMP/idle-$k.txt"
  rm -f "$IM_TMP/idle-$k.ready"
  # process k binds 127.0.(k+1).2, … so no two processes share a source address's ports
  "$LOAD" idle "$IM_TMP/idle-$k.txt" --url "ws://127.0.0.1:${idle_ports[$k]}/" --src-base "127.0.$(( k + 1 )).2" \
    --per-src "$PER_SRC" --ready "$IM_TMP/idle-$k.ready" --max-seconds "$IDLE_SECS" --timeout 60 --hold 900 >"$IM_TMP/idle-$k.out" 2>&1 </dev/null &
  idle_pids+=($!)
done
# every process up (or out of time with the sessions it has), or one failed
while :; do
  up=0; dead=""
  for k in $(seq 0 $(( G - 1 ))); do
    [ -f "$IM_TMP/idle-$k.ready" ] && up=$(( up + 1 )) && continue
    kill -0 "${idle_pids[$k]}" 2>/dev/null || dead=$k
  done
  [ "$up" = "$G" ] && break
  [ -n "$dead" ] && { cat "$IM_TMP/idle-$dead.out"; echo "idle sessions failed (load generator $dead)"; exit 1; }
  sleep 0.5
done
w1=$(now)
sleep 2
r1=$(sum_rss "${idle_gws[@]}"); a1=$(avail); crss=$(sum_rss "${idle_pids[@]}")
open=0; for p in "${idle_ports[@]}"; do open=$(( open + $(conns "$p") )); done
grep -h '^RESULT idle' "$IM_TMP"/idle-*.out
echo "up in $(awk -v a="$w0" -v b="$w1" 'BEGIN{printf "%.1f", b-a}') s; open sessions (gateway metrics): $open;" \
     "$(awk -v n="$open" -v a="$w0" -v b="$w1" -v f="$hello_floor" -v g="$G" 'BEGIN{printf "%.0f hellos/s over %d gateway(s) (hello floor %.0f/s per pool)", n/(b-a), g, f}')"
# one active pair on the first gateway, paced, while every idle session stays open
echo "probe: $PROBE_DEVICES devices (pairs) on gateway 1, paced at $PROBE_RATE sends/s for $SECS s"
start_load pairs "$IM_TMP/pairs.txt" 0 --devices "$PROBE_DEVICES" --rate "$PROBE_RATE" --rate-seconds "$SECS" \
  --url "ws://127.0.0.1:${idle_ports[0]}/" --src-base 127.0.200.2 >"$IM_TMP/probe.out" 2>&1
watch_load $(( 2 * SECS + 60 ))
cat "$IM_TMP/probe.out"
[ "$rc" = 0 ] || { echo "probe failed (exit $rc)"; exit 1; }
r2=$(sum_rss "${idle_gws[@]}")
[ "$open" -gt 0 ] || { echo "no idle session open"; exit 1; }
[ "$open" -lt "$IDLE" ] && echo "NOTE: only $open of $IDLE sessions opened within BENCH_IDLE_SECONDS=$IDLE_SECS (bound: hello rate); figures below are per open session"
echo "RESULT idle sessions=$open gateways=$G gateway_rss_kib=$r0..$r1 gateway_rss_per_session_kib=$(awk -v a="$r0" -v b="$r1" -v n="$open" 'BEGIN{printf "%.2f", (b-a)/n}') (goal <= 4 at 100000)" \
     "after_probe_per_session_kib=$(awk -v a="$r0" -v b="$r2" -v n="$open" 'BEGIN{printf "%.2f", (b-a)/n}')" \
     "client_rss_per_session_kib=$(awk -v c="$crss" -v n="$open" 'BEGIN{printf "%.2f", c/n}')"
echo "RESULT idle hint p99 while open: $(sed -n 's/^RESULT paced .*send_to_hint_p99_ms=\([0-9.]*\).*/\1/p' "$IM_TMP/probe.out") ms (goal <= 100)"
echo "bounds: descriptors — ulimit -n $FDS per process$hard_note, so $G gateway process(es) of <= $PER_PROC sessions (--max-connections $CAP);" \
     "client ports — $(( (share_n + PER_SRC - 1) / PER_SRC )) source address(es) x $PER_SRC per load generator; memory — $(( a1 / 1024 )) MiB still available;" \
     "PostgreSQL max_connections not involved (sessions share each gateway's --pool $POOL); connect time — hellos (authenticate transactions) through the pools"
stop_idle
stop_idle_gateways
fi

if [ "$STORM" -gt 0 ]; then
# STORM_PROC devices per load generator process, all started together:
# libwebsockets inserts every pending connect's timeouts into one sorted list
# from its head, so one process opening 10,000 at once spends the storm in
# that walk (O(n^2)); a few processes keep each list short.  Each of
# STORM_RUNS storms meets a fresh gateway (no hello rate learnt before).
SP=$(( (STORM + STORM_PROC - 1) / STORM_PROC ))
share_s=$(( (STORM + SP - 1) / SP ))
for k in $(seq 0 $(( SP - 1 ))); do
  sed -n "$(( k * share_s + 1 )),$(( (k + 1) * share_s ))p" "$IM_TMP/storm.txt" >"$IM_TMP/storm-$k.txt"
done
storm_secs=""
for run in $(seq "$STORM_RUNS"); do
echo "== 4. reconnect storm $run/$STORM_RUNS: $STORM devices at once (idle sessions closed), $SP load generator process(es) started together, a fresh gateway"
start_gateway "$IM_TMP/gateway-storm-$run.log" || exit 1
sgw=$gw_pid
echo "machine load before: $(cut -d' ' -f1-3 /proc/loadavg)"
g0=$(cpu_of "$sgw"); m0=$(cpu_all); w0=$(now)
storm_pids=()
for k in $(seq 0 $(( SP - 1 ))); do
  "$LOAD" storm "$IM_TMP/storm-$k.txt" --url "ws://127.0.0.1:$gw_port/" --per-src "$PER_SRC" --src-base "127.0.$(( 100 + k )).2" \
    --max-seconds 150 --timeout 60 >"$IM_TMP/storm-$k.out" 2>&1 &
  storm_pids+=($!)
done
# each ends itself (150 s at most, 60 s per wait); past 200 s the script ends them
end=$(( $(date +%s) + 200 )); lc=0; rc=0
for k in $(seq 0 $(( SP - 1 ))); do
  p=${storm_pids[$k]}
  while kill -0 "$p" 2>/dev/null; do
    c=$(cpu_of "$p"); lcs[$k]=$c; sleep 0.2
    [ "$(date +%s)" -gt "$end" ] && { kill -TERM "$p"; sleep 1; kill -KILL "$p" 2>/dev/null; }
  done
  wait "$p" || rc=$?
  lc=$(awk -v a="$lc" -v b="${lcs[$k]:-0}" 'BEGIN{print a + b}')
done
storm_pids=()
g1=$(cpu_of "$sgw"); m1=$(cpu_all); w1=$(now)
cat "$IM_TMP"/storm-*.out
if [ "$rc" != 0 ]; then
  # the processes' progress at their end: how far the storm got
  sed -n 's/^im_load: progress: .* \([0-9]*\) caught up, .*, \([0-9]*\) refusals (\([0-9]*\) without.*/\1 \2 \3/p' "$IM_TMP"/storm-*.out |
    awk -v n="$STORM" '{c += $1; r += $2; w += $3} END{printf "RESULT storm devices=%d caught_up=%d within the limit (150 s) refusals=%d refusals_without_retry_after=%d\n", n, c, r, w}'
  echo "storm failed (exit $rc)"; exit 1
fi
sum_field() { sed -n "s/^RESULT storm .* $1=\([0-9.]*\).*/\1/p" "$IM_TMP"/storm-*.out | awk '{s += $1} END{print s + 0}'; }
secs=$(sed -n 's/^RESULT storm .*all_caught_up_s=\([0-9.]*\).*/\1/p' "$IM_TMP"/storm-*.out | sort -n | tail -1)
storm_secs="$storm_secs $secs"
echo "RESULT storm devices=$STORM all_caught_up_s=$secs" \
     "refusals=$(sum_field refusals) refusals_without_retry_after=$(sum_field refusals_without_retry_after) http_503=$(sum_field http_503)" \
     "(goal: <= 10 s, every refusal with retry_after_ms; its hellos alone would take $(awk -v n="$STORM" -v f="$hello_floor" 'BEGIN{ if (f > 0) printf "%.1f", n/f; else print "?" }') s at the hello floor, $(awk -v n="$STORM" -v f="$hello_batch_floor" 'BEGIN{ if (f > 0) printf "%.1f", n/f; else print "?" }') s at the batch floor)"
echo "CPU during storm: load generators $(share 0 "$lc" "$w0" "$w1")% of a core, gateway $(share "$g0" "$g1" "$w0" "$w1")%, machine $(share "$m0" "$m1" "$w0" "$w1")% (of $(nproc)00%)"
curl -s --max-time 10 "http://127.0.0.1:$gw_port/metrics" | grep -E '^im_gateway_(refusals_total|hellos_waited_total|hello_batches_total|hellos_batched_total|hello_batch_reruns_total|pool_waits_total|db_seconds_count|db_seconds_sum)'
kill -TERM "$sgw" 2>/dev/null; wait "$sgw" 2>/dev/null; sgw=""
sleep 2
done
[ "$STORM_RUNS" -gt 1 ] && echo "RESULT storm all_caught_up_s per run:$storm_secs median $(echo "$storm_secs" | median)"
hello_floor_run " after the storm"
echo "bound: the database's CPU per hello (authenticate, device_session, set_presence; the hello floor above is one hello a transaction, so one serialized NOTIFY flush each) — the gateway runs up to 32 queued hellos in one transaction (im_gateway_hellos_batched_total / im_gateway_hello_batches_total above), one NOTIFYing commit a batch; then the 256 handshakes lws holds at once (accept.c) and --hello-timeout for waiting hellos (refused with retry_after_ms after it)"
fi
curl -s --max-time 10 "http://127.0.0.1:$port/metrics" | grep -E '^im_gateway_(refusals_total|upgrades_refused_total|pool_waits_total|db_seconds_count|db_seconds_sum|hints_sent_total|hints_coalesced_total)'
exit 0
