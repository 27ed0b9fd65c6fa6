"""attnlab inside PyTorch models: an autograd function and a drop-in nn.MultiheadAttention.

    from attnlab.torch import attention, MultiheadAttention
    out = attention(q, k, v, spec="linear:feature=elu1", causal="top-left")   # differentiable
    layer.self_attn = MultiheadAttention(512, 8, batch_first=True, spec="sliding:left=64,right=64")

Masks follow the torch API each one mirrors (docs/python.md):
  attention(attn_mask=)     as torch 2's scaled_dot_product_attention: bool True = may attend
                            (attnlab's own convention), or a float mask added to the scores
                            (an additive bias, differentiable; -inf: do not attend).
  attention(key_padding_mask=), MultiheadAttention's attn_mask and key_padding_mask
                            as nn.MultiheadAttention: bool True = may NOT attend / is padding,
                            or a float mask added to the scores.
A float mask of only 0 and -inf that needs no gradient is passed as a boolean mask, and a
boolean mask equal to the causal pattern as causal="top-left", so variants without biases or
boolean masks (linear) still run under nn.Transformer.generate_square_subsequent_mask.
FlashAttention's and PyTorch's names for the softmax variants' modifiers: window_size,
cu_seqlens, cu_seqlens_k, prefix_lengths, softcap, alibi_slopes, sinks, log_decay (the
forgetting gate), enable_gqa (grouped KV heads).
Tensors are float32 on the CPU; they reach the C++ library through .numpy() without a copy.
q, k and v may also be torch.bfloat16 (all three): attnlab computes in bf16 (its converted
path: float32 kernels on the bf16 values, the row statistics float32), returns out in bf16 and
differentiates through it, dq, dk, dv in bf16; the modifiers stay float32.
"""
import warnings

import numpy as np
import torch

import attnlab

__all__ = ["MultiheadAttention", "attention"]


def _numpy(name, t):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.float32:
        raise TypeError(f"{name}: dtype {t.dtype}, expected torch.float32 (attnlab computes in "
                        "float32)")
    if t.device.type != "cpu":
        raise ValueError(f"{name}: on {t.device}, expected a CPU tensor")
    return t.detach().contiguous().numpy()


def _qkv_arrays(q, k, v):
    """q, k, v as float32 arrays, and whether they are bf16: all three torch.float32, or all
    three torch.bfloat16 (widened exactly; the library rounds them back to the same values)."""
    if isinstance(q, torch.Tensor) and q.dtype == torch.bfloat16:
        for name, t in (("k", k), ("v", v)):
            if isinstance(t, torch.Tensor) and t.dtype != torch.bfloat16:
                raise TypeError(f"{name}: dtype {t.dtype} where q is torch.bfloat16: q, k and v "
                                "take one dtype, torch.float32 or torch.bfloat16")
        return tuple(_numpy(n, t.detach().float()) for n, t in (("q", q), ("k", k), ("v", v))) \
            + (True,)
    for name, t in (("k", k), ("v", v)):
        if isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16:
            raise TypeError(f"{name}: dtype torch.bfloat16 where q is {q.dtype}: q, k and v take "
                            "one dtype, torch.float32 or torch.bfloat16")
    return _numpy("q", q), _numpy("k", k), _numpy("v", v), False


def _split_mask(name, mask, true_means_allowed):
    """(allowed, bias) of a torch mask: a bool one as bool "may attend" (allowed); a float one
    as an additive bias in float32 (differentiably cast), or, when it holds only 0 and -inf and
    needs no gradient, as bool "may attend" (which variants without biases honour too)."""
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype == torch.bool:
        return (mask if true_means_allowed else ~mask), None
    if not mask.is_floating_point():
        raise TypeError(f"{name}: dtype {mask.dtype}, expected torch.bool or a float mask (an "
                        "additive bias)")
    if mask.device.type != "cpu":
        raise ValueError(f"{name}: on {mask.device}, expected a CPU tensor")
    if bool(torch.isnan(mask).any()) or bool((mask == float("inf")).any()):
        raise ValueError(f"{name}: a float mask is an additive bias and may not hold NaN or "
                         "+inf (-inf: do not attend)")
    if not (mask.requires_grad and torch.is_grad_enabled()):
        zero, blocked = mask == 0, mask == float("-inf")
        if bool((zero | blocked).all()):
            return zero, None
    return None, mask.float()


