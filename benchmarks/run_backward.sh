#!/usr/bin/env bash
# Regenerates results/backward/: full's backward against its forwards (plain and saving the
# log-sum-exp; N = 1024, 4096, 16384, plain and causal), sliding's and bigbird's at N = 4096 and
# 16384, the other variants' default specs at N = 4096 and the sgemm yardsticks, rotated in one
# loop of one binary, 3 repetitions in random interleaved order; then the README.
# Usage: benchmarks/run_backward.sh [build-dir]   (default: build; needs bench_backward and
# sgemm_probe). About 10 minutes on 2 loaded cores.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=results/backward
mkdir -p "$out"
. benchmarks/context.sh
bench_context "$build" HEAD -- lib variants benchmarks meson.build
"$build/benchmarks/bench_backward" --benchmark_min_time=1 --benchmark_repetitions=3 \
  --benchmark_enable_random_interleaving=true \
  --benchmark_out="$out/bench_backward.json" --benchmark_out_format=json "${context[@]}"
echo "$(cut -d' ' -f1-3 /proc/loadavg)" > "$out/load_after.txt"
/usr/bin/python3 benchmarks/render_backward.py "$out" > "$out/README.md"
cat "$out/README.md"
