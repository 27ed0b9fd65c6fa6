#!/usr/bin/python3
"""attnlab's masked attention against PyTorch given the equivalent dense mask (issue 43).

Usage: benchmarks/masks_vs_torch.py BENCH_MASKS OUT_DIR [--threads 2] [--rounds 5] [--n 4096]

BENCH_MASKS is the built benchmarks/bench_masks. For 16 documents of N/16 and for a window of
512 on each side, at B 1, H 8, N 4096, D 64: one forward + backward of attnlab (bench_masks'
BM_train, a child process per round) against torch's explicit softmax attention with the same
mask as a dense additive float mask (0 or -inf, as scaled_dot_product_attention takes it) and
autograd, alternating round by round, medians reported. Writes OUT_DIR/masks_vs_torch.json
(every timing and the context: commit, CPU, torch, threads, load before and after, date) and
prints the ratios (torch time / attnlab time).
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = {"16 documents": 4, "window 512": 2}  # bench_masks' mask indices


def dense_mask(name, n):
    """The additive float mask [N, N]: 0 where attnlab's mask lets query i see key j."""
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    if name == "16 documents":
        visible = (i * 16 // n) == (j * 16 // n)
    else:
        visible = (j >= i - 512) & (j <= i + 512)
    return torch.zeros(n, n).masked_fill(~visible, float("-inf"))


def torch_seconds(n, mask):
    q, k, v = (torch.randn(1, 8, n, 64, requires_grad=True) for _ in range(3))
    grad = torch.randn(1, 8, n, 64)
    start = time.perf_counter()
    s = q @ k.transpose(-1, -2) / 8.0 + mask
    (torch.softmax(s, dim=-1) @ v).backward(grad)
    return time.perf_counter() - start


def attnlab_seconds(binary, index, n, threads):
    out = subprocess.run(
        [binary, f"--benchmark_filter=^BM_train/mask:{index}/N:{n}/", "--benchmark_format=json",
         "--benchmark_min_time=0.5"],
        env=dict(os.environ, OMP_NUM_THREADS=str(threads)), capture_output=True, text=True,
        check=True).stdout
    run = json.loads(out)["benchmarks"][0]
    return run["train_ms"] / 1e3


def context(threads):
    def git(*args):
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), platform.processor())
    return {"commit": git("rev-parse", "--short", "HEAD"), "cpu": f"{cpu} x {os.cpu_count()}",
            "torch": torch.__version__, "threads": threads,
            "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", "unset"),
            "load_before": open("/proc/loadavg").read().split()[:3],
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("binary")
    p.add_argument("out")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--n", type=int, default=4096)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    os.makedirs(a.out, exist_ok=True)
    result = {"context": context(a.threads), "n": a.n, "cases": {}}
    for name, index in CASES.items():
        mask = dense_mask(name, a.n)
        times = {"attnlab": [], "torch": []}
        for _ in range(a.rounds):
            times["attnlab"].append(attnlab_seconds(a.binary, index, a.n, a.threads))
            times["torch"].append(torch_seconds(a.n, mask))
        med = {who: statistics.median(t) for who, t in times.items()}
        result["cases"][name] = {"rounds_s": times, "median_s": med,
                                 "torch_over_attnlab": med["torch"] / med["attnlab"]}
        print(f"{name}: attnlab {med['attnlab'] * 1e3:.1f} ms, torch {med['torch'] * 1e3:.1f} ms, "
              f"ratio {med['torch'] / med['attnlab']:.2f}", flush=True)
    result["context"]["load_after"] = open("/proc/loadavg").read().split()[:3]
    with open(os.path.join(a.out, "masks_vs_torch.json"), "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
