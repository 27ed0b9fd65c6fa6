#!/usr/bin/python3
"""Renders DIR/README.md's table from DIR/rows.csv and DIR/context.json (training_speed.py).

Usage: benchmarks/render_training_speed.py DIR [NOTES.md]
Per model and N: the median over rounds of each side's step time (each round's value is itself a
median of steps), PyTorch / attnlab, and attnlab's split of its step. NOTES.md, when given, is
appended as it is.
"""
import csv
import json
import pathlib
import statistics
import sys


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
    lines = [
        "# A training step: attnlab against PyTorch",
        "",
        f"`benchmarks/training_speed.py` at {c['git_commit']}, {c['date']}: {c['cpu']}, "
        f"{c['threads']} threads on both sides; OpenBLAS core {blas.get('corename', '?')} for "
        f"attnlab ({blas.get('core_source', '?')}{our_build}), {c['torch_openblas_core']}"
        f"{torch_build} for PyTorch "
        f"{c['torch']} (OPENBLAS_CORETYPE {c['OPENBLAS_CORETYPE'] or 'unset'}); kernels "
        f"{c.get('attnlab_kernels', '?')}. {c['rounds']} rounds, attnlab and PyTorch in turn, each "
        f"the median of {c['steps']} steps ({c['big_rounds']} round of {c['big_steps']} for the "
        f"4-layer model at N = 1024); load average {' '.join(c['load_before'])} before, "
        f"{' '.join(c['load_after'])} after (each round's load is in rows.csv).",
        "",
        "| model | N | attnlab step | PyTorch step | PyTorch / attnlab | attnlab: attention | "
        "GEMMs | rest |",
        "|---|---|---|---|---|---|---|---|",
    ]
    keys = sorted({(int(r["layers"]), int(r["d_model"]), int(r["heads"]), int(r["ffn"]),
                    int(r["n"])) for r in rows})
    for layers, dm, heads, ffn, n in keys:
        mine = [r for r in rows if (int(r["layers"]), int(r["d_model"]), int(r["n"])) ==
                (layers, dm, n)]
        med = lambda side, col: statistics.median(float(r[col]) for r in mine if r["side"] == side)
        ours, theirs = med("attnlab", "step_s"), med("torch", "step_s")
        part = lambda col: f"{100 * med('attnlab', col) / ours:.0f}%"
        lines.append(f"| {layers} layers, d_model {dm}, {heads} heads, FFN {ffn}, batch "
                     f"{mine[0]['batch']} | {n} | {ours * 1e3:.1f} ms | {theirs * 1e3:.1f} ms | "
                     f"{theirs / ours:.2f}x | {part('attention_s')} | {part('gemm_s')} | "
                     f"{part('rest_s')} |")
    lines.append("")
    lines.append("The split is training::measure_split's: the step's attention calls and its GEMMs "
                 "timed alone at the step's shapes, the rest what remains of the step.")
    if len(sys.argv) > 2:
        lines += ["", pathlib.Path(sys.argv[2]).read_text().rstrip()]
    (d / "README.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
