"""The softmax variants' mask and score modifiers and grouped KV heads from Python, with
FlashAttention's and PyTorch's names: window_size, cu_seqlens, prefix_lengths, softcap,
alibi_slopes, sinks, an additive bias (NumPy bias=, torch's float attn_mask), log_decay as the
forgetting gate, enable_gqa. Each keyword, alone and combined, through the NumPy
forward/backward and through attnlab.torch's autograd, against an explicit float64 softmax in
torch whose visible pairs are written out here from the definitions (lib/attnlab/mask.hpp) and
whose scores are tests/torch_grads.py's modified_attention (the C++ tests' reference); the
float attn_mask and grouped heads also against torch 1.13's _scaled_dot_product_attention; bad
input."""
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

import attnlab
import attnlab.torch as at
from checks import check, finish, raises  # this folder

sys.path.insert(0, os.path.join(os.environ["ATTNLAB_SOURCE_DIR"], "tests"))
import torch_grads  # noqa: E402  (the C++ tests' float64 definitions)

torch.manual_seed(0)
torch.set_num_threads(1)

H, D = 4, 8
TOL = 3e-5  # float32 output and gradients against float64, relative to the largest entry


def rel(a, b):
    """max |a - b| / max |b|, b the float64 reference."""
    a, b = torch.as_tensor(a).double(), torch.as_tensor(b).double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def visible(batch, nq, nk, causal=None, lengths=None, window=None, docs=None, kdocs=None,
            prefix=None):
    """allowed [batch, 1, nq, nk] and each query's key position p(i) [nq], from mask.hpp's
    definitions: documents cut queries and keys, p(i) counts inside the query's document (kept
    as a packed index), causal j <= p(i) relaxed for the first prefix[d or b] keys, the window
    p(i) - left <= j <= p(i) + right, padding j < lengths[b]."""
    qoff, koff = docs or [0, nq], kdocs or docs or [0, nk]
    allowed = torch.zeros(batch, 1, nq, nk, dtype=torch.bool)
    pos = torch.zeros(nq, dtype=torch.float64)
    j = torch.arange(nk)
    for d in range(len(qoff) - 1):
        qs, qe, ks, ke = qoff[d], qoff[d + 1], koff[d], koff[d + 1]
        for i in range(qs, qe):
            p = ks + i - qs + ((ke - ks) - (qe - qs) if causal == "bottom-right" else 0)
            pos[i] = p
            for b in range(batch):
                ok = (j >= ks) & (j < ke)
                if causal:
                    first = prefix[d if docs else b] if prefix else 0
                    ok &= (j <= p) | (j < ks + first)
                if window:
                    ok &= (j >= p - window[0]) if window[0] >= 0 else ok
                    ok &= (j <= p + window[1]) if window[1] >= 0 else ok
                if lengths:
                    ok &= j < lengths[b]
                allowed[b, 0, i] = ok
    return allowed, pos


# attnlab's keyword of each reference input: NumPy's, then torch's.
NUMPY_NAMES = {"bias": "bias", "sinks": "sinks", "slopes": "alibi_slopes", "g": "log_decay"}
TORCH_NAMES = {"bias": "attn_mask", "sinks": "sinks", "slopes": "alibi_slopes", "g": "log_decay"}


