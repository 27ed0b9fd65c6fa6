"""The linear family's recurrent state and packed documents from Python, under
flash-linear-attention's and FlashAttention's names: initial_state, output_final_state,
cu_seqlens, cu_seqlens_k through attnlab.attention, make(spec) and attnlab.torch.attention.
Segments with the state handed on equal one call; packed documents equal each document alone;
grouped KV heads (enable_gqa) equal k and v repeated, the gradients summed over each group;
torch's gradients (the initial state's included) equal autograd of the recurrences written
here in float64; bad input names the argument."""
import numpy as np
import torch

import attnlab
import attnlab.torch as at
from checks import check, finish, raises  # this folder

rng = np.random.default_rng(11)
torch.manual_seed(0)
torch.set_num_threads(1)


def arrays(*shape):
    return rng.standard_normal(shape, dtype=np.float32)


def close(a, b, tol=1e-5):
    """float32 results of different chunkings: they differ by rounding only."""
    return np.allclose(a, b, rtol=tol, atol=tol)


def state_of(spec, lead, dk, dv):
    """A random initial state for `spec`: S, or (S, z) for linear's sum rule."""
    s = 0.5 * arrays(*lead, dk, dv)
    if spec == "linear":
        return s, rng.uniform(0.5, 2.0, lead + (dk,)).astype(np.float32)
    return s


def states_close(a, b):
    if isinstance(a, tuple):
        return isinstance(b, tuple) and all(close(x, y) for x, y in zip(a, b))
    return close(a, b)


SPECS = ["gla", "gated-delta", "delta", "retnet", "linear", "linear:rule=delta"]

# A sequence in two segments, the state handed on, equals one call: [B, H, N, D] and [H, N, D].
for spec in SPECS:
    a = attnlab.make(spec)
    check(a.support["state"] and a.support["documents"], f"{spec}: support names state")
    for lead in ((2, 3), (3,)):
        n, dk, dv = 70, 8, 6
        q, k, v = arrays(*lead, n, dk), arrays(*lead, n, dk), arrays(*lead, n, dv)
        extra = {}
        if a.support["log_decay"]:
            extra["log_decay"] = -rng.uniform(0, 1, lead + (n,)).astype(np.float32)
        if a.support["beta"]:
            extra["beta"] = rng.uniform(0, 1, lead + (n,)).astype(np.float32)
        s0 = state_of(spec, lead, dk, dv)
        out, final = attnlab.attention(q, k, v, spec=spec, causal="top-left", initial_state=s0,
                                       output_final_state=True, **extra)
        cut = 23
        first = {name: x[..., :cut] for name, x in extra.items()}
        rest = {name: x[..., cut:] for name, x in extra.items()}
        o1, f1 = a.forward(q[..., :cut, :], k[..., :cut, :], v[..., :cut, :], causal="top-left",
                           initial_state=s0, output_final_state=True, **first)
        o2, f2 = a.forward(q[..., cut:, :], k[..., cut:, :], v[..., cut:, :], causal="top-left",
                           initial_state=f1, output_final_state=True, **rest)
        check(close(np.concatenate([o1, o2], axis=-2), out), f"{spec} {lead}: segments' outputs")
        check(states_close(f2, final), f"{spec} {lead}: segments' final state")
        shape = (final[0] if isinstance(final, tuple) else final).shape
        check(shape == lead + (dk, dv), f"{spec} {lead}: final state shape {shape}")
        # backward: d_initial_state in initial_state's form; a zero d_final_state changes
        # nothing, and the segments' chain equals one backward.
        d_out = arrays(*lead, n, dv)
        g = a.backward(q, k, v, out, d_out, causal="top-left", initial_state=s0, **extra)
        d0 = g["d_initial_state"]
        check(type(d0) is type(s0), f"{spec} {lead}: d_initial_state's form")
        zero = tuple(np.zeros_like(x) for x in final) if isinstance(final, tuple) \
            else np.zeros_like(final)
        g0 = a.backward(q, k, v, out, d_out, causal="top-left", initial_state=s0,
                        d_final_state=zero, **extra)
        check(close(g0["dq"], g["dq"]), f"{spec} {lead}: zero d_final_state")
        g2 = a.backward(q[..., cut:, :], k[..., cut:, :], v[..., cut:, :], o2,
                        d_out[..., cut:, :], causal="top-left", initial_state=f1, **rest)
        g1 = a.backward(q[..., :cut, :], k[..., :cut, :], v[..., :cut, :], o1,
                        d_out[..., :cut, :], causal="top-left", initial_state=s0,
                        d_final_state=g2["d_initial_state"], **first)
        check(close(np.concatenate([g1["dk"], g2["dk"]], axis=-2), g["dk"], 1e-4),
              f"{spec} {lead}: segments' dk")
        check(states_close(g1["d_initial_state"], d0), f"{spec} {lead}: segments' d_initial")

