"""Pieces shared by the results renderers: whether a target is met, and the "where the time
goes" section from the profiles the run scripts saved."""
from pathlib import Path


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
