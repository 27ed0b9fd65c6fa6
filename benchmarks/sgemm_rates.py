"""The sgemm yardsticks of one Google Benchmark JSON (benchmarks/common.hpp register_sgemm):
medians per (shape, label), the best of all (OpenBLAS's best kernels for the CPU) and the best
with this environment's OPENBLAS_CORETYPE (in-process), and their Markdown table."""
import statistics


def sgemm_rates(bench):
    """Returns (rates, best, best_at, env): rates maps (shape "MxNxK", label) to the median
    GFLOP/s; best_at is the (shape, label) of the best rate; env the best in-process rate."""
    samples = {}
    for b in bench["benchmarks"]:
        if b.get("run_type") != "iteration" or b.get("error_occurred"):
            continue
        if "BM_sgemm" not in b["run_name"]:
            continue
        shape = "x".join(p.split(":")[1] for p in b["run_name"].split("/") if p[:2] in ("m:", "n:", "k:"))
        samples.setdefault((shape, b.get("label", "")), []).append(b["FLOPS"] / 1e9)
    rates = {key: statistics.median(v) for key, v in samples.items()}
    best, best_at = max((g, key) for key, g in rates.items())
    env = max(g for (_, label), g in rates.items() if label.startswith("in-process"))
    return rates, best, best_at, env


def sgemm_table(rates, best, best_at, env):
    """Markdown: the yardsticks of the run, one column per core type, then the two rates used."""
    labels = sorted({label for _, label in rates})
    lines = ["| sgemm shape | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
    for shape in sorted({s for s, _ in rates}, reverse=True):
        lines.append(f"| {shape} | " + " | ".join(
            f"{rates[(shape, l)]:.1f}" if (shape, l) in rates else "—" for l in labels) + " |")
    lines.append("")
    lines.append(f"**Best sgemm: {best:.1f} GFLOP/s** ({best_at[1]}, {best_at[0]}); with the "
                 f"environment's core type at best {env:.1f} GFLOP/s.")
    return "\n".join(lines)
