#!/usr/bin/python3
"""One table of trained variants on the protocol of issue 16: seeds x a learning-rate sweep.

Usage: train-table.py TABLE [--build build] [--runs runs/tables] [--out results/training]
                      [--jobs 2] [--variants V,...] [--render-only]
Every cell is a variant (a factory spec, pre-LN; "SPEC+SWITCH+..." adds model switches, e.g.
"gated-delta+short-conv") trained with each of the table's learning rates and seeds (one
`attnlab train` run each, single-threaded, --jobs at a time: one per core), at each point of the
table's grid when it has one (Zoology's sequence lengths and widths). A variant's rate is the one
with the best mean held-out score over its seeds (the lowest loss, or the highest accuracy where
the table selects by accuracy, as Zoology does); its cell is the mean +/- the sample standard
deviation over the seeds at that rate, with the rate and the time per step beside it.
The rate is chosen on the same held-out set the cell reports (there is no third split), so the
cell is the best of len(rates) on it: a small optimistic bias, the same for every variant.

Resumable: a run whose summary.json reports the table's steps is skipped; any other is started
again with the same command, which continues from its checkpoint (attnlab train resumes). Runs go
to RUNS/TABLE[/POINT]/VARIANT/lr-RATE/seed-S (git-ignored); the rendering goes to
OUT/TABLE/README.md (and, for a grid, OUT/TABLE/accuracy.png: the score against the width, one
line per variant, one panel per sequence length). Every finished run's summary.json and eval.csv
are copied to OUT/TABLE/raw/, the committed record the table is rendered from: runs recorded
there by another checkout or machine stay in the table (delete one there by hand to drop it).
A run that has not finished is shown as not run, never estimated. Each run is niced and takes
the shared CPU lock (flock -s $CPU_LOCK, default /work/.cpu.lock, when the file exists).
"""
import argparse
import csv
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# The encoder of the ListOps and copy tables (attnlab train's default model) and one variant of
# each family LRA's ListOps column compares (softmax, a window, Linformer's projection, a linear
# kernel), with the gated delta rule.
SMALL_ENCODER = ["--layers", "2", "--d-model", "64", "--heads", "4", "--ffn", "256", "--batch", "32"]
FAMILIES = ["full", "linear", "sliding:left=16,right=16", "linformer:k=32", "gated-delta"]

# The Zoology MQAR protocol's options and its grid points (N, d_model), shared by the zoology
# table and issue 46's; the Llama-style KJV model at N = 256, shared by text-llama and issue 46's.
ZOOLOGY_OPTIONS = ["--causal", "--layers", "2", "--heads", "1", "--batch", "64", "--warmup", "100",
                   "--eval-size", "512", "--eval-every", "100", "--checkpoint-every", "250"]


def mqar_grid(ns, ds):
    return [{"name": f"n{n}-d{d}", "n": n, "pairs": n // 16, "d_model": d,
             "options": ["--task", f"mqar:pairs={n // 16},vocab=8192", "--n", str(n),
                         "--d-model", str(d), "--ffn", str(4 * d)]}
            for n in ns for d in ds]


LLAMA_TEXT = ["--task", "text", "--arch", "llama", "--kv-heads", "2", "--n", "256", "--layers",
              "2", "--d-model", "64", "--heads", "4", "--ffn", "256", "--batch", "8", "--warmup",
              "30", "--eval-size", "64", "--eval-every", "100", "--checkpoint-every", "50"]

# Issue 46's variants, in both of its tables.
KDA = "kda+short-conv+head-norm+channel-gate"
GLA = "gla+short-conv+head-norm+channel-gate"
DELTA_PRODUCT = "delta-product:steps=2+short-conv+head-norm"
MOBA = "moba:block=32,topk=3"
BASED = "linear:feature=taylor,taylor_dim=16;sliding:left=63,right=0+short-conv"
FRONTIER = [KDA, GLA, DELTA_PRODUCT, MOBA, BASED]

