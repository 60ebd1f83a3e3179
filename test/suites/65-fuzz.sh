#!/usr/bin/env bash
# 65-fuzz: libFuzzer (ASan+UBSan) for a bounded time (IM_FUZZ_SECONDS in
# all, default 30, split between the targets) on copies of the seed corpus:
#   fuzz_frame      frame decoding and argument extraction (gateway/server/frame.c)
#   fuzz_roundtrip  body round trip: frame -> parameter -> reply splice
#                   (gateway/server/db/json_splice.c) must give back an equal value
# Longer runs: make fuzz (gateway fuzz-long, FUZZ_RUNS executions each).
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=$(( ${IM_FUZZ_SECONDS:-30} / 2 ))
make -s -C gateway fuzz_frame fuzz_roundtrip
work=$(mktemp -d "${IM_TMP:-/tmp}/fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
for t in fuzz_frame fuzz_roundtrip; do
  mkdir -p "$work/$t"
  cp gateway/fuzz/seed/* "$work/$t/"
  [ "$t" = fuzz_roundtrip ] && cp gateway/fuzz/seed_json/* "$work/$t/"
  # -error_exitcode makes a finding fail the suite; the corpus copy keeps
  # the seed directories clean.
  ./gateway/$t -max_total_time="$secs" -dict=gateway/fuzz/json.dict -max_len=65536 -error_exitcode=77 -print_final_stats=1 \
      -artifact_prefix="$work/$t-" "$work/$t" >"$work/$t.log" 2>&1 || {
    echo "$t failed:"; tail -n 40 "$work/$t.log"; ls "$work"/$t-crash-* 2>/dev/null; exit 1; }
  echo "$t: $(grep -h 'stat::number_of_executed_units' "$work/$t.log" | awk '{print $2}') executions"
done
