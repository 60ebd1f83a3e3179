#!/usr/bin/env bash
# Offline push benchmark (NOT a test).  Its own throwaway cluster
# at production durability (--fsync-off: the old variant), then:
#   1. fanout inbox events/s with a push target on every device vs none,
#      alternating rounds in this run (median kept): IM_PUSH_ROUNDS rounds of
#      IM_PUSH_MSGS messages into a 200-member group (one job per target,
#      later messages coalesce into it) and of one message into each of 1,000
#      direct conversations (a new job each); every member has a device in
#      both variants, only the targets differ; im.run_fanout(100) per
#      transaction, the workers' batch size.  Goal: >= 0.8x.
#   2. relay throughput against the stub push gateway: IM_PUSH_JOBS jobs
#      queued, then im_push_relay (--concurrency 32) drains them: pushes/s.
#   3. queue-to-POST latency at a moderate rate: the fanout workers and a
#      relay running, IM_PUSH_RATE messages/s to distinct offline devices for
#      IM_PUSH_SECS seconds, push_delay 0: p50/p99 of (the stub's receive
#      time - the job's queued_at) and of (receive - the message's accept).
set -euo pipefail
cd "$(dirname "$0")/../.."
source test/harness/cluster.sh
im_bench_parse_args "$@" || exit 2
ROUNDS=${IM_PUSH_ROUNDS:-5}
MSGS=${IM_PUSH_MSGS:-100}
JOBS=${IM_PUSH_JOBS:-2000}
RATE=${IM_PUSH_RATE:-20}
SECS=${IM_PUSH_SECS:-10}
PY=/usr/bin/python3
make -s -C gateway im_push_relay

im_bench_cluster_start "im_sync.fanout_paused = on" "im_sync.fanout_workers = 2" >/dev/null || exit 1
pids=()
cleanup() { for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; im_cluster_destroy; }
trap cleanup EXIT
q() { im_psql -d im_test -At -c "$1"; }
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
im_psql -d postgres -c "CREATE DATABASE im_test" >/dev/null
im_psql -d im_test -c "CREATE EXTENSION im_sync CASCADE" >/dev/null 2>&1
im_psql -d postgres -c "ALTER SYSTEM SET im_sync.push_public_key_file = '$PWD/test/push/relay_pub.pem'" \
  -c "ALTER SYSTEM SET im_sync.push_delay = 0" -c "ALTER SYSTEM SET im_sync.push_min_interval = 0" \
  -c "SELECT pg_reload_conf()" >/dev/null

echo "push benchmark: PostgreSQL $(q 'SHOW server_version'), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at start"
im_bench_durability

# ---- 1. fanout with and without targets
# variant v (0: no targets, 1: a target on every device): group g<v> of 200
# members (users v*100000 + 1..200) and 1,000 direct conversations
# (users v*100000 + 1001..3000), every user with a device
im_psql -d im_test -At >/dev/null <<'SQL'
CREATE TABLE bench_conv (variant int, kind text, conversation_id bigint);
SELECT count(*) FROM generate_series(0, 1) v, generate_series(1, 200) i,
       LATERAL im.register_device(v * 100000 + i, 'phone');
SELECT count(*) FROM generate_series(0, 1) v, generate_series(1001, 3000) i,
       LATERAL im.register_device(v * 100000 + i, 'phone');
INSERT INTO bench_conv SELECT v, 'group', im.create_conversation('group',
    (SELECT array_agg(v * 100000 + i) FROM generate_series(1, 200) i), v * 100000 + 1) FROM generate_series(0, 1) v;
INSERT INTO bench_conv SELECT v, 'direct', im.direct_conversation(v * 100000 + i, v * 100000 + i + 1000)
FROM generate_series(0, 1) v, generate_series(1001, 2000) i;
SELECT count(*) FROM generate_series(1, 200) i,
       LATERAL im.register_push_target(100000 + i, 'phone', 'fcm', 'bench', 'ok-g-' || i);
SELECT count(*) FROM generate_series(1001, 3000) i,
       LATERAL im.register_push_target(100000 + i, 'phone', 'fcm', 'bench', 'ok-d-' || i);