# TABLE: what it trains and its options (every run of a table has the same ones but the spec,
# the rate and the seed). Sized for a shared 2-core machine: hours, not days.
TABLES = {
    "text": {
        "title": "Byte-level language model of the King James Bible (task `text`), validation "
                 "bits per byte",
        "options": ["--task", "text", "--causal", "--n", "256", "--layers", "2", "--d-model", "64",
                    "--heads", "4", "--ffn", "256", "--batch", "8", "--warmup", "30",
                    "--eval-size", "64", "--eval-every", "100", "--checkpoint-every", "50"],
        "steps": 300,
        "variants": ["full", "linear", "sliding:left=32,right=0", "gated-delta"],
        "rates": [1e-4, 1e-3, 3e-3, 1e-2],
        "seeds": [1, 2, 3],
        "metric": "bits",
    },
    # The same model and bytes per step (2 x 1024 = 8 x 256) at N = 1024; 1e-4 is left out of
    # the sweep (at N = 256 it was 0.9 bits behind every variant's best after 300 steps).
    "text-1024": {
        "title": "Byte-level language model of the King James Bible (task `text`) at N = 1024, "
                 "validation bits per byte",
        "options": ["--task", "text", "--causal", "--n", "1024", "--layers", "2", "--d-model",
                    "64", "--heads", "4", "--ffn", "256", "--batch", "2", "--warmup", "30",
                    "--eval-size", "16", "--eval-every", "100", "--checkpoint-every", "50"],
        "steps": 300,
        "variants": ["full", "linear", "sliding:left=32,right=0", "gated-delta"],
        "rates": [1e-3, 3e-3, 1e-2],
        "seeds": [1, 2, 3],
        "metric": "bits",
    },
    # The same two text tables with the Llama-style block (`--arch llama`: RMSNorm, rotary q and
    # k, SwiGLU, no biases) and 2 key-value heads for the 4 query heads, beside the 2017
    # block's rows (issue 45): at the two rates that were the 2017 rows' best.
    "text-llama": {
        "title": "Byte-level language model of the King James Bible (task `text`), Llama-style "
                 "block (2 KV heads), validation bits per byte",
        "options": LLAMA_TEXT,
        "steps": 300,
        "variants": ["full", "sliding:left=32,right=0", "linear",
                     "gated-delta+short-conv+head-norm"],
        "rates": [3e-3, 1e-2],
        "seeds": [1, 2, 3],
        "metric": "bits",
        "beside": "text",
    },
    "text-1024-llama": {
        "title": "Byte-level language model of the King James Bible (task `text`) at N = 1024, "
                 "Llama-style block (2 KV heads), validation bits per byte",
        "options": ["--task", "text", "--arch", "llama", "--kv-heads", "2", "--n", "1024",
                    "--layers", "2", "--d-model", "64", "--heads", "4", "--ffn", "256",
                    "--batch", "2", "--warmup", "30", "--eval-size", "16", "--eval-every", "100",
                    "--checkpoint-every", "50"],
        "steps": 300,
        "variants": ["full", "sliding:left=32,right=0", "linear",
                     "gated-delta+short-conv+head-norm"],
        "rates": [3e-3, 1e-2],
        "seeds": [1, 2, 3],
        "metric": "bits",
        "beside": "text-1024",
    },
    # LRA's ListOps (Tay et al. 2021) at N = 256: 10-way classification of a nested expression by
    # the encoder (no causal mask). LRA trains to convergence on sequences up to 2000; 1000 steps
    # of 32 examples here.
    "listops": {
        "title": "ListOps (LRA's generator, N = 256): held-out accuracy",
        "options": ["--task", "listops", "--n", "256", *SMALL_ENCODER, "--warmup", "100",
                    "--eval-size", "512", "--eval-every", "100", "--checkpoint-every", "250"],
        "steps": 1000,
        "variants": FAMILIES,
        "rates": [1e-3, 3e-3],
        "seeds": [1, 2, 3],
        "metric": "accuracy",
        "select": "accuracy",
    },
    # A table of reach: copy 31 symbols, each read 32 positions back (N = 64). A window of 16
    # keys a side cannot see that far in one layer; two layers reach exactly 32, through a
    # token between.
    "copy": {
        "title": "Copy (N = 64, each symbol read 32 positions back): held-out accuracy",
        "options": ["--task", "copy", "--n", "64", *SMALL_ENCODER, "--warmup", "10",
                    "--eval-size", "512", "--eval-every", "25", "--checkpoint-every", "100"],
        "steps": 300,
        "variants": FAMILIES,
        "rates": [3e-3, 6e-3],
        "seeds": [1, 2, 3],
        "metric": "accuracy",
        "select": "accuracy",
    },
    # Zoology's Figure 2 (Arora et al. 2023): MQAR with vocabulary 8192, (N, pairs) = (64, 4),
    # (128, 8) and (256, 16), a 2-layer causal model with one head (and an MLP of 4 d_model,
    # which Zoology's blocks lack), accuracy against the width (Zoology: 64 to 512; 32 is ours).
    # Zoology trains 64 epochs of 100k examples at 4 rates in [1e-4, 1e-2]; on 2 cores we train
    # 2000 steps of 64 fresh examples at 3e-3, at 1e-3 (better at d_model 128), and at 1e-2 where
    # 3e-3 beat 1e-3 at the small widths (results/training/zoology/notes.md says what that can
    # and cannot show). The runs go panel by panel (every seed of N = 64 first).
    "zoology": {
        "title": "Zoology's MQAR (vocabulary 8192): held-out accuracy against model width",
        "options": ZOOLOGY_OPTIONS,
        "grid": mqar_grid((64, 128, 256), (32, 64, 128)),
        "steps": 2000,
        # sliding: a causal window of 16 keys, so a 2-layer model sees 32 tokens back at most;
        # +short-conv, +head-norm: the linear family with the short convolution its papers use,
        # and the delta rule with Gated DeltaNet's output norm as well; DPFP (nu = 1): linear
        # attention with a state twice elu+1's at the same width (Schlag et al. 2021)
        "variants": ["full", "linear", "gated-delta", "sliding:left=16,right=0",
                     "linear+short-conv", "gated-delta+short-conv",
                     "gated-delta+short-conv+head-norm", "linear:feature=dpfp"],
        "rates": [1e-3, 3e-3, 1e-2],
        "seeds": [1, 2, 3],
        "metric": "accuracy",
        "select": "accuracy",
    },
    # Issue 46's accuracy cells: the frontier of the linear family and block-sparse softmax in
    # the Zoology protocol, at N = 128 and 256, d_model 64 and 128 (the zoology grid's points of
    # the same names and options), beside the zoology table's rows. Each in the layer its paper
    # uses (docs/models.md): KDA and GLA with their per-channel gates (channel-gate), the short
    # convolution and the head norm; DeltaProduct (n_h = 2) in Gated DeltaNet's layer; MoBA with
    # the paper's top-3 over blocks of 32 (4 blocks at N = 128, 8 at N = 256); Based's layers
    # alternating Taylor-map linear attention (d' = 16) and a causal window of 64 keys, with the
    # short convolution that stands in for its BaseConv layers. Two rates: 1e-3 and 3e-3 were
    # the best of the zoology grid's delta-rule rows with the head norm at these points.
    "frontier-zoology": {
        "title": "Zoology's MQAR (vocabulary 8192), issue 46's variants: held-out accuracy "
                 "against model width",
        "options": ZOOLOGY_OPTIONS,
        "grid": mqar_grid((128, 256), (64, 128)),
        "steps": 2000,
        "variants": FRONTIER,
        "rates": [1e-3, 3e-3],
        "seeds": [1, 2, 3],
        "metric": "accuracy",
        "select": "accuracy",
        "beside": "zoology",
        # the row there each variant stands beside: its nearest relative in that table
        "beside_rows": {KDA: "gated-delta+short-conv+head-norm", GLA: "linear+short-conv",
                        DELTA_PRODUCT: "gated-delta+short-conv+head-norm", MOBA: "full",
                        BASED: "linear+short-conv"},
    },
    # The same variants on the KJV language model of text-llama (its options, its two rates),
    # beside that table's rows.
    "frontier-text": {
        "title": "Byte-level language model of the King James Bible (task `text`), Llama-style "
                 "block (2 KV heads), issue 46's variants: validation bits per byte",
        "options": LLAMA_TEXT,
        "steps": 300,
        "variants": FRONTIER,
        "rates": [3e-3, 1e-2],
        "seeds": [1, 2, 3],
        "metric": "bits",
        "beside": "text-llama",
        "beside_rows": {KDA: "gated-delta+short-conv+head-norm", GLA: "linear",
                        DELTA_PRODUCT: "gated-delta+short-conv+head-norm", MOBA: "full",
                        BASED: "linear"},
    },
}


