#!/usr/bin/env bash
# Regenerates results/linformer/: linformer against our own exact `full` and the OpenBLAS sgemm
# yardstick, all from one run of one binary (bench_linformer), then the tables of ratios.
# Usage: benchmarks/run_linformer.sh [build-dir] [extra benchmark flags]
#   (default build dir: build; needs bench_linformer built)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
out=results/linformer
mkdir -p "$out"
. benchmarks/context.sh
bench_context "$build" HEAD -- variants/linformer.cpp variants/full.cpp lib/attnlab/kernels.cpp benchmarks/bench_linformer.cpp
context+=(--benchmark_context=openblas_num_threads="${OPENBLAS_NUM_THREADS:-unset}")
"$build/benchmarks/bench_linformer" --benchmark_repetitions=3 --benchmark_min_time=0.3 \
  --benchmark_out="$out/bench_linformer.json" --benchmark_out_format=json "${context[@]}" "$@"
echo "load average after the run: $(cut -d' ' -f1-3 /proc/loadavg)" > "$out/load_after.txt"
/usr/bin/python3 benchmarks/render_linformer.py "$out" > "$out/README.md"
cat "$out/README.md"
