#!/usr/bin/python3
"""`attnlab train` follows PyTorch step for step (issue 16): the meson test `torch_train`.

Usage: torch_train.py ATTNLAB  (works in a temporary folder)

For the pre-LN encoder (with its final LayerNorm), the post-LN encoder, the causal decoder
(pre-LN, train --causal), the causal decoder with the short convolution (short-conv) and the
encoder with the head norm (head-norm) on MQAR, and the causal decoder on ListOps (key padding and mean
pooling), at a tiny size (N 16, d_model 16, 2 heads, 2 layers, batch 4): builds the PyTorch twin
(scripts/torch_twin.py: independent layer inits), exports its initial weights, trains
`attnlab train --init` on them for 1 step and keeps that checkpoint, then trains a fresh run of
STEPS steps writing every batch (--dump-batches), then trains the twin with torch.optim.AdamW on
those batches with the hyper-parameters the run reports (summary.json), and requires
  - every parameter after step 1 equal to torch's to 1e-6 (while step 1 moved some by >= 1e-4),
    except the key biases b_K (the middle third of in_proj_bias): softmax is invariant to them
    (q·b_K is the same for every key of a row), so their true gradient is 0 and both sides
    compute rounding noise of about 1e-9, which Adam's first step, m / (sqrt(v) + eps), turns
    into steps of up to lr_1 in either direction (measured: 3e-5 apart, every other tensor within
    1.5e-8). They are only required to be within two such steps (they cannot change a loss).
  - the batch loss of each of the STEPS steps equal to torch's to 2e-6 (train.csv prints 6
    decimals, so 5e-7 of that is rounding; the two float32 computations sum in other orders),
  - the loss falling (the runs learn something that could have been followed wrongly).
For the Llama-style model (`train --arch llama`, scripts/torch_twin.py's LlamaTaskModel in plain
torch: RMSNorm, rotary embeddings with rotate_half, SwiGLU, no biases) with full, a causal window
(sliding, head tied to the embedding) and gated-delta (with its learned gates, the short
convolution and the head norm) as the core, and with grouped heads (full with 4 query heads over
2 key and value heads, the causal window and gated-delta with the short convolution and the head
norm over 1: attnlab hands the core k and v with fewer heads, the twin repeats them as Hugging
Face's repeat_kv does), on MQAR, LLAMA_STEPS steps from the same weights and batches at lr 1e-3, it
requires every step's loss and every parameter after step 1 and after the
last step within 1e-5 relative of torch's (a parameter relative to its tensor's largest entry:
entries near 0 have no relative precision of their own). Training amplifies float32 rounding:
where torch's own float32 run ends further than half that from the same run in float64 (the
gated-delta case's gate projections: 4e-5), the last step's parameters may differ from torch's
by twice torch's own distance from float64. (At the default lr 3e-3 this amplification is chaos:
gated-delta's losses part after about 80 steps, torch float32's from torch float64's as much as
attnlab's, and parameters part by 5e-4.)
Exits 0 when all hold, 1 naming the first failure, 77 (meson's skip) when torch is absent.
"""
import copy
import json
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
except ImportError as e:
    print(f"torch_train.py: skipped, cannot import {e.name}: {e}", file=sys.stderr)
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import torch_twin  # noqa: E402

STEPS = 50
N, D_MODEL, HEADS, FFN, LAYERS, BATCH = 16, 16, 2, 32, 2, 4
LOSS_TOLERANCE, PARAMETER_TOLERANCE, MOVED = 2e-6, 1e-6, 1e-4
MQAR = ("mqar:pairs=3,vocab=32", 32, 32, True)  # (task, vocab, classes, per token): 12 targets
LISTOPS = ("listops:max_len=16,min_len=4", 16, 10, False)  # padded, one target per sequence
CASES = {  # name: (switches, causal, task)
    "pre-ln": ("pre-ln", False, MQAR),
    "post-ln": ("", False, MQAR),
    "causal": ("pre-ln", True, MQAR),
    "causal-listops": ("pre-ln", True, LISTOPS),
    "causal-short-conv": ("pre-ln,short-conv", True, MQAR),
    "head-norm": ("pre-ln,head-norm", False, MQAR),
}


