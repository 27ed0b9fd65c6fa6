#!/usr/bin/python3
"""The longer run of tests/torch_train.py's comparison, for results/training/torch-check/.

Usage: torch-check.py ATTNLAB OUT_DIR [--steps 1000] [--n 64] [--pairs 4] [--vocab 64]
                      [--d-model 64] [--heads 4] [--ffn 256] [--batch 32] [--switches pre-ln]
                      [--causal] [--seed 1]
Builds the PyTorch twin (scripts/torch_twin.py), exports its initial weights, trains
`attnlab train --task mqar:pairs=P,vocab=V --spec full --init ... --dump-batches ...` for STEPS
steps, then the twin with torch.optim.AdamW on the same batches under the run's own Adam
settings, single-threaded both, and the same twin in float64 from the same initial weights: how
far float32 itself drifts, whoever computes it. Writes OUT_DIR/losses.csv (step, attnlab's batch
loss as its train.csv prints it, 6 decimals; torch's float32 and float64 losses; |attnlab -
torch| and |torch float32 - torch float64|), OUT_DIR/losses.png (gnuplot: the curves overlaid,
and both differences on a log scale), OUT_DIR/attnlab-summary.json (the run's config and
context), and prints the largest differences per step range.
"""
import argparse
import copy
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch

import torch_twin

RANGES = [(1, 10), (11, 50), (51, 100), (101, 200), (201, 500), (501, 1000), (1001, 10 ** 9)]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("attnlab")
    p.add_argument("out")
    for name, default in [("steps", 1000), ("n", 64), ("pairs", 4), ("vocab", 64),
                          ("d-model", 64), ("heads", 4), ("ffn", 256), ("batch", 32), ("seed", 1)]:
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--switches", default="pre-ln")
    p.add_argument("--causal", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    switches = a.switches.split(",") if a.switches else []
    model = torch_twin.TaskModel(a.vocab, a.vocab, a.d_model, a.heads, a.ffn, 2,
                                 pre_ln="pre-ln" in switches,
                                 final_norm="no-final-norm" not in switches, causal=a.causal)
    model64 = copy.deepcopy(model).double()
    os.makedirs(a.out, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="attnlab-torch-check-") as work:
        torch_twin.export(model, os.path.join(work, "init"))
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        subprocess.run([a.attnlab, "train", "--task", f"mqar:pairs={a.pairs},vocab={a.vocab}",
                        "--spec", "full", "--n", str(a.n), "--d-model", str(a.d_model), "--heads",
                        str(a.heads), "--ffn", str(a.ffn), "--batch", str(a.batch), "--switches",
                        a.switches, "--seed", str(a.seed), "--steps", str(a.steps),
                        "--eval-every", str(a.steps), "--checkpoint-every", str(a.steps),
                        "--init", os.path.join(work, "init"), "--dump-batches",
                        os.path.join(work, "batches"), "--out", os.path.join(work, "run"),
                        "--quiet"] + (["--causal"] if a.causal else []), check=True, env=env)
        shutil.copy(os.path.join(work, "run", "summary.json"),
                    os.path.join(a.out, "attnlab-summary.json"))
        with open(os.path.join(work, "run", "summary.json")) as f:
            config = dict(line.split(" ", 1) for line in json.load(f)["config"].splitlines())
        ours = np.loadtxt(os.path.join(work, "run", "train.csv"), delimiter=",", skiprows=1)
        adam = (float(config["lr"]), (float(config["beta1"]), float(config["beta2"])),
                float(config["eps"]), float(config["weight_decay"]), int(config["warmup"]))
        runs = [(model, *torch_twin.adamw(model, *adam)), (model64, *torch_twin.adamw(model64, *adam))]
        theirs, theirs64 = [], []
        for step in range(1, a.steps + 1):
            stem = os.path.join(work, "batches", f"step-{step}")
            tokens, targets, lengths = (
                torch.from_numpy(np.load(f"{stem}.{part}.npy").astype(np.int64))
                for part in ("tokens", "targets", "lengths"))
            for (m, opt, schedule), log in zip(runs, (theirs, theirs64)):
                loss = torch_twin.loss_of(m, tokens, targets, lengths)
                opt.zero_grad()
                loss.backward()
                opt.step()
                schedule.step()
                log.append(loss.item())

    csv_path = os.path.join(a.out, "losses.csv")
    with open(csv_path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["step", "attnlab_loss", "torch_loss", "torch64_loss", "attnlab_vs_torch",
                      "torch_vs_torch64"])
        for step, (mine, t32, t64) in enumerate(zip(ours[:, 1], theirs, theirs64), 1):
            out.writerow([step, f"{mine:.6f}", f"{t32:.8f}", f"{t64:.8f}", f"{abs(mine - t32):.3g}",
                          f"{abs(t32 - t64):.3g}"])
    diff = np.abs(ours[:, 1] - np.array(theirs))
    drift = np.abs(np.array(theirs) - np.array(theirs64))
    for lo, hi in RANGES:
        if lo <= a.steps:
            r = slice(lo - 1, min(hi, a.steps))
            print(f"steps {lo}-{min(hi, a.steps)}: max |attnlab - torch| {diff[r].max():.2g}, "
                  f"max |torch float32 - float64| {drift[r].max():.2g}")
    plot = f"""set terminal pngcairo size 900,700
set output '{os.path.join(a.out, "losses.png")}'
set datafile separator ','
set key autotitle columnhead
set multiplot layout 2,1
set ylabel 'batch loss'
plot '{csv_path}' using 1:2 with lines lw 2 title 'attnlab', '' using 1:3 with lines dt 2 lw 2 title 'PyTorch', '' using 1:4 with lines dt 3 lw 1 title 'PyTorch float64'
set logscale y
set xlabel 'step'
set ylabel '|loss difference|'
plot '{csv_path}' using 1:($5 > 0 ? $5 : 1e-9) with lines title 'attnlab - PyTorch', '' using 1:($6 > 0 ? $6 : 1e-9) with lines title 'PyTorch float32 - float64'

unset multiplot
"""
    subprocess.run(["gnuplot"], input=plot, text=True, check=True)


if __name__ == "__main__":
    sys.exit(main())
