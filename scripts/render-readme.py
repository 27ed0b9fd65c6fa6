#!/usr/bin/python3
"""Renders the README's measured blocks from the data in results/ (never typed).

Usage: scripts/render-readme.py [--check]
Writes each block between "<!-- rendered: NAME" and the next "<!-- /rendered -->" in README.md:
  headline     the table of headline ratios: each row from the raw data of a current folder of
               results/ (rows.csv, a Google Benchmark JSON), computed by the same code as that
               folder's own table; a folder moved to results/archive/ (or not measured yet) gives
               no row
  run-excerpt  an excerpt of what `./dev run` printed for results/default (its summary.txt)
  kjv-sample   the committed KJV model's continuation, results/generation/sample.json
               (scripts/kjv-sample.py)
With --check nothing is written: exit 1 with a diff when a block differs from what the data
gives (the meson test `readme_rendered`). Either way, exit 1 when the rendered README is longer
than MAX_LINES: the front door stays short, and the rest lives in docs/.
"""
import csv
import difflib
import importlib.util
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"
sys.path.insert(0, str(ROOT / "benchmarks"))
from render_training_speed import step_table  # noqa: E402
from report_parts import benchmark_medians, mask_dense_rate  # noqa: E402

# scripts/kjv-sample.py's block(): the README shows the block its page shows
_spec = importlib.util.spec_from_file_location("kjv_sample", ROOT / "scripts" / "kjv-sample.py")
kjv_sample_script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kjv_sample_script)

BEGIN = "<!-- rendered: "
END = "<!-- /rendered -->"


def run_cell(folder, commit, date, cpu):
    """The last column: the folder (linked to its rendered page) and the run's commit, day, CPU."""
    rel = folder.relative_to(ROOT).as_posix()
    page = "README.md" if (folder / "README.md").exists() else "report.md"
    return f"[`{rel}/`]({rel}/{page}), {commit[:7]}, {date[:10]}, {cpu}"


