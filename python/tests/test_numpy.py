"""attnlab's NumPy API: every variant bitwise equal to the CLI's C++ call, the ranks, the copy
claims, the GIL, and a clear Python exception for every kind of bad input."""
import copy
import os
import subprocess
import sys
import tempfile
import threading

import numpy as np

from checks import check, finish, raises  # this folder

import attnlab

CLI = os.environ["ATTNLAB_CLI"]


rng = np.random.default_rng(7)


def qkv(b=2, h=2, nq=40, nk=40, d=16, dv=16):
    return (rng.standard_normal((b, h, nq, d), dtype=np.float32),
            rng.standard_normal((b, h, nk, d), dtype=np.float32),
            rng.standard_normal((b, h, nk, dv), dtype=np.float32))


def cli_run(spec, q, k, v, causal=None, key_lengths=None, mask=None, log_decay=None,
            beta=None):
    """The C++ call through `attnlab run`: (output or None, exit status)."""
    with tempfile.TemporaryDirectory() as d:
        args = [CLI, "run", "--spec", spec, "--out", os.path.join(d, "o.npy")]
        for name, x in (("q", q), ("k", k), ("v", v), ("log-decay", log_decay), ("beta", beta)):
            if x is None:
                continue
            np.save(os.path.join(d, name + ".npy"), x)
            args += ["--" + name, os.path.join(d, name + ".npy")]
        if causal:
            args += ["--causal", causal]
        if key_lengths is not None:
            args += ["--key-lengths", ",".join(map(str, key_lengths))]
        if mask is not None:
            np.save(os.path.join(d, "m.npy"), mask)
            args += ["--mask", os.path.join(d, "m.npy")]
        r = subprocess.run(args, capture_output=True, text=True)
        return (np.load(os.path.join(d, "o.npy")) if r.returncode == 0 else None), r.returncode


# The registry, as the CLI lists it.
names = attnlab.variants()
help_text = subprocess.run([CLI, "--help"], capture_output=True, text=True).stdout
check(f"Variants (factory names): {', '.join(names)}" in help_text, f"variants() {names}")

# Every registered variant with its defaults (the registry's list: a new variant is covered
# without an edit here), and settings that exercise more of some at these sizes, bitwise equal to
# the same call in C++, under each kind of mask, without and with each per-token input (log_decay,
# beta); what a variant refuses, Python refuses too (NotImplementedError) where the CLI exits 2.
specs = [attnlab.make(name).spec for name in names] + [
    "bigbird:block=8", "linformer:k=8,max_len=64", "sliding:left=5,right=3,global=2",
    "moba:block=8,topk=2"]
q, k, v = qkv()
band = np.tril(np.ones((40, 40), dtype=bool), 3) & np.triu(np.ones((40, 40), dtype=bool), -9)
gate = -rng.uniform(0, 0.5, (2, 2, 40)).astype(np.float32)
beta = rng.uniform(0, 1, (2, 2, 40)).astype(np.float32)
masks = [{}, {"causal": "top-left"}, {"key_lengths": [40, 23]}, {"mask": band}]
tokens = [{}, {"log_decay": gate}, {"beta": beta}, {"log_decay": gate, "beta": beta}]
taken = {}
for spec in specs:
    name = spec.split(":")[0]
    support = attnlab.make(spec).support
    for token in tokens:
        if any(not support[t] for t in token):  # refused: checked once, without a mask
            cases = [token]
        else:
            cases = [{**m, **token} for m in masks]
        for case in cases:
            taken[name] = taken.get(name, 0) + (len(token) > 0)
            expected, status = cli_run(spec, q, k, v, **case)
            what = f"{spec} {list(case)}"
            if status == 0:
                out = attnlab.attention(q, k, v, spec=spec, **case)
                check(out.dtype == np.float32 and out.shape == expected.shape, what + " shape")
                check(out.tobytes() == expected.tobytes(), what + " bitwise equal to the CLI")
            else:
                check(status == 2, what + f" CLI exit {status}")
                raises(NotImplementedError, ["does not support"], attnlab.attention, q, k, v,
                       spec=spec, **case)
# Every variant that takes a token input ran with it under every mask.
for name in names:
    support = attnlab.make(name).support
    if support["log_decay"] or support["beta"]:
        check(taken[name] >= 4, f"token cases of {name}: {taken}")

