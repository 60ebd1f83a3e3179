#!/usr/bin/env bash
# Large-group benchmark (NOT a test).  Starts its own
# throwaway cluster and prints, measured side by side in one run:
#   1. a 5,000-member group in `fanout` and in `shared_log` mode receiving
#      the same message stream: rows written per message (inserts + updates
#      on im tables from pg_stat), fanout time per message (one message per
#      fanout batch, and the whole stream as one batch), and the time for a
#      member's device to catch up (sync_changes pages; shared_log: the
#      conversation_dirty event + fetch_messages + clear_dirty);
#   2. a mixed workload with the workers on: many direct conversations
#      sending steadily, alone and then with one hot 5,000-member group
#      sending at the same time; direct-message fanout lag p50/p99
#      (outbox processed_at - created_at).  Goal: p99 under 1 s with the
#      hot group (a benchmark figure, not a test assertion).
# Knobs: IM_BENCH_MEMBERS (5000), IM_BENCH_MSGS (40), IM_BENCH_T (10 s).
set -euo pipefail
cd "$(dirname "$0")/../.."
source test/harness/cluster.sh
im_bench_parse_args "$@" || exit 2
MEMBERS=${IM_BENCH_MEMBERS:-5000}
MSGS=${IM_BENCH_MSGS:-40}
T=${IM_BENCH_T:-10}
D=test/bench/large_group

im_bench_cluster_start "im_sync.fanout_paused = on" "im_sync.fanout_workers = 2" "track_counts = on" >/dev/null || exit 1
trap im_cluster_destroy EXIT
im_psql -d postgres -c "CREATE DATABASE im_test" >/dev/null
im_psql -d im_test -c "CREATE EXTENSION im_sync CASCADE" >/dev/null
q() { im_psql -d im_test -At -c "$1"; }
now_ms() { date +%s%3N; }
# rows written so far on the extension's tables (inserts + updates)
rows_written() {
  q "SELECT pg_catalog.pg_stat_clear_snapshot(); SELECT coalesce(sum(n_tup_ins + n_tup_upd), 0) FROM pg_catalog.pg_stat_user_tables WHERE schemaname = 'im'" | tail -1
}

echo "large_group benchmark: PostgreSQL $(q 'SHOW server_version'), $(nproc) cores, $MEMBERS members, $MSGS messages"
im_bench_durability
echo

declare -A ROWS PER_MSG ONE_BATCH CATCHUP
for mode in fanout shared_log; do
  conv=$(q "SELECT im.create_conversation('group', ARRAY(SELECT g FROM pg_catalog.generate_series(1, $MEMBERS) g)::bigint[], 1)")
  [ "$mode" = shared_log ] && q "SELECT im.set_conversation_mode($conv, '$mode')" >/dev/null
  q "SELECT im.run_fanout()" >/dev/null
  # member 2's device is ACTIVE at the current head (snapshot installed)
  q "SELECT * FROM im.register_device(2, 'bench-$mode')" >/dev/null
  snap=$(q "SELECT snapshot_token || ' ' || manifest_digest FROM im.begin_snapshot(2, 'bench-$mode')")
  q "SELECT status FROM im.ack_snapshot(2, 'bench-$mode', '${snap% *}', '${snap#* }')" >/dev/null
  q "SELECT pg_catalog.pg_stat_force_next_flush()" >/dev/null 2>&1 || true

  # (a) one message per fanout batch
  sleep 1; r0=$(rows_written); t0=$(now_ms)
  for i in $(seq 1 "$MSGS"); do
    q "SELECT msg_seq FROM im.send_message(1, $conv, 'lg-$mode-$i', '{\"text\": \"hello large group\"}'); SELECT im.run_fanout();" >/dev/null
  done
  t1=$(now_ms); sleep 1; r1=$(rows_written)
  ROWS[$mode]=$(awk -v a="$r0" -v b="$r1" -v m="$MSGS" 'BEGIN { printf "%.0f", (b - a) / m }')
  PER_MSG[$mode]=$(awk -v a="$t0" -v b="$t1" -v m="$MSGS" 'BEGIN { printf "%.1f", (b - a) / m }')

  # (b) the same number of messages fanned out as one batch
  for i in $(seq 1 "$MSGS"); do
    q "SELECT msg_seq FROM im.send_message(1, $conv, 'lgb-$mode-$i', '{\"text\": \"hello large group\"}')" >/dev/null
  done
  t0=$(now_ms); q "SELECT im.run_fanout()" >/dev/null; t1=$(now_ms)
  ONE_BATCH[$mode]=$(awk -v a="$t0" -v b="$t1" -v m="$MSGS" 'BEGIN { printf "%.1f", (b - a) / m }')

  # (c) member 2's device catches up on 2 x MSGS messages
  t0=$(now_ms)
  im_psql -d im_test -At -v dev="bench-$mode" -v conv="$conv" -f $D/catch_up.sql >"$IM_TMP/catchup-$mode.out"
  t1=$(now_ms)
  CATCHUP[$mode]=$((t1 - t0))
  got=$(tail -1 "$IM_TMP/catchup-$mode.out")
  echo "  $mode: device caught up on $got message positions"
