#!/usr/bin/env bash
# The AVX2 kernel path against an earlier build of `full` (before the per-instruction-set kernels,
# e.g. commit 8351d35 built with meson's defaults), in alternating rounds so that the shared
# machine's load hits both alike: each round runs the old bench_full at N = 4096 (plain, then
# causal) and this build's BM_full_avx2 at the same points. Writes results/full/avx2_vs_before.json
# (every round's times, the load before and after) for render_full.py.
# Usage: benchmarks/ab_full_avx2.sh OLD_BENCH_FULL [build-dir] [rounds]
# The old binary returns a fresh output per call (8 MiB, a few hundred page faults), the new one
# reuses its output: the old side carries that small extra cost.
set -euo pipefail
cd "$(dirname "$0")/.."
old=$1
build=${2:-build}
rounds=${3:-5}
out=results/full/avx2_vs_before.json
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for ((r = 0; r < rounds; ++r)); do
  for causal in 0 1; do
    "$old" --benchmark_filter="^BM_full/N:4096/causal:$causal/" --benchmark_min_time=1 \
      --benchmark_out="$tmp/old-$r-$causal.json" --benchmark_out_format=json > /dev/null
    "$build/benchmarks/bench_full" --benchmark_filter="^BM_full_avx2/N:4096/causal:$causal/" \
      --benchmark_min_time=1 --benchmark_out="$tmp/new-$r-$causal.json" \
      --benchmark_out_format=json > /dev/null
  done
done
/usr/bin/python3 - "$tmp" "$out" "$old" "$load_before" "$(cut -d' ' -f1-3 /proc/loadavg)" <<'PY'
import json, sys
from pathlib import Path
tmp, out, old, before, after = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
times = {}
for f in sorted(tmp.glob("*.json")):
    side, _, causal = f.stem.split("-")
    b = json.loads(f.read_text())["benchmarks"][0]
    times.setdefault(f"{side} causal={causal}", []).append(b["real_time"])  # ms
json.dump({"old_binary": old, "load_before": before, "load_after": after, "N": 4096,
           "unit": "ms", "times": times}, open(out, "w"), indent=1)
PY
cat "$out"
