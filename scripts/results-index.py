#!/usr/bin/python3
"""Generates results/README.md, the index of every measured folder, from each folder's about.json
and the context its run recorded; says per folder whether the code it measures changed since.

Usage: scripts/results-index.py [--check]
       scripts/results-index.py commands render|rerun BUILD [FOLDER...]
       scripts/results-index.py adopt ARCHIVED-FOLDER

A folder of results/ (or of results/archive/) is indexed when it holds an about.json:
  measures   what it measures, one sentence
  kind       "speed" (times: the machine's load enters the figures) or "accuracy" (seeded
             computations: trained models, studies; their figures do not depend on the load)
  code       the paths (files or folders) whose change can move its figures
  context    glob(s), relative to the folder, of the JSON files its run wrote (Google Benchmark
             output, a sweep's or a study's meta.json, training summaries, a context.json); the
             commit, date, CPU and load are read from them
  rerun      the command that measures it again (from the repository's root)
  render     the command that renders its tables from its data alone, re-running nothing
             ("" when the run writes its page itself and there is nothing to render apart)
  archived   (archive only) one line: why it is no longer current
  current    (archive only) the folder below results/ that its rerun writes
"{dir}" in rerun and render stands for the folder's path, "{build}" for the build folder (the
index shows "build"). An archived folder's rerun writes the current folder, not the archive.
A current folder whose context matches no file yet (prepared: its about.json committed, its
run not) is listed apart as not yet measured, with its rerun command, and has nothing to render.

Stale: whether a commit after the one the folder was measured at (the oldest of its runs), or the
working tree, changed a path of `code`, leaving out the commits listed in
results/neutral-commits.txt (each with why it cannot move a figure: a reformatting, a branch no
caller reaches); the page shows the paths the first such commit changed. Heavy load: the 1-minute
load average before or after the run above 1.5 per core (a speed folder's figures are then the
machine's, not the code's). A current speed folder that is stale or was measured under heavy
load belongs in results/archive/ until it is rerun on a quiet machine.

--check writes nothing and exits 1 with a diff when results/README.md differs from what the
folders and git give (the meson test results_index; it skips, exit 77, without git history).
`commands` prints the render or rerun commands of the named folders (all by default), one per
line, for scripts/regenerate-results.sh; an archived folder's rerun ends with `adopt`, which gives
the folder its rerun wrote an about.json (the archived one's, without `archived` and `current`)
when it has none, so the new run is indexed as current.
"""
import difflib
import glob
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"
HEAVY_PER_CORE = 1.5
SKIP = 77


class NoHistory(Exception):
    """git cannot answer (not a clone, or a shallow one without the measured commit)."""


