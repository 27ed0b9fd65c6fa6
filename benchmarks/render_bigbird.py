#!/usr/bin/python3
"""Renders results/bigbird/README.md from bench_bigbird.json and bench_bigbird_long.json."""
import json
import statistics
import sys
from pathlib import Path

from report_parts import met, notes_link, profile_section
from sgemm_rates import sgemm_rates, sgemm_table

out = Path(sys.argv[1])
bench = json.loads((out / "bench_bigbird.json").read_text())
long_run = json.loads((out / "bench_bigbird_long.json").read_text())["benchmarks"][0]
load_after = (out / "load_after.txt").read_text().strip() if (out / "load_after.txt").exists() else "?"

rows = {}  # (name, N) -> lists of (seconds, GFLOP/s, pairs per query)
for b in bench["benchmarks"]:
    if b.get("run_type") != "iteration":
        continue
    name = b["name"].split("/")[0]
    if name.startswith("BM_sgemm"):
        continue  # sgemm_rates
    key = (name, int(b["name"].split("N:")[1].split("/")[0]))
    rows.setdefault(key, []).append((b["real_time"] / 1e3, b["FLOPS"] / 1e9,
                                     b.get("pairs_per_query", 0)))


def median(key, i):
    return statistics.median(r[i] for r in rows[key])


rates, best, best_at, env = sgemm_rates(bench)
ns = sorted(n for name, n in rows if name == "BM_bigbird")
print("# BigBird (block-sparse, ITC): speed against our own full attention and OpenBLAS sgemm\n")
print("Regenerate: `benchmarks/run_bigbird.sh [build-dir]`. Spec: "
      "`bigbird:block=64,window=3,global=2,random=3,seed=0` (the paper's defaults); B = 1, H = 8,")
print("D = 64, float32, no mask; every forward writes into one output kept across iterations")
print("(kernels are timed, not the page faults of a fresh output). Times are medians of 3")
print("interleaved repetitions (real time) from one run of one binary; GFLOP/s counts only computed")
print("scores: 4·D per (query, key) pair of the layout (the `pairs/query` column). Ratios are taken")
print("within this run.\n")
print("sgemm yardsticks in the same run, GFLOP/s (the environment's `OPENBLAS_CORETYPE` in-process,")
print("the others in child processes, `benchmarks/sgemm_probe`):\n")
print(sgemm_table(rates, best, best_at, env) + "\n")
print("| N | bigbird ms | GFLOP/s | / best sgemm | / env sgemm | pairs/query | full ms | full / bigbird |")
print("|---|---|---|---|---|---|---|---|")
for n in ns:
    t, g, p = (median(("BM_bigbird", n), i) for i in range(3))
    full = ("BM_full", n)
    tf = median(full, 0) if full in rows else None
    print(f"| {n} | {t * 1e3:.1f} | {g:.2f} | {g / best:.2f} | {g / env:.2f} | {p:.0f} | "
          + (f"{tf * 1e3:.1f} | {tf / t:.2f}x |" if tf else "— | — |"))

t4k, t64k = median(("BM_bigbird", 4096), 0), median(("BM_bigbird", 65536), 0)
worst_rate = min(median(("BM_bigbird", n), 1) for n in ns)
full_ns = sorted(n for name, n in rows if name == "BM_full")
slowest_gain = min(median(("BM_full", n), 0) / median(("BM_bigbird", n), 0) for n in full_ns)
checks = [
    ("time(N=65536) / time(N=4096)", f"{t64k / t4k:.1f}", "<= 19 (16 = linear)"),
    ("lowest GFLOP/s over N / best sgemm", f"{worst_rate / best:.2f}", ">= 0.5"),
    ("lowest GFLOP/s over N / the environment's sgemm", f"{worst_rate / env:.2f}", "(reference)"),
    ("peak resident memory, N = 65536 alone (MiB)", f"{long_run['peak_rss_MiB']:.0f}", "<= 1024"),
    (f"smallest full / bigbird time ratio, N = {full_ns[0]} ... {full_ns[-1]}",
     f"{slowest_gain:.2f}", "> 1"),
]

print("\n| measure | value | target | met |\n|---|---|---|---|")
for what, value, target in checks:
    print(f"| {what} | {value} | {target} | {met(value, target)} |")
print(f"\nThe N = 65536 call alone took {long_run['real_time']:.2f} s.\n")
ctx = bench["context"]
print("## Context\n")
for key in ["date", "host_name", "cpu", "num_cpus", "mhz_per_cpu", "git_commit", "compiler",
            "build", "kernels", "openblas_coretype", "omp_num_threads", "load_before"]:
    print(f"- {key}: {ctx.get(key, '—')}")
print(f"- load average reported by Google Benchmark: {ctx.get('load_avg', '—')}; {load_after}")
print("- OpenMP threads: all cores unless omp_num_threads is set; the machine is shared, so a load")
print("  above the core count means other jobs ran at the same time and absolute times are")
print("  inflated: read the ratios, which come from one interleaved run.")
if profile_section(out):
    print("\n" + profile_section(out).rstrip())
if notes_link(out):
    print("\n" + notes_link(out))
