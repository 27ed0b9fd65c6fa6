"""attnlab inside PyTorch models: an autograd function and a drop-in nn.MultiheadAttention.

    from attnlab.torch import attention, MultiheadAttention
    out = attention(q, k, v, spec="linear:feature=elu1", causal="top-left")   # differentiable
    layer.self_attn = MultiheadAttention(512, 8, batch_first=True, spec="sliding:left=64,right=64")

Masks follow the torch API each one mirrors (docs/python.md):
  attention(attn_mask=)     as torch 2's scaled_dot_product_attention: bool True = may attend
                            (attnlab's own convention), or a float mask of 0 (attend) / -inf.
  attention(key_padding_mask=), MultiheadAttention's attn_mask and key_padding_mask
                            as nn.MultiheadAttention: bool True = may NOT attend / is padding,
                            or a float mask of 0 / -inf.
A boolean mask equal to the causal pattern is passed as causal="top-left", so variants without
boolean masks (linear) still run under nn.Transformer.generate_square_subsequent_mask.
Tensors are float32 on the CPU; they reach the C++ library through .numpy() without a copy.
"""
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


def _allowed(name, mask, true_means_allowed):
    """A bool or 0/-inf float mask as bool "may attend"."""
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype == torch.bool:
        return mask if true_means_allowed else ~mask
    if mask.is_floating_point():
        zero, blocked = mask == 0, mask == float("-inf")
        if not bool((zero | blocked).all()):
            raise ValueError(f"{name}: a float mask may hold only 0 (attend) and -inf (do not "
                             "attend); attnlab has no additive biases")
        return zero
    raise TypeError(f"{name}: dtype {mask.dtype}, expected torch.bool or a float 0/-inf mask")


def _masks(q, k, causal, attn_allowed, padding):
    """causal, key_lengths, mask for attnlab.forward on 4-D q, k: attn_allowed is bool
    [Nq, Nk] or [B|1, H|1, Nq, Nk] (True = may attend); padding bool [B, Nk] (True = padding)."""
    b, h, nq, nk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    if causal is True:
        causal = "top-left"
    elif causal is False:
        causal = None
    key_lengths, allowed = None, None
    if attn_allowed is not None:
        if attn_allowed.dim() == 2:
            attn_allowed = attn_allowed[None, None]
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


class _AttentionFunction(torch.autograd.Function):
    """attnlab's forward and backward as one autograd node; saves the output and what the
    forward keeps for its backward (attnlab.Saved: the row log-sum-exp, the scan variants'
    chunk states), so the backward never runs a second forward. log_decay and beta: the linear
    family's per-token inputs, or None; names and params: the variant's own learned tensors
    (linformer's E, F), set on the backend before its forward and its backward (another call
    may have set others in between) and differentiated like q, k and v."""

    @staticmethod
    def forward(ctx, q, k, v, log_decay, beta, s0, z0, backend, masks, scale, final, names,
                *params):
        arrays = _numpy("q", q), _numpy("k", k), _numpy("v", v)
        tokens = {name: None if t is None else _numpy(name, t)
                  for name, t in (("log_decay", log_decay), ("beta", beta))}
        initial = None
        if s0 is not None:
            initial = _numpy("initial_state", s0)
            if z0 is not None:
                initial = (initial, _numpy("initial_state key sum z", z0))
        _set_learned(backend, names, params)
        result = backend.forward(*arrays, scale=scale, save=True, initial_state=initial,
                                 output_final_state=final, **masks, **tokens)
        out, saved = result[0], result[-1]
        out = torch.from_numpy(out)
        ctx.backend, ctx.masks, ctx.scale, ctx.saved = backend, masks, scale, saved
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
        grads = ctx.backend.backward(_numpy("q", q), _numpy("k", k), _numpy("v", v),
                                     out.numpy(), _numpy("d_out", d_out), scale=ctx.scale,
                                     saved=ctx.saved, initial_state=ctx.initial,
                                     d_final_state=d_final, **ctx.masks, **ctx.tokens)
        tokens = [None if ctx.tokens[name] is None else torch.from_numpy(grads["d_" + name])
                  for name in ("log_decay", "beta")]
        state = [None, None]
        if ctx.initial is not None:
            d0 = grads["d_initial_state"]
            state = [torch.from_numpy(d0[0]), torch.from_numpy(d0[1])] if ctx.key_sum \
                else [torch.from_numpy(d0), None]
        learned = [torch.from_numpy(grads["d_" + n.lower()]) for n in ctx.names]
        return (torch.from_numpy(grads["dq"]), torch.from_numpy(grads["dk"]),
                torch.from_numpy(grads["dv"]), *tokens, *state, None, None, None, None, None,
                *learned)


def _backend(spec):
    return spec if isinstance(spec, attnlab.Attention) else attnlab.make(spec)