SELECT im.run_fanout();
SQL
fanout_all() {   # statements of 100 items each until nothing is pending; prints events/s
  local e0 e1 t0 t1 n
  n=$(q "SELECT count(*) FROM im.outbox WHERE state = 'pending'")
  e0=$(q "SELECT count(*) FROM im.inbox"); t0=$(date +%s.%N)
  for _ in $(seq 1 $(( n / 100 + 2 ))); do echo "SELECT im.run_fanout(100);"; done | im_psql -d im_test -At -f - >/dev/null
  [ "$(q "SELECT count(*) FROM im.outbox WHERE state = 'pending'")" = 0 ] || { echo "fanout left items pending" >&2; exit 1; }
  t1=$(date +%s.%N); e1=$(q "SELECT count(*) FROM im.inbox")
  awk -v a="$e0" -v b="$e1" -v t0="$t0" -v t1="$t1" 'BEGIN { printf "%.0f", (b - a) / (t1 - t0) }'
}
send_group() {   # variant: MSGS messages into the group, from member 1
  q "SELECT count(*) FROM generate_series(1, $MSGS) k, LATERAL im.send_message($1 * 100000 + 1,
       (SELECT conversation_id FROM bench_conv WHERE variant = $1 AND kind = 'group'),
       'bg-' || $1 || '-' || k || '-' || clock_timestamp(), '{\"text\": \"bench\"}')" >/dev/null
}
send_direct() {  # variant: one message in each direct conversation, to the target side
  q "SELECT count(*) FROM generate_series(1001, 2000) i, LATERAL im.send_message($1 * 100000 + i,
       im.direct_conversation($1 * 100000 + i, $1 * 100000 + i + 1000),
       'bd-' || $1 || '-' || i || '-' || clock_timestamp(), '{\"text\": \"bench\"}')" >/dev/null
}
declare -a G0 G1 D0 D1
for r in $(seq 1 "$ROUNDS"); do
  send_group 0; G0+=("$(fanout_all)")
  send_group 1; G1+=("$(fanout_all)")
  send_direct 0; D0+=("$(fanout_all)")
  send_direct 1; D1+=("$(fanout_all)")
  q "DELETE FROM im.push_job" >/dev/null    # each round queues afresh (no coalescing across rounds)
done
g0=$(median "${G0[@]}"); g1=$(median "${G1[@]}"); d0=$(median "${D0[@]}"); d1=$(median "${D1[@]}")
echo
echo "1. fanout inbox events/s, median of $ROUNDS alternating rounds (goal: with targets >= 0.8x without)"
printf '   200-member group, %d msgs/round : no targets %7s   a target per device %7s   ratio %s\n' "$MSGS" "$g0" "$g1" "$(ratio "$g1" "$g0")"
printf '   1,000 direct conversations       : no targets %7s   a target per device %7s   ratio %s\n' "$d0" "$d1" "$(ratio "$d1" "$d0")"

# ---- 2. relay throughput
stub_log="$IM_TMP/stub.jsonl"
$PY test/e2e/push_stub.py --port 0 --log "$stub_log" >"$IM_TMP/stub.out" 2>&1 &
pids+=($!)
for _ in $(seq 50); do grep -q listening "$IM_TMP/stub.out" && break; sleep 0.1; done
url="http://127.0.0.1:$(awk '/listening/ {print $3}' "$IM_TMP/stub.out")/_matrix/push/v1/notify"
q "DELETE FROM im.push_job" >/dev/null
q "SELECT count(*) FROM generate_series(1, $JOBS) i, LATERAL (SELECT im.register_device(200000 + i, 'phone'),
     im.register_push_target(200000 + i, 'phone', 'fcm', 'bench', 'ok-r-' || i)) x" >/dev/null
q "SELECT count(*) FROM generate_series(1, $JOBS) i, LATERAL im.send_message(300000 + i,
     im.direct_conversation(300000 + i, 200000 + i), 'br-' || i, '{\"text\": \"bench\"}')" >/dev/null
while [ "$(q "SELECT count(*) FROM im.outbox WHERE state = 'pending'")" != 0 ]; do q "SELECT im.run_fanout(1000)" >/dev/null; done
queued=$(q "SELECT count(*) FROM im.push_job WHERE state = 'pending'")
t0=$(date +%s.%N)
./gateway/im_push_relay --db "host=$PGHOST port=$PGPORT user=$PGUSER dbname=im_test" --key test/push/relay_key.pem \
    --url "$url" --concurrency 32 --batch 100 --relay-id bench >"$IM_TMP/relay.log" 2>&1 &
