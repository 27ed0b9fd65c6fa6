#!/usr/bin/env bash
# Regenerates results/full/: exact attention against OpenBLAS sgemm (one binary, one run), against
# NumPy on the same shapes (same session), and the peak memory of one N = 32768 call.
# Usage: benchmarks/run_full.sh [build-dir]   (default: build; needs bench_full built)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=results/full
mkdir -p "$out"
context=(--benchmark_context=git_commit="$(git rev-parse --short HEAD)$(git diff --quiet || echo -dirty)"
         --benchmark_context=openblas_coretype="${OPENBLAS_CORETYPE:-unset}"
         --benchmark_context=compiler="$(c++ --version | head -1)"
         --benchmark_context=load_before="$(cut -d' ' -f1-3 /proc/loadavg)")
"$build/benchmarks/bench_full" --benchmark_filter='BM_full/|BM_sgemm' --benchmark_min_time=1 \
  --benchmark_out="$out/bench_full.json" --benchmark_out_format=json "${context[@]}"
# Alone in its process, so ru_maxrss is this call's peak.
"$build/benchmarks/bench_full" --benchmark_filter='BM_full_long' \
  --benchmark_out="$out/bench_full_long.json" --benchmark_out_format=json "${context[@]}"
/usr/bin/python3 benchmarks/numpy_full.py 256 512 1024 2048 4096 8192 > "$out/numpy.json"
/usr/bin/python3 benchmarks/render_full.py "$out" > "$out/README.md"
cat "$out/README.md"