def grid(t):
    """The table's points: each with a name ("" for a table without a grid) and its options."""
    return t.get("grid", [{"name": "", "options": []}])


def cell_path(point, variant, rate, seed):
    """One run's folder below a table's runs, raw/ or torch/."""
    return Path(point["name"]) / variant.replace(":", "_").replace("=", "-").replace(",", "_") \
        .replace(";", "_then_") / \
        f"lr-{rate:g}" / f"seed-{seed}"


def run_dir(runs, table, point, variant, rate, seed):
    return runs / table / cell_path(point, variant, rate, seed)


def finished(folder, steps):
    summary = folder / "summary.json"
    if not summary.exists():
        return None
    s = json.loads(summary.read_text())
    return s if s["steps"] >= steps else None


def train(build, t, point, variant, rate, seed, folder):
    if finished(folder, t["steps"]):
        return "skipped"
    folder.mkdir(parents=True, exist_ok=True)
    spec, *switches = variant.split("+")  # "SPEC+switch+...": pre-LN plus those switches
    command = [str(build / "cli" / "attnlab"), "train", "--quiet", *t["options"],
               *point["options"], "--switches", ",".join(["pre-ln", *switches]),
               "--spec", spec, "--lr", f"{rate:g}", "--seed", str(seed),
               "--steps", str(t["steps"]), "--out", str(folder)]
    lock = os.environ.get("CPU_LOCK", "/work/.cpu.lock")
    if Path(lock).exists():
        command = ["flock", "-s", lock, *command]
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    with open(folder / "log.txt", "a") as log:
        done = subprocess.run(["nice", *command], env=env, stdout=log, stderr=subprocess.STDOUT)
    return "done" if done.returncode == 0 else f"FAILED ({done.returncode}, {folder}/log.txt)"


