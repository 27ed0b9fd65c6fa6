#!/usr/bin/python3
"""Renders results/full/README.md from bench_full.json, bench_full_long.json, numpy.json,
load_after.txt and a link to the hand-written analysis
notes.md (profile and discussion) when there is one."""
import json
import statistics
import sys
from pathlib import Path

from report_parts import notes_link, profile_section
from sgemm_rates import sgemm_rates, sgemm_table

out = Path(sys.argv[1])
bench = json.loads((out / "bench_full.json").read_text())
long_run = json.loads((out / "bench_full_long.json").read_text())
numpy = json.loads((out / "numpy.json").read_text())
ctx = bench["context"]

# Medians over the repetitions of each benchmark (iteration rows only).
samples = {}
for b in bench["benchmarks"]:
    if b.get("run_type") == "iteration" and not b.get("error_occurred"):
        samples.setdefault(b["run_name"], []).append(b)


def median(rows, key):
    return statistics.median(r[key] for r in rows)


NAN = (float("nan"), float("nan"))
runs = {}        # (N, causal, D, path) -> (seconds, GFLOP/s)
for name, rows in samples.items():
    if name.startswith("BM_full"):
        args = dict(part.split(":") for part in name.split("/")[1:] if ":" in part)
        key = (int(args["N"]), args["causal"] == "1", int(args["D"]), rows[0]["label"])
        runs[key] = (median(rows, "real_time") / 1e3, median(rows, "FLOPS") / 1e9)

fastest = ctx.get("kernels", "?")
rates, best_sgemm, best_at, env_sgemm = sgemm_rates(bench)

print("# Exact attention (`full`): speed against OpenBLAS sgemm and NumPy\n")
reps = max(len(rows) for rows in samples.values())
print("Regenerate: `benchmarks/run_full.sh [build-dir]`. B = 1, H = 8, float32. Times are medians")
print(f"of {reps} repetitions run in random interleaved order with the sgemm yardsticks (real time);")
print("GFLOP/s counts 4·H·pairs·D useful FLOPs (pairs = N² plain, N(N+1)/2 causal). Every ratio")
print("comes from this one run of one binary; NumPy ran right after it in the same session.\n")
print("sgemm yardsticks in the same run, GFLOP/s (the environment's `OPENBLAS_CORETYPE` in-process,")
print("the others in child processes started per repetition, `benchmarks/sgemm_probe`):\n")
print(sgemm_table(rates, best_sgemm, best_at, env_sgemm) + "\n")
print(f"Kernel path `{fastest}`, D = 64:\n")
print("| N | full ms | GFLOP/s | / best sgemm | / env sgemm | causal ms | causal / plain | NumPy ms | speed-up vs NumPy |")
print("|---|---|---|---|---|---|---|---|---|")
numpy_s = {r["n"]: r["seconds"] for r in numpy["rows"]}
for n in sorted({k[0] for k in runs if k[2] == 64 and k[3] == fastest}):
    t, g = runs.get((n, False, 64, fastest), NAN)
    tc, _ = runs.get((n, True, 64, fastest), (float("nan"), 0))
    np_t = numpy_s.get(n)
    np_cell = f"{np_t * 1e3:.1f}" if np_t else "—"
    up = f"{np_t / t:.1f}x" if np_t else "—"
    print(f"| {n} | {t * 1e3:.1f} | {g:.1f} | {g / best_sgemm:.2f} | {g / env_sgemm:.2f} | "
          f"{tc * 1e3:.1f} | {tc / t:.2f} | {np_cell} | {up} |")

print("\nOther settings in the same run:\n")
print("| setting | N | ms | GFLOP/s | / best sgemm | / env sgemm |")
print("|---|---|---|---|---|---|")
for (n, causal, d, path), (t, g) in sorted(runs.items()):
    if d == 64 and path == fastest:
        continue
    what = f"`{path}`, D = {d}" + (", causal" if causal else "")
    print(f"| {what} | {n} | {t * 1e3:.1f} | {g:.1f} | {g / best_sgemm:.2f} | {g / env_sgemm:.2f} |")


def gflops(n, d=64, causal=False, path=fastest):
    return runs.get((n, causal, d, path), NAN)[1]


def seconds(n, d=64, causal=False, path=fastest):
    return runs.get((n, causal, d, path), NAN)[0]


mem = long_run["benchmarks"][0]
checks = [(f"N = {n}: GFLOP/s / best sgemm", gflops(n) / best_sgemm, ">= 0.6", gflops(n) / best_sgemm >= 0.6)
          for n in (4096, 16384)]
checks += [(f"N = {n}: causal time / plain time", seconds(n, causal=True) / seconds(n), "<= 0.55",
            seconds(n, causal=True) / seconds(n) <= 0.55) for n in (4096, 16384)]
checks += [(f"N = {n}: GFLOP/s at D = 128 / at D = 64", gflops(n, 128) / gflops(n), ">= 0.85",
            gflops(n, 128) / gflops(n) >= 0.85) for n in (4096, 16384)]
ab_file = out / "avx2_vs_before.json"
if ab_file.exists():  # benchmarks/ab_avx2.sh: alternating rounds against the earlier build
    ab = json.loads(ab_file.read_text())
    for name, sides in ab["times"].items():
        ratio = statistics.median(sides["old"]) / statistics.median(sides["new"])
        checks.append((f"N = {ab['N']}, {name}: earlier build's time / `avx2` path's time (median "
                       f"of {len(sides['new'])} alternating rounds)", ratio, ">= 1", ratio >= 1))
numpy_up = numpy_s.get(4096, float("nan")) / seconds(4096)
checks.append(("NumPy time / full time at N = 4096", numpy_up, ">= 2.5", numpy_up >= 2.5))
checks.append(("peak resident memory at N = 32768 (MiB)", mem["peak_rss_MiB"], "<= 1024",
               mem["peak_rss_MiB"] <= 1024))
print("\n| measure | value | target | met |\n|---|---|---|---|")
for what, value, target, met in checks:
    print(f"| {what} | {value:.2f} | {target} | {'—' if met is None else 'yes' if met else 'NO'} |")
print(f"\nN = 32768 took {mem['real_time']:.1f} s (alone in its process).")
if ab_file.exists():
    print(f"The earlier build: `{ab['old_build']}` (`benchmarks/ab_avx2.sh`), load "
          f"{ab['load_before']} before and {ab['load_after']} after its rounds.")
print()

print("## Context\n")
for key in ["date", "host_name", "cpu", "num_cpus", "mhz_per_cpu", "git_commit", "compiler",
            "kernels", "openblas_coretype", "omp_num_threads", "load_before"]:
    print(f"- {key}: {ctx.get(key, '—')}")
after = out / "load_after.txt"
if after.exists():
    print(f"- {after.read_text().strip()}")
print(f"- Google Benchmark's own library build (Debian package): {ctx.get('library_build_type', '—')};"
      " attnlab itself is built with buildtype=release")
print(f"- NumPy {numpy['numpy']}, BLAS: "
      f"{', '.join(i.get('internal_api', '') + ' ' + str(i.get('num_threads', '')) for i in numpy['blas']) or 'threadpoolctl not installed'}")
if profile_section(out):
    print("\n" + profile_section(out).rstrip())
if notes_link(out):
    print("\n" + notes_link(out))
