"""Pieces shared by the results renderers: the medians of a Google Benchmark run, whether a
target is met, the masks run's reference times, the "where the time goes" section from the
profiles the run scripts saved, and the link to a folder's hand-written findings."""
import statistics
from pathlib import Path


def benchmark_medians(bench, key="real_time", scale=1.0):
    """{run_name: the median over the repetitions of `key` times `scale`} of a Google Benchmark
    JSON (iteration rows only; runs without `key` are left out)."""
    values = {}
    for b in bench["benchmarks"]:
        if b.get("run_type") == "iteration" and key in b:
            values.setdefault(b["run_name"], []).append(b[key] * scale)
    return {name: statistics.median(v) for name, v in values.items()}


def benchmark_spreads(bench, key="real_time"):
    """{run_name: (max - min) / median of `key` over the repetitions} of a Google Benchmark JSON
    (iteration rows only; 0 for a run of one repetition)."""
    values = {}
    for b in bench["benchmarks"]:
        if b.get("run_type") == "iteration" and key in b:
            values.setdefault(b["run_name"], []).append(b[key])
    return {name: (max(v) - min(v)) / statistics.median(v) for name, v in values.items()}


# Plain full and plain causal full in bench_masks.json: BM_mask's dense and causal. Runs before
# the interleaved repetitions timed plain full once each in BM_modifier (plain) and BM_grouped
# (Hkv = 8) too, and plain causal in BM_modifier (plain causal): the same calls, kept here so those
# runs still render. Every time of every repetition of every twin is pooled, and the reference is
# their median: single calls at N = 16384 on a shared VM vary by up to 30%.
MASK_TWINS = {"dense": ("BM_mask/mask:0/", "BM_modifier/modifier:0/", "BM_grouped/kv:8/"),
              "causal": ("BM_mask/mask:1/", "BM_modifier/modifier:4/")}


def mask_references(bench):
    """{"dense"|"causal": {"forward_ms"|"backward_ms": (median, [every time pooled])}} of
    bench_masks.json (see MASK_TWINS)."""
    refs = {}
    for config, prefixes in MASK_TWINS.items():
        refs[config] = {}
        for key in ("forward_ms", "backward_ms"):
            times = [b[key] for b in bench["benchmarks"]
                     if b.get("run_type") == "iteration" and key in b
                     and b["run_name"].startswith(prefixes)]
            refs[config][key] = (statistics.median(times), times)
    return refs


def mask_dense_rate(bench, direction):
    """Dense full's GFLOP/s ("forward" or "backward") at the reference time of mask_references:
    BM_mask's dense rate scaled by its own time over the twins' median."""
    def dense(key):
        return next(v for name, v in benchmark_medians(bench, key).items()
                    if name.startswith(MASK_TWINS["dense"][0]))
    reference_ms = mask_references(bench)["dense"][f"{direction}_ms"][0]
    return dense(f"{direction}_GFLOPS") * dense(f"{direction}_ms") / reference_ms


def notes_link(out: Path) -> str:
    """The line that points to the folder's hand-written findings, notes.md, when it has one:
    the page links them instead of copying them, so each sentence lives in one file."""
    if not (out / "notes.md").exists():
        return ""
    return ("## Findings\n\nWritten by hand beside this run, citing the tables above: "
            "[notes.md](notes.md).")


def met(value, target):
    """'yes' or '**no**' for a value against a target such as '>= 0.5' or '<= 19 (16 = linear)';
    '' when the target is not a bound (e.g. '(reference)')."""
    op, _, bound = target.partition(" ")
    checks = {"<=": float.__le__, ">=": float.__ge__, ">": float.__gt__}
    if op not in checks:
        return ""
    return "yes" if checks[op](float(value), float(bound.split(" ")[0])) else "**no**"


def profile_section(out: Path) -> str:
    """Every profile-*.txt in `out` (benchmarks/profile.sh: perf's flat profile of forward_loop),
    verbatim, under a heading; '' when there is none."""
    files = sorted(out.glob("profile-*.txt"))
    if not files:
        return ""
    parts = ["## Where the time goes\n",
             "perf's software-clock samples of `benchmarks/forward_loop` (`benchmarks/profile.sh`),",
             "run right after the benchmarks in the same exclusive hold; symbols above 0.5 % of the",
             "samples (`block<R, W, ..>`: the GEMM micro-kernel, R rows by W vectors).\n"]
    for f in files:
        parts.append(f"`{f.name}`:\n\n```\n{f.read_text().rstrip()}\n```\n")
    return "\n".join(parts)
