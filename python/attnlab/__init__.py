"""attnlab from Python: every attention variant of the C++ library on NumPy arrays.

    import attnlab
    out = attnlab.attention(q, k, v, spec="sliding:left=64,right=0", causal="top-left")

Arrays are float32 [B, H, N, D], [H, N, D] or [N, D] (all three of one rank, as the CLI takes
them); the output has the same rank. Bad input raises before anything runs: TypeError for a wrong
type or dtype, ValueError naming the argument for a wrong shape, value (NaN, Inf) or spec
(attnlab::Error), NotImplementedError for what a variant cannot do (attnlab::Unsupported), each
with the library's message. The GIL is released while a kernel runs. docs/python.md is the full
reference; attnlab.torch adds autograd and a drop-in nn.MultiheadAttention.
"""
import numbers

import numpy as np

from attnlab import _core

__all__ = ["Attention", "Decoder", "Saved", "alibi_slopes", "attention", "compare", "make",
           "reference", "variants"]

Saved = _core.Saved  # what forward(..., save=True) keeps for backward; .lse: array or None

_CAUSAL = {None: "none", "none": "none", "top-left": "top-left", "bottom-right": "bottom-right"}


def variants():
    """The registered variant names, in the registry's order (full, bigbird, ...)."""
    return list(_core.variants())


def alibi_slopes(heads):
    """ALiBi's geometric slopes for `heads` heads (Press et al. 2022, the paper's code), float32
    [heads]: what alibi_slopes= takes."""
    if isinstance(heads, bool) or not isinstance(heads, numbers.Integral) or heads < 1:
        raise ValueError(f"heads: expected a positive integer, got {heads!r}")
    return _core.alibi_slopes(int(heads))


