"""attnlab.torch: attention()'s output and gradients against PyTorch autograd of the dense
definitions in float64 (tests/torch_grads.py, written independently of attnlab's kernels) for
every variant and mask kind; MultiheadAttention against torch.nn.MultiheadAttention with the
same weights; the swap inside nn.TransformerEncoderLayer; bad input."""
import copy
import math
import os
import sys
import warnings

import torch

import attnlab
import attnlab.torch as at
from checks import check, finish, raises  # this folder

sys.path.insert(0, os.path.join(os.environ["ATTNLAB_SOURCE_DIR"], "tests"))
import torch_grads  # noqa: E402  (the C++ tests' float64 definitions of every variant)

torch.manual_seed(0)
torch.set_num_threads(1)


def rel(a, b):
    """max |a - b| / max |b|, b the float64 reference."""
    return float((a.double() - b).abs().max() / b.abs().max().clamp_min(1e-30))


B, H, D = 2, 2, 16
TOL = 3e-5  # float32 output and gradients against float64, relative to the largest entry


def grads_case(what, spec, dense, nq=40, nk=40, dv=D, **kwargs):
    """attnlab.torch.attention(spec, **kwargs) against dense(q, k, v) in float64: out, dq, dk, dv."""
    q = torch.randn(B, H, nq, D, requires_grad=True)
    k = torch.randn(B, H, nk, D, requires_grad=True)
    v = torch.randn(B, H, nk, dv, requires_grad=True)
    d_out = torch.randn(B, H, nq, dv)
    out = at.attention(q, k, v, spec=spec, **kwargs)
    (out * d_out).sum().backward()
    x64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = dense(*x64)
    (ref * d_out.double()).sum().backward()
    errors = [rel(out.detach(), ref.detach())] + [rel(t.grad, r.grad) for t, r in zip((q, k, v), x64)]
    check(max(errors) < TOL, f"{what}: out, dq, dk, dv relative errors {errors}")


def softmax_dense(pattern, causal=None, lengths=None, allowed=None):
    """The float64 softmax reference over pattern(i, j) & the mask parts."""
    def dense(q, k, v):
        nq, nk = q.shape[2], k.shape[2]
        i = torch.arange(nq)[:, None]
        j = torch.arange(nk)[None, :]
        ok = pattern(i, j).expand(nq, nk)[None, None].repeat(B, H, 1, 1)
        if causal == "top-left":
            ok &= j <= i
        if causal == "bottom-right":
            ok &= j <= i + nk - nq
        if lengths is not None:
            ok &= (j[None] < torch.tensor(lengths)[:, None, None])[:, None]
        if allowed is not None:
            ok &= allowed
        return torch_grads.softmax_attention(torch, q, k, v, ok, 1 / math.sqrt(D))
    return dense


everything = lambda i, j: torch.ones_like(i + j, dtype=torch.bool)  # noqa: E731
padding = torch.zeros(B, 40, dtype=torch.bool)
padding[1, 25:] = True                                  # a suffix: key_lengths
holes = torch.zeros(B, 40, dtype=torch.bool)
holes[0, ::3] = True                                    # not a suffix: folded into the mask
band = (torch.ones(40, 40).tril(3) * torch.ones(40, 40).triu(-9)).bool()
causal_float = torch.nn.Transformer.generate_square_subsequent_mask(40)

# full: every mask kind, Nq != Nk, Dv != Dk.
grads_case("full", "full", softmax_dense(everything))
grads_case("full causal", "full", softmax_dense(everything, "top-left"), causal="top-left")
grads_case("full is_causal=True", "full", softmax_dense(everything, "top-left"), causal=True)
grads_case("full cross bottom-right", "full", softmax_dense(everything, "bottom-right"),
           nq=24, causal="bottom-right", dv=8)
grads_case("full cross top-left", "full", softmax_dense(everything, "top-left"), nq=56,
           causal="top-left")
grads_case("full padding", "full", softmax_dense(everything, lengths=[40, 25]),
           key_padding_mask=padding)
grads_case("full cross padding", "full", softmax_dense(everything, lengths=[40, 25]), nq=24,
           key_padding_mask=padding)
grads_case("full padding holes", "full", softmax_dense(everything, allowed=~holes[:, None, None]),
           key_padding_mask=holes)