def cell(t, runs, table, point, variant, raw):
    """The variant's cell at one grid point: (row cells, (mean, sd) or None), from the runs
    recorded in raw/. A run that finished in RUNS is copied there first (its summary.json and
    eval.csv); a recorded run that RUNS lacks (a fresh checkout) is kept, never dropped."""
    metric, by_accuracy = t["metric"], t.get("select") == "accuracy"
    by_rate = {}
    for rate in t["rates"]:
        done = []
        for seed in t["seeds"]:
            d = run_dir(runs, table, point, variant, rate, seed)
            kept = raw / cell_path(point, variant, rate, seed)
            if finished(d, t["steps"]):
                kept.mkdir(parents=True, exist_ok=True)
                for f in ["summary.json", "eval.csv"]:
                    shutil.copy(d / f, kept / f)
            s = finished(kept, t["steps"])
            if s:
                done.append(s)
        by_rate[rate] = done
    # Candidates: the rates with the most seeds finished (every seed, once the table is done).
    most = max(len(v) for v in by_rate.values())
    full = {r: v for r, v in by_rate.items() if most and len(v) == most}
    sweep = ", ".join(
        f"{r:g}: " + (f"{statistics.mean(s['eval'][metric] for s in v):.3f} ({len(v)})"
                      if v else "not run") for r, v in by_rate.items())
    if not full:
        return [f"`{variant}`", "not run", "not run", "-", "-", sweep, "-"], None

    def score(r):  # the selection score: lower is better
        if by_accuracy:
            return -statistics.mean(s["eval"]["accuracy"] for s in full[r])
        return statistics.mean(s["eval"]["loss"] for s in full[r])
    rate = min(full, key=score)
    values = [s["eval"][metric] for s in full[rate]]
    mean = statistics.mean(values)
    spread = statistics.stdev(values) if len(values) > 1 else math.nan
    per_step = statistics.mean(s["seconds_per_step"] for s in full[rate])
    loads = f"{min(s['loadavg_before'] for s in full[rate]):.1f}-" \
            f"{max(s['loadavg_after'] for s in full[rate]):.1f}"
    seeds = str(len(values)) + ("" if len(values) == len(t["seeds"]) else f" of {len(t['seeds'])}")
    return [f"`{variant}`", f"{rate:g}", f"{mean:.3f}" + ("" if math.isnan(spread) else f" +/- {spread:.3f}"), seeds,
            f"{per_step:.3f}", sweep, loads], (mean, spread)


