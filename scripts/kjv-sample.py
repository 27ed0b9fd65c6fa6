#!/usr/bin/python3
"""The README's text continuation: the committed Llama-style KJV model continues a prompt.

Usage: kjv-sample.py BUILD [OUT]      (OUT: results/generation)
       kjv-sample.py --render-only [OUT]
Runs `attnlab generate` greedily (temperature 0: the tokens re-running the whole forward at every
step gives, as tests/test_generation.cpp holds) on benchmarks/checkpoints/kjv-llama and writes
OUT/sample.json: the command, the text it printed, its last stderr line (tokens per second and
the bytes the decoders held) and the context of the run; then OUT/README.md from it.
scripts/render-readme.py renders the README's block with block() below.
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WEIGHTS = "benchmarks/checkpoints/kjv-llama"
PROMPT = "And God said"
TOKENS = 160


def git(*args):
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True,
                          text=True).stdout.strip()


def block(sample):
    """The command, what it printed and its closing line, as a text block."""
    return f"```text\n$ {sample['command']}\n{sample['text']}\n{sample['stats']}\n```\n"


def render(out):
    sample = json.loads((out / "sample.json").read_text())
    (out / "README.md").write_text(
        "# A continuation of the King James Bible by the committed Llama-style model\n\n"
        "Rendered by `scripts/kjv-sample.py` from `sample.json` (the README shows the same "
        "block). The model: `benchmarks/checkpoints/kjv-llama` (its README says how it was "
        "trained and its held-out bits per byte).\n\n" + block(sample) +
        "\nContext of the run: `" + json.dumps(sample["context"]) + "`\n")


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__.split("\n\n")[1])
    out = Path(sys.argv[2]) if len(sys.argv) == 3 else ROOT / "results" / "generation"
    if sys.argv[1] == "--render-only":
        return render(out)
    build = Path(sys.argv[1])
    args = ["generate", "--weights", WEIGHTS, "--prompt", PROMPT, "--tokens", str(TOKENS),
            "--temperature", "0"]
    load_before = open("/proc/loadavg").read().split()[:3]
    run = subprocess.run([str(build.resolve() / "cli" / "attnlab"), *args], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    cpu = open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].strip(" :\t")
    sample = {
        "command": " ".join(["attnlab", *args[:4], f'"{PROMPT}"', *args[5:]]),
        "text": run.stdout.rstrip("\n"),
        "stats": run.stderr.strip().splitlines()[-1],
        "context": {
            "git_commit": git("rev-parse", "--short", "HEAD"),
            "git_dirty": bool(git("status", "--porcelain", "--", "training", "models",
                                  "variants", "lib", WEIGHTS)),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "cpu_model": cpu,
            "threads": {"nproc": os.cpu_count(),
                        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS")},
            "load_average": " ".join(load_before),
            "load_after": " ".join(open("/proc/loadavg").read().split()[:3]),
        },
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "sample.json").write_text(json.dumps(sample, indent=2) + "\n")
    render(out)
    print(block(sample), end="")


if __name__ == "__main__":
    main()