# A token input changes the output (it is read), and [H, N] goes with [H, N, D] q, k, v.
plain = attnlab.attention(q, k, v, spec="gated-delta", causal="top-left")
gated = attnlab.attention(q, k, v, spec="gated-delta", causal="top-left", log_decay=gate,
                         beta=beta)
check(np.abs(plain - gated).max() > 1e-3, "log_decay and beta are read")
expected, status = cli_run("gla", q[0], k[0], v[0], causal="top-left", log_decay=gate[0])
out = attnlab.attention(q[0], k[0], v[0], spec="gla", causal="top-left", log_decay=gate[0])
check(status == 0 and out.shape == (2, 40, 16) and out.tobytes() == expected.tobytes(),
      "rank-3 q with [H, N] log_decay, bitwise equal to the CLI")

# Cross-attention with a value dim of its own, bottom-right causal, explicit scale.
q2, k2, v2 = qkv(nq=24, nk=40, dv=8)
expected, status = cli_run("full", q2, k2, v2, causal="bottom-right")
out = attnlab.attention(q2, k2, v2, causal="bottom-right")
check(status == 0 and out.shape == (2, 2, 24, 8) and out.tobytes() == expected.tobytes(),
      "cross bottom-right bitwise")

# The ranks the CLI takes: [N, D] and [H, N, D] in, the same rank out.
for shape in [(40, 16), (3, 40, 16)]:
    x = rng.standard_normal(shape, dtype=np.float32)
    out = attnlab.attention(x, x, x)
    x4 = x.reshape((1,) * (4 - x.ndim) + shape)
    full = attnlab.attention(x4, x4, x4)
    check(out.shape == shape and out.tobytes() == full.tobytes(), f"rank {x.ndim}")

# Against the float64 reference and the library's metrics.
out = attnlab.attention(q, k, v, causal="top-left")
ref = attnlab.reference(q, k, v, causal="top-left")
metrics = attnlab.compare(out, ref)
check(ref.dtype == np.float64 and metrics["rel_fro"] < 1e-5 and metrics["mean_cos"] > 0.99999,
      f"full vs reference {metrics}")
wide = attnlab.compare(attnlab.attention(q, k, v, spec="sliding:left=2,right=2"), ref)
check(wide["rel_fro"] > 0.1, f"compare sees a different pattern {wide}")

# make(): canonical spec, support, forward with lse, backward (linformer adds d_e, d_f).
a = attnlab.make("sliding:left=4")
check(a.spec.startswith("sliding:left=4,right=128") and attnlab.make(a.spec).spec == a.spec,
      a.spec)
check(attnlab.make("linformer").support["causal"] is False and a.support["backward"], "support")
out, saved = a.forward(q, k, v, save=True)
check(saved.lse.shape == (2, 2, 40) and saved.lse.dtype == np.float32, "lse shape")
d_out = rng.standard_normal(out.shape, dtype=np.float32)
g_saved = a.backward(q, k, v, out, d_out, saved=saved)
g_recomputed = a.backward(q, k, v, out, d_out)
check(all(g_saved[n].shape == x.shape for n, x in (("dq", q), ("dk", k), ("dv", v))),
      "gradient shapes")
check(all(np.allclose(g_saved[n], g_recomputed[n], rtol=1e-5, atol=1e-6)
          for n in ("dq", "dk", "dv")), "saved and recomputed lse give the same gradients")
lin = attnlab.make("linformer:k=8,max_len=64,share=kv")
out = lin.forward(q, k, v)
g = lin.backward(q, k, v, out, d_out)
check(g["d_e"].shape == (2, 8, 64) and "d_f" not in g, "linformer share=kv: one E, its gradient")
# The variant's own tensors: what parameters() gives, set_parameters() takes; a deep copy
# keeps what was set.
learned = lin.parameters(2)
check(list(learned) == ["E"] and learned["E"].shape == (2, 8, 64), "linformer parameters")
lin.set_parameters({"E": learned["E"] * 0.5})
check("init=supplied" in lin.spec and not np.array_equal(lin.forward(q, k, v), out),
      "set_parameters changes the output")
check(np.array_equal(copy.deepcopy(lin).forward(q, k, v), lin.forward(q, k, v)),
      "a deep copy keeps the parameters set")
check(attnlab.make("full").parameters(2) == {}, "full has no parameters")
raises(ValueError, ["no parameter 'F'", "E"], lin.set_parameters, {"E": learned["E"], "F": learned["E"]})
raises(ValueError, ["E has shape [2, 8, 63]", "[H, 8, 64]"], lin.set_parameters,
       {"E": learned["E"][:, :, :63]})