def attention(q, k, v, spec="full", causal=None, key_padding_mask=None, attn_mask=None,
              scale=None, log_decay=None, beta=None, parameters=None, initial_state=None,
              output_final_state=False, cu_seqlens=None, cu_seqlens_k=None):
    """Differentiable attnlab attention of float32 CPU tensors [B, H, N, D] (or [H, N, D],
    [N, D]): out shaped like q with v's last dimension.

    spec: a factory string or an attnlab.Attention; causal: None, "top-left" (or True, as
    scaled_dot_product_attention's is_causal) or "bottom-right"; attn_mask: [Nq, Nk] or
    [B|1, H|1, Nq, Nk], bool True = may attend (scaled_dot_product_attention's convention) or
    float 0/-inf; key_padding_mask: [B, Nk], bool True = padding (nn.MultiheadAttention's);
    scale: the softmax scale (default 1 / sqrt(D)); log_decay (g <= 0) and beta (in [0, 1]):
    the linear family's per-token inputs, float32 tensors of q's rank minus one ([B, H, N]),
    differentiable like q, k and v (gla, gated-delta take log_decay; delta, gated-delta beta);
    parameters: the variant's own learned tensors as float32 tensors {name: tensor}, named and
    shaped as attnlab.make(spec).parameters(H) gives them (linformer's E, F), differentiable too
    (None: the backend's own, not learned).

    flash-linear-attention's names for the linear family: initial_state, a tensor S [B, H, Dk,
    Dv] (q's rank) or the tuple (S, z) for linear's sum rule, differentiable;
    output_final_state=True returns (out, final_state), final_state in the same form and
    differentiable too; cu_seqlens, cu_seqlens_k: FlashAttention's packed-document offsets
    (a 1-D integer tensor or list, q, k, v of a batch of one; states [documents, H, Dk, Dv])."""
    backend = _backend(spec)
    names, params = tuple((parameters or {}).keys()), tuple((parameters or {}).values())
    for name, p in zip(names, params):
        _numpy(name, p)
    for name, t in (("q", q), ("k", k), ("v", v), ("log_decay", log_decay), ("beta", beta)):
        if t is not None or name in ("q", "k", "v"):
            _numpy(name, t)  # type, dtype and device checks before anything else
    if not q.dim() == k.dim() == v.dim() or q.dim() not in (2, 3, 4):
        raise ValueError(f"q, k, v: shapes {list(q.shape)}, {list(k.shape)}, {list(v.shape)}; "
                         "expected one rank of [N, D], [H, N, D] or [B, H, N, D]")
    lift = (1,) * (4 - q.dim())
    q4, k4 = q.reshape(lift + tuple(q.shape)), k.reshape(lift + tuple(k.shape))
    allowed = None if attn_mask is None else _allowed("attn_mask", attn_mask, True)
    padding = None
    if key_padding_mask is not None:
        padding = ~_allowed("key_padding_mask", key_padding_mask, False)
    masks = _masks(q4, k4, causal, allowed, padding)
    for name, offsets in (("cu_seqlens", cu_seqlens), ("cu_seqlens_k", cu_seqlens_k)):
        if isinstance(offsets, torch.Tensor):
            offsets = offsets.tolist()
        masks[name] = offsets
    if isinstance(initial_state, tuple) and len(initial_state) != 2:
        raise ValueError(f"initial_state: expected a tensor S or a tuple (S, z), got a tuple of "
                         f"{len(initial_state)}")
    s0, z0 = initial_state if isinstance(initial_state, tuple) else (initial_state, None)
    for name, t in (("initial_state", s0), ("initial_state key sum z", z0)):
        if t is not None:
            _numpy(name, t)
    inputs = [t for t in (q, k, v, log_decay, beta, s0, z0, *params) if t is not None]
    if any(t.requires_grad for t in inputs) and torch.is_grad_enabled() \
            and not backend.support["backward"]:
        raise NotImplementedError(f"{backend.spec} has no backward pass")
    result = _AttentionFunction.apply(q, k, v, log_decay, beta, s0, z0, backend, masks, scale,
                                      bool(output_final_state), names, *params)
    if not output_final_state:
        return result
    out, s_final, z_final = result
    return out, ((s_final, z_final) if z_final.numel() else s_final)


class MultiheadAttention(torch.nn.MultiheadAttention):
    """torch.nn.MultiheadAttention with attnlab attention inside: the same constructor
    arguments, parameters, state_dict keys, initialisation and call signature, plus spec
    (keyword only). Masks as nn.MultiheadAttention's: attn_mask [L, S] or [B*H, L, S] and
    key_padding_mask [B, S], bool True = may NOT attend / is padding, or float 0/-inf.

    A variant's own learned tensors are parameters of the module beside torch's, named
    attention_<name> and initialised as the variant draws them (linformer: attention_E and,
    under share=none, attention_F), so torch's optimizers train them too.

    Not supported (NotImplementedError): dropout > 0, add_bias_kv, add_zero_attn. The
    attention weights are never formed: forward returns (output, None) whatever need_weights
    says."""

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
        allowed = None
        if attn_mask is not None:
            allowed = _allowed("attn_mask", attn_mask, False)
            if allowed.dim() == 3:
                if allowed.shape[0] != b * h:
                    raise ValueError(f"attn_mask: shape {list(attn_mask.shape)}, expected "
                                     f"[{nq}, {nk}] or [{b * h}, {nq}, {nk}]")
                allowed = allowed.reshape(b, h, nq, nk)
        padding = None
        if key_padding_mask is not None:
            padding = ~_allowed("key_padding_mask", key_padding_mask, False)
        masks = _masks(q, k, None, allowed, padding)
        learned = tuple(getattr(self, "attention_" + name) for name in self._learned)
        out = _AttentionFunction.apply(q, k, v, None, None, None, None, self.backend, masks,
                                       None, False, self._learned, *learned)
        out = self.out_proj(out.transpose(1, 2).reshape(b, nq, e))
        if not batched:
            out = out[0]
        elif not self.batch_first:
            out = out.transpose(0, 1)
        return out, None