# Packed documents equal each document alone; states one per document.
for spec in SPECS:
    lengths = [5, 0, 40, 70]
    offsets = np.cumsum([0] + lengths)
    n, h, dk, dv = int(offsets[-1]), 2, 8, 6
    q, k, v = arrays(1, h, n, dk), arrays(1, h, n, dk), arrays(1, h, n, dv)
    s0 = state_of(spec, (len(lengths), h), dk, dv)
    out, final = attnlab.attention(q, k, v, spec=spec, causal="top-left", initial_state=s0,
                                   output_final_state=True, cu_seqlens=offsets)
    for d, (t0, t1) in enumerate(zip(offsets[:-1], offsets[1:])):
        start = tuple(x[d:d + 1] for x in s0) if isinstance(s0, tuple) else s0[d:d + 1]
        end = tuple(x[d:d + 1] for x in final) if isinstance(final, tuple) else final[d:d + 1]
        if t1 == t0:
            check(states_close(end, start), f"{spec}: an empty document keeps its state")
            continue
        o, f = attnlab.attention(q[:, :, t0:t1], k[:, :, t0:t1], v[:, :, t0:t1], spec=spec,
                                 causal="top-left", initial_state=start, output_final_state=True)
        check(np.array_equal(o, out[:, :, t0:t1]), f"{spec}: document {d} alone")
        check(states_close(f, end), f"{spec}: document {d}'s final state")
# Cross-attention documents (cu_seqlens_k), non-causal, rank 3 ([H, N, D]: a batch of one).
q, k, v = arrays(2, 9, 8), arrays(2, 12, 8), arrays(2, 12, 8)
out = attnlab.attention(q, k, v, spec="gla", cu_seqlens=[0, 4, 9], cu_seqlens_k=[0, 10, 12])
alone = attnlab.attention(q[:, 4:], k[:, 10:], v[:, 10:], spec="gla")
check(np.array_equal(out[:, 4:], alone), "cu_seqlens_k: the second document alone")


# torch: gradients of q, k, v, g and the initial state, and through the final state, against
# autograd of the recurrences in float64.
def gla64(q, k, v, g, s0, scale):
    """S_t = exp(g_t) S_{t-1} + k_t v_t^T, out_t = S_t^T q_t scale; returns (out, S_N)."""
    outs, s = [], s0
    for t in range(q.shape[-2]):
        s = torch.exp(g[..., t])[..., None, None] * s + k[..., t, :, None] * v[..., t, None, :]
        outs.append(torch.einsum("...kv,...k->...v", s, q[..., t, :] * scale))
    return torch.stack(outs, dim=-2), s


def linear64(q, k, v, s0, z0, eps):
    """elu+1 features; S_t = S_{t-1} + phi(k_t) v_t^T, z_t = z_{t-1} + phi(k_t), out_t =
    phi(q_t)^T S_t / (phi(q_t)^T z_t + eps); returns (out, S_N, z_N)."""
    phi = lambda x: torch.nn.functional.elu(x) + 1  # noqa: E731
    outs, s, z = [], s0, z0
    for t in range(q.shape[-2]):
        fk, fq = phi(k[..., t, :]), phi(q[..., t, :])
        s = s + fk[..., :, None] * v[..., t, None, :]
        z = z + fk
        num = torch.einsum("...kv,...k->...v", s, fq)
        outs.append(num / ((fq * z).sum(-1, keepdim=True) + eps))
    return torch.stack(outs, dim=-2), s, z


B, H, N, D = 2, 2, 70, 6
leaves = [torch.randn(B, H, N, D, requires_grad=True) for _ in range(3)]
g = (-torch.rand(B, H, N)).requires_grad_()
s0 = (0.5 * torch.randn(B, H, D, D)).requires_grad_()
out, s_n = at.attention(*leaves, spec="gla", causal="top-left", log_decay=g, initial_state=s0,
                        output_final_state=True)
w_out, w_s = torch.randn_like(out), torch.randn_like(s_n)
((out * w_out).sum() + (s_n * w_s).sum()).backward()
x64 = [t.detach().double().requires_grad_() for t in (*leaves, g, s0)]
o64, s64 = gla64(*x64, scale=D ** -0.5)
((o64 * w_out.double()).sum() + (s64 * w_s.double()).sum()).backward()
check(float((out.double() - o64).abs().max()) < 1e-4, "torch gla: out")
check(float((s_n.double() - s64).abs().max()) < 1e-4, "torch gla: final state")
for name, ours, ref in zip(("q", "k", "v", "g", "initial_state"), (*leaves, g, s0), x64):
    err = float((ours.grad.double() - ref.grad).abs().max() / ref.grad.abs().max())
    check(err < 1e-4, f"torch gla: d{name} relative error {err:.2e}")