def plot_grid(folder, t, means):
    """accuracy.png: the metric against d_model, one line per variant, one panel per N that has
    a finished cell."""
    lengths = sorted({p["n"] for p in t["grid"] for v in t["variants"] if (p["name"], v) in means})
    for i, variant in enumerate(t["variants"]):
        with open(folder / f"variant-{i}.dat", "w") as f:
            for n in lengths:
                f.write(f"# N = {n}\n")
                for p in t["grid"]:
                    if p["n"] == n and (p["name"], variant) in means:
                        mean, sd = means[(p["name"], variant)]
                        f.write(f"{p['d_model']} {mean} {0 if math.isnan(sd) else sd}\n")
                f.write("\n\n")
    widths = sorted({p["d_model"] for p in t["grid"]})
    script = [f"set terminal pngcairo noenhanced size {420 * len(lengths)},520",
              "set output 'accuracy.png'", f"set multiplot layout 1,{len(lengths)}",
              "set logscale x 2", f"set xrange [{widths[0] / 1.3}:{widths[-1] * 1.3}]",
              f"set xtics ({', '.join(str(w) for w in widths)})", "set yrange [0:1.05]",
              "set xlabel 'd_model'", f"set ylabel 'held-out {t['metric']}'", "set grid",
              # one key for every panel, under them all, where it hides no line
              "set bmargin 10", "set key at screen 0.5, 0.02 center bottom vertical maxrows 3"]
    for index, n in enumerate(lengths):
        pairs = next(p["pairs"] for p in t["grid"] if p["n"] == n)
        script.append(f"set title 'N = {n}, {pairs} pairs'")
        script.append("plot " + ", ".join(
            f"'variant-{i}.dat' index {index} using 1:2:3 with yerrorlines title '{v}'"
            for i, v in enumerate(t["variants"])))
        script.append("unset key")
    script.append("unset multiplot")
    (folder / "accuracy.gp").write_text("\n".join(script) + "\n")
    if shutil.which("gnuplot"):
        subprocess.run(["gnuplot", "accuracy.gp"], cwd=folder, check=True)


def passes_half(rows):
    """The first evaluated step at which held-out accuracy reached 0.5 ("-" if none did)."""
    return next((int(r["step"]) for r in rows if float(r["accuracy"]) >= 0.5), "-")


