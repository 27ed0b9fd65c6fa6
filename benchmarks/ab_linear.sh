#!/usr/bin/env bash
# Linear attention and the scan engine's clients against an earlier build (e.g. main before the
# engine carried the key sum and had a chunked backward), in alternating rounds so that the
# shared machine's load hits both alike (the scheme of ab_avx2.sh): each round runs, for every
# case below, the earlier build's benchmark and then this build's, on one thread (OMP_NUM_THREADS=1:
# the CPU time of the calling thread is then the whole cost of a call, which the scheduler of
# a loaded machine does not bend). Writes results/linear/before_after.json (every round's real
# and CPU times and counters, the load before and after), which render_linear.py shows.
# Usage: benchmarks/ab_linear.sh OLD_BUILD [build-dir] [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
old=$1
build=${2:-build}
rounds=${3:-5}
out=results/linear/before_after.json
# name, binary, filter (the same benchmark in both builds)
cases=("linear-4096 bench_linear ^BM_linear/N:4096/causal:0/"
       "linear-causal-4096 bench_linear ^BM_linear/N:4096/causal:1/"
       "linear-causal-16384 bench_linear ^BM_linear/N:16384/causal:1/"
       "linear-fwd-bwd-4096 bench_backward ^BM_variant_backward/linear/N:4096/"
       "gla-fwd-4096 bench_linear_family ^BM_forward/gla/N:4096/"
       "gla-bwd-4096 bench_linear_family ^BM_backward/gla/N:4096/"
       "retnet-bwd-4096 bench_linear_family ^BM_backward/retnet/N:4096/"
       "delta-fwd-4096 bench_linear_family ^BM_forward/delta/N:4096/"
       "delta-bwd-4096 bench_linear_family ^BM_backward/delta/N:4096/")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
new_commit="$(git rev-parse --short HEAD)$(git diff --quiet -- variants benchmarks || echo -dirty)"
cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) x $(nproc)"  # nproc reads OMP_NUM_THREADS
export OMP_NUM_THREADS=1
for ((r = 0; r < rounds; ++r)); do
  for c in "${cases[@]}"; do
    read -r name binary filter <<< "$c"
    for side in old new; do
      dir=$build
      [[ $side == old ]] && dir=$old
      "$dir/benchmarks/$binary" --benchmark_filter="$filter" --benchmark_min_time=0.3 \
        --benchmark_out="$tmp/$side-$r-$name.json" --benchmark_out_format=json > /dev/null
    done
  done
done
/usr/bin/python3 - "$tmp" "$out" "$old" "$(git -C "$old/.." rev-parse --short HEAD 2>/dev/null || echo unknown)" \
  "$new_commit" \
  "$load_before" "$(cut -d' ' -f1-3 /proc/loadavg)" \
  "$cpu" \
  "${OPENBLAS_CORETYPE:-unset}" <<'PY'
import json, sys
from pathlib import Path
tmp, out, old, old_commit, new_commit, before, after, cpu, coretype = sys.argv[1:10]
runs = {}
for f in sorted(Path(tmp).glob("*.json")):
    side, _, name = f.stem.split("-", 2)
    run = json.loads(f.read_text())
    b = run["benchmarks"][0]
    keep = {k: v for k, v in b.items() if isinstance(v, (int, float)) and k not in
            ("family_index", "per_family_instance_index", "repetitions", "repetition_index",
             "threads")}
    keep["time_unit"] = b["time_unit"]
    runs.setdefault(name, {}).setdefault(side, []).append(keep)
json.dump({"old_build": old, "old_commit": old_commit, "new_commit": new_commit,
           "omp_num_threads": 1, "cpu": cpu, "openblas_coretype_env": coretype,
           "load_before": before, "load_after": after, "runs": runs},
          open(out, "w"), indent=1)
PY
