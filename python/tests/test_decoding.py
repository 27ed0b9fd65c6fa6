"""Decoding from Python: attnlab.make(spec).start_decoding(...) for every kind of decoder
(a KV cache, a window's ring, bigbird's pattern, a recurrent state): prefill then steps equal
the causal forward; tokens and bytes held; bad input names the argument."""
import numpy as np

import attnlab
from checks import check, finish, raises  # this folder

rng = np.random.default_rng(5)


def arrays(*shape):
    return rng.standard_normal(shape, dtype=np.float32)


B, H, N, N0, D = 2, 2, 40, 13, 8
for spec in ("full", "sliding:left=5,global=1", "bigbird:block=4,random=1", "gla",
             "linear", "gated-delta"):
    a = attnlab.make(spec)
    q, k, v = arrays(B, H, N, D), arrays(B, H, N, D), arrays(B, H, N, D)
    extra = {}
    if a.support["log_decay"]:
        extra["log_decay"] = -rng.uniform(0, 1, (B, H, N)).astype(np.float32)
    if a.support["beta"]:
        extra["beta"] = rng.uniform(0, 1, (B, H, N)).astype(np.float32)
    want = a.forward(q, k, v, causal="top-left", **extra)
    decoder = a.start_decoding(B, H, D, D, max_tokens=N if spec.startswith("bigbird") else 0)
    rows = [decoder.prefill(q[:, :, :N0], k[:, :, :N0], v[:, :, :N0],
                            **{n: x[..., :N0] for n, x in extra.items()})]
    for t in range(N0, N):
        rows.append(decoder.step(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1],
                                 **{n: x[..., t:t + 1] for n, x in extra.items()}))
    got = np.concatenate(rows, axis=2)
    check(np.allclose(got, want, rtol=1e-4, atol=2e-5), f"{spec}: prefill and steps")
    check(decoder.tokens == [N, N], f"{spec}: tokens {decoder.tokens}")
    check(decoder.bytes > 0, f"{spec}: bytes {decoder.bytes}")

# extend: a context without its outputs, then steps give the forward's rows.
a = attnlab.make("full")
q, k, v = arrays(1, 2, 20, 8), arrays(1, 1, 20, 8), arrays(1, 1, 20, 8)
d = a.start_decoding(1, 2, 8, 8, kv_heads=1)
d.extend(k[:, :, :15], v[:, :, :15])
got = np.concatenate([d.step(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1])
                      for t in range(15, 20)], axis=2)
want = a.forward(q, np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1), causal="top-left")
check(np.allclose(got, want[:, :, 15:], rtol=1e-4, atol=2e-5) and d.tokens == [20],
      "extend then steps")

# Prompt lengths (padding): item 1's prompt is 5 tokens; its padded rows are zeros.
d = attnlab.make("full").start_decoding(2, 1, 4, 4)
out = d.prefill(arrays(2, 1, 8, 4), arrays(2, 1, 8, 4), arrays(2, 1, 8, 4), lengths=[8, 5])
check(d.tokens == [8, 5] and not out[1, :, 5:].any(), f"lengths: {d.tokens}")

x = arrays(1, 2, 1, 4)
raises(NotImplementedError, ["linformer", "decoding"], attnlab.make("linformer:k=4").start_decoding,
       1, 2, 4, 4)
raises(ValueError, ["kv_heads = 3", "heads = 4"], attnlab.make("full").start_decoding, 1, 4, 4,
       4, kv_heads=3)
raises(ValueError, ["window_size"], attnlab.make("full").start_decoding, 1, 2, 4, 4,
       window_size=3)
raises(ValueError, ["sinks", "one per query head"], attnlab.make("full").start_decoding, 1, 2, 4,
       4, sinks=np.ones(1, np.float32))
raises(ValueError, ["softcap", "> 0"], attnlab.make("full").start_decoding, 1, 2, 4, 4,
       softcap=-1.0)
