#!/usr/bin/python3
"""Renders results/full/README.md from bench_full.json, bench_full_long.json and numpy.json."""
import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
bench = json.loads((out / "bench_full.json").read_text())
long_run = json.loads((out / "bench_full_long.json").read_text())
numpy = json.loads((out / "numpy.json").read_text())

runs = {}
sgemm = {}
for b in bench["benchmarks"]:
    if b.get("run_type") != "iteration":
        continue
    name = b["name"]
    if name.startswith("BM_full/"):
        n = int(name.split("N:")[1].split("/")[0])
        causal = name.split("causal:")[1].split("/")[0] == "1"
        runs[(n, causal)] = (b["real_time"] / 1e3, b["FLOPS"] / 1e9)  # ms -> s
    elif "BM_sgemm" in name:
        shape = name.split("BM_sgemm/")[1].split("/real_time")[0]
        sgemm[shape] = b["FLOPS"] / 1e9
numpy_s = {r["n"]: r["seconds"] for r in numpy["rows"]}
ctx = bench["context"]

attention_shape = sgemm.get("m:4096/n:4096/k:64")
square = sgemm.get("m:2048/n:2048/k:2048")
print("# Exact attention (`full`): speed against OpenBLAS sgemm and NumPy\n")
print("Regenerate: `benchmarks/run_full.sh [build-dir]`. B = 1, H = 8, D = 64, float32. Times are")
print("medians of Google Benchmark's repetitions (real time); GFLOP/s counts 4·H·pairs·D useful")
print("FLOPs (pairs = N² plain, N(N+1)/2 causal). Ratios come from one run of one binary; NumPy")
print("ran right after it in the same session.\n")
print("| N | full ms | GFLOP/s | causal ms | causal / plain | NumPy ms | speed-up vs NumPy |")
print("|---|---|---|---|---|---|---|")
for n in sorted({n for n, _ in runs}):
    t, g = runs[(n, False)]
    tc, _ = runs.get((n, True), (float("nan"), 0))
    np_t = numpy_s.get(n)
    np_cell = f"{np_t * 1e3:.1f}" if np_t else "—"
    up = f"{np_t / t:.1f}x" if np_t else "—"
    print(f"| {n} | {t * 1e3:.1f} | {g:.1f} | {tc * 1e3:.1f} | {tc / t:.2f} | {np_cell} | {up} |")

t4, g4 = runs[(4096, False)]
tc4, _ = runs[(4096, True)]
mem = long_run["benchmarks"][0]
checks = [
    ("N = 4096 GFLOP/s / sgemm 4096x4096x64 (the attention's own shape)",
     g4 / attention_shape, ">= 0.6"),
    ("N = 4096 GFLOP/s / sgemm 2048³ (BLAS best case)", g4 / square, "(reference)"),
    ("NumPy time / full time at N = 4096", numpy_s[4096] / t4, ">= 2.5"),
    ("causal time / plain time at N = 4096", tc4 / t4, "<= 0.6"),
    ("peak resident memory at N = 32768 (MiB)", mem["peak_rss_MiB"], "<= 1024"),
]
print("\n| measure | value | target |\n|---|---|---|")
for what, value, target in checks:
    print(f"| {what} | {value:.2f} | {target} |")
print(f"\nsgemm in the same run: {attention_shape:.1f} GFLOP/s at 4096x4096x64, "
      f"{square:.1f} GFLOP/s at 2048³. N = 32768 took {mem['real_time']:.1f} s.\n")
print("## Context\n")
for key in ["date", "host_name", "num_cpus", "mhz_per_cpu", "git_commit", "compiler",
            "openblas_coretype", "load_before"]:
    print(f"- {key}: {ctx.get(key, '—')}")
print(f"- Google Benchmark's own library build (Debian package): {ctx.get('library_build_type', '—')};"
      " attnlab itself is built with buildtype=release")
print(f"- load average reported by Google Benchmark: {ctx.get('load_avg', '—')}")
print(f"- NumPy {numpy['numpy']}, BLAS: "
      f"{', '.join(i.get('internal_api', '') + ' ' + str(i.get('num_threads', '')) for i in numpy['blas']) or 'threadpoolctl not installed'}")
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"- CPU: {cpu}; compiled with -O3 -march=native (meson option native=true), OpenMP threads = cores")
