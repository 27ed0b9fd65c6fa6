#!/usr/bin/python3
"""Renders the tables of results/studies/trained/README.md and prune/README.md that gather the
seeds' runs, from each run's rows.csv (the pages' prose is written by hand around them).

Usage: scripts/render-studies.py [--check]
Each table sits between "<!-- rendered: NAME" and "<!-- /rendered -->" in its page. With
--check nothing is written: exit 1 with a diff when a page's table differs from its rows.csv
(the meson test studies_rendered).
"""
import csv
import difflib
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STUDIES = ROOT / "results" / "studies"
TEXT_SEEDS = ["text-s1", "text-s2", "text-s3"]


def rows(study, run):
    return list(csv.DictReader(open(STUDIES / study / run / "rows.csv")))


def spectrum():
    """trained: per text seed, the k holding 90% of P's singular values' sum and the share of the
    first N/4, each the mean over a layer's heads; uniform causal attention beside."""
    def cell(run, weights, layer):
        data = [r for r in rows("trained", run) if r["weights"] == weights and r["layer"] == layer]
        mean = lambda m: statistics.mean(float(r["value"]) for r in data if r["measure"] == m)
        return f"{mean('rank90'):.0f}, {mean('share_quarter'):.3f}"

    lines = ["| text LM | " + " | ".join(f"seed {s[-1]}" for s in TEXT_SEEDS) + " |",
             "|---" * (len(TEXT_SEEDS) + 1) + "|"]
    for weights in ("trained", "untrained"):
        for layer in ("1", "2"):
            lines.append(f"| {weights}, layer {layer} | " +
                         " | ".join(cell(s, weights, layer) for s in TEXT_SEEDS) + " |")
    lines.append("| uniform causal attention | " +
                 " | ".join(cell(s, "uniform", "all") for s in TEXT_SEEDS) + " |")
    return "\n".join(lines) + "\n"


def cumulative():
    """prune: held-out bits per byte of each text seed against the heads removed in its order."""
    runs = {s: rows("prune", s) for s in TEXT_SEEDS}
    removed = sorted({int(r["removed"]) for rs in runs.values() for r in rs
                      if r["kind"] == "cumulative"})
    heads = max(removed)
    lines = ["| heads removed | " + " | ".join(f"seed {s[-1]}" for s in TEXT_SEEDS) + " |",
             "|---" * (len(TEXT_SEEDS) + 1) + "|"]
    for n in removed:
        label = {0: "0 (unpruned)", heads: f"{heads} (no attention)"}.get(n, str(n))
        lines.append(f"| {label} | " + " | ".join(
            next(f"{float(r['bits']):.3f}" for r in runs[s]
                 if r["kind"] == "cumulative" and int(r["removed"]) == n) for s in TEXT_SEEDS)
            + " |")
    lines.append("| untrained model | " + " | ".join(
        next(f"{float(r['bits']):.3f}" for r in runs[s] if r["kind"] == "untrained")
        for s in TEXT_SEEDS) + " |")
    return "\n".join(lines) + "\n"


PAGES = {STUDIES / "trained" / "README.md": {"spectrum": spectrum},
         STUDIES / "prune" / "README.md": {"cumulative": cumulative}}


def render(text, blocks):
    for name, make in blocks.items():
        begin, end = f"<!-- rendered: {name}", "<!-- /rendered -->"
        start = text.find(begin)
        if start < 0:
            sys.exit(f"no '{begin}' block")
        start = text.index("\n", start) + 1
        stop = text.index(end, start)
        text = text[:start] + make() + text[stop:]
    return text


def main():
    check = sys.argv[1:] == ["--check"]
    if sys.argv[1:] not in ([], ["--check"]):
        sys.exit("usage: scripts/render-studies.py [--check]")
    status = 0
    for page, blocks in PAGES.items():
        old = page.read_text()
        new = render(old, blocks)
        if not check:
            page.write_text(new)
        elif new != old:
            rel = page.relative_to(ROOT).as_posix()
            sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                                       rel, "rendered from rows.csv"))
            print(f"{rel}'s tables are out of date with rows.csv: run scripts/render-studies.py")
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