def fail(case, what):
    print(f"torch_train.py: {case}: {what}", file=sys.stderr)
    sys.exit(1)


def train(attnlab, folder, switches, causal, task, steps):
    cmd = [attnlab, "train", "--task", task, "--spec", "full",
           "--n", str(N), "--layers", str(LAYERS), "--d-model", str(D_MODEL), "--heads",
           str(HEADS), "--ffn", str(FFN), "--batch", str(BATCH), "--switches", switches,
           "--warmup", "10", "--steps", str(steps), "--eval-size", "4", "--init",
           os.path.join(folder, "init"), "--dump-batches", os.path.join(folder, "batches"),
           "--out", os.path.join(folder, "run"), "--quiet"] + (["--causal"] if causal else [])
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        fail(folder, f"attnlab train exited {done.returncode}: {done.stderr.strip()}")


def adam_of(summary):
    """The run's own hyper-parameters, from the config lines it reports."""
    config = dict(line.split(" ", 1) for line in summary["config"].splitlines())
    return dict(lr=float(config["lr"]), betas=(float(config["beta1"]), float(config["beta2"])),
                eps=float(config["eps"]), weight_decay=float(config["weight_decay"]),
                warmup=int(config["warmup"]))


def batch(folder, step):
    stem = os.path.join(folder, "batches", f"step-{step}")
    load = lambda part: torch.from_numpy(np.load(f"{stem}.{part}.npy").astype(np.int64))  # noqa
    return load("tokens"), load("targets"), load("lengths")


def check(attnlab, work, case, switches, causal, task):
    folder = os.path.join(work, case)
    torch.manual_seed(len(case))
    spec, vocab, classes, per_token = task
    model = torch_twin.TaskModel(vocab, classes, D_MODEL, HEADS, FFN, LAYERS,
                                 pre_ln="pre-ln" in switches, causal=causal, per_token=per_token,
                                 short_conv="short-conv" in switches,
                                 head_norm="head-norm" in switches)
    torch_twin.export(model, os.path.join(folder, "init"))
    initial = {k: t.clone() for k, t in model.state_dict().items()}

    train(attnlab, folder, switches, causal, spec, 1)
    os.rename(os.path.join(folder, "run", "checkpoint"), os.path.join(folder, "step-1"))
    os.remove(os.path.join(folder, "run", "train.csv"))  # a fresh run of STEPS steps, not a resume
    train(attnlab, folder, switches, causal, spec, STEPS)
    with open(os.path.join(folder, "run", "summary.json")) as f:
        adam = adam_of(json.load(f))
    opt, schedule = torch_twin.adamw(model, **adam)
    first_lr = adam["lr"] / max(1, adam["warmup"])
    ours = np.loadtxt(os.path.join(folder, "run", "train.csv"), delimiter=",", skiprows=1)

    losses = []
    for step in range(1, STEPS + 1):
        loss = torch_twin.loss_of(model, *batch(folder, step))
        opt.zero_grad()
        loss.backward()
        opt.step()
        schedule.step()
        losses.append(loss.item())
        if step == 1:
            moved = 0.0
            for key, t in model.state_dict().items():
                theirs = np.load(os.path.join(folder, "step-1", key + ".npy"))
                diff = np.abs(theirs - t.numpy()).max()
                if key.endswith("self_attn.in_proj_bias"):  # b_K: see the module's comment
                    key_bias = slice(D_MODEL, 2 * D_MODEL)
                    diff_k = np.abs(theirs[key_bias] - t.numpy()[key_bias]).max()
                    if diff_k > 2 * first_lr:
                        fail(case, f"{key}'s b_K after step 1 differs by {diff_k:.3g}, more than "
                                   f"two steps of Adam ({first_lr:.3g} each)")
                    theirs[key_bias] = t.numpy()[key_bias]
                    diff = np.abs(theirs - t.numpy()).max()
                if diff > PARAMETER_TOLERANCE:
                    fail(case, f"{key} after step 1 differs from torch's by {diff:.3g}")
                moved = max(moved, float((t - initial[key]).abs().max()))
            if moved < MOVED:
                fail(case, f"step 1 moved no parameter by {MOVED} (at most {moved:.3g})")
    diff = np.abs(ours[:, 1] - np.array(losses))
    if len(ours) != STEPS or diff.max() > LOSS_TOLERANCE:
        worst = int(diff.argmax())
        fail(case, f"loss of step {worst + 1}: attnlab {ours[worst, 1]:.6f}, torch "
                   f"{losses[worst]:.8f} ({len(ours)} steps logged)")
    if not losses[-1] < losses[0] - 0.1:
        fail(case, f"the loss did not fall ({losses[0]:.4f} -> {losses[-1]:.4f})")
    print(f"{case}: {STEPS} losses within {diff.max():.2g} of torch's "
          f"({losses[0]:.4f} -> {losses[-1]:.4f}); parameters after step 1 within "
          f"{PARAMETER_TOLERANCE}")


