"""examples/torch_copy.py at a tiny size (N 16, 300 steps): with spec="full" the attnlab model
starts on the same loss as the same model with torch's attention (same seed: same weights and
batches) and solves the task as that one does. The step where the loss falls off its plateau is
not compared: float32 rounding of two correct attentions can shift it by some steps."""
import os
import subprocess
import sys

script = os.path.join(os.environ["ATTNLAB_SOURCE_DIR"], "examples", "torch_copy.py")


def run(attention):
    r = subprocess.run([sys.executable, script, "--attention", attention, "--n", "16",
                        "--steps", "300", "--lr", "1e-2"], capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout, r.stderr)
        sys.exit(1)
    print(attention, r.stdout.strip().replace("\n", " | "))
    lines = r.stdout.split("\n")
    losses = [float(line.split()[-1]) for line in lines if line.startswith("step")]
    accuracy = float(next(line for line in lines if line.startswith("accuracy")).split()[1])
    return losses, accuracy


ours, theirs = run("attnlab"), run("torch")
ok = abs(ours[0][0] - theirs[0][0]) < 0.01 * theirs[0][0]
ok = ok and abs(ours[1] - theirs[1]) < 0.03 and ours[1] > 0.9
print("same training curve and accuracy" if ok else "FAIL: attnlab and torch runs differ")
sys.exit(0 if ok else 1)
