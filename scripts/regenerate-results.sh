#!/usr/bin/env bash
# Re-renders or re-measures what is committed under results/. Every folder that
# results/README.md indexes (one with an about.json) names its two commands there:
#   render   its tables and pages from its committed data alone (rows.csv, Google Benchmark
#            JSON, training summaries), re-running nothing; the studies of seeded weights,
#            python/ and training/torch-check write their pages as they run: nothing to render
#   rerun    a fresh measurement (minutes to hours; speed belongs on a quiet machine: check the
#            load it records before committing it)
# Usage:
#   scripts/regenerate-results.sh [build-dir] render [FOLDER...]   every folder (or those), then
#                                 the index results/README.md and the README's headline table
#   scripts/regenerate-results.sh [build-dir] rerun FOLDER...      those folders' rerun commands,
#                                 then render as above (e.g. rerun default full-sweep)
#   scripts/regenerate-results.sh [build-dir] default|full|micro|studies|trained|decode
#                                 the named measurements the rerun commands call (below)
# FOLDER is a path below results/ as the index shows it (training/zoology, archive/full, ...);
# a rerun of an archived folder writes the current folder anew (results/full, not
# results/archive/full) and gives it the archived one's about.json; the archived copy stays
# (delete it by hand once the new run is committed and says what it said).
# Default build dir: build. KEEP=1 resumes an interrupted sweep instead of starting it afresh.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build
case ${1:-} in
  render | rerun | default | full | micro | studies | trained | decode | "") ;;
  *) build=$1; shift ;;
esac
usage() { awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0" >&2; }
[[ $# -gt 0 ]] || { usage; exit 2; }
[ -d "$build" ] || meson setup "$build"
attnlab="$build/cli/attnlab"

sweep() {  # sweep DIR [sweep flags...]: the sweep renders DIR/report.md and DIR/plots/ itself
  local dir=$1
  shift
  # A fresh run keeps only DIR/about.json, which says what the folder is (results-index.py).
  [ "${KEEP:-0}" = 1 ] || find "$dir" -mindepth 1 -maxdepth 1 ! -name about.json -exec rm -rf {} + \
    2>/dev/null || true
  echo "== $dir: load before $(cut -d' ' -f1-3 /proc/loadavg)"
  "$attnlab" sweep --out "$dir" "$@" | tee "$dir.summary"  # the README's excerpt
  mv "$dir.summary" "$dir/summary.txt"
  echo "== $dir: load after $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$dir/load_after.txt"
}

# The decode sweep of issue 44 into results/decode/ (its about.json stays): every variant's
# default (those that cannot decode are unsupported rows), contexts 1K to 1M, B = 1, H = 8 with
# Hkv = 8 and 2, D = 64 and 128, prefill chunked against token by token at N = 256, 1K and 4K,
# the streaming read bandwidth as the yardstick; report.md (with the speed checks), plots/ and
# the summary beside the rows. A KV cache past half of MemAvailable is a skipped row.
decode() {
  local dir=results/decode
  [ "${KEEP:-0}" = 1 ] ||
    rm -rf "$dir/decode.csv" "$dir/meta.json" "$dir/report.md" "$dir/plots" "$dir/summary.txt" \
      "$dir/load_after.txt"
  mkdir -p "$dir"
  echo "== $dir: load before $(cut -d' ' -f1-3 /proc/loadavg)"
  "$attnlab" decode --out "$dir" --variant '*' --contexts 1024..1048576 --batch 1 --heads 8 \
    --kv-heads 8,2 --dims 64,128 --prefill 256,1024,4096 | tee "$dir.summary"
  mv "$dir.summary" "$dir/summary.txt"
  echo "== $dir: load after $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$dir/load_after.txt"
}

studies() {  # the studies of seeded weights into results/studies/NAME
  local name
  for name in spectrum rank-collapse capacity symmetry heads swap; do
    rm -rf "results/studies/$name"
    "$attnlab" study "$name" --out "results/studies/$name"
  done
}

# The trained models of results/studies/trained and prune, and both studies on each: trains the
# text LM with seeds 1-3 and an MQAR model into runs/trained/ (~20 min; a rerun resumes or
# reuses them).
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

# Runs each command that scripts/results-index.py prints for KIND (render|rerun) and FOLDERS.
run_commands() {
  local kind=$1 command
  shift
  while IFS= read -r command; do
    echo "== $command"
    bash -c "$command"
  done < <(/usr/bin/python3 scripts/results-index.py commands "$kind" "$build" "$@")
}

render() {
  ninja -C "$build" cli/attnlab  # the sweeps' reports
  run_commands render "$@"
  /usr/bin/python3 scripts/results-index.py
  /usr/bin/python3 scripts/render-readme.py
}

case $1 in
  render)
    shift
    render "$@"
    ;;
  rerun)
    shift
    [[ $# -gt 0 ]] || { echo "rerun: name the folders (results/README.md lists them)" >&2; exit 2; }
    ninja -C "$build" cli/attnlab benchmarks/bench_variants
    run_commands rerun "$@"
    render
    ;;
  default | full | micro | studies | trained | decode)
    ninja -C "$build" cli/attnlab benchmarks/bench_variants
    case $1 in
      default) sweep results/default --peers ;;
      full) sweep results/full-sweep --config benchmarks/configs/full-sweep.toml ;;
      micro) benchmarks/run_microbench.sh "$build" ;;
      studies) studies ;;
      trained) trained_studies ;;
      decode) decode ;;
    esac
    ;;
  *)
    echo "unknown part '$1' (render|rerun|default|full|micro|studies|trained|decode)" >&2
    usage
    exit 2
    ;;
esac