grads_case("full bool attn_mask", "full", softmax_dense(everything, allowed=band), attn_mask=band)
grads_case("full float causal attn_mask", "full", softmax_dense(everything, "top-left"),
           attn_mask=(causal_float == 0).float().log())
per_head = torch.rand(B, H, 40, 40) < 0.7
grads_case("full [B,H] attn_mask", "full", softmax_dense(everything, allowed=per_head),
           attn_mask=per_head)

# sliding: the window and global tokens of variants/sliding.hpp.
window = lambda i, j: ((i - j >= 0) & (i - j <= 5)) | ((j - i >= 0) & (j - i <= 3)) | (i < 2) | (j < 2)  # noqa: E731,E501
s = "sliding:left=5,right=3,global=2"
grads_case("sliding", s, softmax_dense(window))
grads_case("sliding causal", s, softmax_dense(window, "top-left"), causal="top-left")
grads_case("sliding padding", s, softmax_dense(window, lengths=[40, 25]), key_padding_mask=padding)

# bigbird without random blocks: window 3 and the first and last block global (block 8, N 40).
blocks = lambda i, j: ((i // 8 - j // 8).abs() <= 1) | (i // 8 == 0) | (i // 8 == 4) | (j // 8 == 0) | (j // 8 == 4)  # noqa: E731,E501
bb = "bigbird:block=8,window=3,global=2,random=0"
check(not bool(blocks(torch.arange(40)[:, None], torch.arange(40)[None]).all()), "bigbird sparse")
grads_case("bigbird", bb, softmax_dense(blocks))
grads_case("bigbird causal", bb, softmax_dense(blocks, "top-left"), causal="top-left")
grads_case("bigbird padding", bb, softmax_dense(blocks, lengths=[40, 25]), key_padding_mask=padding)
grads_case("bigbird attn_mask", bb, softmax_dense(blocks, allowed=band), attn_mask=band)


# linformer with E = F = [I_8 | 0] (init=identity): softmax over the first 8 keys' mixtures.
def linformer_dense(lengths):
    e = torch.eye(8, 40, dtype=torch.float64)[None].repeat(H, 1, 1)
    return lambda q, k, v: torch_grads.linformer(torch, q, k, v, e, e, lengths, 1 / math.sqrt(D))


lf = "linformer:k=8,max_len=64,init=identity"
grads_case("linformer", lf, linformer_dense([40, 40]))
grads_case("linformer padding", lf, linformer_dense([40, 25]), key_padding_mask=padding)


# Linformer's E and F as torch tensors (parameters=): out and every gradient, E's and F's too,
# against autograd of the dense definition with the same matrices tied as `share` ties them.
def learned_linformer_case(share, lengths):
    spec = f"linformer:k=6,max_len=48,share={share}"
    drawn = attnlab.make(spec).parameters(H)
    params = {n: torch.from_numpy(x).clone().requires_grad_() for n, x in drawn.items()}
    q, k, v = (torch.randn(B, H, 40, D, requires_grad=True) for _ in range(3))
    d_out = torch.randn(B, H, 40, D)
    padding = torch.arange(40)[None, :] >= torch.tensor(lengths)[:, None]
    out = at.attention(q, k, v, spec=spec, key_padding_mask=padding, parameters=params)
    (out * d_out).sum().backward()
    x64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    p64 = {n: p.detach().double().requires_grad_() for n, p in params.items()}
    e = p64["E"] if share != "layer" else p64["E"][None].expand(H, -1, -1)
    f = p64.get("F", e)
    ref = torch_grads.linformer(torch, *x64, e[:, :, :40], f[:, :, :40], lengths, 1 / math.sqrt(D))
    (ref * d_out.double()).sum().backward()
    errors = [rel(out.detach(), ref.detach())] + [rel(t.grad, r.grad) for t, r in zip((q, k, v), x64)]
    errors += [rel(params[n].grad, p64[n].grad) for n in params]
    check(sorted(params) == (["E", "F"] if share == "none" else ["E"]), f"linformer {share}: names")
    check(max(errors) < TOL, f"linformer share={share} learned: out, dq, dk, dv, dE(, dF) "
          f"relative errors {errors}")


for share in ("none", "kv", "layer"):
    learned_linformer_case(share, [40, 27])


# The linear family's scan variants with their per-token inputs: out and the gradients of q, k,
# v, log_decay and beta against autograd of the float64 recurrence (torch_grads.scan, the one
# the C++ tests use), causal and not, with padding.
def scan_case(spec, delta, with_g, with_beta, causal, lengths, n=19):
    q, k, v = (torch.randn(B, H, n, D, requires_grad=True) for _ in range(3))
    g = (-torch.rand(B, H, n) * 0.7).requires_grad_() if with_g else None
    beta = torch.rand(B, H, n).requires_grad_() if with_beta else None
    d_out = torch.randn(B, H, n, D)
    padded = torch.arange(n)[None] >= torch.tensor(lengths)[:, None]
    out = at.attention(q, k, v, spec=spec, causal="top-left" if causal else None,
                       key_padding_mask=padded, log_decay=g, beta=beta)
    (out * d_out).sum().backward()
    inputs = [t for t in (q, k, v, g, beta) if t is not None]
    x64 = [t.detach().double().requires_grad_() for t in inputs]
    named = dict(zip([n for n, t in zip("qkvgb", (q, k, v, g, beta)) if t is not None], x64))
    ref = torch_grads.scan(torch, {"normalise": delta, "scale": 1 / math.sqrt(D), "delta": delta,
                                   "lengths": lengths, "causal": causal, "head_g": [0.0] * H,
                                   "beta_value": 1.0}, named["q"], named["k"], named["v"],
                           named.get("g"), named.get("b"))
    (ref * d_out.double()).sum().backward()
    errors = [rel(out.detach(), ref.detach())] + [rel(t.grad, r.grad) for t, r in zip(inputs, x64)]
    what = f"{spec} g={with_g} beta={with_beta} causal={causal} lengths={lengths}"
    check(max(errors) < TOL, f"{what}: out and gradients' relative errors {errors}")


for causal in (True, False):
    scan_case("gated-delta", True, True, True, causal, [19, 12])
    scan_case("gla", False, True, False, causal, [19, 12])
scan_case("delta", True, False, True, True, [19, 19])


def linear_dense(causal, lengths, rule="sum"):
    spec = {"feature": "elu1", "rule": rule, "causal": causal, "eps": 1e-6, "beta": 1.0, "nu": 1,
            "lengths": lengths, "scale": 1 / math.sqrt(D)}
    return lambda q, k, v: torch_grads.linear(torch, spec, q, k, v, None)


grads_case("linear", "linear", linear_dense(False, [40, 40]))
grads_case("linear causal", "linear", linear_dense(True, [40, 40]), causal="top-left")
grads_case("linear causal float mask", "linear", linear_dense(True, [40, 40]),
           attn_mask=(causal_float == 0).float().log())
grads_case("linear padding", "linear", linear_dense(False, [40, 25]), key_padding_mask=padding)
grads_case("linear delta causal", "linear:rule=delta", linear_dense(True, [40, 40], "delta"),
           causal="top-left")

# A directional finite difference in float32 through autograd's own machinery.
q, k, v = (torch.randn(1, 2, 12, 8, requires_grad=True) for _ in range(3))
direction = [torch.randn_like(t) for t in (q, k, v)]
loss = lambda *x: (at.attention(*x, causal="top-left") ** 2).sum()  # noqa: E731
loss(q, k, v).backward()
eps = 1e-2
with torch.no_grad():
    plus = loss(*(t + eps * d for t, d in zip((q, k, v), direction)))
    minus = loss(*(t - eps * d for t, d in zip((q, k, v), direction)))
fd = float((plus - minus) / (2 * eps))
analytic = float(sum((t.grad * d).sum() for t, d in zip((q, k, v), direction)))
check(abs(fd - analytic) < 2e-3 * max(1.0, abs(analytic)), f"finite difference {fd} vs {analytic}")

# MultiheadAttention(spec="full") against torch's with the same weights: output and every
# parameter gradient to 1e-5, in both layouts and with each mask kind.
E, NH, L = 32, 4, 20


def mha_case(what, batch_first=True, kdim=None, vdim=None, s=L, batch=3, **call):
    torch.manual_seed(1)
    ours = at.MultiheadAttention(E, NH, batch_first=batch_first, kdim=kdim, vdim=vdim,
                                 spec="full")
    torch.manual_seed(1)
    theirs = torch.nn.MultiheadAttention(E, NH, batch_first=batch_first, kdim=kdim, vdim=vdim)
    check(list(ours.state_dict()) == list(theirs.state_dict()), what + ": state_dict keys")
    check(all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(),
                                                theirs.state_dict().values())),
          what + ": the same initialisation")
    shape = (lambda n: (batch, n, E)) if batch_first else (lambda n: (n, batch, E))
    if batch is None:
        shape = lambda n: (n, E)  # noqa: E731
    x = torch.randn(shape(L), requires_grad=True)
    key = torch.randn(shape(s)[:-1] + (kdim or E,)) if kdim else x
    value = torch.randn(shape(s)[:-1] + (vdim or E,)) if vdim else x
    out, weights = ours(x, key, value, need_weights=False, **call)
    ref, _ = theirs(x, key, value, need_weights=False, **call)
    grad = torch.randn_like(ref)
    (out * grad).sum().backward()
    dx = x.grad.clone()
    x.grad = None
    (ref * grad).sum().backward()
    check(weights is None and out.shape == ref.shape, what + ": shapes")
    check(torch.allclose(out, ref, rtol=1e-5, atol=1e-5), f"{what}: output {rel(out, ref.double())}")
    check(torch.allclose(dx, x.grad, rtol=1e-5, atol=1e-5), what + ": input gradient")
    for (name, p), r in zip(ours.named_parameters(), theirs.parameters()):
        check(torch.allclose(p.grad, r.grad, rtol=1e-5, atol=1e-5),
              f"{what}: d{name} {rel(p.grad, r.grad.double())}")
    # need_weights=True (the default): torch's weights, head-averaged and per head. Both are
    # float32 probabilities in [0, 1] summed in different orders: 1e-6 absolute.
    for average in (True, False):
        with torch.no_grad():
            _, w_ours = ours(x, key, value, average_attn_weights=average, **call)
            _, w_theirs = theirs(x, key, value, average_attn_weights=average, **call)
        check(w_ours is not None and w_ours.shape == w_theirs.shape and
              torch.allclose(w_ours, w_theirs, rtol=0, atol=1e-6),
              f"{what}: weights (average_attn_weights={average}) "
              f"{None if w_ours is None else (w_ours - w_theirs).abs().max()}")