def beside(t, means, runs, out):
    """Lines setting each variant's cell (means: (point, variant) -> (mean, sd)) beside a row of
    the table t["beside"] names, read from that table's raw/ as its own page reads it, at the
    point of the same name (a grid's) or its only one. The row there is t["beside_rows"]'s for
    the variant, else its bare spec's: a spec with switches stands beside its spec without them
    (gated-delta+short-conv+head-norm beside gated-delta, which the 2017 table ran without)."""
    if "beside" not in t:
        return []
    name, other = t["beside"], TABLES[t["beside"]]
    rows = t.get("beside_rows", {})
    has_grid = "grid" in t
    there_points = {p["name"]: p for p in grid(other)}
    title = f"Beside [`{name}`](../{name}/README.md)" if rows else \
        f"Beside the 2017 block ([`{name}`](../{name}/README.md))"
    which = f"the row of `{name}` named beside it, its nearest relative there" if rows else \
        f"`{name}`'s row of the same spec without switches"
    lines = ["", f"## {title}", "",
             f"Each cell above beside {which} (that table's protocol: its rates, its best one"
             + ("; at the point of the same name" if has_grid else "") +
             f"). {t['metric'].capitalize()}: mean +/- sd over the seeds.", "",
             ("| point " if has_grid else "") +
             f"| variant here | {t['metric']} here | row there | {t['metric']} there | "
             "here - there |", ("|---" if has_grid else "") + "|---|---|---|---|---|"]
    show = lambda c: "not run" if c is None else \
        f"{c[0]:.3f}" + ("" if math.isnan(c[1]) else f" +/- {c[1]:.3f}")
    for point in grid(t):
        there_point = there_points.get(point["name"], grid(other)[0])
        for variant in t["variants"]:
            row = rows.get(variant, variant.split("+")[0])
            there = cell(other, runs, name, there_point, row, out / name / "raw")[1] \
                if row in other["variants"] else None
            here = means.get((point["name"], variant))
            diff = f"{here[0] - there[0]:+.3f}" if here and there else "-"
            lines.append("| " + (f"`{point['name']}` | " if has_grid else "") +
                         f"`{variant}` | {show(here)} | `{row}` | {show(there)} | {diff} |")
    return lines


def torch_twin(folder, t, raw):
    """Lines comparing PyTorch's runs of the same cells (scripts/torch-mqar.py, written to
    TABLE/torch/POINT/VARIANT/lr-RATE/seed-S.csv) with ours at the same rate."""
    rows = []

    def summary(values, steps):
        if not values:
            return "not run", "-"
        spread = f" +/- {statistics.stdev(values):.3f}" if len(values) > 1 else ""
        return f"{statistics.mean(values):.3f}{spread} ({len(values)})", ", ".join(map(str, steps))

    for point in grid(t):
        for variant in t["variants"]:
            for rate in t["rates"]:
                theirs, their_steps, ours, our_steps = [], [], [], []
                for seed in t["seeds"]:
                    path = (folder / "torch" / cell_path(point, variant, rate, seed)).with_suffix(".csv")
                    if path.exists():
                        log = list(csv.DictReader(path.open()))
                        if log and int(log[-1]["step"]) >= t["steps"]:
                            theirs.append(float(log[-1]["accuracy"]))
                            their_steps.append(passes_half(log))
                    kept = raw / cell_path(point, variant, rate, seed)
                    s = finished(kept, t["steps"])
                    if s:
                        ours.append(s["eval"]["accuracy"])
                        our_steps.append(passes_half(csv.DictReader((kept / "eval.csv").open())))
                if theirs:
                    rows.append(f"| `{point['name']}` | `{variant}` | {rate:g} | "
                                + " | ".join(summary(ours, our_steps) + summary(theirs, their_steps))
                                + " |")
    if not rows:
        return []
    return ["", "## PyTorch beside ours", "",
            "The same cells trained by `scripts/torch-mqar.py` (PyTorch's nn.TransformerEncoder "
            "built as our model, `scripts/torch_twin.py`; its own seeds, initial weights and "
            "batches from the same task distribution), at the same rate, steps and held-out "
            "size: the final held-out accuracy, mean +/- sd (seeds), and the step at which each "
            "seed's held-out accuracy first reached 0.5.", "",
            "| point | variant | rate | ours | ours: step at 0.5 | PyTorch | PyTorch: step at 0.5 |",
            "|---|---|---|---|---|---|---|", *rows]