done

echo
printf "%-44s %12s %12s %8s\n" "5,000-member group, same stream" "fanout" "shared_log" "ratio"
printf "%-44s %12s %12s %8s\n" "rows written per message (1 msg/batch)" "${ROWS[fanout]}" "${ROWS[shared_log]}" \
  "$(awk -v a="${ROWS[shared_log]}" -v b="${ROWS[fanout]}" 'BEGIN { printf "%.3f", a / b }')"
printf "%-44s %12s %12s %8s\n" "send+fanout ms per message (1 msg/batch)" "${PER_MSG[fanout]}" "${PER_MSG[shared_log]}" \
  "$(awk -v a="${PER_MSG[shared_log]}" -v b="${PER_MSG[fanout]}" 'BEGIN { printf "%.3f", a / b }')"
printf "%-44s %12s %12s %8s\n" "fanout ms per message ($MSGS msgs in 1 batch)" "${ONE_BATCH[fanout]}" "${ONE_BATCH[shared_log]}" \
  "$(awk -v a="${ONE_BATCH[shared_log]}" -v b="${ONE_BATCH[fanout]}" 'BEGIN { printf "%.3f", a / b }')"
printf "%-44s %12s %12s %8s\n" "member catch-up ms ($((2 * MSGS)) messages)" "${CATCHUP[fanout]}" "${CATCHUP[shared_log]}" \
  "$(awk -v a="${CATCHUP[shared_log]}" -v b="${CATCHUP[fanout]}" 'BEGIN { printf "%.3f", a / b }')"

# 2. mixed workload, workers on (after part 1's bulk writes settle, so
# autovacuum and checkpoints do not land inside the measured windows)
echo
q "VACUUM ANALYZE" >/dev/null; q "CHECKPOINT" >/dev/null
q "ALTER SYSTEM SET im_sync.fanout_paused = off" >/dev/null; q "SELECT pg_catalog.pg_reload_conf()" >/dev/null
q "SELECT pg_catalog.count(im.direct_conversation(100000 + g, 200000 + g)) FROM pg_catalog.generate_series(1, 500) g" >/dev/null
hot=$(q "SELECT im.create_conversation('group', ARRAY(SELECT g FROM pg_catalog.generate_series(300001, 300000 + $MEMBERS) g)::bigint[], 300001)")
q "SELECT im.set_conversation_mode($hot, 'shared_log')" >/dev/null
sleep 2
lag() {  # percentile of direct-message fanout lag (ms) since outbox id $1
  q "SELECT coalesce(round(1000 * EXTRACT(epoch FROM pg_catalog.percentile_cont($2) WITHIN GROUP (ORDER BY o.processed_at - o.created_at))::numeric, 1), -1)
     FROM im.outbox o JOIN im.conversation c USING (conversation_id)
     WHERE o.outbox_id > $1 AND c.kind = 'direct' AND o.state = 'done'"
}
drain() { for _ in $(seq 1 120); do [ "$(q "SELECT count(*) FROM im.outbox WHERE state = 'pending'")" = 0 ] && return; sleep 1; done; }
declare -A P50 P99
for variant in alone with_hot_group; do
  drain
  start=$(q "SELECT coalesce(max(outbox_id), 0) FROM im.outbox")
  if [ "$variant" = with_hot_group ]; then
    "$PGBIN/pgbench" -n -d im_test -f $D/hot_send.sql -c 2 -j 1 -R 20 -T "$T" -D hot="$hot" >/dev/null 2>&1 &
    hot_pid=$!
  fi
  "$PGBIN/pgbench" -n -d im_test -f $D/direct_send.sql -c 4 -j 2 -R 200 -T "$T" >/dev/null 2>&1
  [ "$variant" = with_hot_group ] && wait "$hot_pid"
  drain
  P50[$variant]=$(lag "$start" 0.5); P99[$variant]=$(lag "$start" 0.99)
done
hot_msgs=$(q "SELECT count(*) FROM im.event WHERE conversation_id = $hot AND kind = 'message'")
printf "%-44s %12s %16s\n" "direct-message fanout lag (ms)" "alone" "with hot group"
printf "%-44s %12s %16s\n" "p50" "${P50[alone]}" "${P50[with_hot_group]}"
printf "%-44s %12s %16s\n" "p99 (goal < 1000 with the hot group)" "${P99[alone]}" "${P99[with_hot_group]}"
echo "(direct: 500 conversations, 4 clients at 200 sends/s; hot group: $MEMBERS members in shared_log, 20 sends/s, $hot_msgs messages)"
