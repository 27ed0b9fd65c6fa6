#!/usr/bin/env bash
# Regenerates results/masks/: the softmax engine under each mask and score modifier against dense
# full, and grouped KV heads, from one run of bench_masks (issue 43's speed section); then
# forward + backward against PyTorch given the same dense mask (masks_vs_torch.py); then the page.
# Usage: benchmarks/run_masks.sh [build-dir]   (default: build; needs bench_masks built)
# Every case runs REPETITIONS times (default 6) in random interleaving, at least 2 s of calls per
# repetition, and the page gives medians and their spread. About 18 minutes on 2 quiet cores, from
# the call times of the last quiet run: one pass over the cases takes about 140 s (dense full 14 s
# a call; a cheap case about 3 s, its calls repeated up to the 2 s minimum), the untimed warm
# calls (one per case) about 120 s, the PyTorch comparison about a minute; MoBA at N = 65536 adds
# about 10 s a pass (0.6 TFLOP forward and backward, an estimate from its FLOPs, not yet timed
# quietly).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=results/masks
mkdir -p "$out"
. benchmarks/context.sh
repetitions=${REPETITIONS:-6}
bench_context "$build" HEAD -- lib benchmarks/bench_masks.cpp benchmarks/common.hpp
"$build/benchmarks/bench_masks" --benchmark_filter='^BM_' --benchmark_min_time=2 \
  --benchmark_repetitions="$repetitions" --benchmark_enable_random_interleaving=true \
  --benchmark_out="$out/bench_masks.json" --benchmark_out_format=json "${context[@]}"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" > "$out/load_after.txt"
/usr/bin/python3 benchmarks/masks_vs_torch.py "$build/benchmarks/bench_masks" "$out"
/usr/bin/python3 benchmarks/render_masks.py "$out" > "$out/README.md"
cat "$out/README.md"