def render(table, t, runs, out):
    """OUT/TABLE/README.md from every finished run recorded in OUT/TABLE/raw/."""
    folder = out / table
    raw = folder / "raw"
    selection = ("highest mean held-out accuracy" if t.get("select") == "accuracy"
                 else "lowest mean held-out loss")
    has_grid = "grid" in t
    lines = [f"# {t['title']}", "",
             f"Rendered by `scripts/train-table.py {table}` from the runs that finished; each "
             "cell is mean +/- sample standard deviation over the seeds at the variant's best "
             f"rate ({selection} over the seeds; only the rates with the most seeds finished are "
             "candidates). A cell with fewer seeds than the protocol's says so in its seeds "
             "column: one seed is an anecdote, not a mean.", "",
             f"Protocol: {t['steps']} steps, options `{' '.join(t['options'])}`, rates "
             f"{', '.join(f'{r:g}' for r in t['rates'])}, seeds "
             f"{', '.join(map(str, t['seeds']))}; one thread per run, two runs at a time.", ""]
    if has_grid:
        lines += ["Grid points (options added to the protocol's): " + "; ".join(
            f"`{p['name']}`: `{' '.join(p['options'])}`" for p in t["grid"]), "",
            "![accuracy against width](accuracy.png)", ""]
    lines += [("| point " if has_grid else "") +
              f"| variant | best rate | {t['metric']} (mean +/- sd) | seeds | s/step (mean) | "
              "every rate: mean (seeds finished) | load (1-min avg, before/after) |",
              ("|---" if has_grid else "") + "|---|---|---|---|---|---|---|"]
    means, not_run, best = {}, {}, {}
    for point in grid(t):
        for variant in t["variants"]:
            cells, summary = cell(t, runs, table, point, variant, raw)
            if summary:
                means[(point["name"], variant)] = summary
                best[(point["name"], variant)] = f"{cells[2]} ({cells[1]})"
            elif has_grid:  # a grid's unrun cells are listed below it, not as rows
                not_run.setdefault(point["name"], []).append(f"`{variant}`")
                continue
            lines.append("| " + " | ".join(([f"`{point['name']}`"] if has_grid else []) + cells)
                         + " |")
    if not_run:
        lines += ["", "Not run (no seed finished): " + "; ".join(
            f"`{name}`: {', '.join(variants)}" for name, variants in not_run.items()) + "."]
    if has_grid and best:  # the same cells as a grid, variants down and points across
        points = [p["name"] for p in t["grid"] if any((p["name"], v) in best for v in t["variants"])]
        lines += ["", "The grid: each variant's cell at each point, as above (best rate in brackets).",
                  "", "| variant | " + " | ".join(f"`{p}`" for p in points) + " |",
                  "|---" * (len(points) + 1) + "|"]
        lines += [f"| `{v}` | " + " | ".join(best.get((p, v), "not run") for p in points) + " |"
                  for v in t["variants"]]
    folder.mkdir(parents=True, exist_ok=True)
    if has_grid and means:
        plot_grid(folder, t, means)
    context = next(iter(sorted(raw.rglob("summary.json"))), None) if raw.exists() else None
    if context:
        s = json.loads(context.read_text())
        keep = {k: v for k, v in s.items() if k in ("git_commit", "git_dirty", "cpu_model", "blas",
                                                      "OPENBLAS_CORETYPE", "kernels", "threads",
                                                      "compiler", "build_type", "date")}
        lines += ["", "Context of the first run (every run's summary.json is in raw/): `" +
                  json.dumps(keep) + "`"]
    lines += torch_twin(folder, t, raw)
    lines += beside(t, means, runs, out)
    if (folder / "notes.md").exists():  # linked, not copied: each sentence lives in one file
        lines += ["", "## Findings", "", "Written by hand, citing the tables above: "
                  "[notes.md](notes.md)."]
    (folder / "README.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {folder / 'README.md'}")


