#!/usr/bin/python3
"""Renders DIR/README.md's table from DIR/rows.csv and DIR/context.json (training_speed.py).

Usage: benchmarks/render_training_speed.py DIR
Per model and N: the median over rounds of each side's step time (each round's value is itself a
median of steps), PyTorch / attnlab, and attnlab's split of its step; a link to DIR/notes.md, the
findings written by hand, when there is one.
"""
import csv
import json
import pathlib
import statistics
import sys

from report_parts import notes_link


def step_table(rows):
    """Per model and N (rows of rows.csv): the model's words, N, each side's median step time in
    seconds and attnlab's split of its step in percent. scripts/render-readme.py reads it too."""
    # Older rows.csv have neither arch nor kv_heads: the 2017 model, as many KV heads as heads.
    arch = lambda r: r.get("arch") or "transformer"  # noqa: E731
    keys = sorted({(arch(r), int(r["layers"]), int(r["d_model"]), int(r["heads"]),
                    int(r.get("kv_heads") or r["heads"]), int(r["ffn"]), int(r["n"]))
                   for r in rows})
    table = []
    for kind, layers, dm, heads, kv, ffn, n in keys:
        mine = [r for r in rows if (arch(r), int(r["layers"]), int(r["d_model"]), int(r["n"])) ==
                (kind, layers, dm, n)]
        med = lambda side, col: statistics.median(float(r[col]) for r in mine if r["side"] == side)
        ours = med("attnlab", "step_s")
        words = f"{heads} heads, FFN {ffn}" if kind == "transformer" else \
            f"Llama-style, {heads} query / {kv} KV heads, SwiGLU {ffn}"
        table.append({"model": f"{layers} layers, d_model {dm}, {words}, batch "
                               f"{mine[0]['batch']}",
                      "layers": layers, "d_model": dm, "n": n, "attnlab_s": ours,
                      "torch_s": med("torch", "step_s"),
                      **{part: 100 * med("attnlab", f"{part}_s") / ours
                         for part in ("attention", "gemm", "rest")}})
    return table


def main():
    d = pathlib.Path(sys.argv[1])
    rows = list(csv.DictReader(open(d / "rows.csv")))
    c = json.loads((d / "context.json").read_text())
    blas = c.get("attnlab_blas", {})
    # Each side's OpenBLAS build, where the context records it (attnlab's since bb2c59b,
    # PyTorch's since e922664)
    our_build = f", {blas['threading']} build" if "threading" in blas else ""
    torch_build = ""
    if "torch_openblas_config" in c:
        torch_build = ", OpenMP build" if "USE_OPENMP" in c["torch_openblas_config"] else \
            ", pthreads build"
    big = "" if c.get("arch") == "llama" else \
        f" ({c['big_rounds']} round of {c['big_steps']} for the 4-layer model at N = 1024)"
    lines = [
        "# A training step: attnlab against PyTorch",
        "",
        f"`benchmarks/training_speed.py` at {c['git_commit']}, {c['date']}: {c['cpu']}, "
        f"{c['threads']} threads on both sides; OpenBLAS core {blas.get('corename', '?')} for "
        f"attnlab ({blas.get('core_source', '?')}{our_build}), {c['torch_openblas_core']}"
        f"{torch_build} for PyTorch "
        f"{c['torch']} (OPENBLAS_CORETYPE {c['OPENBLAS_CORETYPE'] or 'unset'}); kernels "
        f"{c.get('attnlab_kernels', '?')}. {c['rounds']} rounds, attnlab and PyTorch in turn, each "
        f"the median of {c['steps']} steps{big}; load average {' '.join(c['load_before'])} before, "
        f"{' '.join(c['load_after'])} after (each round's load is in rows.csv).",
        "",
        "| model | N | attnlab step | PyTorch step | PyTorch / attnlab | attnlab: attention | "
        "GEMMs | rest |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for step in step_table(rows):
        lines.append(f"| {step['model']} | {step['n']} | {step['attnlab_s'] * 1e3:.1f} ms | "
                     f"{step['torch_s'] * 1e3:.1f} ms | {step['torch_s'] / step['attnlab_s']:.2f}x | "
                     f"{step['attention']:.0f}% | {step['gemm']:.0f}% | {step['rest']:.0f}% |")
    lines.append("")
    lines.append("The split is training::measure_split's: the time inside the step's attention "
                 "cores and inside its GEMMs, as the layers time them in the step "
                 "(models/step_clock.hpp), the rest what remains of the step.")
    if notes_link(d):
        lines += ["", notes_link(d)]
    (d / "README.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
