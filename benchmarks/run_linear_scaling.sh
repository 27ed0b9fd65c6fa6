#!/usr/bin/env bash
# The causal delta-rule forwards against N in one process each (forward_loop: one allocation,
# then forwards for SECONDS of CPU time), beside Google Benchmark's figures in
# results/linear-family/README.md: on a VM whose memory is slow to touch, a single long-lived
# allocation is what a training loop sees. With OLD_BUILD (a build of an earlier commit), also
# that build's `linear:rule=delta`, the token-by-token causal delta rule the chunked form
# replaced (161eefd: the last commit before the scan engine), at N = 16384 and D = 64 and 128.
# Usage: benchmarks/run_linear_scaling.sh [build-dir [OLD_BUILD OLD_COMMIT]]
#        (forward_loop built in both; OLD_COMMIT only labels the lines)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
old=${2:-}
old_commit=${3:-unknown}
seconds=${SECONDS_PER_POINT:-4}
out=results/linear-family/scaling.txt
loop() { "$1/benchmarks/forward_loop" "$2" "$3" "$4" 1 "$seconds" 2>/dev/null | tail -1; }
{
  echo "# benchmarks/run_linear_scaling.sh: B = 1, H = 8, causal, g = 0 and beta = 1 (forward_loop's inputs)"
  echo "# commit $(git rev-parse --short HEAD)$(git diff --quiet -- variants benchmarks || echo -dirty); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) x $(nproc); OMP_NUM_THREADS=${OMP_NUM_THREADS:-unset}; OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}; $(date -u +%FT%TZ); load before $(cut -d' ' -f1-3 /proc/loadavg)"
  for spec in delta gated-delta; do
    for n in 4096 16384 65536; do loop "$build" "$spec" "$n" 64; done
  done
  if [[ -n $old ]]; then
    echo "# the token-by-token causal delta rule of $old_commit ($old), then this build's delta"
    for d in 64 128; do
      loop "$old" "linear:rule=delta" 16384 "$d"
      loop "$build" delta 16384 "$d"
    done
  fi
  echo "# load after $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$out"