def default_sweep():
    """results/default (./dev run's grid, committed): each variant's speed-up over `full` at
    N = 4096, causal none, no mask and float32 (a run of older code has no mask or dtype column),
    the geometric mean over the inputs, as the sweep's summary takes it;
    a variant's first spec in the grid is its defaults (the config's "*" comes first)."""
    folder = RESULTS / "default"
    if not (folder / "rows.csv").exists():
        return []
    meta = json.loads((folder / "meta.json").read_text())
    rows = [r for r in csv.DictReader(open(folder / "rows.csv"))
            if r["status"] == "ok" and r["n"] == "4096" and r["causal"] == "none"
            and r.get("mask", "none") == "none" and r.get("dtype", "float32") == "float32"
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
    """results/training-speed/llama: a training step, PyTorch's time over ours."""
    folder = RESULTS / "training-speed" / "llama"
    if not (folder / "rows.csv").exists():
        return []
    context = json.loads((folder / "context.json").read_text())
    run = run_cell(folder, context["git_commit"], context["date"], context["cpu"])
    return [(f"a training step, PyTorch's time / attnlab's: {s['model']}, N = {s['n']}",
             f"{s['torch_s'] / s['attnlab_s']:.2f}x", run)
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


def masks():
    """results/masks: the softmax engine's forward under masks, GFLOP/s over the visible pairs
    against dense full's of the same run (N = 16384) at the median of its twins' times
    (report_parts.MASK_TWINS), as results/masks/README.md gives them."""
    folder = RESULTS / "masks"
    if not (folder / "bench_masks.json").exists():
        return []
    bench = json.loads((folder / "bench_masks.json").read_text())
    label = {b["run_name"]: b.get("label", "").split(" (")[0] for b in bench["benchmarks"]}
    def mask(key):
        return {label[name]: v for name, v in benchmark_medians(bench, key).items()
                if name.startswith("BM_mask/")}
    rate = mask("forward_GFLOPS")
    dense = mask_dense_rate(bench, "forward")
    cells = ", ".join(f"{name} {rate[name] / dense:.2f}x" for name in
                      ("causal", "window 512", "16 documents", "prefix-LM, quarter prefix"))
    context = bench["context"]
    return [("softmax engine's forward under a mask, GFLOP/s over the visible pairs / dense full's, "
             "B = 1, H = 8, D = 64, N = 16384", cells,
             run_cell(folder, context["git_commit"], context["date"], context["cpu"]))]


def headline():
    rows = default_sweep() + masks() + training_step() + linear_family()
    if not rows:
        return ("No current speed measurement: each is archived until it is rerun on a quiet\n"
                "machine ([results/README.md](results/README.md) lists them with their rerun "
                "commands).\n")
    lines = ["| measured | ratio | run |", "| --- | --- | --- |"]
    lines += [f"| {what} | {ratio} | {run} |" for what, ratio, run in rows]
    return "\n".join(lines) + "\n"


def run_excerpt():
    """Parts of results/default/summary.txt (the sweep's summary as `./dev run` prints it): the
    run's context, the first speed table's head, the yardstick and where the report went (not the
    list of plots)."""
    summary = RESULTS / "default" / "summary.txt"
    if not summary.exists():
        return ("No run of the default sweep is committed yet (`scripts/regenerate-results.sh "
                "rerun archive/default`).\n")
    parts = [p.splitlines() for p in summary.read_text().strip().split("\n\n")]
    speed = next(p for p in parts if p[0].startswith("Speed-up"))
    keep = [p for p in parts if p[0].startswith("Summary of")] + [speed[:4] + ["  ..."]]
    keep += [p for p in parts if p[0].startswith("Yardstick")]
    keep += [[line for p in parts if p[0].startswith("Report") for line in p
              if line.startswith("Report")]]
    return "```text\n" + "\n\n".join("\n".join(p) for p in keep) + "\n```\n"


def kjv_sample():
    """The command scripts/kjv-sample.py ran, what it printed, and its tokens-per-second line."""
    path = RESULTS / "generation" / "sample.json"
    if not path.exists():
        return "No continuation is committed yet (`scripts/kjv-sample.py build`).\n"
    return kjv_sample_script.block(json.loads(path.read_text()))


BLOCKS = {"headline": headline, "run-excerpt": run_excerpt, "kjv-sample": kjv_sample}


def render(readme):
    """README.md with every rendered block rewritten."""
    out, at = [], 0
    while (start := readme.find(BEGIN, at)) >= 0:
        name = readme[start + len(BEGIN):].split(None, 1)[0]
        if name not in BLOCKS:
            sys.exit(f"README.md: unknown rendered block '{name}' (known: {', '.join(BLOCKS)})")
        body = readme.index("\n", start) + 1
        end = readme.find(END, body)
        if end < 0:
            sys.exit(f"README.md: the block '{name}' has no '{END}'")
        out += [readme[at:body], BLOCKS[name]()]
        at = end
    if not out:
        sys.exit(f"README.md: no block starting '{BEGIN}'")
    return "".join(out) + readme[at:]


MAX_LINES = 200


def main():
    check = sys.argv[1:] == ["--check"]
    if sys.argv[1:] not in ([], ["--check"]):
        sys.exit("usage: scripts/render-readme.py [--check]")
    readme = (ROOT / "README.md").read_text()
    new = render(readme)
    if len(new.splitlines()) > MAX_LINES:
        print(f"README.md would have {len(new.splitlines())} lines, more than {MAX_LINES}: move "
              "the detail to docs/", file=sys.stderr)
        return 1
    if not check:
        (ROOT / "README.md").write_text(new)
        return 0
    if new != readme:
        sys.stdout.writelines(difflib.unified_diff(readme.splitlines(True), new.splitlines(True),
                                                   "README.md", "rendered from results/"))
        print("README.md's rendered blocks are out of date with results/: run "
              "scripts/render-readme.py and commit README.md")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
