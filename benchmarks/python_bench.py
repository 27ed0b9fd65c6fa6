#!/usr/bin/python3
"""The Python package's costs, measured as ratios within one run (results/python/).

Usage: PYTHONPATH=build/python benchmarks/python_bench.py OUT_DIR [--threads 2] [--rounds 5]
          [--torch-n 1024,2048,4096,8192]
Writes OUT_DIR/bench.json (every timing, with the context: commit, CPU, BLAS, threads, load
before and after, date) and OUT_DIR/tables.md. Each comparison alternates its contestants round
by round and reports medians, so a change of the machine's load hits both alike.

  overhead   a tiny problem (1 x 1 x 16 x 16, full, one thread in a process of its own):
             make(spec).forward from Python against the
             same forward from C++ (Backend._time_cpp_forward: a fresh output per call, as the
             Python call returns one), per call; and attnlab.attention (which builds the backend).
  n4096      B 1, H 8, N 4096, D 64, full: the Python call against the C++ call.
  torch      attnlab.torch.attention(spec="full") forward + backward against torch's own
             attention (torch 1.13's F._scaled_dot_product_attention, dense) at B 1, H 8, D 64.
  training   one Adam step of examples/torch_copy.py's model (2 layers, d_model 64, 4 heads,
             batch 8) at N 512 and 1024 with attnlab (spec full) and with torch's attention.
"""
import argparse
import datetime
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

import attnlab
import attnlab.torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def context(threads):
    def run(*args):
        try:
            return subprocess.run(args, capture_output=True, text=True, cwd=ROOT).stdout.strip()
        except OSError:
            return "unknown"
    dirty = subprocess.run(["git", "diff", "--quiet", "--", "python", "lib", "variants",
                            "benchmarks/python_bench.py", "examples"], cwd=ROOT).returncode
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), platform.processor())
    return {"commit": run("git", "rev-parse", "--short", "HEAD") + ("-dirty" if dirty else ""),
            "cpu": f"{cpu} x {os.cpu_count()}", "python": sys.version.split()[0],
            "numpy": np.__version__, "torch": torch.__version__,
            "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", "unset"),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "unset"),
            "torch_threads": threads, "load_before": open("/proc/loadavg").read().split()[:3],
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def seconds(fn, calls):
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def alternate(rounds, contestants):
    """{name: median seconds} over rounds, contestants taking turns in each round."""
    times = {name: [] for name in contestants}
    for _ in range(rounds):
        for name, measure in contestants.items():
            times[name].append(measure())
    return {name: statistics.median(t) for name, t in times.items()}, times


