#!/usr/bin/env bash
# Regenerates the committed reference results, each from a fresh run, with its report and plots
# (a plain `attnlab sweep` or `./dev run` measures into the git-ignored runs/ instead):
#   results/default/     attnlab sweep --peers (the built-in default grid, ~15 min with the peers)
#   results/full-sweep/  benchmarks/configs/full-sweep.toml (N = 256 ... 65536, ~15 min)
#   results/microbench/  benchmarks/bench_variants (Google Benchmark JSON)
#   results/studies/     attnlab study NAME, every study at its documented size (~10 min)
#   results/studies/trained/, prune/   the studies of trained checkpoints: trains the text LM with
#                        seeds 1-3 and an MQAR model into runs/trained/ (~20 min; a rerun resumes
#                        or reuses them), then runs trained and prune on each (part `trained`, not
#                        a default part)
# Usage: scripts/regenerate-results.sh [build-dir] [default|full|micro|studies|trained|report ...]
#   (default build dir: build; default parts: default full micro studies). `report` only re-renders the
#   reports of the existing rows. Set KEEP=1 to resume a sweep that was interrupted instead of
#   starting it afresh (done points are skipped; see docs/sweep.md).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(default full micro studies)
[ -d "$build" ] || meson setup "$build"
ninja -C "$build" cli/attnlab benchmarks/bench_variants
attnlab="$build/cli/attnlab"

sweep() {  # sweep DIR [sweep flags...]: the sweep renders DIR/report.md and DIR/plots/ itself
  local dir=$1
  shift
  [ "${KEEP:-0}" = 1 ] || rm -rf "$dir"
  echo "== $dir: load before $(cut -d' ' -f1-3 /proc/loadavg)"
  "$attnlab" sweep --out "$dir" "$@"
  echo "== $dir: load after $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$dir/load_after.txt"
}

studies() {  # every study into results/studies/NAME (report.md, rows.csv, meta.json, plots/)
  local name
  for name in spectrum rank-collapse capacity symmetry heads swap; do
    rm -rf "results/studies/$name"
    "$attnlab" study "$name" --out "results/studies/$name"
  done
}

# The trained models of results/studies/trained and prune, and both studies on each.
trained_studies() {
  local seed run name
  export OMP_NUM_THREADS=1
  for seed in 1 2 3; do
    "$attnlab" train --task text --spec full --causal --n 256 --layers 2 --d-model 64 --heads 4 \
      --ffn 256 --batch 8 --warmup 30 --lr 3e-3 --steps 2000 --eval-every 500 \
      --checkpoint-every 500 --seed "$seed" --out "runs/trained/text-s$seed"
  done
  "$attnlab" train --task mqar:pairs=4,vocab=64 --spec full --n 64 --steps 16000 --eval-every 1000 \
    --checkpoint-every 1000 --seed 1 --out runs/trained/mqar-s1
  for run in text-s1 text-s2 text-s3 mqar-s1; do
    for name in trained prune; do
      rm -rf "results/studies/$name/$run"
      "$attnlab" study "$name" --weights "runs/trained/$run/checkpoint" --out "results/studies/$name/$run"
    done
  done
}

for part in "${parts[@]}"; do
  case $part in
    default) sweep results/default --peers ;;
    full) sweep results/full-sweep --config benchmarks/configs/full-sweep.toml ;;
    micro) benchmarks/run_microbench.sh "$build" ;;
    studies) studies ;;
    trained) trained_studies ;;
    report) for d in results/default results/full-sweep; do
              [ -f "$d/rows.csv" ] && "$attnlab" report "$d"; done ;;
    *) echo "unknown part '$part' (default|full|micro|studies|trained|report)" >&2; exit 2 ;;
  esac
done
