#!/usr/bin/python3
"""Tables and learning curves of the training runs (scripts/train-results.sh).

Usage: render-training.py RUNS OUT
Reads RUNS/TASK/NAME/{train.csv, eval.csv, summary.json} (attnlab train's output), copies them
into OUT/TASK/raw/NAME/ (a task with no RUNS/TASK keeps the runs committed there) and writes OUT/README.md (per task: held-out accuracy, time per step,
peak memory and load of every spec, Zoology's finding beside them) and, with gnuplot,
OUT/TASK/curves.png (held-out accuracy and smoothed training loss against the step), then
appends OUT/notes.md (what the tables show, written by hand) when it exists, after
OUT/protocol.md (the tables on the seeds-and-rates protocol and the published findings beside
them, written by hand) when it exists, which comes first. Renders
only what the runs measured: nothing here is re-run or estimated.
"""
import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

ZOOLOGY = ("Zoology (Arora et al. 2023, anchors/papers.md): softmax attention solves MQAR at every "
           "model width tried; linear attention needs a much larger width (state size) to match, "
           "and the gap grows with the sequence length and the number of pairs.")
TASKS = {
    "mqar": "mqar: multi-query associative recall, per query (chance among the values: 1/32; "
            "among the 8 values in the context: 12.5%)",
    "mqar-long": "mqar-long: the same recall at N = 64 with 4 pairs, trained 16 or more times as "
                 "long, to see past the plateau (chance among the values: 1/32; among the 4 values "
                 "in the context: 25%)",
}


def rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def gnuplot_curves(folder, runs, title):
    """curves.png: held-out accuracy and training loss (moving mean of 20 steps) by step."""
    dat, acc_plots, loss_plots = [], [], []
    for i, (name, r) in enumerate(runs):
        dat.append(f"# {name} eval\n" + "".join(f"{e['step']} {float(e['accuracy']) * 100}\n"
                                                  for e in r["eval"]) + "\n\n")
        losses = [float(t["loss"]) for t in r["train"]]
        smooth = [sum(losses[max(0, k - 19):k + 1]) / len(losses[max(0, k - 19):k + 1])
                  for k in range(len(losses))]
        dat.append(f"# {name} loss\n" + "".join(f"{t['step']} {s}\n"
                                                  for t, s in zip(r["train"], smooth)) + "\n\n")
        acc_plots.append(f"'curves.dat' index {2 * i} using 1:2 with linespoints title '{r['spec']}'")
        loss_plots.append(f"'curves.dat' index {2 * i + 1} using 1:2 with lines title '{r['spec']}'")
    (folder / "curves.dat").write_text("".join(dat))
    script = (
        "set terminal pngcairo size 1200,480 noenhanced\nset output 'curves.png'\nset multiplot layout 1,2 "
        f"title '{title}'\nset key bottom right font ',8'\nset xlabel 'step'\n"
        "set ylabel 'held-out accuracy %'\nset grid\nplot " + ", ".join(acc_plots) + "\n"
        "set key top right font ',8'\nset ylabel 'training loss (mean of 20 steps)'\nplot "
        + ", ".join(loss_plots) + "\nunset multiplot\n")
    (folder / "curves.gp").write_text(script)
    if shutil.which("gnuplot"):
        subprocess.run(["gnuplot", "curves.gp"], cwd=folder, check=True)