raises(NotImplementedError, ["retnet", "softcap"], attnlab.make("retnet").start_decoding, 1, 2,
       4, 4, softcap=2.0)
raises(ValueError, ["bigbird", "max_tokens"], attnlab.make("bigbird").start_decoding, 1, 2, 4, 4)
raises(ValueError, ["dk", "non-negative integer"], attnlab.make("full").start_decoding, 1, 2,
       -4, 4)
d = attnlab.make("full").start_decoding(1, 2, 4, 4, max_tokens=1)
raises(ValueError, ["q", "[B, H, N, D]"], d.step, x[0], x[0], x[0])
raises(ValueError, ["q", "[1, 2, 1, 5]", "[1, 2, 1, 4]"], d.step, arrays(1, 2, 1, 5), x, x)
raises(ValueError, ["lengths[0] = 3", "N = 1"], d.prefill, x, x, x, lengths=[3])
d.step(x, x, x)
raises(ValueError, ["max_tokens = 1"], d.step, x, x, x)
raises(NotImplementedError, ["linear", "log-decay"], attnlab.make("linear").start_decoding(1, 2,
       4, 4).step, x, x, x, log_decay=np.zeros((1, 2, 1), np.float32))



def reference(q, k, v, window, softcap, sinks, slopes, gate):
    """Causal softmax in float64 from the definitions (mask.hpp, attention.hpp): query head h
    reads KV head h // (H / Hkv); scores scale·q·k, soft-capped, minus slope·(i - j), plus the
    forgetting gate's sum of g over j < t <= i; a sink joins each denominator."""
    B, H, N, D = q.shape
    group = H // k.shape[1]
    out = np.zeros((B, H, N, v.shape[3]))
    F = np.cumsum(gate.astype(np.float64), axis=2)
    for b in range(B):
        for h in range(H):
            kh, vh = k[b, h // group].astype(np.float64), v[b, h // group].astype(np.float64)
            for i in range(N):
                j = np.arange(max(0, i - window), i + 1)
                s = q[b, h, i].astype(np.float64) @ kh[j].T / np.sqrt(D)
                s = softcap * np.tanh(s / softcap) - slopes[h] * (i - j) + F[b, h, i] - F[b, h, j]
                top = max(s.max(), sinks[h])
                p = np.exp(s - top)
                out[b, h, i] = p @ vh[j] / (p.sum() + np.exp(sinks[h] - top))
    return out


# Grouped heads (4 query heads over 2 KV heads, each stored once) with every modifier.
B, H, Hkv, N, N0, D = 2, 4, 2, 30, 11, 8
q, k, v = 3 * arrays(B, H, N, D), arrays(B, Hkv, N, D), arrays(B, Hkv, N, D)
gate = -rng.uniform(0, 0.3, (B, H, N)).astype(np.float32)
sinks = np.array([0.5, -1, 2, -10], np.float32)
slopes = attnlab.alibi_slopes(H)
want = reference(q, k, v, 7, 2.0, sinks, slopes, gate)
for spec in ("full", "sliding:left=7,global=0"):
    d = attnlab.make(spec).start_decoding(B, H, D, D, kv_heads=Hkv, window_size=(7, 0),
                                           softcap=2.0, sinks=sinks, alibi_slopes=slopes)
    rows = [d.prefill(q[:, :, :N0], k[:, :, :N0], v[:, :, :N0], log_decay=gate[..., :N0])]
    for t in range(N0, N):
        rows.append(d.step(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1],
                           log_decay=gate[..., t:t + 1]))
    got = np.concatenate(rows, axis=2)
    # float32 against float64: the same sums rounded at each step
    check(np.allclose(got, want, rtol=1e-4, atol=2e-5),
          f"{spec}: grouped heads and modifiers, max error {np.abs(got - want).max():.2e}")
    check(d.bytes == 8 * B * Hkv * 8 * 2 * 4 + 8 * B * H * 8 + 8 * B * H,
          f"{spec}: a ring of 8 keys and values per KV head, and F: {d.bytes} bytes")

finish()
