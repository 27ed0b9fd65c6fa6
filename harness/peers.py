#!/usr/bin/python3
"""Exact attention peers for `attnlab sweep --peers`: NumPy and PyTorch on the CPU.

Usage: peers.py {numpy|torch} DIR --reps R [--warmup W] [--causal] [--threads T]
                [--max-score-bytes BYTES]  (default 1 GiB: larger problems are "skipped")

Reads DIR/q.npy, DIR/k.npy, DIR/v.npy (float32, [batch, heads, seq, dim], written by the C++
side), computes softmax(q k^T / sqrt(dk)) v in float32 (causal: key j visible to query i when
j <= i, the top-left convention), and writes DIR/out.npy plus DIR/result.json:
  {"status": "ok"|"skipped"|"error", "message": str, "backend": str,
   "times_s": [...], "peak_mem_bytes": int}
A missing numpy or torch is "skipped", never a crash. Peak memory is the growth of the resident
set during the first (warm-up) call: VmHWM is reset through /proc/self/clear_refs first.
"""
import json
import os
import sys
import time


def write_result(directory, result):
    with open(os.path.join(directory, "result.json"), "w") as f:
        json.dump(result, f)


def read_status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def reset_peak():
    """Resets VmHWM to the current RSS; False when the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def numpy_attention(np, causal):
    def run(q, k, v):
        scale = np.float32(1.0 / np.sqrt(q.shape[-1]))
        s = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
        if causal:
            n_q, n_k = s.shape[-2], s.shape[-1]
            s = np.where(np.tril(np.ones((n_q, n_k), dtype=bool)), s, np.float32(-np.inf))
        s -= s.max(axis=-1, keepdims=True)
        np.exp(s, out=s)
        s /= s.sum(axis=-1, keepdims=True)
        return np.matmul(s, v)
    return run


def torch_attention(torch, causal):
    functional = torch.nn.functional
    if hasattr(functional, "scaled_dot_product_attention"):
        def run(q, k, v):
            return functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return run, "scaled_dot_product_attention"

    def run(q, k, v):
        s = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / q.shape[-1] ** 0.5)
        if causal:
            n_q, n_k = s.shape[-2], s.shape[-1]
            keep = torch.ones(n_q, n_k, dtype=torch.bool).tril()
            s = s.masked_fill(~keep, float("-inf"))
        return torch.matmul(torch.softmax(s, dim=-1), v)
    return run, "matmul-softmax"


def main(argv):
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("which", choices=["numpy", "torch"])
    parser.add_argument("dir")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--max-score-bytes", type=int, default=1 << 30)
    args = parser.parse_args(argv)
    result = {"status": "error", "message": "", "backend": args.which, "times_s": [],
              "peak_mem_bytes": 0}
    try:
        import numpy as np
    except ImportError as e:
        result.update(status="skipped", message="numpy not importable: %s" % e)
        write_result(args.dir, result)
        return 0
    q, k, v = (np.load(os.path.join(args.dir, n + ".npy")) for n in ("q", "k", "v"))
    # The dense score matrix and its temporaries take about 3x its size: refuse what would
    # crowd the machine (the C++ side checks the same limit first).
    score_bytes = 4 * q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2]
    if score_bytes > args.max_score_bytes:
        result.update(status="skipped", message="%s: the dense score matrix needs %d MiB, over "
                      "the peers' limit of %d MiB" % (args.which, score_bytes >> 20,
                                                      args.max_score_bytes >> 20))
        write_result(args.dir, result)
        return 0

    if args.which == "numpy":
        run = numpy_attention(np, args.causal)
        result["backend"] = "numpy %s matmul-softmax" % np.__version__
        convert_in, convert_out = (lambda a: a), (lambda a: a)
    else:
        try:
            import torch
        except ImportError as e:
            result.update(status="skipped", message="torch not importable: %s" % e)
            write_result(args.dir, result)
            return 0
        if args.threads > 0:
            torch.set_num_threads(args.threads)
        run, form = torch_attention(torch, args.causal)
        result["backend"] = "torch %s %s" % (torch.__version__, form)
        convert_in = torch.from_numpy
        convert_out = lambda t: t.numpy()
        torch.set_grad_enabled(False)

    q, k, v = convert_in(q), convert_in(k), convert_in(v)
    rss_before = read_status_kib("VmRSS")
    can_reset = reset_peak()
    out = run(q, k, v)
    peak = read_status_kib("VmHWM")
    result["peak_mem_bytes"] = max(0, peak - rss_before) * 1024 if can_reset else 0
    for _ in range(max(0, args.warmup - 1)):
        out = run(q, k, v)
    times = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        out = run(q, k, v)
        times.append(time.perf_counter() - t0)
    np.save(os.path.join(args.dir, "out.npy"), np.ascontiguousarray(convert_out(out), dtype=np.float32))
    result.update(status="ok", times_s=times)
    if not can_reset:
        result["message"] = "peak memory unavailable: /proc/self/clear_refs not writable"
    write_result(args.dir, result)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except MemoryError:
        directory = sys.argv[2] if len(sys.argv) > 2 else "."
        write_result(directory, {"status": "oom", "message": "MemoryError", "times_s": [],
                                 "peak_mem_bytes": 0, "backend": ""})
        sys.exit(0)