def main():
    runs_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    lines, context = [], None
    for task in ["mqar", "mqar-long"]:
        # A task not run this time keeps its committed rows (OUT/TASK/raw).
        source = runs_dir / task if (runs_dir / task).is_dir() else out / task / "raw"
        if not source.is_dir():
            continue
        runs = []
        for run in sorted(source.iterdir()):
            if not (run / "summary.json").exists():
                continue
            summary = json.loads((run / "summary.json").read_text())
            raw = out / task / "raw" / run.name
            if raw != run:
                raw.mkdir(parents=True, exist_ok=True)
                for f in ["train.csv", "eval.csv", "summary.json"]:
                    shutil.copy(run / f, raw / f)
            runs.append((run.name, {"spec": summary["spec"], "summary": summary,
                                    "train": rows(run / "train.csv"),
                                    "eval": rows(run / "eval.csv")}))
        if not runs:
            continue
        context = context or runs[0][1]["summary"]
        s0 = runs[0][1]["summary"]
        cfg = dict(line.split(" ", 1) for line in s0["config"].strip().split("\n"))
        lines += [f"## {task}", "", TASKS[task] + ".", "",
                  f"Task `{cfg['task']}`, N = {cfg['n']}, {cfg['layers']} layers, d_model "
                  f"{cfg['d_model']}, {cfg['heads']} heads, FFN {cfg['ffn']}, {cfg['switches']}, "
                  f"batch {cfg['batch']}, Adam lr {float(cfg['lr']):g} (warm-up "
                  f"{cfg['warmup']}), held-out set of {cfg['eval_size']} examples, seed "
                  f"{cfg['seed']}. Run at " + "; ".join(sorted(
                      {f"commit {r['summary']['git_commit'][:10]}"
                       f"{' (dirty)' if r['summary']['git_dirty'] else ''}" for _, r in runs}))
                  + f", {s0['date']}.", ""]
        header = ["spec", "steps", "held-out accuracy %", "best held-out %", "held-out loss",
                  "s / step", "peak extra heap MiB", "max RSS MiB", "load before / after"]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for name, r in runs:
            s = r["summary"]
            best = max(float(e["accuracy"]) for e in r["eval"]) * 100
            cells = [f"`{r['spec']}`", str(s["steps"]), f"{s['eval']['accuracy'] * 100:.1f}",
                     f"{best:.1f}",
                     f"{s['eval']['loss']:.3f}", f"{s['seconds_per_step']:.3f}",
                     f"{s['peak_heap_bytes'] / 2**20:.1f}", f"{s['max_rss_bytes'] / 2**20:.0f}",
                     f"{s['loadavg_before']:.1f} / {s['loadavg_after']:.1f}"]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        if task.startswith("mqar"):
            lines += [ZOOLOGY, ""]
            for name, r in runs:
                split = r["summary"].get("split")
                if split:
                    step = split["step_seconds"]
                    lines += [f"Time split of one training step of `{r['spec']}` (medians of "
                              f"{split['rounds']} rounds, measured after its run; attention = its "
                              f"{cfg['layers']} attention forwards saving the log-sum-exp and "
                              "their backwards, GEMMs = every projection, FFN and head GEMM of "
                              "the step with its two backward GEMMs, each measured alone at the "
                              "step's shapes; everything else = the step minus both):", "",
                              "| step | attention | GEMMs | everything else |", "|---|---|---|---|",
                              f"| {step:.4f} s | {split['attention_seconds']:.4f} s "
                              f"({100 * split['attention_seconds'] / step:.0f}%) | "
                              f"{split['gemm_seconds']:.4f} s "
                              f"({100 * split['gemm_seconds'] / step:.0f}%) | "
                              f"{split['rest_seconds']:.4f} s "
                              f"({100 * split['rest_seconds'] / step:.0f}%) |", "",
                              f"Training `{r['spec']}` for {r['summary']['steps']} steps took "
                              f"{r['summary']['train_seconds'] / 60:.1f} minutes of training "
                              "time (held-out scoring and checkpoints aside).", ""]
        lines += [f"Learning curves: [{task}/curves.png]({task}/curves.png).", ""]
        gnuplot_curves(out / task, runs, task)
    c = context
    # The tables on the protocol that can rank variants first, then these single-seed ones.
    protocol = out / "protocol.md"
    head = ["# Training results", ""]
    if protocol.exists():
        head += [protocol.read_text().rstrip(), "", "## The single-seed tables", ""]
    head += ["Rendered by scripts/render-training.py from the runs of scripts/train-results.sh "
            "(raw logs and summaries under TASK/raw/): one seed per row, kept as the record of "
            "MQAR's plateau that led to the protocol above (`zoology/` measures recall on it). "
            "Small models and short runs (mqar: 1000 steps at N = 256; mqar-long: 16000 at "
            "N = 64): these are not converged accuracies.",
            "", f"Context (the commit and date of each task's runs are with its table): "
            f"{c['cpu_model']} ({c['threads']['nproc']} cores, one OpenMP thread per run, two "
            f"runs at a time), {c['compiler']}, {c['blas']['config']}, OPENBLAS_CORETYPE "
            f"{c['OPENBLAS_CORETYPE']}, kernels {c['kernels']}. The machine is "
            "shared: each table gives the 1-minute load average before and after its run.", ""]
    notes = out / "notes.md"  # the findings, written by hand from the tables above
    if notes.exists():
        lines += [notes.read_text()]
    (out / "README.md").write_text("\n".join(head + lines))


if __name__ == "__main__":
    main()