LLAMA_STEPS, LLAMA_TOLERANCE, LLAMA_DRIFT, LLAMA_LR = 200, 1e-5, 2.0, 1e-3
LLAMA_CASES = {  # name: (spec, switches, tied embeddings, heads, kv_heads)
    "llama-full": ("full", "pre-ln", False, HEADS, HEADS),
    "llama-sliding-tied": ("sliding:left=5,right=0", "pre-ln", True, HEADS, HEADS),
    "llama-gated-delta": ("gated-delta", "pre-ln,short-conv,head-norm", False, HEADS, HEADS),
    # Grouped heads: attnlab hands the core k and v with kv_heads heads, the twin repeats them.
    "llama-full-gqa": ("full", "pre-ln", False, 4, 2),
    "llama-sliding-mqa": ("sliding:left=5,right=0", "pre-ln,short-conv,head-norm", False, 2, 1),
    "llama-gated-delta-mqa": ("gated-delta", "pre-ln,short-conv,head-norm", False, 2, 1),
}


def llama_train(attnlab, folder, case, spec, switches, tied, heads, kv_heads, steps, out, dump):
    cmd = [attnlab, "train", "--arch", "llama", "--task", MQAR[0], "--spec", spec, "--n", str(N),
           "--layers", str(LAYERS), "--d-model", str(D_MODEL), "--heads", str(heads), "--ffn",
           str(FFN), "--batch", str(BATCH), "--switches", switches, "--warmup", "10", "--steps",
           str(steps), "--eval-size", "4", "--eval-every", str(steps), "--init",
           os.path.join(folder, "init"), "--out", os.path.join(folder, out), "--quiet"]
    cmd += ["--tied-embeddings"] if tied else []
    cmd += ["--kv-heads", str(kv_heads)] if kv_heads != heads else []
    cmd += ["--lr", str(LLAMA_LR)]
    cmd += ["--dump-batches", os.path.join(folder, "batches")] if dump else []
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        fail(case, f"attnlab train exited {done.returncode}: {done.stderr.strip()}")


def largest_distance(model, tied, folder=None, reference=None):
    """The largest distance of one of `model`'s tensors from the same tensor of the checkpoint in
    `folder`, or of the model `reference`, relative to `model`'s tensor's largest entry; and the
    tensor's name."""
    worst, name = 0.0, ""
    other = reference.state_dict() if reference is not None else None
    for key, t in model.state_dict().items():
        if tied and key == "lm_head.weight":  # the embedding itself
            continue
        mine = t.double().numpy()
        theirs = other[key].double().numpy() if other is not None else \
            np.load(os.path.join(folder, key + ".npy"))
        d = float(np.abs(theirs - mine).max() / np.abs(mine).max())
        if d > worst:
            worst, name = d, key
    return worst, name


