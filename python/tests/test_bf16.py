"""bfloat16 from Python (issue 47's converted path): attnlab.attention(..., dtype="bf16") on
NumPy and attnlab.torch.attention on torch.bfloat16 tensors, forward and backward, against an
explicit float64 softmax of the bf16-rounded inputs in torch; the rounding against torch's own
float32 -> bfloat16 conversion (round to nearest, ties to even); bad input."""
import math

import numpy as np
import torch

import attnlab
import attnlab.torch as at
from checks import check, finish, raises  # this folder

torch.manual_seed(0)
torch.set_num_threads(1)

U = 2.0 ** -8  # bf16's unit roundoff: rounding moves x by at most U |x|


def bf16_values(a):
    """a rounded to bf16 by torch, as float64."""
    return torch.as_tensor(a).to(torch.bfloat16).double()


def softmax_attention(q, k, v, causal=False, sinks=None):
    """float64 softmax attention of [B, H, N, D] tensors; causal top-left; sinks [H] join each
    row's denominator."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    if sinks is not None:
        sink = sinks.double().reshape(1, -1, 1, 1).expand(*s.shape[:-1], 1)
        return torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :-1] @ v
    return torch.softmax(s, dim=-1) @ v


def err(a, b):
    """max |a - b| and max |b| over the elements, b the float64 reference."""
    a, b = torch.as_tensor(a).double(), torch.as_tensor(b).double()
    return float((a - b).abs().max()), float(b.abs().max())


# The rounding: bit for bit torch's (round to nearest, ties to even) on random bit patterns,
# ties and subnormals; NaN stays NaN (torch writes one canonical NaN, we keep the sign and top
# bits), infinities stay.
bits = np.random.default_rng(3).integers(0, 2 ** 32, 20000, dtype=np.uint64).astype(np.uint32)
ties = (np.array([0x3F80, 0x3F81, 0x0001, 0x0080], np.uint32)[:, None] << 16 |
        np.array([0x8000, 0x7FFF, 0x8001], np.uint32)[None, :]).ravel()
x = np.concatenate([bits, ties]).view(np.float32).reshape(1, -1)
ours = attnlab._core.round_bf16(x)
theirs = torch.from_numpy(x.copy()).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
nan = np.isnan(x)
check(np.array_equal(ours[~nan], theirs[~nan]), "round_bf16 equals torch's rounding off NaN")
check(bool(np.isnan(attnlab._core.widen_bf16(ours)[nan]).all()), "NaN rounds to NaN")
check(np.array_equal(attnlab._core.widen_bf16(ours).view(np.uint32), ours.astype(np.uint32) << 16),
      "widening is exact")
check(attnlab._core.bf16_path() == "bf16-via-f32", "the bf16 path is named")

# NumPy, dtype="bf16": the float32 inputs are rounded, the output is a bf16 result in float32.
# Bound against the float64 attention r of the rounded inputs: u |r| from the output's rounding
# plus float32's error (1e-4 relative, tests/test_bf16.cpp), so max error <= (U + 2e-4) max |r|.
B, H, N, D = 2, 3, 23, 64
q, k, v = (torch.randn(B, H, N, D) for _ in range(3))
for causal in (None, "top-left"):
    out = attnlab.attention(q.numpy(), k.numpy(), v.numpy(), causal=causal, dtype="bf16")
    ref = softmax_attention(bf16_values(q), bf16_values(k), bf16_values(v), causal is not None)
    e, scale = err(out, ref)
    check(e <= (U + 2e-4) * scale, f"numpy bf16 forward causal={causal}: {e} vs {scale}")
    check(np.array_equal(attnlab._core.widen_bf16(attnlab._core.round_bf16(out)), out),
          "numpy bf16 output holds bf16 values")
    plain = attnlab.attention(q.numpy(), k.numpy(), v.numpy(), causal=causal)
    check(not np.array_equal(plain, out), "dtype='bf16' is not the float32 result")

# NumPy backward with dtype="bf16" against torch's float64 autograd of the rounded inputs: the
# final rounding (u |g|), bf16 out in rowsum(dO ∘ O) (at most U sum |dO| |O| per row, spread
# over the row's gradients; tests/test_bf16.cpp bounds it elementwise) and float32's error: a
# max error of 4 U relative to the largest gradient (measured below 1.5 U here).
a = attnlab.make("full")
out, saved = a.forward(q.numpy(), k.numpy(), v.numpy(), sinks=np.full(H, 0.5, np.float32),
                       save=True, dtype="bf16")
d_out = torch.randn(B, H, N, D)
grads = a.backward(q.numpy(), k.numpy(), v.numpy(), out, d_out.numpy(), saved=saved,
                   sinks=np.full(H, 0.5, np.float32), dtype="bf16")
q64, k64, v64 = (bf16_values(t).requires_grad_() for t in (q, k, v))
softmax_attention(q64, k64, v64, sinks=torch.full((H,), 0.5)).backward(bf16_values(d_out))
for name, t in (("dq", q64), ("dk", k64), ("dv", v64)):
    e, scale = err(grads[name], t.grad)
    check(e <= 4 * U * scale, f"numpy bf16 {name}: {e} vs {scale}")
    check(grads[name].dtype == np.float32, f"numpy bf16 {name} is float32")
check(grads["d_sinks"].shape == (H,), "numpy bf16 d_sinks")

# torch: bf16 tensors in, bf16 out and gradients, equal to the NumPy path bit for bit, and
# against float64 autograd as above. The loss's weights reach the backward as a bf16 d_out.
qb, kb, vb = (t.to(torch.bfloat16).requires_grad_() for t in (q, k, v))
w = torch.randn(B, H, N, D)
ob = at.attention(qb, kb, vb, causal=True, window_size=(7, 0), sinks=torch.full((H,), 0.5))
check(ob.dtype == torch.bfloat16, "torch bf16 out is bf16")
same = attnlab.attention(q.numpy(), k.numpy(), v.numpy(), causal="top-left", window_size=(7, 0),
                         sinks=np.full(H, 0.5, np.float32), dtype="bf16")
check(torch.equal(ob.float(), torch.from_numpy(same)), "torch bf16 equals numpy dtype='bf16'")
(ob.float() * w).sum().backward()
q64, k64, v64 = (bf16_values(t).requires_grad_() for t in (q, k, v))
i, j = torch.arange(N)[:, None], torch.arange(N)[None, :]
s = q64 @ k64.transpose(-1, -2) / math.sqrt(D)
s = s.masked_fill((j > i) | (j < i - 7), float("-inf"))
sink = torch.full((B, H, N, 1), 0.5, dtype=torch.float64)
ref = torch.softmax(torch.cat([s, sink], -1), -1)[..., :-1] @ v64
e, scale = err(ob, ref.detach())
check(e <= (U + 2e-4) * scale, f"torch bf16 forward: {e} vs {scale}")
ref.backward(bf16_values(w))
for name, t, t64 in (("q", qb, q64), ("k", kb, k64), ("v", vb, v64)):
    check(t.grad is not None and t.grad.dtype == torch.bfloat16, f"torch d{name} is bf16")
    e, scale = err(t.grad, t64.grad)
    check(e <= 4 * U * scale, f"torch bf16 d{name}: {e} vs {scale}")

# Bad input: one dtype for q, k, v, named; NaN refused as in float32; dtype= named.
raises(TypeError, ["k", "torch.float32", "bfloat16"], at.attention, qb, k, vb)
raises(TypeError, ["v", "torch.bfloat16"], at.attention, q, k, vb)
bad = q.clone()
bad[0, 1, 2, 3] = float("nan")
raises(ValueError, ["q has NaN at [0, 1, 2, 3]"], at.attention, bad.to(torch.bfloat16), kb, vb)
raises(ValueError, ["q has NaN at [0, 1, 2, 3]"], attnlab.attention, bad.numpy(), k.numpy(),
       v.numpy(), dtype="bf16")
raises(ValueError, ["dtype", "'fp8'", "bf16"], attnlab.attention, q.numpy(), k.numpy(),
       v.numpy(), dtype="fp8")
raises(ValueError, ["dtype", "'bfloat16'"], a.backward, q.numpy(), k.numpy(), v.numpy(), out,
       d_out.numpy(), dtype="bfloat16")
finish()