mha_pad = torch.zeros(3, L, dtype=torch.bool)
mha_pad[1, 13:] = True
mha_pad[2, ::4] = True
mha_band = ~(torch.ones(L, L).tril(2) * torch.ones(L, L).triu(-5)).bool()  # True = blocked
mha_case("MHA")
mha_case("MHA seq-first", batch_first=False)
mha_case("MHA unbatched", batch=None)
mha_case("MHA key_padding_mask", key_padding_mask=mha_pad)
mha_case("MHA float key_padding_mask", key_padding_mask=mha_pad.float().masked_fill(mha_pad, -math.inf))
mha_case("MHA bool attn_mask", attn_mask=mha_band)
mha_case("MHA causal float attn_mask", attn_mask=torch.nn.Transformer.generate_square_subsequent_mask(L))
mha_case("MHA [B*H] attn_mask and padding", attn_mask=torch.rand(3 * NH, L, L) < 0.3,
         key_padding_mask=mha_pad)
mha_case("MHA kdim vdim cross", kdim=24, vdim=12, s=28)
mha_case("MHA float attn_mask added (a bias)", attn_mask=torch.randn(L, L))
mha_case("MHA float key_padding_mask added", key_padding_mask=torch.randn(3, L))
mha_case("MHA [B*H] float attn_mask and padding", attn_mask=torch.randn(3 * NH, L, L),
         key_padding_mask=mha_pad)