def _lift_bias(name, bias, shape):
    """A float mask of rank <= 4 as a bias broadcastable to `shape` [B, H, Nq, Nk] (leading axes
    of 1 added, a differentiable view), or a ValueError naming it."""
    lifted = None
    if bias.dim() <= 4:
        lifted = bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape))
    if lifted is None or any(n not in (1, want) for n, want in zip(lifted.shape, shape)):
        raise ValueError(f"{name}: shape {list(bias.shape)} does not broadcast to [B, H, Nq, Nk] "
                         f"= {list(shape)}")
    return lifted


def _padding(key_padding_mask, bias, shape):
    """(padding, bias): a bool (or 0/-inf) key_padding_mask [B, Nk] as bool True = padding, or
    a float one added to the bias (None or 4-D) as [B, 1, 1, Nk]."""
    if key_padding_mask is None:
        return None, bias
    keep, added = _split_mask("key_padding_mask", key_padding_mask, False)
    if added is None:
        return ~keep, bias
    if added.dim() != 2:
        raise ValueError(f"key_padding_mask: shape {list(added.shape)}, expected [B, Nk] = "
                         f"[{shape[0]}, {shape[3]}]")
    added = _lift_bias("key_padding_mask", added[:, None, None, :], shape)
    return None, added if bias is None else bias + added


def _masks(q, k, causal, attn_allowed, padding):
    """causal, key_lengths, mask for attnlab.forward on 4-D q, k: attn_allowed is bool of
    rank <= 4 broadcastable to [B, H, Nq, Nk] ([Nq, Nk], [B|1, H|1, Nq, Nk], ...; True = may
    attend); padding bool [B, Nk] (True = padding)."""
    b, h, nq, nk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    if causal is True:
        causal = "top-left"
    elif causal is False:
        causal = None
    key_lengths, allowed = None, None
    if attn_allowed is not None:
        if attn_allowed.dim() <= 4:
            attn_allowed = attn_allowed.reshape((1,) * (4 - attn_allowed.dim()) +
                                                tuple(attn_allowed.shape))
        if attn_allowed.dim() != 4 or attn_allowed.shape[2:] != (nq, nk):
            raise ValueError(f"attn_mask: shape {list(attn_allowed.shape)}, expected [{nq}, {nk}] "
                             f"or [B or 1, H or 1, {nq}, {nk}]")
        tril = torch.ones(nq, nk, dtype=torch.bool).tril()
        if causal is None and nq == nk and bool((attn_allowed == tril).all()):
            causal = "top-left"
        else:
            allowed = attn_allowed
    if padding is not None:
        if padding.dim() != 2 or padding.shape != (b, nk):
            raise ValueError(f"key_padding_mask: shape {list(padding.shape)}, expected [{b}, {nk}]")
        lengths = (~padding).sum(dim=1)
        suffix = torch.arange(nk)[None, :] >= lengths[:, None]
        if bool((suffix == padding).all()):
            key_lengths = lengths.tolist()
        else:  # padding that is not a suffix: folded into the boolean mask
            keep = ~padding[:, None, None, :]
            allowed = keep if allowed is None else allowed & keep
    if allowed is not None:
        if allowed.shape[0] not in (1, b) or allowed.shape[1] not in (1, h):
            raise ValueError(f"attn_mask: shape {list(allowed.shape)} does not broadcast to "
                             f"[{b}, {h}, {nq}, {nk}]")
        if allowed.shape[:2] != (1, 1):
            allowed = allowed.expand(b, h, nq, nk)
        allowed = allowed.contiguous().numpy()
    return dict(causal=causal, key_lengths=key_lengths, mask=allowed)


