#!/usr/bin/env bash
# The AVX2 kernel path against an earlier build (before the per-instruction-set kernels, e.g.
# commit 8351d35 configured with meson's defaults, which compiled its kernels with
# -march=native), in alternating rounds so that the shared machine's load hits both alike: each
# round runs, for every case below, the earlier build's benchmark and then this build's with
# ATTNLAB_ISA=avx2. Writes results/full/avx2_vs_before.json (every round's times, the load
# before and after), which render_full.py shows.
# Usage: benchmarks/ab_avx2.sh OLD_BUILD [build-dir] [rounds]
# The earlier benchmarks return a fresh output per call (8 MiB at N = 4096, some hundreds of page
# faults), this build's reuse one: the earlier side carries that small extra cost.
set -euo pipefail
cd "$(dirname "$0")/.."
old=$1
build=${2:-build}
rounds=${3:-5}
out=results/full/avx2_vs_before.json
cases=("full bench_full ^BM_full/N:4096/causal:0/"
       "full-causal bench_full ^BM_full/N:4096/causal:1/"
       "sliding bench_sliding ^BM_sliding/N:4096/"
       "bigbird bench_bigbird ^BM_bigbird/N:4096/")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for ((r = 0; r < rounds; ++r)); do
  for c in "${cases[@]}"; do
    read -r name binary filter <<< "$c"
    "$old/benchmarks/$binary" --benchmark_filter="$filter" --benchmark_min_time=1 \
      --benchmark_out="$tmp/old-$r-$name.json" --benchmark_out_format=json > /dev/null
    ATTNLAB_ISA=avx2 "$build/benchmarks/$binary" --benchmark_filter="$filter" \
      --benchmark_min_time=1 --benchmark_out="$tmp/new-$r-$name.json" \
      --benchmark_out_format=json > /dev/null
  done
done
/usr/bin/python3 - "$tmp" "$out" "$old" "$load_before" "$(cut -d' ' -f1-3 /proc/loadavg)" <<'PY'
import json, sys
from pathlib import Path
tmp, out, old, before, after = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
times = {}
for f in sorted(tmp.glob("*.json")):
    side, _, name = f.stem.split("-", 2)
    b = json.loads(f.read_text())["benchmarks"][0]
    times.setdefault(name, {}).setdefault(side, []).append(b["real_time"])  # ms
json.dump({"old_build": old, "load_before": before, "load_after": after, "N": 4096,
           "unit": "ms", "times": times}, open(out, "w"), indent=1)
PY
cat "$out"
