#!/usr/bin/env bash
# The softmax engine of one build against another's (e.g. main before an engine change) on
# bench_masks' ab_* cases (the sparse masks at N = 16384, the rest at 4096), in alternating
# rounds so that a shared machine's load hits both alike (the scheme of ab_avx2.sh): each round
# runs both builds' bench_masks, the one going first alternating, on OMP_NUM_THREADS threads
# (default 1: the process's CPU time is then a call's whole cost, which the scheduler of a loaded
# machine does not stretch). Writes OUT (every round's counters of every case per build, the load
# before and after) and prints, per case, the median over rounds of B / A for forward and
# backward CPU ms with the range of that ratio over the rounds.
# Usage: benchmarks/ab_masks.sh BUILD_A BUILD_B OUT [rounds] [filter]
#   filter: a regex over the ab_* names (default: every one), e.g. 'ab_mask/(0|3|5|7|8)/'
set -euo pipefail
cd "$(dirname "$0")/.."
a=$1 b=$2 out=$3
rounds=${4:-5}
filter=${5:-^ab_}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for ((r = 0; r < rounds; ++r)); do
  order=(a b)
  ((r % 2 == 0)) || order=(b a)
  for side in "${order[@]}"; do
    build=$a
    [[ $side == b ]] && build=$b
    "$build/benchmarks/bench_masks" --benchmark_filter="$filter" --benchmark_min_time=0.5 \
      --benchmark_out="$tmp/$side-$r.json" --benchmark_out_format=json > /dev/null
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
/usr/bin/python3 - "$tmp" "$rounds" "$out" "$a" "$b" "$load_before" "$load_after" <<'PY'
import json, os, statistics, sys
tmp, rounds, out, a, b, before, after = sys.argv[1:]
runs = {side: [json.load(open(f"{tmp}/{side}-{r}.json")) for r in range(int(rounds))]
        for side in "ab"}
def rows(run):
    return {x["run_name"]: x for x in run["benchmarks"] if x.get("run_type") == "iteration"}
result = {"a": a, "b": b, "omp_num_threads": os.environ["OMP_NUM_THREADS"],
          "load_before": before, "load_after": after, "rounds": {s: [rows(r) for r in runs[s]]
                                                                  for s in "ab"}}
json.dump(result, open(out, "w"), indent=1)
print(f"B / A, median over {rounds} rounds [min, max] (A = {a}, B = {b}; load {before} -> {after})")
names = list(rows(runs["a"][0]))
for key in ("forward_cpu_ms", "backward_cpu_ms"):
    print(f"\n{key}:")
    for name in names:
        ratios = [rows(rb)[name][key] / rows(ra)[name][key]
                  for ra, rb in zip(runs["a"], runs["b"]) if key in rows(ra)[name]]
        if not ratios:
            continue
        label = rows(runs["a"][0])[name].get("label", "")
        a_ms = statistics.median(rows(r)[name][key] for r in runs["a"])
        print(f"  {name:28s} {label[:40]:40s} A {a_ms:8.1f} ms  B/A {statistics.median(ratios):.3f} "
              f"[{min(ratios):.3f}, {max(ratios):.3f}]")
PY
