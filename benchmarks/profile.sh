#!/usr/bin/env bash
# Where a forward's time goes: perf samples (software clock: this VM exposes no hardware
# counters) of forward_loop running one spec for SECONDS, as a flat profile by symbol.
# Usage: benchmarks/profile.sh BUILD SPEC N D CAUSAL [SECONDS]   (needs perf: Debian linux-perf)
# Prints the load before/after, forward_loop's own line and the symbols above 0.5 % of samples.
set -euo pipefail
cd "$(dirname "$0")/.."
build=$1 spec=$2 n=$3 d=$4 causal=$5 seconds=${6:-10}
data=$(mktemp)
trap 'rm -f "$data"' EXIT
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg); OMP_NUM_THREADS=${OMP_NUM_THREADS:-unset}"
perf record -q -e cpu-clock -F 1999 -o "$data" -- \
  "$build/benchmarks/forward_loop" "$spec" "$n" "$d" "$causal" "$seconds" 2>/dev/null
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
perf report -i "$data" --stdio --no-children --sort symbol --percent-limit 0.5 2>/dev/null |
  grep -E '^ +[0-9.]+%' | sed -E 's/( +-)+ *$//; s/\(anonymous namespace\):://g; s/attnlab::kernels::detail:://; s/attnlab::kernels::simd:://' |
  cut -c1-120
