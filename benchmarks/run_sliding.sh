#!/usr/bin/env bash
# Regenerates results/sliding/: sliding-window attention (left = right = 128) against our own full
# attention and OpenBLAS sgemm (one binary, one run), and the peak memory of one N = 65536 call.
# Usage: benchmarks/run_sliding.sh [build-dir]   (default: build; needs bench_sliding built)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=results/sliding
mkdir -p "$out"
. benchmarks/context.sh
bench_context "$build" HEAD -- lib variants benchmarks meson.build
# Repetitions are interleaved at random, so load that comes and goes on this shared machine
# hits every benchmark alike and the ratios stay fair. Values with '=' cannot go through --benchmark_context: a side file the renderer reads.
{
  echo "flags: $(grep -o '"command": "[^"]*variants/sliding.cpp' "$build/compile_commands.json" |
    grep -oE ' -(O[0-3s]|march=[a-z0-9-]+|std=[a-z0-9+]+|fopenmp|DNDEBUG)' | sort -u | tr -d '\n')"
  echo "omp_num_threads: ${OMP_NUM_THREADS:-unset (one thread per core)}"
} > "$out/context.txt"
"$build/benchmarks/bench_sliding" --benchmark_filter='BM_sliding/|BM_sliding_dilated/|BM_full/|BM_sgemm' \
  --benchmark_min_time=0.2 --benchmark_repetitions=5 --benchmark_enable_random_interleaving=true \
  --benchmark_out="$out/bench_sliding.json" --benchmark_out_format=json "${context[@]}"
# Alone in its process, so ru_maxrss is this call's peak.
"$build/benchmarks/bench_sliding" --benchmark_filter='BM_sliding_long' \
  --benchmark_out="$out/bench_sliding_long.json" --benchmark_out_format=json "${context[@]}"
echo "load_after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/context.txt"
# Where the time goes (perf: Debian's linux-perf; skipped without it).
rm -f "$out"/profile-*.txt
if command -v perf > /dev/null; then
  benchmarks/profile.sh "$build" sliding:left=128,right=128 65536 64 0 8 > "$out/profile-sliding.txt"
fi
/usr/bin/python3 benchmarks/render_sliding.py "$out" > "$out/README.md"
cat "$out/README.md"
