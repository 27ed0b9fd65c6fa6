#!/usr/bin/python3
"""Renders the README's table of headline ratios from the data in results/ (never typed).

Usage: scripts/render-readme.py [--check]
Writes the block between "<!-- rendered: headline" and "<!-- /rendered -->" in README.md. Each
row comes from the raw data of a current folder of results/ (rows.csv, a Google Benchmark JSON),
computed by the same code as that folder's own table; a folder moved to results/archive/ (or
not measured yet) gives no row. With --check nothing is written: exit 1 with a diff when the
README's block differs from what the data gives (the meson test `readme_rendered`).
"""
import csv
import difflib
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"
sys.path.insert(0, str(ROOT / "benchmarks"))
from render_training_speed import step_table  # noqa: E402
from report_parts import benchmark_medians  # noqa: E402

BEGIN = "<!-- rendered: headline"
END = "<!-- /rendered -->"


def run_cell(folder, commit, date, cpu):
    """The last column: the folder (linked to its rendered page) and the run's commit, day, CPU."""
    rel = folder.relative_to(ROOT).as_posix()
    page = "README.md" if (folder / "README.md").exists() else "report.md"
    return f"[`{rel}/`]({rel}/{page}), {commit[:7]}, {date[:10]}, {cpu}"


def default_sweep():
    """results/default (./dev run's grid, committed): each variant's speed-up over `full` at
    N = 4096, causal none, the geometric mean over the inputs, as the sweep's summary takes it;
    a variant's first spec in the grid is its defaults (the config's "*" comes first)."""
    folder = RESULTS / "default"
    if not (folder / "rows.csv").exists():
        return []
    meta = json.loads((folder / "meta.json").read_text())
    rows = [r for r in csv.DictReader(open(folder / "rows.csv"))
            if r["status"] == "ok" and r["n"] == "4096" and r["causal"] == "none"
            and r["variant"] not in ("numpy", "torch")]
    full = {r["input"]: float(r["time_median_s"]) for r in rows if r["spec"] == "full"}
    defaults = {}
    for spec in meta["grid"]["specs"]:
        defaults.setdefault(spec.split(":")[0], spec)
    ups = {}
    for r in rows:
        if r["spec"] != "full" and r["spec"] == defaults[r["variant"]] and r["input"] in full:
            ups.setdefault(r["variant"], []).append(full[r["input"]] / float(r["time_median_s"]))
    cells = ", ".join(f"`{name}` {math.exp(sum(map(math.log, v)) / len(v)):.1f}x"
                      for name, v in ups.items())
    return [("one forward call, speed-up over exact `full`: each variant's defaults, B = 1, H = 8, "
             "D = 64, N = 4096 (geometric mean over the sweep's inputs)", cells,
             run_cell(folder, meta["git_commit"], meta["date"], meta["cpu_model"]))]


def training_step():
    """results/training-speed/intel-167-openmp: a training step, PyTorch's time over ours."""
    folder = RESULTS / "training-speed" / "intel-167-openmp"
    if not (folder / "rows.csv").exists():
        return []
    context = json.loads((folder / "context.json").read_text())
    run = run_cell(folder, context["git_commit"], context["date"], context["cpu"])
    return [(f"a training step, PyTorch's time / attnlab's: {s['layers']} layers, d_model "
             f"{s['d_model']}, N = {s['n']}", f"{s['torch_s'] / s['attnlab_s']:.2f}x", run)
            for s in step_table(list(csv.DictReader(open(folder / "rows.csv"))))]


def linear_family():
    """results/linear-family: the scan engine's backward over its causal forward at N = 16384."""
    folder = RESULTS / "linear-family"
    if not (folder / "bench_linear_family.json").exists():
        return []
    bench = json.loads((folder / "bench_linear_family.json").read_text())
    time, context = benchmark_medians(bench), bench["context"]
    cells = ", ".join(
        f"`{spec}` {time[f'BM_backward/{spec}/N:16384/real_time'] / forward:.1f}x"
        for spec in ("delta", "gated-delta", "gla", "retnet")
        for forward in [time[f"BM_forward/{spec}/N:16384/real_time"]])
    return [("backward over causal forward, B = 1, H = 8, D = 64, N = 16384", cells,
             run_cell(folder, context["git_commit"], context["date"], context["cpu"]))]


def render():
    rows = default_sweep() + training_step() + linear_family()
    if not rows:
        return ("No current speed measurement: each is archived until it is rerun on a quiet\n"
                "machine ([results/README.md](results/README.md) lists them with their rerun "
                "commands).\n")
    lines = ["| measured | ratio | run |", "| --- | --- | --- |"]
    lines += [f"| {what} | {ratio} | {run} |" for what, ratio, run in rows]
    return "\n".join(lines) + "\n"


def main():
    check = sys.argv[1:] == ["--check"]
    if sys.argv[1:] not in ([], ["--check"]):
        sys.exit("usage: scripts/render-readme.py [--check]")
    readme = (ROOT / "README.md").read_text()
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start:
        sys.exit(f"README.md: no block between '{BEGIN}' and '{END}'")
    start = readme.index("\n", start) + 1
    new = readme[:start] + render() + readme[end:]
    if not check:
        (ROOT / "README.md").write_text(new)
        return 0
    if new != readme:
        sys.stdout.writelines(difflib.unified_diff(readme.splitlines(True), new.splitlines(True),
                                                   "README.md", "rendered from results/"))
        print("README.md's headline table is out of date with results/: run "
              "scripts/render-readme.py and commit README.md")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
