#!/usr/bin/python3
"""NumPy's exact attention, softmax(q @ k^T / sqrt(d)) @ v, timed on the shapes of bench_full.

Usage: numpy_full.py N [N ...] > numpy.json
Inputs are float32 [1, 8, N, 64]; the softmax is the usual max-subtracted one. Prints JSON with the
median of 3 timed calls after one warm-up, plus numpy's version and BLAS configuration.
"""
import json
import sys
import time

import numpy as np


def attention(q, k, v):
    s = q @ np.swapaxes(k, -1, -2) * np.float32(1.0 / np.sqrt(q.shape[-1]))
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    return s @ v


def main():
    rng = np.random.default_rng(1)
    rows = []
    for n in map(int, sys.argv[1:]):
        q, k, v = (rng.standard_normal((1, 8, n, 64), dtype=np.float32) for _ in range(3))
        attention(q, k, v)
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            attention(q, k, v)
            times.append(time.perf_counter() - t0)
        rows.append({"n": n, "seconds": sorted(times)[1]})
    blas = {}
    try:
        from threadpoolctl import threadpool_info  # optional: which BLAS numpy really runs
        blas = threadpool_info()
    except ImportError:
        pass
    json.dump({"numpy": np.__version__, "blas": blas, "rows": rows}, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