leaves = [torch.randn(B, H, N, D, requires_grad=True) for _ in range(3)]
s0 = (0.5 * torch.randn(B, H, D, D)).requires_grad_()
z0 = (0.5 + torch.rand(B, H, D)).requires_grad_()
out, (s_n, z_n) = at.attention(*leaves, spec="linear:eps=0.001", causal="top-left",
                               initial_state=(s0, z0), output_final_state=True)
w_out, w_s, w_z = torch.randn_like(out), torch.randn_like(s_n), torch.randn_like(z_n)
((out * w_out).sum() + (s_n * w_s).sum() + (z_n * w_z).sum()).backward()
x64 = [t.detach().double().requires_grad_() for t in (*leaves, s0, z0)]
o64, s64, z64 = linear64(*x64, eps=1e-3)
((o64 * w_out.double()).sum() + (s64 * w_s.double()).sum()
 + (z64 * w_z.double()).sum()).backward()
check(float((out.double() - o64).abs().max()) < 1e-4, "torch linear: out")
for name, ours, ref in zip(("q", "k", "v", "S_0", "z_0"), (*leaves, s0, z0), x64):
    err = float((ours.grad.double() - ref.grad).abs().max() / ref.grad.abs().max())
    check(err < 1e-4, f"torch linear: d{name} relative error {err:.2e}")

# torch with cu_seqlens (a tensor of offsets): documents alone.
q, k, v = (torch.randn(1, 2, 30, 4) for _ in range(3))
out = at.attention(q, k, v, spec="gla", causal=True, cu_seqlens=torch.tensor([0, 11, 30]))
alone = at.attention(q[:, :, 11:], k[:, :, 11:], v[:, :, 11:], spec="gla", causal=True)
check(torch.equal(out[:, :, 11:], alone), "torch cu_seqlens: the second document alone")