def case(what, inputs=(), batch=2, nq=24, nk=24, hkv=H, spec="full", bias_shape=None,
         softcap=None, causal=None, lengths=None, window=None, docs=None, kdocs=None,
         prefix=None, pattern=None):
    """One call through NumPy and through torch against the float64 reference: the output and
    the gradient of every float input (q, k, v and those in `inputs`)."""
    x = {"q": torch.randn(batch, H, nq, D), "k": torch.randn(batch, hkv, nk, D),
         "v": torch.randn(batch, hkv, nk, D)}
    if "bias" in inputs:
        x["bias"] = torch.randn(bias_shape or (batch, H, nq, nk))
    if "sinks" in inputs:
        x["sinks"] = torch.randn(H)
    if "slopes" in inputs:
        x["slopes"] = torch.from_numpy(attnlab.alibi_slopes(H)) * 4  # steep enough to matter
    if "g" in inputs:
        x["g"] = -torch.rand(batch, H, nk) * 0.5
    allowed, pos = visible(batch, nq, nk, causal, lengths, window, docs, kdocs, prefix)
    if pattern is not None:
        allowed = allowed & pattern(torch.arange(nq)[:, None], torch.arange(nk)[None, :])
    allowed = allowed.expand(batch, H, nq, nk)
    x64 = {n: t.double().requires_grad_() for n, t in x.items()}
    scale = 1 / math.sqrt(D)
    ref = torch_grads.modified_attention(
        torch, {"scale": scale, "softcap": softcap, "lengths": lengths or [nk] * batch},
        x64, allowed, pos)
    d_out = torch.randn(ref.shape)
    (ref * d_out.double()).sum().backward()
    common = dict(causal=causal, window_size=window, cu_seqlens=docs, cu_seqlens_k=kdocs,
                  prefix_lengths=prefix, softcap=softcap, enable_gqa=hkv != H)

    # NumPy: forward, then backward from the saved lse.
    arrays = {n: t.numpy() for n, t in x.items()}
    keywords = dict(common, key_lengths=lengths,
                    **{NUMPY_NAMES[n]: arrays[n] for n in inputs})
    backend = attnlab.make(spec)
    out, saved = backend.forward(arrays["q"], arrays["k"], arrays["v"], save=True, **keywords)
    grads = backend.backward(arrays["q"], arrays["k"], arrays["v"], out, d_out.numpy(),
                             saved=saved, **keywords)
    names = {"q": "dq", "k": "dk", "v": "dv", "bias": "d_bias", "sinks": "d_sinks",
             "slopes": "d_alibi_slopes", "g": "d_log_decay"}
    errors = {"out": rel(out, ref.detach())}
    for n, t in x64.items():
        got = grads[names[n]]
        check(got.shape == tuple(t.shape), f"{what}: NumPy {names[n]} shape {got.shape}")
        errors[names[n]] = rel(got, t.grad)
    check(set(grads) == {names[n] for n in x}, f"{what}: NumPy gradients {sorted(grads)}")
    check(max(errors.values()) < TOL, f"{what}: NumPy relative errors {errors}")
    if spec == "full":  # the library's float64 reference: the same sums in another order
        exact = attnlab.reference(arrays["q"], arrays["k"], arrays["v"], **keywords)
        check(exact.dtype == np.float64 and rel(exact, ref.detach()) < 1e-12,
              f"{what}: attnlab.reference {rel(exact, ref.detach())}")

    # torch: the same through autograd, every float input a leaf.
    leaves = {n: t.clone().requires_grad_() for n, t in x.items()}
    padding = None
    if lengths:
        padding = torch.arange(nk)[None, :] >= torch.tensor(lengths)[:, None]
    out_t = at.attention(leaves["q"], leaves["k"], leaves["v"], spec=spec,
                         key_padding_mask=padding, **common,
                         **{TORCH_NAMES[n]: leaves[n] for n in inputs})
    (out_t * d_out).sum().backward()
    errors = {"out": rel(out_t.detach(), ref.detach())}
    errors.update({"d" + n: rel(leaves[n].grad, x64[n].grad) for n in x})
    check(max(errors.values()) < TOL, f"{what}: torch relative errors {errors}")


# Each keyword alone (with what it needs), then combined.
case("window_size (3, 2)", window=(3, 2))
case("window_size (5, 0) causal", causal="top-left", window=(5, 0))
case("window_size (-1, 4)", window=(-1, 4))
case("prefix_lengths causal", causal="top-left", prefix=[6, 0])
case("prefix_lengths with padding", causal="top-left", prefix=[24, 9], lengths=[24, 17])
case("softcap", softcap=2.0)
case("alibi_slopes", inputs=("slopes",))
case("alibi_slopes causal bottom-right cross", inputs=("slopes",), nq=10, causal="bottom-right")
case("bias [B, H, Nq, Nk]", inputs=("bias",))
case("bias [H, 1, Nk] broadcast", inputs=("bias",), bias_shape=(H, 1, 24), causal="top-left")
case("bias [Nq, Nk] cross", inputs=("bias",), bias_shape=(10, 24), nq=10)
case("sinks", inputs=("sinks",))
case("sinks causal padded", inputs=("sinks",), causal="top-left", lengths=[24, 11])
case("rows that see no key, with sinks (bottom-right, Nq > Nk)", inputs=("sinks", "bias"), nk=10,
     causal="bottom-right")
