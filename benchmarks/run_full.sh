#!/usr/bin/env bash
# Regenerates results/full/: exact attention (fastest kernel path, D = 64 and 128; the AVX2 path
# beside it) against OpenBLAS sgemm with this environment's OPENBLAS_CORETYPE and with OpenBLAS's
# best kernels for the CPU (child processes), all in one run of one binary with repetitions in
# random interleaved order; then NumPy on the same shapes (same session), the peak memory of one
# N = 32768 call, and the README.
# Usage: benchmarks/run_full.sh [build-dir]   (default: build; needs bench_full and sgemm_probe)
# With OLD_BUILD=<build folder of an earlier commit> it also compares the AVX2 path with that
# build in alternating rounds (benchmarks/ab_avx2.sh; needs bench_sliding and bench_bigbird too).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=results/full
mkdir -p "$out"
. benchmarks/context.sh
bench_context "$build" HEAD -- lib variants benchmarks meson.build
"$build/benchmarks/bench_full" --benchmark_filter='BM_full/|BM_full_d128|BM_full_avx2|BM_sgemm' \
  --benchmark_min_time=0.5 --benchmark_repetitions=3 --benchmark_enable_random_interleaving=true \
  --benchmark_out="$out/bench_full.json" --benchmark_out_format=json "${context[@]}"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" > "$out/load_after.txt"
# Alone in its process, so ru_maxrss is this call's peak.
"$build/benchmarks/bench_full" --benchmark_filter='BM_full_long' \
  --benchmark_out="$out/bench_full_long.json" --benchmark_out_format=json "${context[@]}"
if [[ -n ${OLD_BUILD:-} ]]; then benchmarks/ab_avx2.sh "$OLD_BUILD" "$build"; fi
/usr/bin/python3 benchmarks/numpy_full.py 256 512 1024 2048 4096 8192 > "$out/numpy.json"
# Where the time goes (perf: Debian's linux-perf; skipped without it).
rm -f "$out"/profile-*.txt
if command -v perf > /dev/null; then
  benchmarks/profile.sh "$build" full 4096 64 0 8 > "$out/profile-full.txt"
  benchmarks/profile.sh "$build" full 4096 64 1 8 > "$out/profile-full-causal.txt"
  benchmarks/profile.sh "$build" full 4096 128 0 8 > "$out/profile-full-d128.txt"
fi
/usr/bin/python3 benchmarks/render_full.py "$out" > "$out/README.md"
cat "$out/README.md"