relay=$!; pids+=($relay)
q "DO \$\$ BEGIN FOR i IN 1..30000 LOOP
     EXIT WHEN NOT EXISTS (SELECT 1 FROM im.push_job WHERE state IN ('pending', 'claimed', 'retry'));
     PERFORM pg_sleep(0.01); END LOOP; END \$\$" >/dev/null
t1=$(date +%s.%N)
done_n=$(q "SELECT count(*) FROM im.push_job WHERE state = 'delivered'")
echo
echo "2. relay throughput against the stub push gateway (Python http.server, one process)"
awk -v n="$done_n" -v q="$queued" -v a="$t0" -v b="$t1" \
  'BEGIN { printf "   %d of %d jobs delivered in %.2f s: %.0f pushes/s (concurrency 32)\n", n, q, b - a, n / (b - a) }'

# ---- 3. latency at a moderate rate, the workers fanning out
q "DELETE FROM im.push_job" >/dev/null
: >"$stub_log"
N=$(( RATE * SECS ))
q "SELECT count(*) FROM generate_series(1, $N) i, LATERAL (SELECT im.register_device(400000 + i, 'phone'),
     im.register_push_target(400000 + i, 'phone', 'fcm', 'bench', 'ok-l-' || i)) x" >/dev/null
q "CREATE TABLE bench_lat AS SELECT i, im.direct_conversation(500000 + i, 400000 + i) AS c FROM generate_series(1, $N) i" >/dev/null
q "ALTER SYSTEM SET im_sync.fanout_paused = off" >/dev/null; q "SELECT pg_reload_conf()" >/dev/null; sleep 1.5
$PY - "$N" "$RATE" <<PYEOF
import subprocess, sys, time
n, rate = int(sys.argv[1]), float(sys.argv[2])
p = subprocess.Popen(["$PGBIN/psql", "-X", "-q", "-At", "-d", "im_test", "-f", "-"], stdin=subprocess.PIPE, text=True,
                     stdout=subprocess.DEVNULL)
t0 = time.monotonic()
for i in range(1, n + 1):
    while time.monotonic() < t0 + (i - 1) / rate:
        time.sleep(0.001)
    p.stdin.write("SELECT 1 FROM im.send_message(%d, (SELECT c FROM bench_lat WHERE i = %d), 'bl-%d', '{\"text\": \"bench\"}');\n"
                  % (500000 + i, i, i))
    p.stdin.flush()
p.stdin.close(); p.wait()
PYEOF
q "DO \$\$ BEGIN FOR i IN 1..3000 LOOP
     EXIT WHEN (SELECT count(*) FROM im.push_job WHERE state = 'delivered' AND user_id > 400000) >= $N;
     PERFORM pg_sleep(0.01); END LOOP; END \$\$" >/dev/null
$PY - "$stub_log" <<'PYEOF' >"$IM_TMP/lat.csv"
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("pushkey", "").startswith("ok-l-"):
        print("%s,%.6f" % (r["pushkey"][5:], r["t"]))
PYEOF
im_psql -d im_test -At <<SQL
CREATE TEMP TABLE got (i int, t float8);
\copy got FROM '$IM_TMP/lat.csv' WITH (FORMAT csv)
WITH l AS (
  SELECT (g.t - extract(epoch FROM j.queued_at)) * 1000 AS queue_ms,
         (g.t - extract(epoch FROM e.created_at)) * 1000 AS accept_ms
  FROM got g JOIN im.push_job j ON j.user_id = 400000 + g.i AND j.state = 'delivered'
  JOIN im.event e ON e.message_id = j.message_id)
SELECT format(E'\n3. queue-to-POST latency, %s messages at $RATE/s to offline devices (push_delay 0, workers and one relay):\n'
              '   queued -> POST received: p50 %s ms, p99 %s ms\n   accepted -> POST received: p50 %s ms, p99 %s ms',
              count(*),
              round(percentile_cont(0.5) WITHIN GROUP (ORDER BY queue_ms)::numeric, 1),
              round(percentile_cont(0.99) WITHIN GROUP (ORDER BY queue_ms)::numeric, 1),
              round(percentile_cont(0.5) WITHIN GROUP (ORDER BY accept_ms)::numeric, 1),
              round(percentile_cont(0.99) WITHIN GROUP (ORDER BY accept_ms)::numeric, 1))
FROM l;
SQL
