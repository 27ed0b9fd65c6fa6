#!/usr/bin/python3
"""Renders results/sliding/README.md from bench_sliding.json and bench_sliding_long.json."""
import json
import sys
from pathlib import Path

from report_parts import met, notes_link, profile_section
from sgemm_rates import sgemm_rates, sgemm_table

out = Path(sys.argv[1])
bench = json.loads((out / "bench_sliding.json").read_text())
long_run = json.loads((out / "bench_sliding_long.json").read_text())
ctx = dict(bench["context"])
for line in (out / "context.txt").read_text().splitlines():  # values that contain '='
    key, _, value = line.partition(": ")
    ctx[key] = value


def median_rows(data):
    """run_name -> the median aggregate (or the single iteration row without repetitions)."""
    rows = {}
    for b in data["benchmarks"]:
        if b.get("aggregate_name") == "median" or (b.get("run_type") == "iteration"
                                                    and b.get("repetitions", 1) <= 1):
            rows[b["run_name"]] = b
    return rows


rows = median_rows(bench)
fitted = {b["name"]: b for b in bench["benchmarks"] if b.get("aggregate_name") in ("BigO", "RMS")}


def series(prefix):
    """N -> (seconds, useful GFLOP/s) for BM_<prefix>/N:<n>/real_time."""
    result = {}
    for name, b in rows.items():
        if name.startswith(prefix + "/N:"):
            n = int(name.split("N:")[1].split("/")[0])
            result[n] = (b["real_time"] / 1e3, b["FLOPS"] / 1e9)  # ms -> s
    return result


sliding, full, dilated = series("BM_sliding"), series("BM_full"), series("BM_sliding_dilated")
rates, best, best_at, env = sgemm_rates(bench)

print("# Sliding-window attention (`sliding:left=128,right=128`): speed against full attention and sgemm\n")
print("Regenerate: `benchmarks/run_sliding.sh [build-dir]`. B = 1, H = 8, D = 64, float32, no")
print("mask; every forward writes into one output kept across iterations (kernels are timed, not")
print("the page faults of a fresh output). Times are medians of 5 repetitions (real time), run in")
print("random interleaved order with the sgemm yardsticks.")
print("Useful GFLOP/s counts only the attended (query, key) pairs, 4·H·D per pair")
print("(`SlidingAttention::flops`); the kernel computes about 280 keys per query for 257 useful")
print("ones (24-query tiles), the rest is not counted. Every ratio comes from one run of one")
print("binary (`bench_sliding`); the N = 65536 memory from its own process.\n")
print("sgemm yardsticks in the same run, GFLOP/s (the environment's `OPENBLAS_CORETYPE` in-process,")
print("the others in child processes, `benchmarks/sgemm_probe`):\n")
print(sgemm_table(rates, best, best_at, env) + "\n")
print("| N | sliding ms | useful GFLOP/s | / best sgemm | / env sgemm | full ms | full / sliding |")
print("|---|---|---|---|---|---|---|")
for n in sorted(sliding):
    t, g = sliding[n]
    ft = full.get(n)
    full_cells = f"{ft[0] * 1e3:.1f} | {ft[0] / t:.1f}x" if ft else "— | —"
    print(f"| {n} | {t * 1e3:.1f} | {g:.1f} | {g / best:.2f} | {g / env:.2f} | {full_cells} |")

mem = long_run["benchmarks"][0]
t4, t64 = sliding[4096][0], sliding[65536][0]
worst = min(g for _, g in sliding.values())
slowest_vs_full = min(full[n][0] / sliding[n][0] for n in full if n in sliding)
checks = [
    ("time(N = 65536) / time(N = 4096) (linear: 16)", t64 / t4, "<= 19"),
    ("lowest useful GFLOP/s over N / best sgemm", worst / best, ">= 0.5"),
    ("same, against the environment's sgemm", worst / env, "(reference)"),
    (f"full time / sliding time, lowest over N = {min(full)} ... {max(full)}", slowest_vs_full, "> 1"),
    ("peak resident memory of one N = 65536 call, own process (MiB)", mem["peak_rss_MiB"], "<= 1024"),
]


print("\n| measure | value | target | met |\n|---|---|---|---|")
for what, value, target in checks:
    print(f"| {what} | {value:.2f} | {target} | {met(value, target)} |")

big_o = fitted.get("BM_sliding/real_time_BigO")
rms = fitted.get("BM_sliding/real_time_RMS")
if big_o and rms:
    print(f"\nGoogle Benchmark's O(N) fit of the sliding times: {big_o['real_coefficient']:.4g} "
          f"{big_o['time_unit']}·N, RMS {rms['rms'] * 100:.0f} %.")
print(f"The N = 65536 call alone took {mem['real_time']:.0f} ms.\n")
if dilated:
    print("The dilated path (`dilation=4,global=16`: residue classes gathered, 16 global tokens),")
    print("same run: " + ", ".join(f"N = {n}: {t * 1e3:.1f} ms, {g:.1f} useful GFLOP/s "
                                    f"({t / sliding[n][0]:.2f}x the undilated time)"
                                    for n, (t, g) in sorted(dilated.items())) + ".\n")
print("## Context\n")
for key in ["date", "host_name", "num_cpus", "mhz_per_cpu", "git_commit", "compiler", "flags",
            "kernels", "openblas_coretype", "omp_num_threads", "load_before", "load_after"]:
    print(f"- {key}: {ctx.get(key, '—')}")
print(f"- load average reported by Google Benchmark at start: {ctx.get('load_avg', '—')}")
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"- CPU: {cpu}")
print("- The machine is shared: a load average above the core count means other jobs ran at the")
print("  same time, so absolute times are pessimistic and ratios carry that noise.")
if profile_section(out):
    print("\n" + profile_section(out).rstrip())
if notes_link(out):
    print("\n" + notes_link(out))