def split_specs(text):
    """Comma-separated variant specs; a spec's own commas (sliding:left=16,right=0) stay in it."""
    specs = []
    for piece in text.split(","):
        if specs and not re.match(r"[a-z][a-z0-9+-]*(:|$)", piece):
            specs[-1] += "," + piece
        else:
            specs.append(piece)
    return specs


def choose(given, known, what, table, parse=str, show=str):
    """The entries of `known` that `given` names (all when it names none); exits on unknown ones."""
    if not given:
        return known
    chosen, unknown = [], []
    for text in given:
        try:
            value = parse(text)
        except ValueError:
            value = None
        if value in known:
            chosen.append(value)
        else:
            unknown.append(text)
    if unknown:
        sys.exit(f"train-table.py: {', '.join(unknown)}: not a {what} of table {table} "
                 f"({', '.join(show(k) for k in known)})")
    return chosen


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("table", choices=sorted(TABLES))
    ap.add_argument("--build", default="build", type=Path)
    ap.add_argument("--runs", default="runs/tables", type=Path)
    ap.add_argument("--out", default="results/training", type=Path)
    ap.add_argument("--jobs", default=2, type=int)
    ap.add_argument("--variants", help="train only these of the table's variants (comma "
                    "separated), e.g. one added later, beside a driver running the others")
    ap.add_argument("--points", help="train only at these of a grid's points (comma separated, "
                    "e.g. n128-d128): a grid larger than one session's time is run a part at a "
                    "time")
    ap.add_argument("--rates", help="train only at these of the table's learning rates (comma "
                    "separated, e.g. 0.001): a cell's second rate where its first left it on a "
                    "plateau")
    ap.add_argument("--seeds", help="train only these of the table's seeds (comma separated): "
                    "two drivers side by side, one with a cell's first seeds, one with its last")
    ap.add_argument("--render-only", action="store_true")
    a = ap.parse_args()
    t = TABLES[a.table]
    rates = choose(a.rates and a.rates.split(","), t["rates"], "rate", a.table, float,
                   lambda r: f"{r:g}")
    chosen = choose(a.variants and split_specs(a.variants), t["variants"], "variant", a.table)
    seeds = choose(a.seeds and a.seeds.split(","), t["seeds"], "seed", a.table, int)
    points = grid(t)
    names = choose(a.points and a.points.split(","), [p["name"] for p in points], "point",
                   a.table)
    points = [p for p in points if p["name"] in names]
    if not a.render_only:
        # sequence length by sequence length (a grid's panels), seed-major within one: the
        # first seed of every cell of a panel finishes before any cell's third
        panels = sorted({p.get("n", 0) for p in points})
        jobs = [(p, v, r, s) for n in panels for s in seeds for p in points
                if p.get("n", 0) == n for v in chosen for r in rates]
        print(f"{len(jobs)} runs, {a.jobs} at a time; load {open('/proc/loadavg').read().strip()}")
        with ThreadPoolExecutor(a.jobs) as pool:
            results = pool.map(lambda j: (j, train(a.build, t, *j, run_dir(a.runs, a.table, *j))),
                               jobs)
            for (p, v, r, s), status in results:
                print(f"{p['name']} {v} lr {r:g} seed {s}: {status}", flush=True)
    render(a.table, t, a.runs, a.out)


if __name__ == "__main__":
    sys.exit(main())
