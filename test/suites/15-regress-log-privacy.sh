#!/usr/bin/env bash
# Server log privacy: failing calls of every function that
# takes a message body or a token — errors raised by im_sync itself and
# errors raised by SPI inside it (a READ ONLY transaction makes the first
# row lock fail) — must leave no body text and no token in the server log.
# Bodies carry marker strings; tokens are real ones, so the call gets past
# token verification.  A control error outside im_sync must appear in the
# log, which proves the statement logging this test relies on is on.
set -euo pipefail
cd "$(dirname "$0")/../.."
source test/harness/cluster.sh
log="$IM_TMP/server.log"
db=im_log_privacy
im_createdb $db
q() { im_psql -d $db -At "$@"; }
# a failing call: the error is expected, its text goes to our own output only
unexpected=0
fails() {
  if "$PGBIN/psql" -X -q -d $db -v ON_ERROR_STOP=1 -c "$1" >/dev/null 2>"$IM_TMP/log_privacy.err"; then
    echo "expected an error from: $1"; unexpected=1
  fi
}
read_only() { fails "BEGIN READ ONLY; $1; COMMIT"; }

# user 1 with device 'phone': snapshot installed, then a two-page batch
c=$(q -c "SELECT im.create_conversation('group', ARRAY[1, 2]::bigint[], 1)")
q -c "SELECT msg_seq FROM im.send_message(2, $c, 'lp-0', '{\"text\": \"before\"}')" >/dev/null
q -c "SELECT state FROM im.register_device(1, 'phone')" >/dev/null
q -c "SELECT im.run_fanout()" >/dev/null
m=$(q -c "SELECT message_id FROM im.send_message(1, $c, 'lp-1', '{\"text\": \"mine\"}')")
snap=$(q -F ' ' -c "SELECT snapshot_token, manifest_digest FROM im.begin_snapshot(1, 'phone')")
snap_token=${snap% *}; digest=${snap#* }
q -c "SELECT status FROM im.ack_snapshot(1, 'phone', '$snap_token', '$digest')" >/dev/null
q -c "SELECT msg_seq FROM im.send_message(2, $c, 'lp-2', '{\"text\": \"a\"}')" >/dev/null
q -c "SELECT msg_seq FROM im.send_message(2, $c, 'lp-3', '{\"text\": \"b\"}')" >/dev/null
q -c "SELECT im.run_fanout()" >/dev/null
gen=$(q -c "SELECT sync_generation FROM im.device_session(1, 'phone', 0)")
page=$(q -F ' ' -c "SELECT batch_token, next_cursor FROM im.sync_changes(1, 'phone', $gen, $(q -c "SELECT server_acked_sync_seq FROM im.device_session(1, 'phone', 0)"), 1)")
batch_token=${page% *}; cursor=${page#* }
device_token=$(q -c "SELECT im.issue_device_token(1, 'phone')")
for t in "$snap_token" "$batch_token" "$cursor" "$device_token"; do
  [ ${#t} -gt 20 ] || { echo "setup did not produce a token: '$t'"; exit 1; }
done

# send / edit / recall: im_sync's own errors and SPI errors
fails "SELECT * FROM im.send_message(3, $c, 'lp-x1', '{\"text\": \"LOGMARK_BODY_NOT_MEMBER\"}')"
fails "SELECT * FROM im.send_message(1, $c, 'lp-x2', '{\"text\": \"LOGMARK_BODY_NUMBER\", \"n\": 1e19}')"
fails "SELECT * FROM im.send_message(1, $c, 'lp-x3', '{\"text\": \"LOGMARK_BODY_CONTENT_TYPE\"}', '')"
read_only "SELECT * FROM im.send_message(1, $c, 'lp-x4', '{\"text\": \"LOGMARK_BODY_READ_ONLY\"}')"
fails "SELECT * FROM im.edit_message(1, $c, 'lp-x5', 999999, '{\"text\": \"LOGMARK_BODY_EDIT_TARGET\"}')"
read_only "SELECT * FROM im.edit_message(1, $c, 'lp-x6', $m, '{\"text\": \"LOGMARK_BODY_EDIT_READ_ONLY\"}')"
fails "SELECT * FROM im.recall_message(1, $c, 'LOGMARK_RECALL_TARGET', 999999)"
read_only "SELECT * FROM im.recall_message(1, $c, 'LOGMARK_RECALL_READ_ONLY', $m)"
# token-bearing calls
fails "SELECT * FROM im.sync_changes(1, 'tablet', $gen, 0, 10, 'LOGMARK_CURSOR_UNKNOWN_DEVICE')"
fails "SELECT * FROM im.sync_changes(1, 'phone', $gen, 0, 0, '$cursor')"
read_only "SELECT * FROM im.sync_changes(1, 'phone', $gen, 0, 10, '$cursor')"
fails "SELECT * FROM im.ack_sync(1, 'tablet', 'LOGMARK_BATCH_UNKNOWN_DEVICE', 1)"
read_only "SELECT * FROM im.ack_sync(1, 'phone', '$batch_token', 1)"
fails "SELECT * FROM im.fetch_snapshot(1, 'phone', '$snap_token', 99)"
read_only "SELECT * FROM im.fetch_snapshot(1, 'phone', '$snap_token', 0)"
fails "SELECT * FROM im.ack_snapshot(1, 'tablet', 'LOGMARK_SNAPSHOT_UNKNOWN_DEVICE', 'x')"
read_only "SELECT * FROM im.ack_snapshot(1, 'phone', '$snap_token', '$digest')"
fails "SELECT * FROM im.authenticate('LOGMARK_DEVICE_TOKEN_MALFORMED')"
read_only "SELECT * FROM im.authenticate('$device_token')"
# a FATAL while the call runs (pg_terminate_backend of a send waiting for the
# conversation row): reported at once, not after unwinding
"$PGBIN/psql" -X -q -d $db -c "BEGIN; SELECT 1 FROM im.conversation WHERE conversation_id = $c FOR UPDATE; SELECT pg_sleep(30); COMMIT" \
  >/dev/null 2>&1 &
holder=$!
for _ in $(seq 1 100); do
  [ "$(q -c "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(30)%' AND state = 'active' AND pid <> pg_backend_pid()")" = 1 ] && break
  sleep 0.1
done
"$PGBIN/psql" -X -q -d $db -c "SELECT * FROM im.send_message(1, $c, 'lp-x7', '{\"text\": \"LOGMARK_BODY_TERMINATED\"}')" \
  >/dev/null 2>&1 &
sender=$!
for _ in $(seq 1 100); do
  [ "$(q -c "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%lp-x7%' AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()")" = 1 ] && break
  sleep 0.1
done
q -c "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE '%lp-x7%' AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()" \
  | grep -q t || { echo "the send never waited for the conversation lock"; unexpected=1; }
wait $sender || true
q -c "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(30)%' AND pid <> pg_backend_pid()" >/dev/null
wait $holder || true
grep -q "terminating connection due to administrator command" "$log" \
  || { echo "the FATAL of the terminated send is not in the log"; unexpected=1; }

# control: an error outside im_sync logs its statement
fails "SELECT 1 / 0 AS LOGMARK_CONTROL"

grep -q LOGMARK_CONTROL "$log" || { echo "control statement is not in the server log: the test cannot see leaks"; exit 1; }
leaks=0
for marker in LOGMARK_BODY LOGMARK_RECALL LOGMARK_CURSOR LOGMARK_BATCH LOGMARK_SNAPSHOT LOGMARK_DEVICE \
              "$snap_token" "$batch_token" "$cursor" "$device_token"; do
  if grep -n -F -- "$marker" "$log" >"$IM_TMP/log_privacy.hits"; then
    echo "server log holds '${marker:0:32}':"; head -5 "$IM_TMP/log_privacy.hits"; leaks=1
  fi
done
[ $leaks = 0 ] && [ $unexpected = 0 ] && echo "log privacy: no body or token in the server log (22 failing calls)"
[ $leaks = 0 ] && [ $unexpected = 0 ]