case("log_decay forgetting gate", inputs=("g",), causal="top-left", lengths=[24, 19])
case("cu_seqlens", batch=1, docs=[0, 7, 7, 24], causal="top-left")
case("cu_seqlens cu_seqlens_k cross", batch=1, docs=[0, 5, 12], kdocs=[0, 9, 24], nq=12)
case("grouped heads Hkv = 2", hkv=2, causal="top-left")
case("grouped heads Hkv = 1 (MQA)", hkv=1, inputs=("bias", "sinks"))
case("everything: documents, causal, window, prefix, ALiBi, softcap, sinks, bias, gate, GQA",
     batch=1, hkv=2, docs=[0, 10, 24], causal="top-left", window=(6, 0), prefix=[3, 4],
     softcap=3.0, inputs=("slopes", "sinks", "bias", "g"), bias_shape=(H, 24, 24))
case("sliding with modifiers", spec="sliding:left=4,right=2", inputs=("bias", "sinks", "slopes"),
     softcap=2.5, pattern=lambda i, j: (j >= i - 4) & (j <= i + 2))
case("bigbird every block global (= full) with modifiers",
     spec="bigbird:block=8,window=3,global=3,random=0", inputs=("sinks", "slopes"),
     causal="top-left", hkv=2)

# Exact reductions from Python: a window covering N, cap -> large, zero slopes, a -inf sink and
# a zero bias each equal plain full bitwise or to float tolerance.
q, k, v = (np.random.default_rng(3).standard_normal((2, H, 24, D), dtype=np.float32)
           for _ in range(3))
plain = attnlab.attention(q, k, v, causal="top-left")
check(np.array_equal(attnlab.attention(q, k, v, causal="top-left", window_size=(-1, -1)), plain),
      "window_size (-1, -1) is no window")
check(np.array_equal(attnlab.attention(q, k, v, causal="top-left", softcap=0.0), plain),
      "softcap 0 is none (FlashAttention's default)")
for what, keywords in (("window covering N", dict(window_size=(24, 24))),
                       ("zero slopes", dict(alibi_slopes=np.zeros(H, np.float32))),
                       ("-inf sinks", dict(sinks=np.full(H, -np.inf, np.float32))),
                       ("zero bias", dict(bias=np.zeros((24, 24), np.float32))),
                       ("softcap 1e6", dict(softcap=1e6))):
    got = attnlab.attention(q, k, v, causal="top-left", **keywords)
    check(np.abs(got - plain).max() < 1e-5, f"{what} equals plain full: {np.abs(got - plain).max()}")

# A query that sees no key outputs zeros, with a sink too (it takes all the weight).
q, k, v = (np.random.default_rng(4).standard_normal((1, H, n, D), dtype=np.float32)
           for n in (12, 5, 5))
none_seen = attnlab.attention(q, k, v, causal="bottom-right", sinks=np.zeros(H, np.float32))
check(np.all(none_seen[:, :, :7] == 0) and np.all(np.abs(none_seen[:, :, 7:]).sum(-1) > 0),
      "rows that see no key are zeros, the others are not")

# support names what each variant takes.
full_support, linear_support = attnlab.make("full").support, attnlab.make("linear").support
for flag in ("window", "prefix", "softcap", "bias", "sinks", "alibi", "forgetting_gate"):
    check(full_support[flag] and not linear_support[flag], f"support[{flag!r}]")
check(full_support["grouped_heads"] and linear_support["grouped_heads"]
      and not attnlab.make("linformer").support["grouped_heads"], "support['grouped_heads']")

# alibi_slopes(H): the paper's geometric slopes, 2^(-8 (h + 1) / H) for H a power of two.
check(np.allclose(attnlab.alibi_slopes(8), 2.0 ** (-np.arange(1, 9))), "alibi_slopes(8)")
check(attnlab.alibi_slopes(6).shape == (6,) and attnlab.alibi_slopes(6).dtype == np.float32,
      "alibi_slopes(6) shape and dtype")

# torch 1.13's _scaled_dot_product_attention (float attn_mask added to the scores, as in torch
# 2's public function): a float attn_mask as bias, plain and with causal, and grouped heads
# with k, v repeated for SDPA (its enable_gqa came in torch 2.5); outputs and gradients in
# float32 (both sides round: 1e-5).
SDPA_TOL = 1e-5