def _floats(name, x):
    """x as a C-contiguous float32 array of rank 2..4, converted at most once."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name}: expected a numpy.ndarray, got {type(x).__name__}")
    if x.dtype.kind != "f":
        raise TypeError(f"{name}: dtype {x.dtype}, expected float32 (float16 and float64 are "
                        "rounded to float32)")
    if x.ndim not in (2, 3, 4):
        raise ValueError(f"{name}: shape {list(x.shape)}, expected [N, D], [H, N, D] or "
                         "[B, H, N, D]")
    return np.ascontiguousarray(x, dtype=np.float32)


def _dtype(dtype):
    """dtype= of forward and backward: "float32" (the default) or "bf16"."""
    if dtype not in ("float32", "bf16"):
        raise ValueError(f"dtype: {dtype!r}, expected \"float32\" or \"bf16\" (bfloat16: the "
                         "inputs rounded to it, the results too)")
    return dtype == "bf16"


def _bhnd(x):
    """[N, D] and [H, N, D] lifted to [B, H, N, D] (a view); any array of rank <= 4 to rank 4."""
    return x.reshape((1,) * (4 - x.ndim) + x.shape)


def _qkv(q, k, v):
    q, k, v = _floats("q", q), _floats("k", k), _floats("v", v)
    if not q.ndim == k.ndim == v.ndim:
        raise ValueError(f"q, k and v must have the same rank: {list(q.shape)}, "
                         f"{list(k.shape)}, {list(v.shape)}")
    return q.ndim, _bhnd(q), _bhnd(k), _bhnd(v)


def _mask(q, k, causal, key_lengths, mask, scale):
    """The C++ Mask of one call on [B, H, N, D] q and k; raises naming the bad argument."""
    m = _core.Mask()
    if not isinstance(causal, (str, type(None))) or causal not in _CAUSAL:
        raise ValueError(f"causal={causal!r}: expected None, 'top-left' or 'bottom-right'")
    m.causal = _CAUSAL[causal]
    if key_lengths is not None:
        lengths = np.asarray(key_lengths)
        if lengths.ndim != 1 or (lengths.size and lengths.dtype.kind not in "iu"):
            raise ValueError(f"key_lengths: expected a list of B integers, got {key_lengths!r}")
        m.key_lengths = [int(n) for n in lengths]
    if mask is not None:
        if not isinstance(mask, np.ndarray):
            raise TypeError(f"mask: expected a numpy.ndarray, got {type(mask).__name__}")
        if mask.dtype == np.uint8 and mask.size and mask.max() > 1:
            raise ValueError("mask: uint8 entries must be 0 or 1")
        if mask.dtype not in (np.bool_, np.uint8):
            raise TypeError(f"mask: dtype {mask.dtype}, expected bool (True = may attend)")
        if mask.ndim not in (2, 3, 4):
            raise ValueError(f"mask: shape {list(mask.shape)}, expected [Nq, Nk], [H, Nq, Nk] "
                             "or [B, H, Nq, Nk]")
        mask = _bhnd(mask.astype(np.bool_, copy=False))
        if mask.shape[0] == 1 and mask.shape[1] != 1 and q.shape[0] != 1:
            mask = np.broadcast_to(mask, (q.shape[0],) + mask.shape[1:])  # [H, Nq, Nk]
        m.allowed = np.ascontiguousarray(mask)
    if scale is not None:
        if not isinstance(scale, numbers.Real) or not np.isfinite(scale) or scale <= 0:
            raise ValueError(f"scale={scale!r}: expected a finite number > 0")
        m.scale = float(scale)
    return m


def _grouped(q, k, enable_gqa):
    """Grouped KV heads (k, v with fewer heads than q) only when asked, as torch's
    scaled_dot_product_attention (2.5) refuses them without enable_gqa."""
    if not isinstance(enable_gqa, bool):
        raise TypeError(f"enable_gqa: expected a bool, got {type(enable_gqa).__name__}")
    if q.shape[1] != k.shape[1] and not enable_gqa:
        raise ValueError(f"k, v: {k.shape[1]} heads for q's {q.shape[1]}: grouped KV heads "
                         "need enable_gqa=True (as scaled_dot_product_attention's)")


def _modifiers(m, window_size, prefix_lengths, softcap):
    """FlashAttention's window_size=(left, right) (-1: unbounded; (-1, -1): no window), prefix-LM
    lengths (one per item, or per document) and softcap (None or 0: none, FlashAttention's
    default; else a finite cap > 0) on mask m."""
    if window_size is not None:
        pair = tuple(window_size) if isinstance(window_size, (tuple, list)) else None
        if pair is None or len(pair) != 2 or not all(
                isinstance(w, numbers.Integral) and not isinstance(w, bool) and w >= -1
                for w in pair):
            raise ValueError(f"window_size={window_size!r}: expected (left, right), integers "
                             ">= 0, or -1 for an unbounded side")
        if pair != (-1, -1):
            m.window = (int(pair[0]), int(pair[1]))
    if prefix_lengths is not None:
        lengths = np.asarray(prefix_lengths)
        if lengths.ndim != 1 or (lengths.size and lengths.dtype.kind not in "iu"):
            raise ValueError(f"prefix_lengths: expected a list of integers (one per batch item, "
                             f"or per document), got {prefix_lengths!r}")
        m.prefix_lengths = [int(n) for n in lengths]
    if softcap is not None:
        if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real) \
                or not np.isfinite(softcap) or softcap < 0:
            raise ValueError(f"softcap={softcap!r}: expected a finite cap > 0 (or 0: none)")
        if softcap > 0:
            m.softcap = float(softcap)
    return m


def _offsets(name, x):
    """cu_seqlens-style offsets as a list of ints (the library checks their order and end)."""
    if x is None:
        return []
    offsets = np.asarray(x)
    if offsets.ndim != 1 or (offsets.size and offsets.dtype.kind not in "iu"):
        raise ValueError(f"{name}: expected a 1-D list of integer offsets (0, ..., N), got {x!r}")
    return [int(o) for o in offsets]


def _documents(m, q, cu_seqlens, cu_seqlens_k):
    """Packed documents on mask m: FlashAttention's cu_seqlens (query offsets) and cu_seqlens_k
    (key offsets; None: the same), for q, k, v of a batch of one."""
    if cu_seqlens is None and cu_seqlens_k is not None:
        raise ValueError("cu_seqlens_k: given without cu_seqlens (the query offsets)")
    if cu_seqlens is not None and q.shape[0] != 1:
        raise ValueError(f"cu_seqlens: packed documents take a batch of one, got q of shape "
                         f"{list(q.shape)}")
    m.documents = _offsets("cu_seqlens", cu_seqlens)
    m.key_documents = _offsets("cu_seqlens_k", cu_seqlens_k)
    return m


_TOKEN_SHAPES = {2: "[N]", 3: "[H, N]", 4: "[B, H, N]"}


def _tokens(rank, log_decay, beta):
    """The per-token inputs of one call on rank-`rank` q, k, v: each None or a float array of
    rank - 1 ([N], [H, N], [B, H, N]), lifted to [B, H, N]; the library checks the sizes and
    values (g <= 0, beta in [0, 1], finite) and refuses one the variant does not take."""
    t = _core.Tokens()
    for name, x in (("log_decay", log_decay), ("beta", beta)):
        if x is None:
            continue
        if not isinstance(x, np.ndarray):
            raise TypeError(f"{name}: expected a numpy.ndarray, got {type(x).__name__}")
        if x.dtype.kind != "f":
            raise TypeError(f"{name}: dtype {x.dtype}, expected float32")
        if x.ndim != rank - 1:
            raise ValueError(f"{name}: shape {list(x.shape)}, expected {_TOKEN_SHAPES[rank]} "
                             f"(one value per token of rank-{rank} q, k, v)")
        x = np.ascontiguousarray(x, dtype=np.float32)
        setattr(t, name, x.reshape((1,) * (4 - rank) + x.shape))
    return t


def _scores(t, rank, bias, sinks, alibi_slopes):
    """The score modifiers onto tokens t: bias, a float array of rank <= 4 broadcastable to
    [B, H, Nq, Nk] (NumPy's rules: [Nq, Nk], [H, 1, Nk], ...), lifted to rank 4; sinks and
    alibi_slopes float [H] (H = 1 for rank-2 q). The library checks sizes and values."""
    if bias is not None:
        if not isinstance(bias, np.ndarray):
            raise TypeError(f"bias: expected a numpy.ndarray, got {type(bias).__name__}")
        if bias.dtype.kind != "f":
            raise TypeError(f"bias: dtype {bias.dtype}, expected float32 (an additive bias; "
                            "a boolean mask is mask=)")
        if not 1 <= bias.ndim <= 4:
            raise ValueError(f"bias: shape {list(bias.shape)}, expected at most 4 axes "
                             "broadcastable to [B, H, Nq, Nk]")
        t.bias = _bhnd(np.ascontiguousarray(bias, dtype=np.float32))
    for name, x in (("sinks", sinks), ("alibi_slopes", alibi_slopes)):
        if x is None:
            continue
        if not isinstance(x, np.ndarray):
            raise TypeError(f"{name}: expected a numpy.ndarray, got {type(x).__name__}")
        if x.dtype.kind != "f":
            raise TypeError(f"{name}: dtype {x.dtype}, expected float32")
        if x.ndim != 1:
            raise ValueError(f"{name}: shape {list(x.shape)}, expected [H], one value per "
                             "query head")
        setattr(t, name, np.ascontiguousarray(x, dtype=np.float32))
    return t


def _unlift(x, rank):
    return x.reshape(x.shape[4 - rank:])


def _state_shape(rank, documents, trailing):
    """How a caller writes a state for q of `rank`: [B, H, ...], [H, ...] or [...]; under
    cu_seqlens [documents, H, ...] (rank >= 3) or [documents, ...] (rank 2)."""
    lead = {4: "B, H", 3: "H", 2: ""}[rank]
    if documents:
        lead = "documents, H" if rank >= 3 else "documents"
    return "[" + ", ".join(p for p in (lead, trailing) if p) + "]"


def _lift_state(name, x, rank, documents, trailing):
    """One array of a state (S: trailing "Dk, Dv"; z: "Dk") as the library's [S, H, ...]."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name}: expected a numpy.ndarray, got {type(x).__name__}")
    if x.dtype.kind != "f":
        raise TypeError(f"{name}: dtype {x.dtype}, expected float32")
    extra = trailing.count(",") + 1
    leading = (2 if rank >= 3 else 1) if documents else rank - 2
    if x.ndim != leading + extra:
        raise ValueError(f"{name}: shape {list(x.shape)}, expected "
                         f"{_state_shape(rank, documents, trailing)} for rank-{rank} q, k, v")
    x = np.ascontiguousarray(x, dtype=np.float32)
    if documents and rank == 2:
        return x.reshape((x.shape[0], 1) + x.shape[1:])
    return x.reshape((1,) * (2 - leading) + x.shape)


def _unlift_state(x, rank, documents):
    """The library's [S, H, ...] state array in the caller's layout (see _state_shape)."""
    if documents:
        return x.reshape((x.shape[0],) + x.shape[2:]) if rank == 2 else x
    return x.reshape(x.shape[4 - rank:])


def _set_state(t, name, state, rank, documents):
    """A state argument (S, or the tuple (S, z) for a state with a key sum) onto tokens t as
    <name> and <name's key sum>, lifted to [S, H, ...]."""
    if state is None:
        return
    if isinstance(state, tuple) and len(state) != 2:
        raise ValueError(f"{name}: expected an array S or a tuple (S, z), got a tuple of "
                         f"{len(state)}")
    memory, key_sum = state if isinstance(state, tuple) else (state, None)
    prefix = "initial" if name == "initial_state" else "d_final"
    setattr(t, prefix + "_state", _lift_state(name, memory, rank, documents, "Dk, Dv"))
    if key_sum is not None:
        setattr(t, prefix + "_key_sum",
                _lift_state(name + " key sum z", key_sum, rank, documents, "Dk"))


def _state_out(memory, key_sum, rank, documents):
    """A state the library returned, as initial_state takes it: S, or (S, z)."""
    memory = _unlift_state(memory, rank, documents)
    if key_sum is None:
        return memory
    return memory, _unlift_state(key_sum, rank, documents)


class Attention:
    """One backend built from a factory string (make(spec)); reusable and thread-safe."""

    def __init__(self, spec):
        if not isinstance(spec, str):
            raise TypeError(f"spec: expected a string such as 'full', got {type(spec).__name__}")
        self._backend = _core.Backend(spec)
        self._made_from = spec
        self._learned_heads = None  # the heads of the last set_parameters' tensors

    @property
    def spec(self):
        """The canonical factory string: make(a.spec) builds an identical backend."""
        return self._backend.spec

    @property
    def support(self):
        """What the backend honours: {"causal", "causal_cross", "key_lengths", "allowed",
        "cross", "value_dim", "backward", "log_decay", "beta", "state", "documents",
        "grouped_heads", "window", "prefix", "softcap", "bias", "sinks", "alibi",
        "forgetting_gate"} -> bool: state: initial_state / output_final_state (the linear
        family); documents: cu_seqlens; grouped_heads: enable_gqa; window: window_size;
        prefix: prefix_lengths; forgetting_gate: log_decay on a softmax variant."""
        return dict(self._backend.support)

    def __repr__(self):
        return f"attnlab.make({self.spec!r})"

    def __reduce__(self):  # pickle and copy.deepcopy (nn.TransformerEncoder clones its layers)
        learned = self._learned_heads and self.parameters(self._learned_heads)
        return (_remake, (self._made_from, learned))

    def start_decoding(self, batch, heads, dk, dv, kv_heads=None, scale=None, max_tokens=0,
                       window_size=None, softcap=None, sinks=None, alibi_slopes=None):
        """A Decoder for `batch` sequences of `heads` query heads of sizes dk, dv: a KV cache
        (full; kv_heads key and value heads, a divisor of heads, each stored once), its window's
        ring (sliding), its block pattern (bigbird, which needs max_tokens) or its recurrent
        state (the linear family). scale: the softmax scale (default 1 / sqrt(dk)); max_tokens:
        the most tokens an item may hold (0: no limit). The softmax variants' modifiers, as the
        forward takes them: window_size=(left, right) (FlashAttention's; causal, so right does not
        matter), softcap (None or 0: none), sinks and alibi_slopes (float32 [heads]); the
        forgetting gate is prefill's and step's log_decay. NotImplementedError for a variant without a causal
        form (linformer) or an option it does not take."""
        for name, x in (("batch", batch), ("heads", heads), ("dk", dk), ("dv", dv),
                        ("max_tokens", max_tokens),
                        ("kv_heads", 0 if kv_heads is None else kv_heads)):
            if isinstance(x, bool) or not isinstance(x, numbers.Integral) or x < 0:
                raise ValueError(f"{name}: expected a non-negative integer, got {x!r}")
        if scale is not None and (not isinstance(scale, numbers.Real) or not np.isfinite(scale)
                                  or scale <= 0):
            raise ValueError(f"scale={scale!r}: expected a finite number > 0")
        mask = _modifiers(_core.Mask(), window_size, None, softcap)
        per_head = _scores(_core.Tokens(), 4, None, sinks, alibi_slopes)
        handle = self._backend.start_decoding(
            int(batch), int(heads), int(dk), int(dv), 0 if kv_heads is None else int(kv_heads),
            None if scale is None else float(scale), int(max_tokens), mask, per_head)
        return Decoder(handle, self.spec)

    def parameters(self, heads):
        """The variant's own learned tensors as `heads` heads use them, {name: float32 array}:
        linformer's "E" and "F" ([H, k, max_len], share=none), "E" alone (share=kv) or "E"
        [k, max_len] (share=layer); {} for a variant without any. backward reports their
        gradients as "d_" + the lower-case name, in the same shapes."""
        if isinstance(heads, bool) or not isinstance(heads, numbers.Integral) or heads < 1:
            raise ValueError(f"heads: expected a positive integer, got {heads!r}")
        return dict(self._backend.parameters(int(heads)))

    def set_parameters(self, values):
        """Replaces the variant's own learned tensors: a dict {name: array} with every tensor
        parameters() names, in its shape (copied; the spec then says init=supplied).
        ValueError names a missing, unknown, mis-shaped or non-finite tensor;
        NotImplementedError for a variant without learned tensors."""
        if not isinstance(values, dict):
            raise TypeError(f"values: expected a dict of name -> array, got "
                            f"{type(values).__name__}")
        arrays = {}
        for name, x in values.items():
            if not isinstance(x, np.ndarray) or x.dtype.kind != "f":
                raise TypeError(f"{name}: expected a float numpy.ndarray, got "
                                f"{getattr(x, 'dtype', type(x).__name__)}")
            arrays[str(name)] = np.ascontiguousarray(x, dtype=np.float32)
        self._backend.set_parameters(arrays)
        self._learned_heads = max((x.shape[0] for x in arrays.values() if x.ndim == 3),
                                  default=1)

    def forward(self, q, k, v, causal=None, key_lengths=None, mask=None, scale=None,
                log_decay=None, beta=None, save=False, initial_state=None,
                output_final_state=False, cu_seqlens=None, cu_seqlens_k=None, *, bias=None,
                sinks=None, alibi_slopes=None, softcap=None, window_size=None,
                prefix_lengths=None, enable_gqa=False, dtype="float32"):
        """softmax-or-variant attention of q, k, v: a new float32 array shaped like q with v's
        last dimension. dtype="bf16" computes in bfloat16 (NumPy has none): q, k and v are
        rounded to bf16 (to nearest, ties to even) and the output is the bf16 result, returned
        as float32 (every value a bf16 one); the modifiers stay float32 (docs/python.md).
        log_decay (g <= 0) and beta (in [0, 1]): the linear family's per-token
        inputs, [B, H, N] for [B, H, N, D] q (one rank less than q), where support says the
        variant takes them. save=True returns (out, saved): saved (attnlab.Saved) is what
        backward reads instead of running the forward again, the row log-sum-exp of a softmax
        variant (saved.lse [B, H, Nq]; None for the linear family) or the scan variants' chunk
        states.

        flash-linear-attention's names, where support()["state"]: initial_state, the recurrent
        state before the first token, S [B, H, Dk, Dv] for [B, H, N, D] q (q's rank; Dk: the
        feature map's dimension for linear), or the tuple (S, z) with the key sum z [B, H, Dk]
        for linear's sum rule; output_final_state=True returns (out, final_state) in the same
        form ((out, final_state, saved) with save=True). cu_seqlens, cu_seqlens_k:
        FlashAttention's offsets of packed documents (0, ..., N) for q, k, v of a batch of one;
        states are then one per document, [documents, H, Dk, Dv].

        Mask and score modifiers of the softmax variants (full, sliding, bigbird; support says
        which a variant takes), with FlashAttention's and PyTorch's names: window_size=(left,
        right), keys p(i) - left <= j <= p(i) + right (-1: unbounded); prefix_lengths, one per
        item (or document), prefix-LM under a causal mask; softcap, cap · tanh(s / cap) (None
        or 0: none); bias, an additive float bias broadcastable to [B, H, Nq, Nk] (-inf masks a
        pair); sinks [H], a logit per head that joins every row's denominator; alibi_slopes
        [H] (alibi_slopes(H): the paper's); log_decay, for a softmax variant the forgetting
        gate (FoX, causal). enable_gqa=True lets k, v have fewer heads than q (a divisor of
        its heads), as in scaled_dot_product_attention."""
        rank, q4, k4, v4 = _qkv(q, k, v)
        _grouped(q4, k4, enable_gqa)
        documents = cu_seqlens is not None
        m = _documents(_mask(q4, k4, causal, key_lengths, mask, scale), q4, cu_seqlens,
                       cu_seqlens_k)
        _modifiers(m, window_size, prefix_lengths, softcap)
        t = _scores(_tokens(rank, log_decay, beta), rank, bias, sinks, alibi_slopes)
        _set_state(t, "initial_state", initial_state, rank, documents)
        if _dtype(dtype):
            bits = [_core.round_bf16(x) for x in (q4, k4, v4)]
            result = self._backend.forward_bf16(*bits, m, t, save=True)
            out, saved = _core.widen_bf16(result[0]), result[1]
        elif not save and not output_final_state:
            return _unlift(self._backend.forward(q4, k4, v4, m, t), rank)
        else:
            out, saved = self._backend.forward(q4, k4, v4, m, t, save=True)
        if not save and not output_final_state:
            return _unlift(out, rank)
        out = _unlift(out, rank)
        if not output_final_state:
            return out, saved
        if saved.final_state is None:
            raise NotImplementedError(f"{self.spec}: output_final_state: the variant has no "
                                      "recurrent state")
        final = _state_out(*saved.final_state, rank, documents)
        return (out, final, saved) if save else (out, final)

    def backward(self, q, k, v, out, d_out, causal=None, key_lengths=None, mask=None,
                 scale=None, log_decay=None, beta=None, saved=None, initial_state=None,
                 d_final_state=None, cu_seqlens=None, cu_seqlens_k=None, *, bias=None,
                 sinks=None, alibi_slopes=None, softcap=None, window_size=None,
                 prefix_lengths=None, enable_gqa=False, dtype="float32"):
        """Gradients of a loss L through out = forward(q, k, v, ...), given d_out = dL/d(out):
        {"dq", "dk", "dv"} shaped like q, k, v; "d_log_decay" and "d_beta" shaped like the
        log_decay and beta given; and "d_" + the lower-case name of each of the variant's own
        parameters, shaped as parameters() gives them (linformer: "d_e", and "d_f" under
        share=none). saved: what forward(...,
        save=True) returned with out, or None to recompute it. initial_state and cu_seqlens:
        the forward's; d_final_state: dL/d(final state) in final_state's form, when the loss
        reads it; with initial_state, "d_initial_state" is its gradient in its form. The
        modifiers as forward's: "d_bias" (in bias's shape, summed over its broadcast axes),
        "d_sinks" and "d_alibi_slopes" ([H]) are the gradients of those given. dtype="bf16":
        the forward's; q, k, v, out and d_out are rounded to bf16, and dq, dk, dv are bf16
        results returned as float32 (the other gradients float32)."""
        rank, q4, k4, v4 = _qkv(q, k, v)
        _grouped(q4, k4, enable_gqa)
        out, d_out = _floats("out", out), _floats("d_out", d_out)
        if not out.ndim == d_out.ndim == rank:
            raise ValueError(f"out and d_out must have q's rank {rank}: {list(out.shape)}, "
                             f"{list(d_out.shape)}")
        out4, d4 = _bhnd(out), _bhnd(d_out)
        documents = cu_seqlens is not None
        m = _documents(_mask(q4, k4, causal, key_lengths, mask, scale), q4, cu_seqlens,
                       cu_seqlens_k)
        _modifiers(m, window_size, prefix_lengths, softcap)
        t = _scores(_tokens(rank, log_decay, beta), rank, bias, sinks, alibi_slopes)
        _set_state(t, "initial_state", initial_state, rank, documents)
        _set_state(t, "d_final_state", d_final_state, rank, documents)
        if saved is not None and not isinstance(saved, _core.Saved):
            raise TypeError(f"saved: expected what forward(..., save=True) returned, got "
                            f"{type(saved).__name__}")
        if _dtype(dtype):
            bits = [_core.round_bf16(x) for x in (q4, k4, v4, out4, d4)]
            grads = self._backend.backward_bf16(*bits[:3], m, t, *bits[3:], saved)
            for name in ("dq", "dk", "dv"):
                grads[name] = _core.widen_bf16(grads[name])
        else:
            grads = self._backend.backward(q4, k4, v4, m, t, out4, d4, saved)
        for name in ("dq", "dk", "dv"):
            grads[name] = _unlift(grads[name], rank)
        for name in ("d_log_decay", "d_beta"):
            if name in grads:
                grads[name] = grads[name].reshape(grads[name].shape[4 - rank:])
        if "d_bias" in grads:
            grads["d_bias"] = grads["d_bias"].reshape(bias.shape)
        if "d_initial_state" in grads:
            grads["d_initial_state"] = _state_out(grads["d_initial_state"],
                                                  grads.pop("d_initial_key_sum", None), rank,
                                                  documents)
        return grads


class Decoder:
    """Token-by-token decoding (Attention.start_decoding): a causal variant's KV cache, window
    ring or recurrent state. Inputs are float32: q [B, H, N, Dk], k [B, Hkv, N, Dk], v
    [B, Hkv, N, Dv] (N = 1 for step); prefill followed by steps gives the rows of the causal
    forward of all the tokens."""

    def __init__(self, handle, spec):
        self._handle = handle
        self._spec = spec

    def __repr__(self):
        return f"<attnlab.Decoder of {self._spec!r}, {self.tokens} tokens, {self.bytes} bytes>"

    @property
    def tokens(self):
        """The tokens held per batch item, a list."""
        return list(self._handle.tokens)

    @property
    def bytes(self):
        """The bytes the decoder holds (its cache's storage as allocated, or its states)."""
        return int(self._handle.bytes)

    @staticmethod
    def _rank4(**named):
        out = []
        for name, x in named.items():
            x = _floats(name, x)
            if x.ndim != 4:
                raise ValueError(f"{name}: shape {list(x.shape)}, expected [B, H, N, D] (a "
                                 "decoder takes rank 4)")
            out.append(x)
        return out

    def _inputs(self, q, k, v, log_decay, beta):
        return (*self._rank4(q=q, k=k, v=v), _tokens(4, log_decay, beta))

    def prefill(self, q, k, v, log_decay=None, beta=None, lengths=None):
        """A prompt of N tokens per item after those held: its outputs [B, H, N, Dv], the rows
        of the causal forward (chunked). lengths: B prompt lengths (the rest of each item's N
        tokens is padding: not kept, output zeros); None: all N."""
        q, k, v, t = self._inputs(q, k, v, log_decay, beta)
        return self._handle.prefill(q, k, v, t, _offsets("lengths", lengths))

    def step(self, q, k, v, log_decay=None, beta=None):
        """One token per item ([B, H, 1, D]) after those held: its output [B, H, 1, Dv]."""
        q, k, v, t = self._inputs(q, k, v, log_decay, beta)
        return self._handle.step(q, k, v, t)

    def extend(self, k, v, log_decay=None, beta=None):
        """A context whose outputs are not wanted (k [B, Hkv, N, Dk], v [B, Hkv, N, Dv]) after
        the tokens held: a KV cache stores it without attending, a recurrent state takes it in."""
        k, v = self._rank4(k=k, v=v)
        self._handle.extend(k, v, _tokens(4, log_decay, beta))


def _remake(spec, learned):
    a = make(spec)
    if learned:
        a.set_parameters(learned)
    return a


def make(spec):
    """The backend a factory string names ("full", "sliding:left=64", ...): an Attention."""
    return Attention(spec)


def attention(q, k, v, spec="full", causal=None, key_lengths=None, mask=None, scale=None,
              log_decay=None, beta=None, initial_state=None, output_final_state=False,
              cu_seqlens=None, cu_seqlens_k=None, *, bias=None, sinks=None, alibi_slopes=None,
              softcap=None, window_size=None, prefix_lengths=None, enable_gqa=False,
              dtype="float32"):
    """make(spec).forward(q, k, v, ...): one call, a new float32 array.

    causal: None, "top-left" (j <= i) or "bottom-right" (j <= i + Nk - Nq); key_lengths: B valid
    key counts (the rest is padding); mask: bool [Nq, Nk], [H, Nq, Nk] or [B, H, Nq, Nk],
    True = may attend; scale: the softmax scale (default 1 / sqrt(D)); log_decay: the log of
    the memory's decay g <= 0 per key token (gla, gated-delta), beta: the delta rule's write
    strength in [0, 1] per key token (delta, gated-delta), each [B, H, N] (q's rank minus one);
    a variant that does not take one raises NotImplementedError. initial_state,
    output_final_state (returns (out, final_state)), cu_seqlens and cu_seqlens_k: as
    flash-linear-attention and FlashAttention name them (see Attention.forward); bias, sinks,
    alibi_slopes, softcap, window_size, prefix_lengths and enable_gqa (grouped KV heads): the
    softmax variants' modifiers (see Attention.forward); dtype="bf16": q, k, v rounded to
    bfloat16 and the result too, returned as float32 (see Attention.forward)."""
    return make(spec).forward(q, k, v, causal=causal, key_lengths=key_lengths, mask=mask,
                              scale=scale, log_decay=log_decay, beta=beta,
                              initial_state=initial_state,
                              output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                              cu_seqlens_k=cu_seqlens_k, bias=bias, sinks=sinks,
                              alibi_slopes=alibi_slopes, softcap=softcap,
                              window_size=window_size, prefix_lengths=prefix_lengths,
                              enable_gqa=enable_gqa, dtype=dtype)


def reference(q, k, v, causal=None, key_lengths=None, mask=None, scale=None, *,
              cu_seqlens=None, cu_seqlens_k=None, bias=None, sinks=None, alibi_slopes=None,
              softcap=None, window_size=None, prefix_lengths=None, log_decay=None,
              enable_gqa=False):
    """Exact softmax attention under the same mask and modifiers (attention's keywords; log_decay
    is the forgetting gate), accumulated in float64 from the equations: a float64 array."""
    rank, q4, k4, v4 = _qkv(q, k, v)
    _grouped(q4, k4, enable_gqa)
    m = _documents(_mask(q4, k4, causal, key_lengths, mask, scale), q4, cu_seqlens, cu_seqlens_k)
    _modifiers(m, window_size, prefix_lengths, softcap)
    t = _scores(_tokens(rank, log_decay, None), rank, bias, sinks, alibi_slopes)
    if any(x is not None for x in (log_decay, bias, sinks, alibi_slopes)):
        # The float64 reference reads these unchecked: full's forward, which takes every one,
        # checks their shapes and values first (and costs less than the reference).
        _core.Backend("full").forward(q4, k4, v4, m, t)
    return _unlift(_core.reference(q4, k4, v4, m, t), rank)


def compare(out, ref):
    """The library's error metrics of out against ref (same shape): {"rel_fro", "max_abs",
    "mean_cos", "p99_row"}."""
    out = _floats("out", out)
    if not isinstance(ref, np.ndarray) or ref.dtype.kind != "f":
        raise TypeError("ref: expected a floating-point numpy.ndarray")
    if ref.shape != out.shape:
        raise ValueError(f"out {list(out.shape)} and ref {list(ref.shape)} differ in shape")
    return _core.compare(_bhnd(out), _bhnd(np.ascontiguousarray(ref, dtype=np.float64)))
