#!/usr/bin/env bash
# Regenerates results/bigbird/: BigBird (defaults) against our own exact `full` and the OpenBLAS
# sgemm yardstick, all from one run of one binary (bench_bigbird), then the N = 65536 call alone in
# its process for its peak memory, then the table of measured ratios.
# Usage: benchmarks/run_bigbird.sh [build-dir]   (default: build; needs bench_bigbird built)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=results/bigbird
mkdir -p "$out"
. benchmarks/context.sh
bench_context "$build" HEAD -- lib variants benchmarks meson.build
# Three repetitions, randomly interleaved so that the shared machine's load drifts hit every
# configuration alike; the renderer takes medians.
"$build/benchmarks/bench_bigbird" --benchmark_filter='BM_bigbird/|BM_full/|BM_sgemm' \
  --benchmark_repetitions=3 --benchmark_min_time=0.3 --benchmark_enable_random_interleaving=true \
  --benchmark_out="$out/bench_bigbird.json" --benchmark_out_format=json "${context[@]}"
# Alone in its process, so ru_maxrss is this call's peak (inputs, keys transposed and output).
"$build/benchmarks/bench_bigbird" --benchmark_filter='BM_bigbird_long' \
  --benchmark_out="$out/bench_bigbird_long.json" --benchmark_out_format=json "${context[@]}"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" > "$out/load_after.txt"
# Where the time goes (perf: Debian's linux-perf; skipped without it).
rm -f "$out"/profile-*.txt
if command -v perf > /dev/null; then
  benchmarks/profile.sh "$build" bigbird 65536 64 0 8 > "$out/profile-bigbird.txt"
fi
/usr/bin/python3 benchmarks/render_bigbird.py "$out" > "$out/README.md"
cat "$out/README.md"
