#!/usr/bin/env bash
# Regenerates results/microbench/: bench_variants (every registered variant, N = 256 ... 65536,
# full to 8192, with the sgemm yardstick in the same run) as Google Benchmark JSON, with the run's
# context (git commit, compiler, OPENBLAS_CORETYPE, load average before and after).
# Usage: benchmarks/run_microbench.sh [build-dir] [extra google-benchmark flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
out=results/microbench
mkdir -p "$out"
"$build/benchmarks/bench_variants" --benchmark_min_time=0.2 \
  --benchmark_out="$out/bench_variants.json" --benchmark_out_format=json \
  --benchmark_context=git_commit="$(git rev-parse --short HEAD)$(git diff --quiet || echo -dirty)" \
  --benchmark_context=compiler="$(c++ --version | head -1)" \
  --benchmark_context=load_before="$(cut -d' ' -f1-3 /proc/loadavg)" "$@"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$out/load_after.txt"
/usr/bin/python3 benchmarks/render_microbench.py "$out" > "$out/README.md"