def _set_learned(backend, names, params):
    """The variant's own learned tensors (names, torch tensors) onto the backend."""
    if names:
        backend.set_parameters({n: _numpy(n, p) for n, p in zip(names, params)})


# The per-call float inputs the autograd node differentiates besides q, k, v, in its argument
# order: the linear family's per-token inputs and the softmax variants' score modifiers.
_TOKENS = ("log_decay", "beta", "bias", "sinks", "alibi_slopes")


class _AttentionFunction(torch.autograd.Function):
    """attnlab's forward and backward as one autograd node; saves the output and what the
    forward keeps for its backward (attnlab.Saved: the row log-sum-exp, the scan variants'
    chunk states), so the backward never runs a second forward. log_decay, beta, bias (4-D),
    sinks and alibi_slopes (_TOKENS): tensors or None, each differentiated when given; names
    and params: the variant's own learned tensors (linformer's E, F), set on the backend before
    its forward and its backward (another call may have set others in between) and
    differentiated like q, k and v."""

    @staticmethod
    def forward(ctx, q, k, v, log_decay, beta, bias, sinks, slopes, s0, z0, backend, masks,
                scale, final, names, *params):
        *arrays, bf16 = _qkv_arrays(q, k, v)
        tokens = {name: None if t is None else _numpy(name, t)
                  for name, t in zip(_TOKENS, (log_decay, beta, bias, sinks, slopes))}
        initial = None
        if s0 is not None:
            initial = _numpy("initial_state", s0)
            if z0 is not None:
                initial = (initial, _numpy("initial_state key sum z", z0))
        _set_learned(backend, names, params)
        result = backend.forward(*arrays, scale=scale, save=True, initial_state=initial,
                                 output_final_state=final, **masks, **tokens,
                                 dtype="bf16" if bf16 else "float32")
        out, saved = result[0], result[-1]
        out = torch.from_numpy(out)
        if bf16:
            out = out.to(torch.bfloat16)  # exact: every value is a bf16 one
        ctx.backend, ctx.masks, ctx.scale, ctx.saved = backend, masks, scale, saved
        ctx.bf16 = bf16
        ctx.tokens, ctx.names, ctx.initial, ctx.final = tokens, names, initial, final
        ctx.key_sum = z0 is not None
        ctx.save_for_backward(q, k, v, out, *params)
        if not final:
            return out
        state = result[1] if isinstance(result[1], tuple) else (result[1], None)
        # The final state as tensors that own copies: the arrays are views into saved.
        s_final = torch.from_numpy(state[0].copy())
        z_final = torch.from_numpy(state[1].copy()) if state[1] is not None else torch.empty(0)
        ctx.final_has_z = state[1] is not None
        return out, s_final, z_final

    @staticmethod
    @torch.autograd.function.once_differentiable  # a second derivative raises, not zeros
    def backward(ctx, d_out, d_s=None, d_z=None):
        q, k, v, out, *params = ctx.saved_tensors
        _set_learned(ctx.backend, ctx.names, params)
        d_final = None
        if ctx.final:
            d_final = _numpy("d_final_state", d_s)
            if ctx.final_has_z:
                d_final = (d_final, _numpy("d_final_state key sum z", d_z))
        if ctx.bf16:  # bf16 values widened exactly, rounded back to the same by the library
            *arrays, _ = _qkv_arrays(q, k, v)
            arrays += [out.float().numpy(), _numpy("d_out", d_out.float())]
        else:
            arrays = [_numpy("q", q), _numpy("k", k), _numpy("v", v), out.numpy(),
                      _numpy("d_out", d_out)]
        grads = ctx.backend.backward(*arrays, scale=ctx.scale, saved=ctx.saved,
                                     initial_state=ctx.initial, d_final_state=d_final,
                                     **ctx.masks, **ctx.tokens,
                                     dtype="bf16" if ctx.bf16 else "float32")
        qkv_dtype = torch.bfloat16 if ctx.bf16 else torch.float32
        tokens = [None if ctx.tokens[name] is None else torch.from_numpy(grads["d_" + name])
                  for name in _TOKENS]
        state = [None, None]
        if ctx.initial is not None:
            d0 = grads["d_initial_state"]
            state = [torch.from_numpy(d0[0]), torch.from_numpy(d0[1])] if ctx.key_sum \
                else [torch.from_numpy(d0), None]
        learned = [torch.from_numpy(grads["d_" + n.lower()]) for n in ctx.names]
        return (*(torch.from_numpy(grads[n]).to(qkv_dtype) for n in ("dq", "dk", "dv")),
                *tokens, *state, None, None, None, None, None, *learned)


