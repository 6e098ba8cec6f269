#!/usr/bin/env bash
# Runs each libFuzzer target (built by `make fuzz-build` into $FUZZ_DIR, default build-fuzz) for
# SECONDS (default 25) on its corpus ($FUZZ_DIR/corpus/<target>, kept between runs, seeded from
# pw/*/fuzz_seeds), and prints executions and crashes per target. Fails if a target crashed; its
# reproducer is left in $FUZZ_DIR/crashes/<target>/ (make it a test).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-25}
dir=${FUZZ_DIR:-build-fuzz}
status=0
total=0
for target in wire_fuzz cluster_spec_fuzz; do
  corpus=$dir/corpus/$target
  crashes=$dir/crashes/$target
  mkdir -p "$corpus" "$crashes"
  seeds=()
  case $target in
    cluster_spec_fuzz) seeds=(pw/cluster/fuzz_seeds) ;;
  esac
  log=$dir/$target.log
  result=ok
  if ! "$dir/bin/$target" -max_total_time="$secs" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$crashes/" "$corpus" "${seeds[@]}" >"$log" 2>&1; then
    result="CRASH (see $log)"
    status=1
  fi
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  total=$((total + execs))
  echo "fuzz: $target: $execs executions in ${secs}s, $(ls "$crashes" | wc -l) crash files, $result" >&2
done
echo "fuzz: $total executions in all" >&2
exit $status
