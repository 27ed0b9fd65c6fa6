#!/usr/bin/python3
"""Issue 17's BLAS target for the models: with OPENBLAS_CORETYPE unset, do the GEMMs of
`attnlab train` and `attnlab model` run at the rate of the best core one can force?

Usage: benchmarks/blas_core_training.py ATTNLAB OUT_DIR [--rounds 3] [--threads 2]

The same binary, `rounds` rounds, in each the cores in turn (unset, SkylakeX, Cooperlake), so that
a shared machine's drift hits them alike:
- train: `ATTNLAB train --spec full` (4 layers, d_model 256, FFN 1024, N 256, batch 32, MQAR)
  `--profile 2`: summary.json's GEMM time of a step (training::measure_split: the projections',
  FFN's and head's GEMMs at the step's shapes, alone) and the core attnlab ran with;
- model: `ATTNLAB model --spec full --n 2048 --layers 2` (issue 17's example), the wall time of the
  process.
Writes OUT_DIR/blas-core.csv (one row per round, core and command) and OUT_DIR/blas-core.json (the
context, the medians and the ratios: the best forced core's median time / unset's, so 1.0 means
unset runs at the best forced rate and the target is >= 0.8).
"""
import argparse
import csv
import json
import os
import pathlib
import statistics
import subprocess
import tempfile
import time

from training_speed import ROOT, loadavg  # the training benchmark's root and load reader

CORES = ["unset", "SkylakeX", "Cooperlake"]
TRAIN = ["train", "--task", "mqar", "--spec", "full", "--n", "256", "--layers", "4",
         "--d-model", "256", "--heads", "4", "--ffn", "1024", "--batch", "32", "--steps", "1",
         "--eval-size", "32", "--eval-every", "1000", "--profile", "2", "--quiet"]
MODEL = ["model", "--spec", "full", "--n", "2048", "--layers", "2"]


def env_for(core, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    env.pop("OPENBLAS_CORETYPE", None)
    if core != "unset":
        env["OPENBLAS_CORETYPE"] = core
    return env


def train_gemm(attnlab, env):
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([attnlab] + TRAIN + ["--out", out], check=True, env=env,
                       stdout=subprocess.DEVNULL)
        summary = json.loads((pathlib.Path(out) / "summary.json").read_text())
    return summary["split"]["gemm_seconds"], summary["blas"]["corename"]


def model_wall(attnlab, env):
    start = time.perf_counter()
    subprocess.run([attnlab] + MODEL, check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("attnlab")
    p.add_argument("out")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    context = {
        "git_commit": subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
                                     capture_output=True, text=True).stdout.strip(),
        "cpu": open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].strip(" :\t"),
        "threads": a.threads, "rounds": a.rounds, "load_before": loadavg(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "train": " ".join(TRAIN), "model": " ".join(MODEL),
    }
    rows = []
    for r in range(a.rounds):
        for core in CORES:
            env = env_for(core, a.threads)
            gemm, used = train_gemm(a.attnlab, env)
            rows.append({"round": r, "coretype": core, "command": "train", "seconds": gemm,
                         "core_used": used, "load": loadavg()[0]})
            wall = model_wall(a.attnlab, env)
            rows.append({"round": r, "coretype": core, "command": "model", "seconds": wall,
                         "core_used": used, "load": loadavg()[0]})
            print(f"round {r} {core} ({used}): train GEMMs {gemm:.3f} s, model {wall:.3f} s",
                  flush=True)
    with open(out / "blas-core.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    medians = {cmd: {core: statistics.median(x["seconds"] for x in rows
                                             if x["command"] == cmd and x["coretype"] == core)
                     for core in CORES} for cmd in ("train", "model")}
    ratios = {cmd: min(m[c] for c in CORES[1:]) / m["unset"] for cmd, m in medians.items()}
    context.update(load_after=loadavg(), median_seconds=medians,
                   best_forced_over_unset=ratios)
    (out / "blas-core.json").write_text(json.dumps(context, indent=2) + "\n")
    print(json.dumps(ratios))


if __name__ == "__main__":
    main()