def _backend(spec):
    return spec if isinstance(spec, attnlab.Attention) else attnlab.make(spec)


def _slopes(alibi_slopes):
    """ALiBi slopes as a float32 tensor: a tensor as given (differentiable), or a NumPy array,
    list or tuple of numbers as a constant."""
    if alibi_slopes is None or isinstance(alibi_slopes, torch.Tensor):
        return alibi_slopes
    if not isinstance(alibi_slopes, (np.ndarray, list, tuple)):
        raise TypeError(f"alibi_slopes: expected a torch.Tensor (learned) or an array of "
                        f"numbers (constant), got {type(alibi_slopes).__name__}")
    values = np.asarray(alibi_slopes)
    if values.dtype.kind not in "fiu":
        raise TypeError(f"alibi_slopes: dtype {values.dtype}, expected numbers")
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))


def _integers(x):
    """Offsets, lengths or a window given as an integer tensor, as a list; anything else as
    given."""
    return x.tolist() if isinstance(x, torch.Tensor) else x


def attention(q, k, v, spec="full", causal=None, key_padding_mask=None, attn_mask=None,
              scale=None, log_decay=None, beta=None, parameters=None, initial_state=None,
              output_final_state=False, cu_seqlens=None, cu_seqlens_k=None, *,
              enable_gqa=False, window_size=None, alibi_slopes=None, softcap=None, sinks=None,
              prefix_lengths=None):
    """Differentiable attnlab attention of float32 CPU tensors [B, H, N, D] (or [H, N, D],
    [N, D]): out shaped like q with v's last dimension. q, k, v all torch.bfloat16: out and
    the gradients of q, k, v in bf16, computed as attnlab.attention(..., dtype="bf16")
    computes them (the modifiers stay float32).

    spec: a factory string or an attnlab.Attention; causal: None, "top-left" (or True, as
    scaled_dot_product_attention's is_causal) or "bottom-right"; attn_mask: broadcastable to
    [B, H, Nq, Nk] ([Nq, Nk], [B|1, H|1, Nq, Nk], ...), as scaled_dot_product_attention's:
    bool True = may attend, or float, added to the scores (an additive bias, differentiable;
    -inf: do not attend); key_padding_mask: [B, Nk], bool True = padding
    (nn.MultiheadAttention's), or float, added; scale: the softmax scale (default 1 / sqrt(D));
    log_decay (g <= 0) and beta (in [0, 1]): the linear family's per-token inputs, float32
    tensors of q's rank minus one ([B, H, N]), differentiable like q, k and v (gla, gated-delta
    take log_decay; delta, gated-delta beta; on a softmax variant log_decay is the forgetting
    gate, causal); parameters: the variant's own learned tensors as float32 tensors
    {name: tensor}, named and shaped as attnlab.make(spec).parameters(H) gives them
    (linformer's E, F), differentiable too (None: the backend's own, not learned).

    flash-linear-attention's names for the linear family: initial_state, a tensor S [B, H, Dk,
    Dv] (q's rank) or the tuple (S, z) for linear's sum rule, differentiable;
    output_final_state=True returns (out, final_state), final_state in the same form and
    differentiable too; cu_seqlens, cu_seqlens_k: FlashAttention's packed-document offsets
    (a 1-D integer tensor or list, q, k, v of a batch of one; states [documents, H, Dk, Dv]).

    The softmax variants' modifiers, as attnlab.attention's: enable_gqa=True lets k, v have
    fewer heads than q; window_size=(left, right); prefix_lengths (a list or integer tensor);
    softcap (None or 0: none); sinks, a float32 tensor [H], differentiable; alibi_slopes [H],
    a float32 tensor (differentiable) or an array of numbers (constant; attnlab.alibi_slopes(H)
    gives the paper's)."""
    backend = _backend(spec)
    names, params = tuple((parameters or {}).keys()), tuple((parameters or {}).values())
    for name, p in zip(names, params):
        _numpy(name, p)
    alibi_slopes = _slopes(alibi_slopes)
    _qkv_arrays(q, k, v)  # type, dtype and device checks before anything else
    for name, t in (("log_decay", log_decay), ("beta", beta), ("sinks", sinks),
                    ("alibi_slopes", alibi_slopes)):
        if t is not None:
            _numpy(name, t)
    if not q.dim() == k.dim() == v.dim() or q.dim() not in (2, 3, 4):
        raise ValueError(f"q, k, v: shapes {list(q.shape)}, {list(k.shape)}, {list(v.shape)}; "
                         "expected one rank of [N, D], [H, N, D] or [B, H, N, D]")
    lift = (1,) * (4 - q.dim())
    q4, k4 = q.reshape(lift + tuple(q.shape)), k.reshape(lift + tuple(k.shape))
    shape = (q4.shape[0], q4.shape[1], q4.shape[2], k4.shape[2])
    allowed, bias = None, None
    if attn_mask is not None:
        allowed, bias = _split_mask("attn_mask", attn_mask, True)
        if bias is not None:
            bias = _lift_bias("attn_mask", bias, shape)
    padding, bias = _padding(key_padding_mask, bias, shape)
    masks = _masks(q4, k4, causal, allowed, padding)
    masks.update(cu_seqlens=_integers(cu_seqlens), cu_seqlens_k=_integers(cu_seqlens_k),
                 prefix_lengths=_integers(prefix_lengths), enable_gqa=enable_gqa,
                 window_size=_integers(window_size), softcap=softcap)
    if isinstance(initial_state, tuple) and len(initial_state) != 2:
        raise ValueError(f"initial_state: expected a tensor S or a tuple (S, z), got a tuple of "
                         f"{len(initial_state)}")
    s0, z0 = initial_state if isinstance(initial_state, tuple) else (initial_state, None)
    for name, t in (("initial_state", s0), ("initial_state key sum z", z0)):
        if t is not None:
            _numpy(name, t)
    inputs = [t for t in (q, k, v, log_decay, beta, bias, sinks, alibi_slopes, s0, z0, *params)
              if t is not None]
    if any(t.requires_grad for t in inputs) and torch.is_grad_enabled() \
            and not backend.support["backward"]:
        raise NotImplementedError(f"{backend.spec} has no backward pass")
    result = _AttentionFunction.apply(q, k, v, log_decay, beta, bias, sinks, alibi_slopes, s0,
                                      z0, backend, masks, scale, bool(output_final_state), names,
                                      *params)
    if not output_final_state:
        return result
    out, s_final, z_final = result
    return out, ((s_final, z_final) if z_final.numel() else s_final)