raises(ValueError, ["E", "non-finite"], lin.set_parameters, {"E": np.full((2, 8, 64), np.nan, np.float32)})
raises(NotImplementedError, ["full", "learned parameters"], attnlab.make("full").set_parameters,
       {"E": learned["E"]})
raises(TypeError, ["values", "dict"], lin.set_parameters, [learned["E"]])
raises(ValueError, ["heads"], lin.parameters, 0)
check(attnlab.make("linear").forward(q, k, v, save=True)[1].lse is None, "linear saves no lse")
raises(TypeError, ["saved"], lambda: a.backward(q, k, v, out, d_out, saved=saved.lse))
# The scan variants' chunk states: the saved backward equals the recomputing one bitwise (the
# same token-by-token backward from the same states).
for spec, tokens in (("delta", {}), ("gated-delta", {"log_decay": gate, "beta": beta})):
    s = attnlab.make(spec)
    o, kept = s.forward(q, k, v, causal="top-left", save=True, **tokens)
    g1 = s.backward(q, k, v, o, d_out, causal="top-left", saved=kept, **tokens)
    g2 = s.backward(q, k, v, o, d_out, causal="top-left", **tokens)
    check(all(np.array_equal(g1[n], g2[n]) for n in g1), f"{spec}: saved state gives the "
          "recomputed gradients")
gd = attnlab.make("gated-delta")
out = gd.forward(q, k, v, causal="top-left", log_decay=gate, beta=beta)
grads = gd.backward(q, k, v, out, d_out, causal="top-left", log_decay=gate, beta=beta)
check(grads["d_log_decay"].shape == gate.shape and grads["d_beta"].shape == beta.shape
      and np.isfinite(grads["d_beta"]).all() and np.abs(grads["d_log_decay"]).max() > 0,
      "gated-delta token gradients")
check("d_beta" not in gd.backward(q, k, v, gd.forward(q, k, v, log_decay=gate), d_out,
                                  log_decay=gate), "d_beta only where beta was given")

# Copies: each result is the C++ Tensor itself, handed over (its base is a capsule that owns
# it), not a copy made on the way out; a C-contiguous float32 input is read in place (the
# wrapper passes a view of it on, at whose address the library reads), any other is converted
# once, so the caller's array is never written and a view gives what a contiguous copy gives.
out = attnlab.attention(q, k, v)
base = out
while isinstance(base, np.ndarray) and base.base is not None:
    base = base.base
check(type(base).__name__ == "PyCapsule" and not out.flags.owndata,
      f"output handed over without a copy (base {type(base).__name__})")
_, q4, k4, _ = attnlab._qkv(q, k, v)
check(attnlab._core._read_address(q4) == q.ctypes.data and np.shares_memory(q4, q),
      "C-contiguous float32 q read in place")
q2 = q[0]  # [H, N, D], lifted to [1, H, N, D] by a reshape, still in place
check(attnlab._core._read_address(attnlab._qkv(q2, q2, q2)[1]) == q2.ctypes.data,
      "a rank-3 input read in place")
check(attnlab._core._read_address(attnlab._qkv(np.asfortranarray(q), k, v)[1]) != q.ctypes.data,
      "a Fortran-order input converted")
g_in = np.full(q.shape[:3], -0.1, np.float32)  # a per-token input [B, H, N], read in place too
check(attnlab._core._read_address(attnlab._tokens(4, g_in, None).log_decay) == g_in.ctypes.data,
      "C-contiguous float32 log_decay read in place")
before = q.copy()
strided = np.asfortranarray(q)
check(attnlab.attention(strided, k, v).tobytes() == out.tobytes(), "non-contiguous input")
check(attnlab.attention(q.astype(np.float64), k, v).tobytes() == out.tobytes(),
      "float64 input rounded to float32")
check(np.array_equal(q, before), "input untouched")

# The GIL is released while the kernel runs: with a 10 s switch interval a thread waiting for
# the GIL cannot run during a call that holds it, yet the counter moves during the call.
big = rng.standard_normal((1, 4, 1024, 64), dtype=np.float32)
counter, stop = [0], threading.Event()


def spin():
    import time
    while not stop.is_set():
        counter[0] += 1
        time.sleep(0)


