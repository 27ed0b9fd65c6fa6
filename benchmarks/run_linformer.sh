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
flags=$(meson introspect --buildoptions "$build" 2>/dev/null | /usr/bin/python3 -c '
import json, sys
o = {x["name"]: x["value"] for x in json.load(sys.stdin)}
print(" ".join(f"{k}:{o.get(k)}" for k in ["buildtype", "native", "b_ndebug", "b_sanitize"]))' ||
  echo unknown)
dirty=$(git diff --quiet HEAD -- variants/linformer.cpp variants/full.cpp lib/attnlab/kernels.cpp benchmarks/bench_linformer.cpp || echo -dirty)
context=(--benchmark_context=git_commit="$(git rev-parse --short HEAD)$dirty"
         --benchmark_context=openblas_coretype="${OPENBLAS_CORETYPE:-unset}"
         --benchmark_context=omp_num_threads="${OMP_NUM_THREADS:-unset}"
         --benchmark_context=openblas_num_threads="${OPENBLAS_NUM_THREADS:-unset}"
         --benchmark_context=compiler="$(c++ --version | head -1)"
         --benchmark_context=build="$flags"
         --benchmark_context=cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) x $(nproc)"
         --benchmark_context=load_before="$(cut -d' ' -f1-3 /proc/loadavg)")
"$build/benchmarks/bench_linformer" --benchmark_repetitions=3 --benchmark_min_time=0.3 \
  --benchmark_out="$out/bench_linformer.json" --benchmark_out_format=json "${context[@]}" "$@"
echo "load average after the run: $(cut -d' ' -f1-3 /proc/loadavg)" > "$out/load_after.txt"
/usr/bin/python3 benchmarks/render_linformer.py "$out" > "$out/README.md"
cat "$out/README.md"