# The specs MultiheadAttention has warned about: need_weights=True where no weights are defined.
_WARNED_NO_WEIGHTS = set()


def _normalised_kernel(backend):
    """Whether backend is linear attention under its sum rule, out = W v with W the normalised
    kernel phi(q_i)·phi(k_j) / sum over j of the same (its attention weights)."""
    name, _, keys = backend.spec.partition(":")
    return name == "linear" and "rule=sum" in keys.split(",")


def _weights(backend, q, k, masks, bias, per_head):
    """The attention weights of 4-D q, k under masks (attnlab's keywords) and bias (None or a
    4-D float tensor), without gradient: [B, H, Nq, Nk] (per_head) or their mean over heads
    [B, Nq, Nk]; None where the variant defines none.

    Softmax variants (those taking a bias): the backward's bias gradient is
    P ∘ (dO v^T - rowsum(dO ∘ out)) with `out` read as given, so v = 0 (one column), d_out = 1
    and out = -1 make it P itself, exactly as the forward weighs the keys, every mask and
    modifier applied; its cost is a forward's and a backward's at Dv = 1 (O(visible pairs ·
    Dk)), not the O(Nq · Nk²) of multiplying P by an identity. A bias broadcast over heads
    sums their weights, so the mean costs no [B, H, Nq, Nk] tensor. Linear's sum rule: out is
    linear in v, so v = the identity gives W (O(Nq · Nk · features))."""
    b, h, nq, nk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    qa, ka = _numpy("q", q), _numpy("k", k)
    if backend.support["bias"] and backend.support["backward"]:
        heads = h if per_head or (bias is not None and bias.shape[1] != 1) else 1
        probe = torch.zeros(b, heads, nq, nk)
        if bias is not None:
            probe = probe + bias.detach()
        zeros = np.zeros((b, k.shape[1], nk, 1), np.float32)
        ones = np.ones((b, h, nq, 1), np.float32)
        grads = backend.backward(qa, ka, zeros, -ones, ones, bias=probe.numpy(), **masks)
        weights = torch.from_numpy(grads["d_bias"])
    elif _normalised_kernel(backend):
        identity = np.ascontiguousarray(
            np.broadcast_to(np.eye(nk, dtype=np.float32), (b, k.shape[1], nk, nk)))
        weights = torch.from_numpy(backend.forward(qa, ka, identity, **masks))
    else:
        return None
    if per_head:
        return weights
    return weights.mean(dim=1) if weights.shape[1] != 1 else weights[:, 0] / h


