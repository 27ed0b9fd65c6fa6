#!/usr/bin/python3
"""A training step of attnlab against the same model, optimizer and batch in PyTorch, in one run.

Usage: benchmarks/training_speed.py ATTNLAB OUT_DIR [--rounds 3] [--steps 3] [--threads 2]
                                     [--big-rounds 1] [--big-steps 1]
                                     [--arch llama [--llama L,D,H,KV,FFN,N,B]]

For each model (2 layers d_model 64, 4 heads, FFN 256; 4 layers d_model 256, 4 heads, FFN 1024) at
N = 256 and 1024, batch 32, on MQAR (pairs N/16, vocab 256), `rounds` times in turn (the largest,
4 layers at N = 1024, `big-rounds` times of `big-steps` steps: a minute or more per step here):
- attnlab: `ATTNLAB train --spec full ... --steps 1 --profile STEPS` in a process of its own; its
  summary.json gives the median of STEPS whole steps (forward, loss, backward, Adam) and their
  split into attention, GEMMs and the rest (training::measure_split);
- PyTorch: scripts/torch_twin.py's model, the one torch-mqar.py trains (pre-LN
  nn.TransformerEncoder with its final LayerNorm, a Linear head at every position; AdamW betas
  0.9, 0.98, weight decay 0.01), one warm-up step, then the median of STEPS steps (forward,
  cross-entropy, zero_grad, backward, AdamW).
With --arch llama, the one model of issue 45 instead: a Llama-style model (`attnlab train --arch
llama`: RMSNorm, rotary q and k, SwiGLU, no biases) of 4 layers, d_model 256, 8 query heads and 2
key-value heads, SwiGLU hidden size 768 (Llama's 8/3 d_model rounded up to a multiple of 256), at
N = 1024, batch 16 (--llama gives other sizes, e.g. a tiny one to check the command), `rounds`
rounds; PyTorch's side is scripts/torch_twin.py's LlamaTaskModel
(plain torch, k and v repeated for the grouped heads, the head at every position).
Both run with `threads` threads (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, torch.set_num_threads) on
the OpenBLAS this process's environment gives (PyTorch's libblas is OpenBLAS here; both cores are
recorded), the batch drawn outside the timed part. Writes OUT_DIR/rows.csv (one row per round and
side) and OUT_DIR/context.json; benchmarks/render_training_speed.py renders README.md from them.
"""
import argparse
import csv
import ctypes
import importlib.util
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
from torch import nn

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODELS = [  # (layers, d_model, heads, ffn)
    (2, 64, 4, 256),
    (4, 256, 4, 1024),
]
LENGTHS = [256, 1024]
BATCH, VOCAB = 32, 256
LLAMA = "4,256,8,2,768,1024,16"  # layers, d_model, heads, kv_heads, ffn, N, batch


