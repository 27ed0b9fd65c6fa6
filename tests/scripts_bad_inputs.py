"""The training scripts refuse bad options with one line naming the value (exit status non-zero),
and train-table.py keeps a variant spec's own commas (and ';').

Usage: scripts_bad_inputs.py SCRIPTS_DIR
"""
import importlib.util
import subprocess
import sys
from pathlib import Path

scripts = Path(sys.argv[1]).resolve()
failures = []


def refuses(script, args, message):
    done = subprocess.run([sys.executable, str(scripts / script), *args], capture_output=True,
                          text=True, cwd=scripts)
    last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
    if done.returncode == 0 or message not in last:
        failures.append(f"{script} {' '.join(args)}: exit {done.returncode}, stderr {last!r}")


refuses("train-table.py", ["zoology", "--rates", "2e-3"], "2e-3: not a rate of table zoology")
refuses("train-table.py", ["zoology", "--rates", "x"], "x: not a rate of table zoology")
refuses("train-table.py", ["zoology", "--variants", "sliding:left=16,right=0,bogus"],
        "bogus: not a variant of table zoology")
refuses("train-table.py", ["zoology", "--points", "n64-d999"], "n64-d999: not a point of table")
refuses("train-table.py", ["zoology", "--seeds", "4"], "4: not a seed of table zoology")
if importlib.util.find_spec("torch"):  # torch-mqar.py imports torch before it reads options
    refuses("torch-mqar.py", ["out.csv", "--heads", "3"],
            "--d-model 64: expected a multiple of --heads 3")
    refuses("torch-mqar.py", ["out.csv", "--batch", "0"], "--batch 0: expected at least 1")

spec = importlib.util.spec_from_file_location("train_table", scripts / "train-table.py")
train_table = importlib.util.module_from_spec(spec)
spec.loader.exec_module(train_table)
specs = train_table.split_specs("gated-delta,sliding:left=16,right=0,linear,sliding:left=[4,16],right=0")
if specs != ["gated-delta", "sliding:left=16,right=0", "linear", "sliding:left=[4,16],right=0"]:
    failures.append(f"split_specs: {specs}")
# A model spec of alternating layers keeps its ';' and its commas, and its runs' folder has no ';'.
based = "linear:feature=taylor,taylor_dim=16;sliding:left=63,right=0+short-conv"
specs = train_table.split_specs(based + ",moba:block=32,topk=3")
if specs != [based, "moba:block=32,topk=3"]:
    failures.append(f"split_specs: {specs}")
if ";" in str(train_table.cell_path({"name": "n128-d64"}, based, 1e-3, 1)):
    failures.append(f"cell_path keeps ';': {train_table.cell_path({'name': ''}, based, 1e-3, 1)}")
# Every frontier variant's row there exists in the table it stands beside.
for name, t in train_table.TABLES.items():
    for variant, row in t.get("beside_rows", {}).items():
        if variant not in t["variants"] or row not in train_table.TABLES[t["beside"]]["variants"]:
            failures.append(f"{name}: beside_rows {variant} -> {row}")

for f in failures:
    print("FAILED:", f)
print(f"{'ok' if not failures else f'{len(failures)} failed'}")
sys.exit(1 if failures else 0)
