#!/usr/bin/python3
"""Renders results/backward/README.md from bench_backward.json, load_after.txt and, when present,
the hand-written notes.md (the run's circumstances and discussion)."""
import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
bench = json.loads((out / "bench_backward.json").read_text())
load_after = (out / "load_after.txt").read_text().strip()
ctx = bench["context"]

# Per benchmark: the repetitions' ratios and the medians Google Benchmark aggregated.
reps, medians = {}, {}
for b in bench["benchmarks"]:
    name = b["run_name"]
    if b.get("run_type") == "iteration":
        reps.setdefault(name, []).append(b["ratio"])
    elif b.get("aggregate_name") == "median":
        medians[name] = b


def ratio_cell(name):
    r = reps[name]
    return f"{medians[name]['ratio']:.2f} ({min(r):.2f}-{max(r):.2f})"


print("# Backward passes: time against the forward\n")
print("Regenerate: `benchmarks/run_backward.sh [build-dir]`. B = 1, H = 8, D = 64, float32. In each")
print("iteration the forward (saving the row log-sum-exp, as a training step does) and the backward")
print("run once each, alternately leading, so the machine's drift hits both alike; outputs and")
print("gradients are reused tensors. Medians of 3 repetitions in random interleaved order (real")
print("time); the ratio column gives the median and, in brackets, the range over the repetitions.")
print("GFLOP/s count useful work over the visible pairs: the forward's 2 products (4·H·pairs·D),")
print("the backward's 5 (10·H·pairs·D).\n")
print("## full\n")
print("| N | causal | forward ms | backward ms | backward / forward | forward GFLOP/s | backward GFLOP/s |")
print("|---|---|---|---|---|---|---|")
full = sorted((m for m in medians if m.startswith("BM_full_backward/")),
              key=lambda m: (int(m.split("N:")[1].split("/")[0]), m))
for name in full:
    b = medians[name]
    n = name.split("N:")[1].split("/")[0]
    causal = "yes" if "causal:1" in name else "no"
    print(f"| {n} | {causal} | {b['forward_ms']:.1f} | {b['backward_ms']:.1f} | {ratio_cell(name)} | "
          f"{b['forward_GFLOPs']:.1f} | {b['backward_GFLOPs']:.1f} |")

target = "BM_full_backward/N:4096/causal:0/real_time"
causal_target = "BM_full_backward/N:4096/causal:1/real_time"
print("\n| measure | value | target | met |\n|---|---|---|---|")
for what, name in [("backward / forward, N = 4096", target),
                   ("backward / forward, N = 4096, causal", causal_target)]:
    value = medians[name]["ratio"]
    print(f"| {what} | {value:.2f} (worst repetition {max(reps[name]):.2f}) | <= 3 | "
          f"{'yes' if value <= 3 else 'NO'} |")

print("\n## Every variant's default spec, N = 4096 (for information)\n")
print("| spec | forward ms | backward ms | backward / forward |")
print("|---|---|---|---|")
for name, b in medians.items():
    if name.startswith("BM_variant_backward/"):
        print(f"| `{b.get('label', name)}` | {b['forward_ms']:.1f} | {b['backward_ms']:.1f} | "
              f"{ratio_cell(name)} |")

print("\n## Context\n")
for key in ["date", "host_name", "num_cpus", "mhz_per_cpu", "git_commit", "compiler", "cpu",
            "kernels", "openblas_coretype", "omp_num_threads"]:
    print(f"- {key}: {ctx.get(key, '—')}")
print(f"- load average (1, 5, 15 min) before the run: {ctx.get('load_before', '—')}, after: {load_after}")
print(f"- Google Benchmark's own library build (Debian package): {ctx.get('library_build_type', '—')};"
      " attnlab itself is built with buildtype=release, -march=native")

notes = out / "notes.md"
if notes.exists():
    print("\n" + notes.read_text().strip())