def train_twin(model, folder, adam, steps, on_step=None):
    """Trains `model` on the run's dumped batches with its Adam; returns the losses."""
    opt, schedule = torch_twin.adamw(model, **adam)
    losses = []
    for step in range(1, steps + 1):
        loss = torch_twin.loss_of(model, *batch(folder, step))
        opt.zero_grad()
        loss.backward()
        opt.step()
        schedule.step()
        losses.append(loss.item())
        if on_step:
            on_step(step)
    return np.array(losses)


def check_llama(attnlab, work, case, spec, switches, tied, heads, kv_heads):
    folder = os.path.join(work, case)
    torch.manual_seed(len(case))
    _, vocab, classes, _ = MQAR
    model = torch_twin.LlamaTaskModel(vocab, classes, D_MODEL, heads, FFN, LAYERS, spec=spec,
                                      kv_heads=kv_heads, tied=tied,
                                      short_conv="short-conv" in switches,
                                      head_norm="head-norm" in switches)
    torch_twin.export(model, os.path.join(folder, "init"))
    reference = copy.deepcopy(model).double()  # the same weights, for a float64 run if needed
    run = (attnlab, folder, case, spec, switches, tied, heads, kv_heads)
    llama_train(*run, 1, "step-1", False)
    llama_train(*run, LLAMA_STEPS, "run", True)
    with open(os.path.join(folder, "run", "summary.json")) as f:
        adam = adam_of(json.load(f))
    ours = np.loadtxt(os.path.join(folder, "run", "train.csv"), delimiter=",", skiprows=1)

    first = []

    def after_step(step):
        if step == 1:
            diff, key = largest_distance(model, tied, os.path.join(folder, "step-1", "checkpoint"))
            if diff > LLAMA_TOLERANCE:
                fail(case, f"{key} after step 1 differs from torch's by {diff:.3g} of its largest "
                           f"entry")
            first.append(diff)

    losses = train_twin(model, folder, adam, LLAMA_STEPS, after_step)
    relative = np.abs(ours[:, 1] - losses) / np.abs(losses)
    if len(ours) != LLAMA_STEPS or relative.max() > LLAMA_TOLERANCE:
        worst = int(relative.argmax())
        fail(case, f"loss of step {worst + 1}: attnlab {ours[worst, 1]:.6f}, torch "
                   f"{losses[worst]:.8f} ({len(ours)} steps logged)")
    if not losses[-1] < losses[0] - 0.1:
        fail(case, f"the loss did not fall ({losses[0]:.4f} -> {losses[-1]:.4f})")
    final = os.path.join(folder, "run", "checkpoint")
    to_torch, key = largest_distance(model, tied, final)
    drift = ""
    if to_torch > LLAMA_TOLERANCE:
        # Float32 rounding, amplified by 200 steps of training, moves torch's own run this far
        # from the same run in float64: attnlab may differ from torch's by twice that.
        train_twin(reference, folder, adam, LLAMA_STEPS)
        torch_drift, _ = largest_distance(model, tied, reference=reference)
        drift = f" (torch float32's own distance from float64: {torch_drift:.2g})"
        if to_torch > LLAMA_DRIFT * torch_drift:
            fail(case, f"{key} after {LLAMA_STEPS} steps differs from torch's by {to_torch:.3g} "
                       f"of its largest entry: more than {LLAMA_TOLERANCE}, and more than "
                       f"{LLAMA_DRIFT}x{drift}")
    print(f"{case}: {LLAMA_STEPS} losses within {relative.max():.2g} relative of torch's "
          f"({losses[0]:.4f} -> {losses[-1]:.4f}); parameters within {first[0]:.2g} after step 1 "
          f"and {to_torch:.2g} after step {LLAMA_STEPS}{drift}")


def main(attnlab):
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="attnlab-torch-train-") as work:
        for case, (switches, causal, task) in CASES.items():
            check(attnlab, work, case, switches, causal, task)
        for case, (spec, switches, tied, heads, kv_heads) in LLAMA_CASES.items():
            check_llama(attnlab, work, case, spec, switches, tied, heads, kv_heads)


if __name__ == "__main__":
    main(sys.argv[1])
