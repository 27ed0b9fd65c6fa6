#!/usr/bin/env bash
# Regenerates results/linear/: linear attention against our own exact `full` and the OpenBLAS
# sgemm yardstick, all from one run of one binary (bench_linear), then the table and ratios.
# Usage: benchmarks/run_linear.sh [build-dir]   (default: build; needs bench_linear built)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=results/linear
mkdir -p "$out"
. benchmarks/context.sh
bench_context "$build" -- variants/linear.cpp variants/feature_maps.cpp benchmarks/bench_linear.cpp
# Seven repetitions, randomly interleaved across benchmarks so that the shared machine's load
# drifts hit every configuration alike; the renderer takes medians.
"$build/benchmarks/bench_linear" --benchmark_repetitions=7 --benchmark_min_time=0.5 \
  --benchmark_enable_random_interleaving=true \
  --benchmark_out="$out/bench_linear.json" --benchmark_out_format=json "${context[@]}"
# The same binary on one thread: CPU time is then the whole cost of a call, so the share of the
# loaded machine that the scheduler takes away drops out of the ratio.
OMP_NUM_THREADS=1 "$build/benchmarks/bench_linear" --benchmark_filter='BM_full/N:4096|BM_linear/N:4096/' \
  --benchmark_repetitions=5 --benchmark_min_time=0.5 --benchmark_enable_random_interleaving=true \
  --benchmark_out="$out/bench_linear_1thread.json" --benchmark_out_format=json "${context[@]}"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" > "$out/load_after.txt"
/usr/bin/python3 benchmarks/render_linear.py "$out" > "$out/README.md"
cat "$out/README.md"
