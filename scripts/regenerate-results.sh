#!/usr/bin/env bash
# Regenerates the committed reference results, each from a fresh run, with its report and plots
# (a plain `attnlab sweep` or `./dev run` measures into the git-ignored runs/ instead):
#   results/default/     attnlab sweep --peers (the built-in default grid, ~15 min with the peers)
#   results/full-sweep/  benchmarks/configs/full-sweep.toml (N = 256 ... 65536, ~15 min)
#   results/microbench/  benchmarks/bench_variants (Google Benchmark JSON)
#   results/studies/     attnlab study NAME, every study at its documented size (~10 min)
# Usage: scripts/regenerate-results.sh [build-dir] [default|full|micro|studies|report ...]
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

for part in "${parts[@]}"; do
  case $part in
    default) sweep results/default --peers ;;
    full) sweep results/full-sweep --config benchmarks/configs/full-sweep.toml ;;
    micro) benchmarks/run_microbench.sh "$build" ;;
    studies) studies ;;
    report) for d in results/default results/full-sweep; do
              [ -f "$d/rows.csv" ] && "$attnlab" report "$d"; done ;;
    *) echo "unknown part '$part' (default|full|micro|studies|report)" >&2; exit 2 ;;
  esac
done