# Weights of the variants that are not torch's: per head, each row sums to 1 over the keys it
# sees (softmax; linear's normalised kernel to 1 - O(eps)), zeros outside sliding's window, and
# the weights times the projected values, through out_proj, give the module's output (1e-5:
# float32 sums in another order); the head average is their mean.
def weights_case(spec, blocked=None, row_sum_tol=1e-5):
    torch.manual_seed(3)
    mha = at.MultiheadAttention(E, NH, batch_first=True, spec=spec)
    x = torch.randn(2, L, E)
    with torch.no_grad():
        out, per_head = mha(x, x, x, average_attn_weights=False)
        _, mean = mha(x, x, x)
        wv = mha.in_proj_weight.chunk(3)[2]
        bv = mha.in_proj_bias.chunk(3)[2]
        v = torch.nn.functional.linear(x, wv, bv).reshape(2, L, NH, E // NH).transpose(1, 2)
        rebuilt = mha.out_proj((per_head @ v).transpose(1, 2).reshape(2, L, E))
    check(per_head.shape == (2, NH, L, L) and mean.shape == (2, L, L), f"{spec}: weight shapes")
    check(torch.allclose(rebuilt, out, atol=1e-5), f"{spec}: weights times v give the output "
          f"{(rebuilt - out).abs().max()}")
    check(torch.allclose(mean, per_head.mean(dim=1), atol=1e-7), f"{spec}: the head average")
    check(float((per_head.sum(dim=-1) - 1).abs().max()) < row_sum_tol, f"{spec}: rows sum to 1")
    if blocked is not None:
        check(bool((per_head[..., blocked] == 0).all()), f"{spec}: zeros where no key is seen")


# Every registered variant (the registry's list, each at its defaults but where the sizes here
# need smaller settings): weights where it defines them (the softmax variants, those taking a
# bias; linear's sum rule), else (output, None) and one warning per spec.
i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
small = {"bigbird": "bigbird:block=4,window=3,global=1,random=1",
         "sliding": "sliding:left=3,right=1", "moba": "moba:block=4,topk=2",
         "linformer": "linformer:k=4,max_len=32"}
weight_specs = {name: small.get(name, name) for name in attnlab.variants()}
for name, spec in weight_specs.items():
    if attnlab.make(spec).support["bias"] or name == "linear":
        blocked = (j < i - 3) | (j > i + 1) if name == "sliding" else None
        weights_case(spec, blocked, row_sum_tol=1e-4 if name == "linear" else 1e-5)
        continue
    mha = at.MultiheadAttention(E, NH, batch_first=True, spec=spec)
    x = torch.randn(2, L, E)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = mha(x, x, x)
        second = mha(x, x, x)
        quiet = mha(x, x, x, need_weights=False)
    check(first[1] is None and second[1] is None and quiet[1] is None, f"{spec}: no weights")
    check(len(caught) == 1 and "defines no attention weights" in str(caught[0].message) and
          name in str(caught[0].message), f"{spec}: warned once: "
          f"{[str(w.message) for w in caught]}")
    check(torch.equal(first[0], quiet[0]), f"{spec}: need_weights leaves the output alone")

# Linformer inside the drop-in: E and F are the module's parameters (attention_E, attention_F),
# initialised as the variant draws them; an optimizer step moves them and the output with them;
# a deep copy keeps them.
lin_mha = at.MultiheadAttention(E, NH, batch_first=True, spec="linformer:k=4,max_len=32")
names = [n for n, _ in lin_mha.named_parameters()]
check("attention_E" in names and "attention_F" in names, f"linformer MHA parameters {names}")
drawn = attnlab.make("linformer:k=4,max_len=32").parameters(NH)
check(torch.equal(lin_mha.attention_E.detach(), torch.from_numpy(drawn["E"])), "E as drawn")
x = torch.randn(2, L, E)
before, _ = lin_mha(x, x, x)
before.square().sum().backward()
check(float(lin_mha.attention_E.grad.abs().sum()) > 0 and
      float(lin_mha.attention_F.grad.abs().sum()) > 0, "E and F get gradients")
torch.optim.SGD([lin_mha.attention_E, lin_mha.attention_F], lr=0.1).step()
after, _ = lin_mha(x, x, x)
check(not torch.equal(before.detach(), after.detach()), "a step on E and F changes the output")
twin = copy.deepcopy(lin_mha)
check(torch.equal(twin(x, x, x)[0], after), "a deep copy computes the same")
check("attention_E" in lin_mha.state_dict(), "E in the state_dict")

# Inside torch's own encoder layer: spec="full" matches torch's layer; a sliding window differs
# in eval mode under no_grad too (torch's fused fast path, which would skip self_attn.forward,
# stays off), and the layer clones (nn.TransformerEncoder deep-copies it) and trains.
torch.manual_seed(2)
layer = torch.nn.TransformerEncoderLayer(E, NH, dim_feedforward=64, dropout=0.0, batch_first=True)
swapped = copy.deepcopy(layer)
swapped.self_attn = at.MultiheadAttention(E, NH, batch_first=True, spec="full")
swapped.self_attn.load_state_dict(layer.self_attn.state_dict())
x = torch.randn(2, L, E)
check(torch.allclose(swapped(x), layer(x), atol=1e-5), "encoder layer with spec=full")
local = copy.deepcopy(swapped)
local.self_attn.backend = attnlab.make("sliding:left=1,right=1")
local.eval()
layer.eval()
with torch.no_grad():
    check(not torch.allclose(local(x), layer(x), atol=1e-3), "eval no_grad runs attnlab (no fast path)")
    check(torch.allclose(swapped.eval()(x), layer(x), atol=1e-5), "eval no_grad full equals torch")
encoder = torch.nn.TransformerEncoder(local.train(), num_layers=2)
check(encoder.layers[1].self_attn.backend.spec == local.self_attn.backend.spec, "deepcopy keeps spec")
optimizer = torch.optim.Adam(encoder.parameters(), lr=1e-2)
target = torch.randn(2, L, E)
losses = []
for _ in range(20):
    optimizer.zero_grad()
    loss = ((encoder(x) - target) ** 2).mean()
    loss.backward()
    optimizer.step()
    losses.append(float(loss))
check(losses[-1] < 0.5 * losses[0], f"Adam through attnlab layers {losses[0]} -> {losses[-1]}")

# Bad input.
q = torch.randn(1, 2, 8, 4)
x2, w = q.clone().requires_grad_(), torch.ones(1, 2, 8, 4, requires_grad=True)
(g,) = torch.autograd.grad(at.attention(x2, q, q), x2, grad_outputs=w, create_graph=True)
raises(RuntimeError, ["twice"], lambda: g.sum().backward())  # no silent second derivative
raises(TypeError, ["q", "float64", "float32"], at.attention, q.double(), q, q)
raises(TypeError, ["k", "ndarray"], at.attention, q, q.numpy(), q)
raises(TypeError, ["log_decay", "float64"], at.attention, q, q, q, spec="gla",
       log_decay=torch.zeros(1, 2, 8, dtype=torch.float64))
raises(ValueError, ["log_decay", "[B, H, N]"], at.attention, q, q, q, spec="gla",
       log_decay=torch.zeros(2, 8))
raises(NotImplementedError, ["full", "beta"], at.attention, q, q, q, beta=torch.zeros(1, 2, 8))
raises(ValueError, ["attn_mask", "shape"], at.attention, q, q, q, attn_mask=torch.ones(8, 7).bool())
raises(TypeError, ["attn_mask", "int64"], at.attention, q, q, q, attn_mask=torch.ones(8, 8).long())
raises(ValueError, ["key_padding_mask", "shape"], at.attention, q, q, q,
       key_padding_mask=torch.zeros(2, 8).bool())
raises(ValueError, ["unknown", "bogus"], at.attention, q, q, q, spec="bogus")
raises(NotImplementedError, ["linformer", "causal"], at.attention, q, q, q,
       spec="linformer:k=4,max_len=8", causal="top-left")
# learned tensors: each named in the message when its dtype, name or shape is wrong
lf_spec = "linformer:k=4,max_len=8"
lf_e = torch.from_numpy(attnlab.make(lf_spec).parameters(q.shape[1])["E"])
raises(TypeError, ["E", "float64"], at.attention, q, q, q, spec=lf_spec,
       parameters={"E": lf_e.double(), "F": lf_e})
raises(ValueError, ["no parameter 'G'"], at.attention, q, q, q, spec=lf_spec,
       parameters={"E": lf_e, "F": lf_e, "G": lf_e})
raises(ValueError, ["E has shape"], at.attention, q, q, q, spec=lf_spec,
       parameters={"E": lf_e[..., :7].contiguous(), "F": lf_e})
raises(NotImplementedError, ["full", "learned parameters"], at.attention, q, q, q,
       parameters={"E": lf_e})
nan = q.clone()
nan[0, 1, 2, 3] = math.nan
raises(ValueError, ["q", "NaN"], at.attention, nan, q, q)
raises(NotImplementedError, ["dropout"], at.MultiheadAttention, E, NH, dropout=0.1)
raises(NotImplementedError, ["add_bias_kv"], at.MultiheadAttention, E, NH, add_bias_kv=True)
m = at.MultiheadAttention(E, NH, batch_first=True)
raises(ValueError, ["attn_mask"], m, x, x, x, attn_mask=torch.zeros(5, L, L).bool())
raises(ValueError, ["embedding"], m, x[..., :16], x[..., :16], x[..., :16])

finish()