def torch_mqar():
    sys.path.insert(0, str(ROOT / "scripts"))  # torch-mqar.py imports its neighbour torch_twin
    spec = importlib.util.spec_from_file_location("torch_mqar", ROOT / "scripts" / "torch-mqar.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def loadavg():
    return open("/proc/loadavg").read().split()[:3]


def attnlab_round(attnlab, layers, d, heads, ffn, n, steps, env, batch=BATCH, llama=()):
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([attnlab, "train", "--task", "mqar", "--spec", "full", "--n", str(n),
                        "--layers", str(layers), "--d-model", str(d), "--heads", str(heads),
                        "--ffn", str(ffn), "--batch", str(batch), "--steps", "1",
                        "--eval-size", "32", "--eval-every", "1000", "--profile", str(steps),
                        "--out", out, "--quiet", *llama], check=True, env=env,
                       stdout=subprocess.DEVNULL)
        summary = json.loads((pathlib.Path(out) / "summary.json").read_text())
    s = summary["split"]
    return {"step_s": s["step_seconds"], "attention_s": s["attention_seconds"],
            "gemm_s": s["gemm_seconds"], "rest_s": s["rest_seconds"]}, summary


class TorchStep:
    """scripts/torch_twin.py's model (attnlab's pre-LN encoder with its final LayerNorm and a head
    at every position) and AdamW at one size; step() is one timed step."""

    def __init__(self, mqar, layers, d, heads, ffn, n, batch=BATCH, kv_heads=None):
        torch.manual_seed(1)
        if kv_heads:  # the Llama-style twin
            self.model = mqar.torch_twin.LlamaTaskModel(VOCAB, VOCAB, d_model=d, heads=heads,
                                                        ffn=ffn, layers=layers, kv_heads=kv_heads)
        else:
            self.model = mqar.torch_twin.TaskModel(VOCAB, VOCAB, d_model=d, heads=heads, ffn=ffn,
                                                   layers=layers)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=3e-3, betas=(0.9, 0.98),
                                     weight_decay=0.01)
        self.x, self.y = mqar.mqar_batch(np.random.default_rng(1), batch, n, n // 16, VOCAB)

    def step(self):
        start = time.perf_counter()
        loss = nn.functional.cross_entropy(self.model(self.x).reshape(-1, VOCAB),
                                           self.y.reshape(-1))  # mqar_batch's -100: unscored
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return time.perf_counter() - start


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("attnlab")
    p.add_argument("out")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--big-rounds", type=int, default=1)
    p.add_argument("--big-steps", type=int, default=1)
    p.add_argument("--arch", choices=["transformer", "llama"], default="transformer")
    p.add_argument("--llama", default=LLAMA, help="the Llama model's L,D,H,KV,FFN,N,B")
    a = p.parse_args()
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), OPENBLAS_NUM_THREADS=str(a.threads))
    torch.set_num_threads(a.threads)
    openblas = ctypes.CDLL("libopenblas.so.0")  # the one PyTorch's libblas.so.3 resolves to here
    openblas.openblas_get_corename.restype = ctypes.c_char_p
    openblas.openblas_get_config.restype = ctypes.c_char_p
    # The environment above reaches attnlab's process; this one's OpenBLAS was loaded with torch,
    # before it, and would run PyTorch's GEMMs on as many threads as there are cores.
    openblas.openblas_set_num_threads(a.threads)
    mqar = torch_mqar()
    context = {
        "git_commit": subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
                                     capture_output=True, text=True).stdout.strip(),
        "cpu": platform.processor() or open("/proc/cpuinfo").read().split("model name")[1]
        .split("\n")[0].strip(" :\t"),
        "threads": a.threads, "rounds": a.rounds, "steps": a.steps, "arch": a.arch,
        "big_rounds": a.big_rounds, "big_steps": a.big_steps,
        "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE"),
        "torch": torch.__version__,
        "torch_openblas_core": openblas.openblas_get_corename().decode(),
        "torch_openblas_config": openblas.openblas_get_config().decode(),  # USE_OPENMP or not
        "torch_threads": torch.get_num_threads(),
        "torch_openblas_threads": openblas.openblas_get_num_threads(),
        "load_before": loadavg(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    rows = []
    if a.arch == "llama":
        layers, d, heads, kv_heads, ffn, n, batch = (int(v) for v in a.llama.split(","))
        configs = [(layers, d, heads, kv_heads, ffn, n, batch, a.rounds, a.steps)]
    else:
        configs = []
        for layers, d, heads, ffn in MODELS:
            for n in LENGTHS:
                big = (layers, d, n) == (MODELS[-1][0], MODELS[-1][1], LENGTHS[-1])
                rounds, steps = (a.big_rounds, a.big_steps) if big else (a.rounds, a.steps)
                configs.append((layers, d, heads, heads, ffn, n, BATCH, rounds, steps))
    for layers, d, heads, kv_heads, ffn, n, batch, rounds, steps in configs:
        llama = a.arch == "llama"
        torch_side = TorchStep(mqar, layers, d, heads, ffn, n, batch, kv_heads if llama else None)
        torch_side.step()  # warm-up: allocations, Adam's state
        options = ["--arch", "llama", "--kv-heads", str(kv_heads)] if llama else []
        for r in range(rounds):
            times, summary = attnlab_round(a.attnlab, layers, d, heads, ffn, n, steps, env, batch,
                                           options)
            context["attnlab_blas"] = summary["blas"]
            context["attnlab_kernels"] = summary["kernels"]
            base = {"arch": a.arch, "layers": layers, "d_model": d, "heads": heads,
                    "kv_heads": kv_heads, "ffn": ffn, "n": n, "batch": batch, "round": r,
                    "load": loadavg()[0]}
            rows.append(dict(base, side="attnlab", **times))
            step = float(np.median([torch_side.step() for _ in range(steps)]))
            rows.append(dict(base, side="torch", step_s=step, attention_s="", gemm_s="",
                             rest_s=""))
            print(f"{a.arch} L={layers} d={d} N={n} round {r}: attnlab {times['step_s']:.4f} s, "
                  f"torch {step:.4f} s", flush=True)
            write(out, rows, dict(context, load_after=loadavg()))  # what is done survives


def write(out, rows, context):
    with open(out / "rows.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    (out / "context.json").write_text(json.dumps(context, indent=2) + "\n")


if __name__ == "__main__":
    main()
