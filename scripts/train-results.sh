#!/usr/bin/env bash
# results/training's single-seed MQAR tables: every variant's default spec and a few settings
# trained on mqar and mqar-long at the sizes below, then the tables and plots
# (scripts/render-training.py). The tables that rank variants (seeds x rates) are
# scripts/train-table.py's.
# Usage: scripts/train-results.sh [BUILD] [TASK...]   (default: build, every task below)
# Runs two trainings at a time, each on one thread (OMP_NUM_THREADS=1: on 2 shared cores two
# single-threaded runs finish sooner than one two-threaded run after another), each under the
# shared CPU lock (they are not speed benchmarks; each summary.json records the load average).
# Raw runs go to runs/training/TASK/NAME (checkpoints included, git-ignored); the renderer copies
# their logs and summaries into results/training/TASK/raw/. On a 2-core VM mqar-long took 28
# minutes (with `full` resumed to 32000 steps beside it: rerunning a job with a larger --steps
# resumes it).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
only=" ${*:-mqar mqar-long} "
export OMP_NUM_THREADS=1

specs=(full linformer linformer:k=32 sliding sliding:left=16,right=16 bigbird bigbird:block=16
       linear linear:feature=favor linear:feature=dpfp)
# task | options [| specs, when not all of the above]
# mqar-long: recall needs many more steps than the 1000 of mqar (a phase change after a long
# plateau; a PyTorch model of the same shape, scripts/torch-mqar.py, changed near step 10500), so it
# runs at N = 64 with the softmax and linear feature maps that Zoology compares.
tasks=(
  "mqar|--task mqar:pairs=8,vocab=64 --n 256 --steps 1000 --eval-every 100"
  "mqar-long|--task mqar:pairs=4,vocab=64 --n 64 --steps 16000 --eval-every 500 --checkpoint-every 1000|full linear linear:feature=favor linear:feature=dpfp"
)
jobs=()
for t in "${tasks[@]}"; do
  IFS='|' read -r task options task_specs <<<"$t"
  [[ $only == *" $task "* ]] || continue
  read -r -a run_specs <<<"${task_specs:-${specs[*]}}"
  for spec in "${run_specs[@]}"; do
    name=$(echo "$spec" | tr ':=,' '_-_')
    extra=""
    [[ $task == mqar && $spec == full ]] && extra="--profile 5"  # the time split
    jobs+=("$options --spec $spec --out runs/training/$task/$name $extra")
  done
done
echo "load before: $(cat /proc/loadavg)"
printf '%s\n' "${jobs[@]}" |
  xargs -P 2 -I{} sh -c "flock -s ${CPU_LOCK:-/work/.cpu.lock} $build/cli/attnlab train --quiet {} || echo FAILED: {}"
echo "load after: $(cat /proc/loadavg)"
/usr/bin/python3 scripts/render-training.py runs/training results/training
