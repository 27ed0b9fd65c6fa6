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
# name, binary, the earlier build's benchmark, this build's (bench_full's BM_full sets the fastest
# path itself, whatever ATTNLAB_ISA says: BM_full_avx2 is its AVX2 row).
cases=("full bench_full ^BM_full/N:4096/causal:0/ ^BM_full_avx2/N:4096/causal:0/"
       "full-causal bench_full ^BM_full/N:4096/causal:1/ ^BM_full_avx2/N:4096/causal:1/"
       "sliding bench_sliding ^BM_sliding/N:4096/ ^BM_sliding/N:4096/"
       "bigbird bench_bigbird ^BM_bigbird/N:4096/ ^BM_bigbird/N:4096/")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for ((r = 0; r < rounds; ++r)); do
  for c in "${cases[@]}"; do
    read -r name binary old_filter new_filter <<< "$c"
    "$old/benchmarks/$binary" --benchmark_filter="$old_filter" --benchmark_min_time=1 \
      --benchmark_out="$tmp/old-$r-$name.json" --benchmark_out_format=json > /dev/null
    ATTNLAB_ISA=avx2 "$build/benchmarks/$binary" --benchmark_filter="$new_filter" \
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
    run = json.loads(f.read_text())
    b = run["benchmarks"][0]
    if side == "new" and (b.get("label", "avx2") != "avx2" or run["context"]["kernels"] != "avx2"):
        sys.exit(f"{f.name}: not the avx2 path ({b.get('label')}, {run['context'].get('kernels')})")
    times.setdefault(name, {}).setdefault(side, []).append(b["real_time"])  # ms
json.dump({"old_build": old, "load_before": before, "load_after": after, "N": 4096,
           "unit": "ms", "times": times}, open(out, "w"), indent=1)
PY
cat "$out"