def sdpa_case(what, bias_shape, hkv=H, causal=False):
    q = torch.randn(2, H, 20, D, requires_grad=True)
    k, v = (torch.randn(2, hkv, 20, D, requires_grad=True) for _ in range(2))
    bias = torch.randn(bias_shape, requires_grad=True) if bias_shape else None
    d_out = torch.randn(2, H, 20, D)
    ours = at.attention(q, k, v, attn_mask=bias, causal=causal, enable_gqa=hkv != H)
    (ours * d_out).sum().backward()
    mine = [t.grad.clone() for t in (q, k, v) + ((bias,) if bias is not None else ())]
    for t in (q, k, v, bias):
        if t is not None:
            t.grad = None
    group = H // hkv
    full_mask = bias
    if causal:
        blocked = torch.ones(20, 20).triu(1).bool()
        full_mask = (bias if bias is not None else torch.zeros(20, 20)).masked_fill(
            blocked, -math.inf)
    theirs, _ = F._scaled_dot_product_attention(q, k.repeat_interleave(group, 1),
                                                v.repeat_interleave(group, 1), full_mask, 0.0,
                                                False, False)
    (theirs * d_out).sum().backward()
    ref = [t.grad for t in (q, k, v) + ((bias,) if bias is not None else ())]
    errors = [rel(ours.detach(), theirs.detach())] + [rel(a, b) for a, b in zip(mine, ref)]
    check(max(errors) < SDPA_TOL, f"SDPA {what}: out and gradients' relative errors {errors}")


sdpa_case("float attn_mask [B, H, N, N]", (2, H, 20, 20))
sdpa_case("float attn_mask [N, N] causal", (20, 20), causal=True)
sdpa_case("float attn_mask [B, 1, 1, N] (padding-like)", (2, 1, 1, 20))
sdpa_case("grouped heads Hkv = 2", None, hkv=2)
sdpa_case("grouped heads Hkv = 1 with a bias", (H, 20, 20), hkv=1)

# A float attn_mask of 0 / -inf without grad keeps working as a boolean mask where a variant
# has no bias (linear under nn.Transformer's causal mask); with grad it is a bias.
x = torch.randn(1, 2, 12, D)
causal_float = torch.nn.Transformer.generate_square_subsequent_mask(12)
check(torch.equal(at.attention(x, x, x, spec="linear", attn_mask=causal_float),
                  at.attention(x, x, x, spec="linear", causal=True)), "linear under a 0/-inf mask")
zero_inf = causal_float.clone().requires_grad_()
at.attention(x, x, x, attn_mask=zero_inf).sum().backward()
check(zero_inf.grad is not None and zero_inf.grad.shape == (12, 12), "0/-inf mask with grad")

# torch: a float key_padding_mask is added to the scores as [B, 1, 1, Nk] (nn.MultiheadAttention
# adds it so), differentiably; window_size and prefix_lengths may be integer tensors.
x = torch.randn(2, H, 12, D)
added = torch.randn(2, 12, requires_grad=True)
as_bias = added.detach().clone().requires_grad_()
d_out = torch.randn(2, H, 12, D)
(at.attention(x, x, x, key_padding_mask=added) * d_out).sum().backward()
(at.attention(x, x, x, attn_mask=as_bias[:, None, None, :]) * d_out).sum().backward()
check(torch.allclose(added.grad, as_bias.grad, atol=1e-6), "float key_padding_mask as a bias")
check(torch.equal(at.attention(x, x, x, causal=True, window_size=torch.tensor([3, 0]),
                               prefix_lengths=torch.tensor([2, 5])),
                  at.attention(x, x, x, causal=True, window_size=(3, 0), prefix_lengths=[2, 5])),
      "window_size and prefix_lengths as tensors")

# Bad input: each names the keyword, for NumPy and for torch, and leaves the inputs as they were.
q, k, v = (np.random.default_rng(5).standard_normal((2, H, 8, D), dtype=np.float32)
           for _ in range(3))
k2, v2 = k[:, :2].copy(), v[:, :2].copy()
k3 = np.ascontiguousarray(k[:, :3])
before = [a.copy() for a in (q, k, v, k2, v2)]
raises(ValueError, ["enable_gqa=True", "2 heads"], attnlab.attention, q, k2, v2)
raises(ValueError, ["enable_gqa=True"], at.attention, *map(torch.from_numpy, (q, k2, v2)))
raises(ValueError, ["heads"], attnlab.attention, q, k3, k3, enable_gqa=True)
raises(TypeError, ["enable_gqa"], attnlab.attention, q, k2, v2, enable_gqa="yes")
raises(NotImplementedError, ["linformer", "grouped heads"], attnlab.attention, q, k2, v2,
       spec="linformer:k=4,max_len=8", enable_gqa=True)
for bad in ((-2, 0), (3,), 5, (1.5, 2), (True, 1)):
    raises(ValueError, ["window_size"], attnlab.attention, q, k, v, window_size=bad)
raises(ValueError, ["window_size"], at.attention, *map(torch.from_numpy, (q, k, v)),
       window_size=(0, -3))
raises(NotImplementedError, ["linear", "window"], attnlab.attention, q, k, v, spec="linear",
       window_size=(2, 2))