class MultiheadAttention(torch.nn.MultiheadAttention):
    """torch.nn.MultiheadAttention with attnlab attention inside: the same constructor
    arguments, parameters, state_dict keys, initialisation and call signature, plus spec
    (keyword only). Masks as nn.MultiheadAttention's: attn_mask [L, S] or [B*H, L, S] and
    key_padding_mask [B, S], bool True = may NOT attend / is padding, or float, added to the
    scores (a differentiable bias, for the variants that take one: full, sliding, bigbird).

    A variant's own learned tensors are parameters of the module beside torch's, named
    attention_<name> and initialised as the variant draws them (linformer: attention_E and,
    under share=none, attention_F), so torch's optimizers train them too.

    need_weights=True (the default) returns the attention weights as nn.MultiheadAttention
    does, [B, L, S] averaged over heads or [B, H, L, S] with average_attn_weights=False
    (without a batch axis for unbatched input), where the variant defines them: the softmax
    variants (full, sliding, bigbird; zeros where a key is not attended) and linear attention's
    normalised kernel (rule=sum). They are computed apart from the output, at about the cost
    of one more forward and backward, and carry no gradient. Elsewhere forward returns
    (output, None) and warns once per spec; need_weights=False skips them.

    Not supported (NotImplementedError): dropout > 0, add_bias_kv, add_zero_attn."""

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False,
                 add_zero_attn=False, kdim=None, vdim=None, batch_first=False, device=None,
                 dtype=None, *, spec="full"):
        for name, value in (("dropout", dropout), ("add_bias_kv", add_bias_kv),
                            ("add_zero_attn", add_zero_attn)):
            if value:
                raise NotImplementedError(f"attnlab.torch.MultiheadAttention: {name}={value!r} "
                                          "is not supported")
        super().__init__(embed_dim, num_heads, dropout, bias, add_bias_kv, add_zero_attn, kdim,
                         vdim, batch_first, device, dtype)
        self.__dict__["_attnlab_ready"] = True
        self.backend = _backend(spec)
        learned = self.backend.parameters(num_heads)
        self._learned = tuple(learned)
        for name, values in learned.items():
            self.register_parameter("attention_" + name,
                                    torch.nn.Parameter(torch.from_numpy(values)))

    # torch's TransformerEncoder(Layer) calls a fused kernel with self_attn's weights instead of
    # self_attn.forward in eval mode without grad when this is True, which would skip attnlab.
    # It reads True only where torch's own MultiheadAttention code needs the truth: in __init__
    # and _reset_parameters, which choose the parameters to create and initialise by it.
    @property
    def _qkv_same_embed_dim(self):
        return self._attnlab_same_dims and not self.__dict__.get("_attnlab_ready", False)

    @_qkv_same_embed_dim.setter
    def _qkv_same_embed_dim(self, same):
        self.__dict__["_attnlab_same_dims"] = same

    def _reset_parameters(self):
        ready = self.__dict__.pop("_attnlab_ready", False)
        try:
            super()._reset_parameters()
        finally:
            self.__dict__["_attnlab_ready"] = ready

    def extra_repr(self):
        return f"spec={self.backend.spec!r}"

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True,
                attn_mask=None, average_attn_weights=True):
        batched = query.dim() == 3
        if not batched:
            query, key, value = query[None], key[None], value[None]
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask[None]
        elif not self.batch_first:
            query, key, value = (x.transpose(0, 1) for x in (query, key, value))
        b, nq, e = query.shape
        nk, h = key.shape[1], self.num_heads
        if e != self.embed_dim:
            raise ValueError(f"query: embedding size {e}, expected {self.embed_dim}")
        if self._attnlab_same_dims:
            wq, wk, wv = self.in_proj_weight.chunk(3)
        else:
            wq, wk, wv = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        bq, bk, bv = (None,) * 3 if self.in_proj_bias is None else self.in_proj_bias.chunk(3)
        linear = torch.nn.functional.linear

        def heads(x, w, bias, n):  # [B, n, E] -> [B, H, n, E / H]
            return linear(x, w, bias).reshape(b, n, h, self.head_dim).transpose(1, 2)

        q, k, v = heads(query, wq, bq, nq), heads(key, wk, bk, nk), heads(value, wv, bv, nk)
        allowed, bias = None, None
        if attn_mask is not None:
            allowed, bias = _split_mask("attn_mask", attn_mask, False)
            if attn_mask.dim() == 3:
                if attn_mask.shape[0] != b * h:
                    raise ValueError(f"attn_mask: shape {list(attn_mask.shape)}, expected "
                                     f"[{nq}, {nk}] or [{b * h}, {nq}, {nk}]")
                allowed, bias = (None if m is None else m.reshape(b, h, nq, nk)
                                 for m in (allowed, bias))
            if bias is not None:
                bias = _lift_bias("attn_mask", bias, (b, h, nq, nk))
        padding, bias = _padding(key_padding_mask, bias, (b, h, nq, nk))
        masks = _masks(q, k, None, allowed, padding)
        learned = tuple(getattr(self, "attention_" + name) for name in self._learned)
        out = _AttentionFunction.apply(q, k, v, None, None, bias, None, None, None, None,
                                       self.backend, masks, None, False, self._learned,
                                       *learned)
        out = self.out_proj(out.transpose(1, 2).reshape(b, nq, e))
        if not batched:
            out = out[0]
        elif not self.batch_first:
            out = out.transpose(0, 1)
        if not need_weights:
            return out, None
        weights = _weights(self.backend, q, k, masks, bias, not average_attn_weights)
        if weights is None:
            if self.backend.spec not in _WARNED_NO_WEIGHTS:
                _WARNED_NO_WEIGHTS.add(self.backend.spec)
                warnings.warn(f"attnlab.torch.MultiheadAttention: {self.backend.spec} defines "
                              "no attention weights; need_weights=True returns None for them "
                              "(need_weights=False says so)", stacklevel=2)
            return out, None
        return out, (weights if batched else weights[0])
