#!/usr/bin/python3
"""Renders results/backward/README.md from bench_backward.json, load_after.txt and a link to the
hand-written notes.md (the run's circumstances and discussion) when there is one."""
import json
import sys
from pathlib import Path

from report_parts import met, notes_link
from sgemm_rates import sgemm_rates, sgemm_table

out = Path(sys.argv[1])
bench = json.loads((out / "bench_backward.json").read_text())
load_after = (out / "load_after.txt").read_text().strip()
ctx = bench["context"]

# Per benchmark: the repetitions' rows and the medians Google Benchmark aggregated.
reps, medians = {}, {}
for b in bench["benchmarks"]:
    name = b["run_name"]
    if "BM_sgemm" in name:
        continue
    if b.get("run_type") == "iteration":
        reps.setdefault(name, []).append(b)
    elif b.get("aggregate_name") == "median":
        medians[name] = b
rates, best, best_at, env = sgemm_rates(bench)


def ratio_cell(name, key="ratio", digits=2):
    r = [b[key] for b in reps[name]]
    return f"{medians[name][key]:.{digits}f} ({min(r):.{digits}f}-{max(r):.{digits}f})"


def full(n, causal):
    return f"BM_full_backward/N:{n}/causal:{int(causal)}/real_time"


print("# Backward passes: time against the forward and against sgemm\n")
print("Regenerate: `benchmarks/run_backward.sh [build-dir]`. B = 1, H = 8, D = 64, float32. In each")
print("iteration the plain forward, the forward saving the row log-sum-exp (as a training step")
print("does) and the backward run once each, each leading in turn, so the machine's drift hits all")
print("three alike; outputs and gradients are reused tensors. Medians of 3 repetitions in random")
print("interleaved order with the sgemm yardsticks (real time). backward / forward is the")
print("backward's time over the forward with lse's, lse / plain forward the two forwards' times;")
print("each the median and, in brackets, the range over the repetitions. GFLOP/s count useful work")
print("over the visible pairs: the forward's 2 products (4·H·pairs·D), the backward's 5")
print("(10·H·pairs·D).\n")
print("sgemm yardsticks in the same run, GFLOP/s (the environment's `OPENBLAS_CORETYPE` in-process,")
print("the others in child processes, `benchmarks/sgemm_probe`):\n")
print(sgemm_table(rates, best, best_at, env) + "\n")
print("## full\n")
print("| N | causal | forward ms | forward with lse ms | backward ms | backward / forward | "
      "lse / plain forward | backward GFLOP/s | backward / best sgemm |")
print("|---|---|---|---|---|---|---|---|---|")
names = sorted((m for m in medians if m.startswith("BM_full_backward/")),
               key=lambda m: (int(m.split("N:")[1].split("/")[0]), m))
for name in names:
    b = medians[name]
    n = name.split("N:")[1].split("/")[0]
    causal = "yes" if "causal:1" in name else "no"
    print(f"| {n} | {causal} | {b['forward_ms']:.1f} | {b['forward_lse_ms']:.1f} | "
          f"{b['backward_ms']:.1f} | {ratio_cell(name)} | {ratio_cell(name, 'lse_over_plain', 3)} | "
          f"{b['backward_GFLOPs']:.1f} | {b['backward_GFLOPs'] / best:.2f} |")

rows = []
for n in (4096, 16384):
    plain, causal = medians.get(full(n, False)), medians.get(full(n, True))
    if not plain:
        continue
    rows += [(f"full backward / forward, N = {n}", plain["ratio"], "<= 2.6"),
             (f"full backward / best sgemm, N = {n}", plain["backward_GFLOPs"] / best, ">= 0.6"),
             (f"full forward with lse / plain forward (time), N = {n}", plain["lse_over_plain"],
              "<= 1.053 (0.95x the rate)")]
    if causal:
        rows.append((f"full causal backward / plain backward (time), N = {n}",
                     causal["backward_ms"] / plain["backward_ms"], "about 0.5"))
for spec in ("sliding", "bigbird"):
    for n in (4096, 16384):
        b = medians.get(f"BM_variant_backward/{spec}/N:{n}/real_time")
        if b:
            rows.append((f"{spec} backward / forward, N = {n}", b["ratio"], "<= 2.6"))
print("\n| measure | value | target | met |\n|---|---|---|---|")
for what, value, target in rows:
    print(f"| {what} | {value:.3f} | {target} | {met(value, target)} |")

print("\n## Other variants (default specs)\n")
print("| spec | N | forward ms | forward with lse ms | backward ms | backward / forward |")
print("|---|---|---|---|---|---|")
for name, b in sorted(medians.items(),
                      key=lambda item: (item[1].get("label", ""), int(item[0].split("N:")[-1].split("/")[0])
                                        if "N:" in item[0] else 0)):
    if name.startswith("BM_variant_backward/"):
        n = name.split("N:")[1].split("/")[0]
        print(f"| `{b.get('label', name)}` | {n} | {b['forward_ms']:.1f} | "
              f"{b['forward_lse_ms']:.1f} | {b['backward_ms']:.1f} | {ratio_cell(name)} |")

print("\n## Context\n")
for key in ["date", "host_name", "num_cpus", "mhz_per_cpu", "git_commit", "compiler", "build",
            "cpu", "kernels", "openblas_coretype", "omp_num_threads"]:
    print(f"- {key}: {ctx.get(key, '—')}")
print(f"- load average (1, 5, 15 min) before the run: {ctx.get('load_before', '—')}, after: {load_after}")
print(f"- Google Benchmark's own library build (Debian package): {ctx.get('library_build_type', '—')}")

if notes_link(out):
    print("\n" + notes_link(out))