for bad in (-1.0, math.nan, math.inf, "2"):
    raises(ValueError, ["softcap"], attnlab.attention, q, k, v, softcap=bad)
raises(NotImplementedError, ["linear", "softcap"], attnlab.attention, q, k, v, spec="linear",
       softcap=2.0)
raises(ValueError, ["prefix_lengths", "causal"], attnlab.attention, q, k, v, prefix_lengths=[2, 2])
raises(ValueError, ["prefix_lengths[1]", "9"], attnlab.attention, q, k, v, causal="top-left",
       prefix_lengths=[2, 9])
raises(ValueError, ["prefix_lengths"], attnlab.attention, q, k, v, causal="top-left",
       prefix_lengths=[2.5, 1])
raises(ValueError, ["prefix_lengths", "has 1"], at.attention, *map(torch.from_numpy, (q, k, v)),
       causal=True, prefix_lengths=[2])
raises(TypeError, ["bias", "int64"], attnlab.attention, q, k, v, bias=np.zeros((8, 8), np.int64))
raises(TypeError, ["bias", "list"], attnlab.attention, q, k, v, bias=[[0.0] * 8] * 8)
raises(ValueError, ["bias", "broadcast"], attnlab.attention, q, k, v,
       bias=np.zeros((3, 8, 8), np.float32))
nan_bias = np.zeros((8, 8), np.float32)
nan_bias[2, 3] = np.nan
raises(ValueError, ["bias", "NaN"], attnlab.attention, q, k, v, bias=nan_bias)
raises(ValueError, ["bias", "NaN"], attnlab.reference, q, k, v, bias=nan_bias)
raises(ValueError, ["sinks", "H = 4"], attnlab.reference, q, k, v, sinks=np.zeros(3, np.float32))
raises(ValueError, ["attn_mask", "NaN"], at.attention, *map(torch.from_numpy, (q, k, v)),
       attn_mask=torch.from_numpy(nan_bias))
raises(ValueError, ["attn_mask", "broadcast"], at.attention, *map(torch.from_numpy, (q, k, v)),
       attn_mask=torch.zeros(3, 8, 8))
raises(NotImplementedError, ["linear", "bias"], attnlab.attention, q, k, v, spec="linear",
       bias=np.ones((8, 8), np.float32))
raises(NotImplementedError, ["linear", "bias"], at.attention, *map(torch.from_numpy, (q, k, v)),
       spec="linear", attn_mask=torch.ones(8, 8))
raises(ValueError, ["sinks", "H = 4"], attnlab.attention, q, k, v, sinks=np.zeros(3, np.float32))
raises(ValueError, ["sinks", "[H]"], attnlab.attention, q, k, v,
       sinks=np.zeros((1, H), np.float32))
raises(ValueError, ["sinks[1]", "NaN"], attnlab.attention, q, k, v,
       sinks=np.array([0, np.nan, 0, 0], np.float32))
raises(TypeError, ["sinks", "float64"], at.attention, *map(torch.from_numpy, (q, k, v)),
       sinks=torch.zeros(H, dtype=torch.float64))
raises(ValueError, ["alibi_slopes[0]", ">= 0"], attnlab.attention, q, k, v,
       alibi_slopes=np.array([-1, 0, 0, 0], np.float32))
raises(ValueError, ["alibi_slopes", "[H]"], attnlab.attention, q, k, v,
       alibi_slopes=np.zeros((2, H), np.float32))
raises(TypeError, ["alibi_slopes", "str"], at.attention, *map(torch.from_numpy, (q, k, v)),
       alibi_slopes="geometric")
check(torch.equal(at.attention(*map(torch.from_numpy, (q, k, v)), alibi_slopes=[0.5] * H),
                  at.attention(*map(torch.from_numpy, (q, k, v)),
                               alibi_slopes=torch.full((H,), 0.5))),
      "alibi_slopes as a list (constant) equals the same tensor")
raises(ValueError, ["heads"], attnlab.alibi_slopes, 0)
raises(ValueError, ["log-decay", "<= 0"], attnlab.attention, q, k, v, causal="top-left",
       log_decay=np.ones((2, H, 8), np.float32))
raises(NotImplementedError, ["full", "forgetting gate", "causal"], attnlab.attention, q, k, v,
       log_decay=np.zeros((2, H, 8), np.float32))
check(all(np.array_equal(a, b) for a, b in zip(before, (q, k, v, k2, v2))),
      "bad calls leave the inputs as they were")

finish()
