#!/usr/bin/env bash
# Regenerates results/linear-family/: the scan engine's clients forward and backward against the
# OpenBLAS sgemm yardstick, from one run of bench_linear_family, then the table.
# Usage: benchmarks/run_linear_family.sh [build-dir]   (default: build; needs the bench built)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=results/linear-family
mkdir -p "$out"
. benchmarks/context.sh
bench_context "$build" -- variants/linear_scan.cpp variants/linear.cpp \
  benchmarks/bench_linear_family.cpp
# Three repetitions, randomly interleaved so that the shared machine's load drifts hit every
# configuration alike; the renderer takes medians.
"$build/benchmarks/bench_linear_family" --benchmark_repetitions=3 --benchmark_min_time=0.2 \
  --benchmark_enable_random_interleaving=true \
  --benchmark_out="$out/bench_linear_family.json" --benchmark_out_format=json "${context[@]}"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" > "$out/load_after.txt"
/usr/bin/python3 benchmarks/render_linear_family.py "$out" > "$out/README.md"
cat "$out/README.md"
