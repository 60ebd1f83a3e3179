#!/usr/bin/env bash
# 65-fuzz: libFuzzer (ASan+UBSan) over the gateway's frame decoding and
# argument extraction (gateway/frame.c) for a bounded time on a copy of the
# seed corpus.  Longer runs: make fuzz (gateway fuzz-long, FUZZ_SECONDS).
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${IM_FUZZ_SECONDS:-30}
make -s -C gateway fuzz_frame
work=$(mktemp -d "${IM_TMP:-/tmp}/fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
cp gateway/fuzz/seed/* "$work/"
# -error_exitcode makes a crash fail the suite; the corpus copy keeps the
# seed directory clean.
./gateway/fuzz_frame -max_total_time="$secs" -max_len=65536 -error_exitcode=77 \
    -artifact_prefix="$work/" "$work" >"$work/fuzz.log" 2>&1 || {
  echo "fuzzer failed:"; tail -n 40 "$work/fuzz.log"; ls "$work"/crash-* 2>/dev/null; exit 1; }
grep -E '^Done|stat::number_of_executed_units' "$work/fuzz.log" | tail -n 1
