#!/usr/bin/python3
"""Renders results/microbench/bench_variants.json (Google Benchmark) as a markdown table:
time, GFLOP/s and its fraction of the same run's sgemm rate, error counters, and the fitted
complexity of each spec. Usage: render_microbench.py DIR > DIR/README.md"""
import json
import os
import sys

d = sys.argv[1] if len(sys.argv) > 1 else "results/microbench"
data = json.load(open(os.path.join(d, "bench_variants.json")))
ctx = data["context"]
runs = [b for b in data["benchmarks"] if b.get("run_type") == "iteration"]
big_o = {b["run_name"].split("/")[0]: b["big_o"] for b in data["benchmarks"]
         if b.get("aggregate_name") == "BigO"}
sgemm = {b["name"]: b.get("FLOPS", 0) / 1e9 for b in runs if b["name"].startswith("BM_sgemm")}
yard = next((v for k, v in sgemm.items() if "m:4096/n:4096/k:64" in k), None)

print("# Microbenchmarks: every registered variant (benchmarks/bench_variants.cpp)\n")
print("B = 1, H = 8, D = 64, gaussian inputs, no mask; error on 32 seeded query rows against the "
      "fp64 reference. One run of one binary; regenerate with `benchmarks/run_microbench.sh "
      "BUILD_DIR` (or `scripts/regenerate-results.sh BUILD_DIR micro`).\n")
print("Context: date %s, host %s, %s CPUs, git %s, %s, OpenBLAS %s (core %s, OPENBLAS_CORETYPE %s). "
      "Load average before the run %s, after: %s." % (
          ctx.get("date"), ctx.get("host_name"), ctx.get("num_cpus"), ctx.get("git_commit"),
          ctx.get("compiler"), ctx.get("openblas_config"), ctx.get("openblas_corename"),
          ctx.get("openblas_coretype_env"), ctx.get("load_before"),
          open(os.path.join(d, "load_after.txt")).read().strip().replace("load after: ", "")
          if os.path.exists(os.path.join(d, "load_after.txt")) else "not recorded"))
print("\n**The machine was shared and heavily loaded during this run (load average far above its "
      "2 cores)**: absolute times are inflated and wall time far exceeds CPU time; read ratios "
      "within the run, and even those with caution.\n")
print("sgemm yardstick (same run): " + ", ".join("%s %.1f GFLOP/s" % (k.split("/", 1)[1].replace("/real_time", ""), v)
                                              for k, v in sgemm.items()) + ".\n")
print("| spec | fitted | N | time (ms) | GFLOP/s | of sgemm 4096x4096x64 | rel_fro | mean_cos | process peak RSS so far, MiB |")
print("|---|---|---|---|---|---|---|---|---|")
for b in runs:
    if not b["name"].startswith("BM_attention"):
        continue
    family = b["run_name"].split("/")[0]
    spec = family[len("BM_attention<"):-1]
    n = b["name"].split("/N:")[1].split("/")[0]
    if b.get("error_occurred"):
        print("| `%s` | | %s | %s | | | | | |" % (spec, n, "error: " + b.get("error_message", "")))
        continue
    flops = b.get("FLOPS")
    gf = "%.2f" % (flops / 1e9) if flops else "—"
    frac = "%.2f" % (flops / 1e9 / yard) if flops and yard else "—"
    print("| `%s` | %s | %s | %.3g | %s | %s | %.3g | %.4f | %.0f |" % (
        spec, big_o.get(family, ""), n, b["real_time"], gf, frac, b["rel_fro"], b["mean_cos"],
        b["peak_rss_MiB"]))