def overhead(rounds):
    """Per-call times on 1 x 1 x 16 x 16 (full): Python and C++."""
    q = np.random.default_rng(0).standard_normal((1, 1, 16, 16), dtype=np.float32)
    full, no_mask, calls = attnlab.make("full"), attnlab._core.Mask(), 20000
    med, raw = alternate(rounds, {
        "python_forward": lambda: seconds(lambda: full.forward(q, q, q), calls),
        "python_attention": lambda: seconds(lambda: attnlab.attention(q, q, q), calls),
        "cpp_forward": lambda: full._backend._time_cpp_forward(q, q, q, no_mask, calls),
    })
    return {"shape": [1, 1, 16, 16], "omp_num_threads": 1, "calls_per_round": calls,
            "median_s": med, "rounds_s": raw,
            "overhead_us": (med["python_forward"] - med["cpp_forward"]) * 1e6}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--torch-n", default="1024,2048,4096,8192")
    p.add_argument("--overhead-only", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.overhead_only:
        print(json.dumps(overhead(a.rounds)))
        return
    if os.environ.get("OMP_NUM_THREADS") != str(a.threads):
        sys.exit(f"set OMP_NUM_THREADS={a.threads} (attnlab's threads) to match --threads")
    torch.set_num_threads(a.threads)
    os.makedirs(a.out, exist_ok=True)
    result = {"context": context(a.threads)}
    r = np.random.default_rng(0)
    no_mask = attnlab._core.Mask()

    # Call overhead on a tiny problem, in a process of its own with one OpenMP thread: the
    # Python side's cost does not depend on the threads, and waking a team of two on a loaded
    # machine costs more than the call.
    child = subprocess.run([sys.executable, os.path.abspath(__file__), "--overhead-only",
                            "--rounds", str(a.rounds), a.out],
                           env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True,
                           text=True, check=True)
    result["overhead"] = json.loads(child.stdout)
    print("overhead", result["overhead"]["overhead_us"], "us", flush=True)
    full = attnlab.make("full")

    # N = 4096: the Python call against the C++ call.
    q, k, v = (r.standard_normal((1, 8, 4096, 64), dtype=np.float32) for _ in range(3))
    med, raw = alternate(a.rounds, {
        "python": lambda: seconds(lambda: full.forward(q, k, v), 2),
        "cpp": lambda: full._backend._time_cpp_forward(q, k, v, no_mask, 2),
    })
    result["n4096"] = {"shape": [1, 8, 4096, 64], "median_s": med, "rounds_s": raw,
                       "python_over_cpp": med["python"] / med["cpp"]}
    print("n4096", result["n4096"]["python_over_cpp"], flush=True)

    # attnlab.torch against torch's own attention, forward + backward.
    result["torch"] = []
    for n in [int(x) for x in a.torch_n.split(",")]:
        xs = [torch.randn(1, 8, n, 64, requires_grad=True) for _ in range(3)]
        grad = torch.randn(1, 8, n, 64)

        def ours():
            out = attnlab.torch.attention(*xs, spec=full)
            out.backward(grad)

        def theirs():
            out, _ = torch.nn.functional._scaled_dot_product_attention(
                *(x.view(8, n, 64) for x in xs), None, 0.0, False, False)
            out.backward(grad.view(8, n, 64))

        ours(), theirs()  # warm-up
        med, raw = alternate(a.rounds, {"attnlab": lambda: seconds(ours, 1),
                                        "torch": lambda: seconds(theirs, 1)})
        result["torch"].append({"n": n, "median_s": med, "rounds_s": raw,
                                "speedup": med["torch"] / med["attnlab"]})
        print("torch", n, result["torch"][-1]["speedup"], flush=True)
        del xs, grad

    # A training step of the example model with each attention.
    spec = importlib.util.spec_from_file_location("torch_copy",
                                                  os.path.join(ROOT, "examples", "torch_copy.py"))
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    result["training"] = []
    for n in (512, 1024):
        models = {}
        for kind in ("attnlab", "torch"):
            torch.manual_seed(1)
            model = example.Model(n, 10, kind, "full")
            models[kind] = (model, torch.optim.Adam(model.parameters(), lr=1e-3))
        x, y = example.copy_batch(torch.Generator().manual_seed(1), 8, n)

        def step(kind):
            model, optimizer = models[kind]
            loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, 10), y.reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        step("attnlab"), step("torch")
        med, raw = alternate(a.rounds, {k: (lambda k=k: seconds(lambda: step(k), 2))
                                        for k in ("attnlab", "torch")})
        result["training"].append({"n": n, "batch": 8, "median_s": med, "rounds_s": raw,
                                   "speedup": med["torch"] / med["attnlab"]})
        print("training", n, result["training"][-1]["speedup"], flush=True)

    result["context"]["load_after"] = open("/proc/loadavg").read().split()[:3]
    with open(os.path.join(a.out, "bench.json"), "w") as f:
        json.dump(result, f, indent=1)
    c = result["context"]
    o, n4 = result["overhead"], result["n4096"]
    lines = [
        f"Measured at {c['commit']} on {c['cpu']}, {c['date']}, {c['torch_threads']} threads "
        f"(OMP_NUM_THREADS={c['omp_num_threads']}, torch.set_num_threads), OPENBLAS_CORETYPE="
        f"{c['openblas_coretype']}, load {' '.join(c['load_before'])} before, "
        f"{' '.join(c['load_after'])} after; torch {c['torch']}, numpy {c['numpy']}. "
        f"Medians of {a.rounds} alternating rounds.", "",
        "| call overhead (1x1x16x16, full, 1 thread) | per call |", "|---|---|",
        f"| C++ forward | {o['median_s']['cpp_forward'] * 1e6:.1f} us |",
        f"| Python make(spec).forward | {o['median_s']['python_forward'] * 1e6:.1f} us |",
        f"| Python attnlab.attention (builds the backend) | "
        f"{o['median_s']['python_attention'] * 1e6:.1f} us |",
        f"| overhead of the Python call | **{o['overhead_us']:.1f} us** |", "",
        "| N = 4096, B 1, H 8, D 64, full | forward |", "|---|---|",
        f"| C++ | {n4['median_s']['cpp'] * 1e3:.1f} ms |",
        f"| Python | {n4['median_s']['python'] * 1e3:.1f} ms |",
        f"| Python / C++ | **{n4['python_over_cpp']:.3f}** |", "",
        "| forward + backward, B 1, H 8, D 64 | attnlab.torch (full) | torch "
        "_scaled_dot_product_attention | speed-up |", "|---|---|---|---|"]
    lines += [f"| N = {t['n']} | {t['median_s']['attnlab'] * 1e3:.0f} ms | "
              f"{t['median_s']['torch'] * 1e3:.0f} ms | **{t['speedup']:.2f}x** |"
              for t in result["torch"]]
    lines += ["", "| training step, examples/torch_copy.py model, batch 8 | attnlab (full) | "
              "torch attention | speed-up |", "|---|---|---|---|"]
    lines += [f"| N = {t['n']} | {t['median_s']['attnlab'] * 1e3:.0f} ms | "
              f"{t['median_s']['torch'] * 1e3:.0f} ms | **{t['speedup']:.2f}x** |"
              for t in result["training"]]
    with open(os.path.join(a.out, "tables.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
