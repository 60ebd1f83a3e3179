#!/usr/bin/env bash
# make bench: every benchmark, one after another (each starts and stops its
# own throwaway cluster and prints ratios against a floor measured in the
# same run, at production durability; --fsync-off runs the old variant).
# IM_BENCH_ONLY=send_fanout,sync,large_group,gateway,relations,push,client,new_device,failover,shards picks some.
set -uo pipefail
cd "$(dirname "$0")"
rc=0
for b in send_fanout sync_bench large_group gateway_bench relations push client_bench new_device failover shards; do
  if [ -n "${IM_BENCH_ONLY:-}" ] && [[ ",$IM_BENCH_ONLY," != *",${b%_bench},"* && ",$IM_BENCH_ONLY," != *",$b,"* ]]; then
    continue
  fi
  echo "################ $b"
  bash "./$b.sh" "$@" || { echo "benchmark $b failed"; rc=1; }
  echo
done
exit $rc