old = sys.getswitchinterval()
sys.setswitchinterval(10)
thread = threading.Thread(target=spin)
thread.start()
start = counter[0]
for _ in range(5):
    attnlab.attention(big, big, big)
moved = counter[0] - start
stop.set()
thread.join()
sys.setswitchinterval(old)
check(moved > 0, f"GIL released during the call (counter moved {moved})")

# Calls from several threads at once on one backend (each thread copies into its own buffers),
# at changing shapes: each result equals the one-thread result.
shared = attnlab.make("full")
problems = [qkv(nq=24 + 8 * i, nk=40 + 4 * i) for i in range(4)]
alone = [shared.forward(*p, causal="bottom-right") for p in problems]
together = [None] * len(problems)


def worker(i):
    for _ in range(3):
        together[i] = shared.forward(*problems[i], causal="bottom-right")


threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(problems))]
for t in threads:
    t.start()
for t in threads:
    t.join()
check(all(a.tobytes() == b.tobytes() for a, b in zip(alone, together)), "threads at once")

# Bad input: a Python exception naming the problem, never a crash.
raises(TypeError, ["q", "int32", "float32"], attnlab.attention, q.astype(np.int32), k, v)
raises(TypeError, ["k", "list"], attnlab.attention, q, k.tolist(), v)
raises(ValueError, ["q", "shape", "[B, H, N, D]"], attnlab.attention, q[None], k, v)
raises(ValueError, ["same rank"], attnlab.attention, q, k[0], v)
raises(ValueError, ["k"], attnlab.attention, q, k[:, :, :, :8], v)
raises(ValueError, ["v"], attnlab.attention, q, k, v[:, :, :30])
nan = q.copy()
nan[1, 0, 3, 2] = np.nan
raises(ValueError, ["q", "NaN", "[1, 0, 3, 2]"], attnlab.attention, nan, k, v)
raises(ValueError, ["unknown", "nosuch"], attnlab.attention, q, k, v, spec="nosuch")
raises(ValueError, ["sliding:left=-1"], attnlab.make, "sliding:left=-1")
raises(ValueError, ["moba:topk=0", "topk=0", ">= 1"], attnlab.make, "moba:topk=0")
raises(ValueError, ["moba:block=0", "block=0", ">= 1"], attnlab.make, "moba:block=0")
raises(ValueError, ["taylor_dim=17", "Dk = 16"], attnlab.attention, q, k, v,
       spec="linear:feature=taylor,taylor_dim=17")
raises(ValueError, ["mask"], attnlab.attention, q, k, v, mask=band[:30])
raises(TypeError, ["mask", "float32"], attnlab.attention, q, k, v, mask=band.astype(np.float32))
raises(ValueError, ["causal"], attnlab.attention, q, k, v, causal="upper")
raises(ValueError, ["key_lengths"], attnlab.attention, q, k, v, key_lengths=[1.5, 2])
raises(ValueError, ["key"], attnlab.attention, q, k, v, key_lengths=[40])
raises(ValueError, ["scale"], attnlab.attention, q, k, v, scale=-1.0)
raises(NotImplementedError, ["linformer", "causal"], attnlab.attention, q, k, v,
       spec="linformer:k=8,max_len=64", causal="top-left")
raises(ValueError, ["d_out"], a.backward, q, k, v, out, d_out[:, :, :5])
raises(ValueError, ["ref"], attnlab.compare, out, ref[:, :1])
raises(TypeError, ["spec"], attnlab.make, 3)
raises(TypeError, ["log_decay", "list"], attnlab.attention, q, k, v, spec="gla",
       log_decay=gate.tolist())
raises(TypeError, ["beta", "int64"], attnlab.attention, q, k, v, spec="delta",
       beta=np.zeros((2, 2, 40), dtype=np.int64))
raises(ValueError, ["log_decay", "[B, H, N]"], attnlab.attention, q, k, v, spec="gla",
       log_decay=gate[0])
raises(ValueError, ["log-decay", "shape"], attnlab.attention, q, k, v, spec="gla",
       log_decay=gate[:, :, :30])
raises(ValueError, ["beta", "[0, 1]"], attnlab.attention, q, k, v, spec="delta", beta=beta + 1)
raises(ValueError, ["log-decay", "<= 0"], attnlab.attention, q, k, v, spec="gla", log_decay=-gate)
raises(NotImplementedError, ["retnet", "log-decay"], attnlab.attention, q, k, v, spec="retnet",
       log_decay=gate)

finish()
