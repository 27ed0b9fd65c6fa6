#!/bin/bash
# benchmarks/omp_wait_policy.sh ATTNLAB ROUNDS: attnlab train --profile 3 (2 layers, d_model 64, N 256, batch 32) under three
# OpenMP wait settings in turn per round; CSV on stdout.
BIN=$1; echo "round,setting,step_s,attention_s,gemm_s,rest_s,load"
for r in $(seq 0 $(($2-1))); do for s in default passive spincount10000; do
  o=$(mktemp -d); env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 \
    $( [ $s = passive ] && echo OMP_WAIT_POLICY=passive ) $( [ $s = spincount10000 ] && echo GOMP_SPINCOUNT=10000 ) \
    $BIN train --task mqar --spec full --n 256 --batch 32 --steps 1 --eval-size 32 --eval-every 1000 --profile 3 --out $o --quiet >/dev/null
  python3 -c "
import json; s=json.load(open('$o/summary.json'))['split']
print('$r,$s,%.4f,%.4f,%.4f,%.4f,%s'%(s['step_seconds'],s['attention_seconds'],s['gemm_seconds'],s['rest_seconds'],open('/proc/loadavg').read().split()[0]))"
  rm -rf $o; done; done