# Grouped KV heads (enable_gqa): 4 query heads over 2 and 1 KV heads equal k and v repeated,
# the state per query head; NumPy's dk, dv and torch's k.grad, v.grad are the repeated ones
# summed over each group (the same float sums in the same order: bitwise for NumPy).
for spec in SPECS:
    a = attnlab.make(spec)
    check(a.support["grouped_heads"], f"{spec}: support names grouped_heads")
    for kv in (2, 1):
        n, h, dk, dv = 70, 4, 8, 6
        q, k, v = arrays(2, h, n, dk), arrays(2, kv, n, dk), arrays(2, kv, n, dv)
        rep = lambda x: np.repeat(x, h // kv, axis=1)  # noqa: E731
        extra = {}
        if a.support["log_decay"]:
            extra["log_decay"] = -rng.uniform(0, 1, (2, h, n)).astype(np.float32)
        if a.support["beta"]:
            extra["beta"] = rng.uniform(0, 1, (2, h, n)).astype(np.float32)
        s0 = state_of(spec, (2, h), dk, dv)
        out, final = a.forward(q, k, v, causal="top-left", enable_gqa=True, initial_state=s0,
                               output_final_state=True, **extra)
        out_r, final_r = a.forward(q, rep(k), rep(v), causal="top-left", initial_state=s0,
                                   output_final_state=True, **extra)
        check(np.array_equal(out, out_r), f"{spec} Hkv={kv}: output")
        check(states_close(final, final_r), f"{spec} Hkv={kv}: final state")
        d_out = arrays(2, h, n, dv)
        g = a.backward(q, k, v, out, d_out, causal="top-left", enable_gqa=True, initial_state=s0,
                       **extra)
        g_r = a.backward(q, rep(k), rep(v), out, d_out, causal="top-left", initial_state=s0,
                         **extra)
        for name in ("dk", "dv"):
            parts = g_r[name].reshape(2, kv, h // kv, n, -1)
            total = parts[:, :, 0]
            for u in range(1, h // kv):
                total = total + parts[:, :, u]
            check(g[name].shape == (2, kv, n, parts.shape[-1]) and np.array_equal(g[name], total),
                  f"{spec} Hkv={kv}: {name} the group sums of the repeated call's")
        check(np.array_equal(g["dq"], g_r["dq"]), f"{spec} Hkv={kv}: dq")
    raises(ValueError, ["enable_gqa"], a.forward, arrays(1, 4, 5, 8), arrays(1, 2, 5, 8),
           arrays(1, 2, 5, 8))
qt = torch.randn(2, 4, 70, 6, requires_grad=True)
kt, vt = (torch.randn(2, 1, 70, 6, requires_grad=True) for _ in range(2))
gt = (-torch.rand(2, 4, 70)).requires_grad_()
out = at.attention(qt, kt, vt, spec="gla", causal=True, log_decay=gt, enable_gqa=True)
w_out = torch.randn_like(out)
(out * w_out).sum().backward()
x64 = [t.detach().double().requires_grad_() for t in (qt, kt, vt, gt)]
o64, _ = gla64(x64[0], x64[1].expand(2, 4, 70, 6), x64[2].expand(2, 4, 70, 6), x64[3],
               torch.zeros(2, 4, 6, 6, dtype=torch.float64), scale=6 ** -0.5)
(o64 * w_out.double()).sum().backward()
check(float((out.double() - o64).abs().max()) < 1e-4, "torch gla MQA: out")
for name, ours, ref in zip(("q", "k", "v", "g"), (qt, kt, vt, gt), x64):
    err = float((ours.grad.double() - ref.grad).abs().max() / ref.grad.abs().max())
    check(ours.grad.shape == ref.grad.shape and err < 1e-4,
          f"torch gla MQA: d{name} relative error {err:.2e}")

# Bad input names the argument.
q, k, v = arrays(1, 2, 10, 4), arrays(1, 2, 10, 4), arrays(1, 2, 10, 4)
gla = attnlab.make("gla")
raises(ValueError, ["initial_state", "[1, 2, 3, 4]"], gla.forward, q, k, v,
       initial_state=arrays(1, 2, 3, 4))
raises(ValueError, ["initial_state", "[B, H, Dk, Dv]"], gla.forward, q, k, v,
       initial_state=arrays(2, 4, 4))
bad = arrays(1, 2, 4, 4)
bad[0, 1, 2, 3] = np.nan
raises(ValueError, ["initial_state", "NaN", "[0, 1, 2, 3]"], gla.forward, q, k, v,
       initial_state=bad)
raises(TypeError, ["initial_state", "numpy.ndarray"], gla.forward, q, k, v,
       initial_state=[[0.0]])
raises(ValueError, ["initial_state", "tuple of 3"], gla.forward, q, k, v,
       initial_state=(bad, bad, bad))
raises(ValueError, ["initial_state", "no key sum"], attnlab.make("linear").forward, q, k, v,
       initial_state=arrays(1, 2, 4, 4))
raises(NotImplementedError, ["full", "recurrent state", "initial_state"],
       attnlab.make("full").forward, q, k, v, initial_state=arrays(1, 2, 4, 4))
raises(NotImplementedError, ["full", "output_final_state"], attnlab.make("full").forward, q, k,
       v, output_final_state=True)
raises(NotImplementedError, ["linear", "recurrent state", "stabiliser"], attnlab.attention, q,
       k, v, spec="linear:feature=favor,m=4", initial_state=(bad, arrays(1, 2, 4)))
raises(ValueError, ["cu_seqlens", "must not decrease"], gla.forward, q, k, v,
       cu_seqlens=[0, 6, 4, 10])
raises(ValueError, ["cu_seqlens", "start at 0"], gla.forward, q, k, v, cu_seqlens=[2, 10])
raises(ValueError, ["cu_seqlens", "ends at 9", "Nq = 10"], gla.forward, q, k, v,
       cu_seqlens=[0, 9])
raises(ValueError, ["cu_seqlens", "integer offsets"], gla.forward, q, k, v,
       cu_seqlens=[0.0, 10.0])
raises(ValueError, ["cu_seqlens", "batch of one"], gla.forward, arrays(2, 2, 10, 4),
       arrays(2, 2, 10, 4), arrays(2, 2, 10, 4), cu_seqlens=[0, 10])
raises(ValueError, ["cu_seqlens_k", "without cu_seqlens"], gla.forward, q, k, v,
       cu_seqlens_k=[0, 10])
raises(ValueError, ["d_final_state", "[1, 2, 4, 4]", "[2, 2, 4, 4]"], gla.backward, q, k, v,
       q, q, cu_seqlens=[0, 3, 10], d_final_state=arrays(1, 2, 4, 4))
tq, tk, tv = (torch.randn(1, 2, 10, 4) for _ in range(3))
raises(TypeError, ["initial_state", "torch.float32"], at.attention, tq, tk, tv, spec="gla",
       initial_state=torch.zeros(1, 2, 4, 4, dtype=torch.float64))
raises(ValueError, ["initial_state", "tuple of 3"], at.attention, tq, tk, tv, spec="gla",
       initial_state=(tq, tq, tq))

finish()