def git(*args):
    done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise NoHistory(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def folders():
    """Every folder with an about.json: the current ones, then the archived ones."""
    found = sorted(p.parent for p in RESULTS.rglob("about.json"))
    current = [f for f in found if RESULTS / "archive" not in f.parents]
    return current, [f for f in found if RESULTS / "archive" in f.parents]


def has_run(folder, about):
    """Whether the folder holds any of the context files its run writes."""
    return any(glob.glob(str(folder / pattern), recursive=True) for pattern in about["context"])


def floats(text):
    return [float(x) for x in re.findall(r"\d+\.\d+|\d+", str(text))]


def run_context(folder, about):
    """The runs' commits, dates, CPUs, core counts and loads, from the JSON files they wrote."""
    runs = []
    for pattern in about["context"]:
        for path in sorted(glob.glob(str(folder / pattern), recursive=True)):
            data = json.loads(Path(path).read_text())
            c = data.get("context", data)
            commit = str(c.get("git_commit") or c.get("commit") or "")
            dirty = commit.endswith("-dirty") or bool(c.get("git_dirty"))
            load = c.get("load_average") or c.get("load_before") or c.get("loadavg_before")
            after = c.get("load_after") or c.get("loadavg_after")
            threads = c.get("threads")
            cores = c.get("num_cpus") or (threads.get("nproc") if isinstance(threads, dict) else 0)
            cpu = c.get("cpu_model") or c.get("cpu") or "?"
            runs.append({"commit": commit.removesuffix("-dirty"), "dirty": dirty,
                         "date": str(c.get("date", "?")), "cpu": re.sub(r" x \d+$", "", cpu),
                         "cores": int(cores or 2),
                         "load": floats(load)[:1], "after": floats(after)[:1]})
    after_file = folder / "load_after.txt"
    if after_file.exists() and runs and not runs[-1]["after"]:
        runs[-1]["after"] = floats(after_file.read_text())[:1]
    if not runs:
        raise SystemExit(f"{folder}: about.json's context {about['context']} matches no file")
    return runs


def neutral_commits():
    """The commits listed in results/neutral-commits.txt, as full hashes."""
    out = set()
    for line in (RESULTS / "neutral-commits.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            out.add(git("rev-parse", line.split()[0] + "^{commit}").strip())
    return out


def in_history(commit):
    """Whether `commit` is HEAD or one of its ancestors (not merely an object in the store)."""
    done = subprocess.run(["git", "-C", str(ROOT), "merge-base", "--is-ancestor", commit, "HEAD"],
                          capture_output=True)
    return done.returncode == 0


def oldest(commits):
    """The earliest of `commits` by commit date (the run every later one followed)."""
    log = git("log", "--no-walk", "--format=%ct %H", *sorted(set(commits))).split("\n")
    return min(tuple(line.split()) for line in log if line.strip())[1]


def staleness(about, commit, neutral):
    """The paths of `code` that the first later commit to change any (neutral ones left out)
    changed, or else the working tree changes; [] when neither. The first commit's, not all:
    the page changes when a folder turns stale, not at every later commit; and no hash, so the
    commit that turns a folder stale can carry this page's update itself."""
    log = git("log", "--reverse", "--format=%H", f"{commit}..HEAD", "--", *about["code"]).split()
    for c in log:
        if c not in neutral:
            return sorted(set(git("diff-tree", "--no-commit-id", "--name-only", "-r", "-m", c,
                                  "--", *about["code"]).split()))
    return sorted(git("diff", "--name-only", "HEAD", "--", *about["code"]).split())


def describe(folder, neutral):
    about = json.loads((folder / "about.json").read_text())
    runs = run_context(folder, about)
    commits = [r["commit"] for r in runs if r["commit"]]
    # A run at a commit this history lacks (a branch rebased before it landed) is named, and the
    # staleness is judged from the runs whose commits it has.
    known = [c for c in set(commits) if in_history(c)]
    base = oldest(known) if known else None
    changed = staleness(about, base, neutral) if base else None
    loads = [x for r in runs for x in r["load"] + r["after"]]
    cores = min(r["cores"] for r in runs)
    heavy = bool(loads) and max(loads) > HEAVY_PER_CORE * cores
    dates = sorted(r["date"][:10] for r in runs)
    return {
        "folder": folder.relative_to(RESULTS).as_posix(), "about": about, "runs": len(runs),
        "commit": (base[:7] if base else min(commits)[:7])
                  + (f" (+{len(known) - 1} later)" if len(known) > 1 else "")
                  + (f" ({len(set(commits)) - len(known)} not in this history)"
                     if len(set(commits)) > len(known) else "")
                  + (", dirty" if any(r["dirty"] for r in runs) else ""),
        "date": dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}",
        "cpu": ", ".join(sorted({r["cpu"] for r in runs})) + f", {cores} cores",
        "load": (("?" if not loads else f"{min(loads):.1f}" if f"{min(loads):.1f}" == f"{max(loads):.1f}"
                  else f"{min(loads):.1f} to {max(loads):.1f}")) +
                (", heavy" if heavy else ""),
        "heavy": heavy, "changed": changed}


def page(folder):
    for name in ("README.md", "report.md"):
        if (RESULTS / folder / name).exists():
            return f"{folder}/{name}"
    return f"{folder}/"


def stale_cell(changed):
    if changed is None:
        return "unknown (its commit is not in this history)"
    if not changed:
        return "no"
    more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
    return "**yes**: " + ", ".join(f"`{p}`" for p in changed[:3]) + more


def render():
    current, archived = folders()
    neutral = neutral_commits()
    lines = [
        "# results/",
        "",
        "Generated by `scripts/results-index.py` from each folder's `about.json` and the context "
        "its run recorded (do not edit; the test `results_index` fails when this page is out of "
        "date with the folders or with git). Every figure lives in one folder, in its raw data "
        "(rows, JSON) and in the tables its script renders from them; findings written by hand "
        "cite those tables.",
        "",
        "- **measured**: the commit (of the oldest run, for a folder of many runs), the dates, "
        "the CPU and the 1-minute load average before and after (`heavy`: above "
        f"{HEAVY_PER_CORE} per core).",
        "- **stale**: whether a later commit changed the code the folder measures (its "
        "`about.json`'s `code`), leaving out the commits `neutral-commits.txt` lists, and the paths "
        "that the first such commit changed (`git log COMMIT.. -- PATH` lists them all). A stale accuracy folder may still hold: the figures of seeded runs move "
        "only where the change reaches their numerics; rerun it to know.",
        "- **kind**: `speed` (times) or `accuracy` (trained models, studies). A speed folder "
        "that is stale or was measured under heavy load is moved to `archive/`, below, and no "
        "longer quoted as current until it is rerun on a quiet machine.",
        "",
        "`scripts/regenerate-results.sh render` re-renders every folder's tables from its data, "
        "re-running nothing; `scripts/regenerate-results.sh rerun FOLDER...` measures folders "
        "again with the commands below (a speed rerun belongs on a quiet machine).",
        "",
        "## Current",
        "",
        "| folder | measures | kind | measured | load | stale | rerun |",
        "|---|---|---|---|---|---|---|"]
    archive_rows, prepared_rows = [], []
    for folder in current + archived:
        about = json.loads((folder / "about.json").read_text())
        if folder in current and not has_run(folder, about):
            prepared_rows.append(
                f"| `{folder.relative_to(RESULTS).as_posix()}/` | {about['measures']} | "
                f"{about['kind']} | `{about['rerun'].replace('{build}', 'build')}` |")
            continue
        d = describe(folder, neutral)
        a = d["about"]
        measured = f"{d['commit']}, {d['date']}, {d['cpu']}" + \
            (f", {d['runs']} runs" if d["runs"] > 1 else "")
        rerun = "`" + a["rerun"].replace("{dir}", "results/" + d["folder"]) \
            .replace("{build}", "build") + "`"
        link = f"[`{d['folder']}/`]({page(d['folder'])})"
        if folder in current:
            lines.append(f"| {link} | {a['measures']} | {a['kind']} | {measured} | {d['load']} | "
                         f"{stale_cell(d['changed'])} | {rerun} |")
        else:
            archive_rows.append(f"| {link} | {a['archived']} | {a['measures']} | {measured} | "
                                f"{d['load']} | {stale_cell(d['changed'])} | {rerun} |")
    if prepared_rows:
        lines += ["", "## Not yet measured", "",
                  "Prepared (the command and what it measures are committed), waiting for a run "
                  "on a quiet machine.", "",
                  "| folder | measures | kind | rerun |", "|---|---|---|---|", *prepared_rows]
    lines += ["", "## Archived: no longer current", "",
              "Kept as they were measured, with their pages; rerun on a quiet machine to bring one "
              "back (its rerun command writes the current folder anew).", "",
              "| folder | why archived | measures | measured | load | stale | rerun |",
              "|---|---|---|---|---|---|---|", *archive_rows]
    return "\n".join(lines) + "\n"


def commands(kind, build, names):
    current, archived = folders()
    chosen = current + archived
    if names:
        by_name = {f.relative_to(RESULTS).as_posix(): f for f in chosen}
        unknown = [n for n in names if n.removeprefix("results/").rstrip("/") not in by_name]
        if unknown:
            sys.exit(f"results-index.py: not an indexed folder: {', '.join(unknown)} "
                     f"(known: {', '.join(by_name)})")
        chosen = [by_name[n.removeprefix("results/").rstrip("/")] for n in names]
    for folder in chosen:
        about = json.loads((folder / "about.json").read_text())
        if kind == "render" and not has_run(folder, about):
            continue  # prepared, not yet measured: no data to render
        command = about[kind].replace("{dir}", folder.relative_to(ROOT).as_posix()) \
            .replace("{build}", build)
        if command and kind == "rerun" and "current" in about:
            command = f"{command} && /usr/bin/python3 scripts/results-index.py adopt " \
                      f"{folder.relative_to(ROOT).as_posix()}"
        if command:
            print(command)


def adopt(archived):
    """Gives the folder an archived folder's rerun wrote its about.json, unless it has one."""
    about = json.loads((ROOT / archived / "about.json").read_text())
    target = RESULTS / about["current"] / "about.json"
    if not target.parent.is_dir():
        sys.exit(f"results-index.py: {archived}'s rerun wrote no {target.parent}")
    if not target.exists():
        target.write_text(json.dumps({k: v for k, v in about.items()
                                      if k not in ("archived", "current")}, indent=2) + "\n")
        print(f"wrote {target.relative_to(ROOT)}")


def main():
    args = sys.argv[1:]
    if args[:1] == ["commands"] and len(args) >= 3 and args[1] in ("render", "rerun"):
        return commands(args[1], args[2], args[3:])
    if args[:1] == ["adopt"] and len(args) == 2:
        return adopt(args[1])
    if args not in ([], ["--check"]):
        sys.exit(__doc__.split("\n\n")[1])
    try:
        if git("rev-parse", "--is-shallow-repository").strip() == "true":
            raise NoHistory("a shallow clone")
        text = render()
    except NoHistory as e:
        print(f"results-index.py: skipped, no git history to judge staleness by: {e}")
        return SKIP
    index = RESULTS / "README.md"
    if not args:
        index.write_text(text)
        return 0
    old = index.read_text() if index.exists() else ""
    if old != text:
        sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), text.splitlines(True),
                                                   "results/README.md", "generated"))
        print("results/README.md is out of date with the folders or with git: run "
              "scripts/results-index.py and commit results/README.md")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
