#!/usr/bin/python3
"""An independent check of our MQAR runs: the same model trained in PyTorch.

Usage: torch-mqar.py OUT.csv [--n 64] [--pairs 4] [--vocab 64] [--steps 16000] [--lr 3e-3]
                     [--d-model 64] [--heads 4] [--ffn 256] [--batch 32] [--causal]
                     [--eval-every 250] [--no-final-norm] [--seed 1]
Trains exactly the model `attnlab train --task mqar:pairs=P,vocab=V --spec full --n N` trains
with the same options (scripts/torch_twin.py: a 2-layer pre-LN encoder with its final LayerNorm,
no dropout, each layer initialised on its own, every attention call causal with --causal;
--no-final-norm is our `--switches pre-ln,no-final-norm`), AdamW (betas 0.9, 0.98, weight decay
0.01) with a 100-step linear warm-up, on MQAR drawn as training/tasks/mqar.cpp draws it (its own
NumPy generator and seed: the batches and the initial weights differ from ours, the distribution
does not; for the same batches and weights see tests/torch_train.py). Writes step, training loss
and held-out accuracy (512 examples; the head runs on the queries only) every --eval-every steps to OUT.csv.
The defaults are the setting of results/training's first MQAR runs (one seed, git history);
results/training/zoology's cells are
`--vocab 8192 --causal --heads 1 --batch 64 --steps 2000 --eval-every 100` with their n, pairs,
d_model and ffn, written to results/training/zoology/torch/POINT/full/lr-RATE/seed-S.csv, where
`scripts/train-table.py zoology` puts them beside ours. It answers whether what our runs show (a plateau at the chance of guessing among
the context's values, the step at which a run leaves it, the accuracy it ends at) is what this
model does on this task, or something of attnlab's own.
"""
import argparse
import csv

import numpy as np
import torch
from torch import nn

import torch_twin


def mqar_batch(rng, size, n, pairs, vocab):
    """Pairs (key, value) at the start, each key asked once at a power-law gap, noise elsewhere."""
    half, context = vocab // 2, 2 * pairs
    space = (n - context) // 2
    power = np.arange(1, space + 1) ** (0.01 - 1.0)
    power /= power.sum()
    x = np.zeros((size, n), np.int64)
    y = np.full((size, n), -100, np.int64)  # -100: not scored
    for e in range(size):
        keys = rng.choice(np.arange(1, half), pairs, replace=False)
        values = rng.choice(np.arange(half, vocab), pairs, replace=False)
        gaps = rng.choice(space, pairs, replace=False, p=power)
        x[e] = rng.choice(np.setdiff1d(np.arange(vocab), keys), n)  # keys only where placed
        x[e, 0:context:2], x[e, 1:context:2] = keys, values
        x[e, context + 2 * gaps], y[e, context + 2 * gaps] = keys, values
    return torch.from_numpy(x), torch.from_numpy(y)


def query_logits(model, x, y):
    """The logits at the scored (query) positions only: the vocab-wide head on those rows alone,
    as attnlab's scored-rows head computes it (the same loss as scoring every row with -100)."""
    return model.head(model.features(x)[y >= 0])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--pairs", type=int, default=4)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--steps", type=int, default=16000)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=256)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--no-final-norm", action="store_true")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    rng = np.random.default_rng(a.seed)
    for name in ("n", "pairs", "vocab", "steps", "d_model", "heads", "ffn", "batch", "eval_every"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} {getattr(a, name)}: expected at least 1")
    if a.d_model % a.heads:
        p.error(f"--d-model {a.d_model}: expected a multiple of --heads {a.heads}")
    model = torch_twin.TaskModel(a.vocab, a.vocab, d_model=a.d_model, heads=a.heads, ffn=a.ffn,
                                 final_norm=not a.no_final_norm, causal=a.causal)
    opt, warmup = torch_twin.adamw(model, a.lr)
    held_x, held_y = mqar_batch(rng, 512, a.n, a.pairs, a.vocab)
    with open(a.out, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["step", "loss", "accuracy"])
        for step in range(1, a.steps + 1):
            x, y = mqar_batch(rng, a.batch, a.n, a.pairs, a.vocab)
            loss = nn.functional.cross_entropy(query_logits(model, x, y), y[y >= 0])
            opt.zero_grad()
            loss.backward()
            opt.step()
            warmup.step()
            if step % a.eval_every == 0:
                with torch.no_grad():
                    guess = query_logits(model, held_x, held_y).argmax(-1)
                    acc = (guess == held_y[held_y >= 0]).float().mean()
                out.writerow([step, f"{loss.item():.4f}", f"{acc.item():.4f}"])
                f.flush()
                print(f"step {step}/{a.steps}  loss {loss.item():.4f}  held-out {acc.item():.1%}",
                      flush=True)


if __name__ == "__main__":
    main()
