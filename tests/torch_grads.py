#!/usr/bin/python3
"""Gradients of attnlab's attention variants by PyTorch autograd in float64, for the tests.

Usage: torch_grads.py DIR

Every folder DIR/case*/ holds case.json ({"kind": ..., parameters}) and float32 .npy inputs,
d_out.npy among them. Each case's output is computed here from the variants' definitions
(written independently of attnlab's kernels), the loss sum(out * d_out) is differentiated, and
d<name>.npy (float64) is written beside every differentiated input. DIR/status.json says
{"status": "ok"|"skipped"|"error", "message": ...}; a missing torch is "skipped".

Kinds:
  softmax    q k v, allowed [B,H,Nq,Nk] (0/1), scale: softmax over the allowed keys, zero rows
             where none is allowed.
  linformer  q k v, E F [H,kp,Nk] (the matrices each head uses), lengths, scale: softmax
             attention over E K and F V, padded keys and values zeroed before the projection.
  linear     q k v, feature (elu1|relu|favor|dpfp|taylor), rule (sum|delta), causal, eps, beta,
             nu, lengths, scale, and W: favor's [m,Dk], taylor's projection [d',Dk] if any:
             linear attention with favor's stabilisers (query row max; key max over the
             visible keys) held constant, as in attnlab.
  scan       q k v, and g [B,H,N] / beta [B,H,N] when "g" / "beta" are true; delta, normalise,
             causal, lengths, scale, head_g (the per-head log-decay when g is not an input),
             beta_value: the decay-and-delta recurrence of variants/linear_scan.hpp.
  modified   q [B,H,Nq,Dk], k v [B,Hkv,Nk,D] (grouped heads: each KV head repeated for H / Hkv
             query heads), allowed [B,H,Nq,Nk] (0/1), pos [Nq] (each query's key position),
             scale, softcap (or null), lengths, and the inputs named in "inputs" among bias
             (broadcastable to [B,H,Nq,Nk]), sinks [H], slopes [H] and g [B,H,Nk]: an explicit
             softmax of scale q k^T, soft-capped, plus -slope |pos_i - j|, the bias and
             F[pos_i] - F[j] (F the cumulative sum of g over the unpadded keys), over the allowed
             keys and a sink column; every float input differentiated.
"""
import json
import math
import os
import sys
import traceback


def load(np, torch, folder, name):
    array = np.load(os.path.join(folder, name + ".npy")).astype(np.float64)
    return torch.tensor(array, requires_grad=True)


def softmax_attention(torch, q, k, v, allowed, scale):
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    s = s.masked_fill(allowed == 0, float("-inf"))
    any_key = (allowed != 0).any(dim=-1, keepdim=True)
    s = torch.where(any_key, s, torch.zeros_like(s))  # empty rows: no NaN, zeroed below
    return torch.matmul(torch.softmax(s, dim=-1) * (allowed != 0), v)


def modified_attention(torch, spec, x, allowed, pos):
    q, k, v = x["q"], x["k"], x["v"]
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    s = torch.matmul(q, k.transpose(-1, -2)) * spec["scale"]
    if spec.get("softcap"):
        s = spec["softcap"] * torch.tanh(s / spec["softcap"])
    nk = k.shape[2]
    keys = torch.arange(nk, dtype=q.dtype)
    if "slopes" in x:
        s = s - x["slopes"][None, :, None, None] * (pos[:, None] - keys[None, :]).abs()
    if "bias" in x:
        s = s + x["bias"]
    if "g" in x:
        valid = (torch.arange(nk)[None, :] < torch.tensor(spec["lengths"])[:, None]).to(q.dtype)
        f = torch.cumsum(x["g"] * valid[:, None, :], dim=-1)
        at = pos.long().clamp(0, nk - 1)
        s = s + f[:, :, at][..., None] - f[:, :, None, :]
    ok = allowed != 0
    s = s.masked_fill(~ok, float("-inf"))
    if "sinks" in x:
        sink = x["sinks"][None, :, None, None].expand(s.shape[0], s.shape[1], s.shape[2], 1)
        p = torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :-1]
    else:
        any_key = ok.any(dim=-1, keepdim=True)
        s = torch.where(any_key, s, torch.zeros_like(s))  # empty rows: no NaN, zeroed below
        p = torch.softmax(s, dim=-1) * ok
    return torch.matmul(p, v)


def linformer(torch, q, k, v, e, f, lengths, scale):
    rows = []
    for b in range(q.shape[0]):
        valid = (torch.arange(k.shape[2]) < lengths[b]).to(q.dtype)[:, None]
        heads = []
        for h in range(q.shape[1]):
            kp = e[h] @ (k[b, h] * valid)
            vp = f[h] @ (v[b, h] * valid)
            p = torch.softmax(q[b, h] @ kp.T * scale, dim=-1)
            heads.append(p @ vp)
        rows.append(torch.stack(heads))
    return torch.stack(rows)


def features(torch, spec, x, w):
    """phi(x) per row; favor in log form (stabilised by the caller)."""
    functional = torch.nn.functional
    feature = spec["feature"]
    if feature == "elu1":
        return functional.elu(x) + 1
    if feature == "relu":
        return functional.relu(x)
    if feature == "favor":
        scale = spec["scale"]
        xs = x * math.sqrt(scale)
        return xs @ w.T - (xs * xs).sum(-1, keepdim=True) / 2 - 0.5 * math.log(w.shape[0])
    if feature == "taylor":  # [1, x', vec(x' x'^T) / sqrt(2)], x' = W x / d'^(1/4)
        xp = x if w is None else x @ w.T
        m = xp.shape[-1]
        xp = xp / m ** 0.25
        outer = (xp[:, :, None] * xp[:, None, :]).reshape(xp.shape[0], m * m) / math.sqrt(2)
        return torch.cat([torch.ones_like(xp[:, :1]), xp, outer], dim=-1)
    xp = torch.cat([functional.relu(x), functional.relu(-x)], dim=-1)
    return torch.cat([xp * torch.roll(xp, j, dims=-1) for j in range(1, spec["nu"] + 1)], dim=-1)


def linear(torch, spec, q, k, v, w):
    favor = spec["feature"] == "favor"
    causal = spec["causal"]
    rows = []
    for b in range(q.shape[0]):
        n = spec["lengths"][b]
        heads = []
        for h in range(q.shape[1]):
            fq = features(torch, spec, q[b, h], w)
            fk = features(torch, spec, k[b, h, :n], w)
            if favor:  # stabilisers held constant (detached), as in attnlab
                fq = torch.exp(fq - fq.max(-1, keepdim=True).values.detach())
            if spec["rule"] == "delta":
                heads.append(delta_rule(torch, spec, fq, fk, v[b, h, :n], favor, causal))
                continue
            nq = q.shape[2]
            if n == 0:  # no key: zero output
                heads.append(torch.zeros(nq, v.shape[-1], dtype=q.dtype))
                continue
            visible = torch.tensor([[j < n and (not causal or j <= i) for j in range(n)]
                                    for i in range(nq)], dtype=torch.bool)
            if favor:
                ek = fk.detach()
                top = torch.where(visible[:, :, None], ek[None, :, :],
                                  torch.full_like(ek[None], float("-inf")))
                c = top.amax(dim=(1, 2))  # per query: max over the keys it sees
                c = torch.where(torch.isfinite(c), c, torch.zeros_like(c))
                a = torch.exp(fk[None, :, :] - c[:, None, None])  # [Nq, n, P]
                a = (fq[:, None, :] * a).sum(-1)
            else:
                a = fq @ fk.T
            a = a * visible
            num = a @ v[b, h, :n]
            den = a.sum(-1, keepdim=True)
            safe = torch.where(den > 0, den + spec["eps"], torch.ones_like(den))
            heads.append(torch.where(den > 0, num / safe, torch.zeros_like(num)))
        rows.append(torch.stack(heads))
    return torch.stack(rows)


def normalise(torch, f):
    total = f.sum(-1, keepdim=True)
    return torch.where(total > 0, f / torch.where(total > 0, total, torch.ones_like(total)),
                       torch.zeros_like(f))


def delta_rule(torch, spec, fq, fk, v, favor, causal):
    if favor:
        fk = torch.exp(fk - fk.max(-1, keepdim=True).values.detach())
    fq, fk = normalise(torch, fq), normalise(torch, fk)
    beta = spec["beta"]
    memory = torch.zeros(v.shape[1], fq.shape[1], dtype=fq.dtype)  # W [Dv, P]
    outs = []
    for j in range(fk.shape[0]):
        memory = memory + beta * torch.outer(v[j] - memory @ fk[j], fk[j])
        if causal:
            outs.append(memory @ fq[j])
    if causal:
        for i in range(fk.shape[0], fq.shape[0]):  # queries past the last valid key
            outs.append(memory @ fq[i])
        return torch.stack(outs)
    return fq @ memory.T


def scan(torch, spec, q, k, v, g, beta):
    """S_t = a_t S_{t-1} + k_t u_t^T, u_t = v_t (sum) or beta_t (v_t - a_t S_{t-1}^T k_t);
    g [B,H,N,Dk]: a_t = Diag(exp g_t), per key channel."""
    if spec["normalise"]:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    q = q * spec["scale"]
    rows = []
    for b in range(q.shape[0]):
        heads = []
        for h in range(q.shape[1]):
            memory = torch.zeros(k.shape[3], v.shape[3], dtype=q.dtype)
            outs = []
            for t in range(k.shape[2]):
                if t < spec["lengths"][b]:
                    log_a = g[b, h, t] if g is not None else spec["head_g"][h]
                    decay = torch.exp(torch.as_tensor(log_a, dtype=q.dtype))
                    if decay.dim() == 1:  # per key channel: Diag(exp g_t) S
                        decay = decay[:, None]
                    prior = decay * memory
                    if spec["delta"]:
                        strength = beta[b, h, t] if beta is not None else spec["beta_value"]
                        u = strength * (v[b, h, t] - prior.T @ k[b, h, t])
                    else:
                        u = v[b, h, t]
                    memory = prior + torch.outer(k[b, h, t], u)
                if spec["causal"]:
                    outs.append(memory.T @ q[b, h, t])
            heads.append(torch.stack(outs) if spec["causal"] else q[b, h] @ memory)
        rows.append(torch.stack(heads))
    return torch.stack(rows)


def run_case(np, torch, folder):
    with open(os.path.join(folder, "case.json")) as f:
        spec = json.load(f)
    kind = spec["kind"]
    names = ["q", "k", "v"] + (["E", "F"] if kind == "linformer" else [])
    names += [n for n in ("g", "beta") if kind == "scan" and spec[n]]
    names += spec.get("inputs", []) if kind == "modified" else []
    x = {name: load(np, torch, folder, name) for name in names}
    d_out = torch.tensor(np.load(os.path.join(folder, "d_out.npy")).astype(np.float64))
    if kind == "softmax":
        allowed = torch.tensor(np.load(os.path.join(folder, "allowed.npy")))
        out = softmax_attention(torch, x["q"], x["k"], x["v"], allowed, spec["scale"])
    elif kind == "modified":
        allowed = torch.tensor(np.load(os.path.join(folder, "allowed.npy")))
        pos = torch.tensor(np.load(os.path.join(folder, "pos.npy")).astype(np.float64))
        out = modified_attention(torch, spec, x, allowed, pos)
    elif kind == "linformer":
        out = linformer(torch, x["q"], x["k"], x["v"], x["E"], x["F"], spec["lengths"],
                        spec["scale"])
    elif kind == "scan":
        out = scan(torch, spec, x["q"], x["k"], x["v"], x.get("g"), x.get("beta"))
    else:
        w = None  # favor's random features, or taylor's projection when it has one
        if os.path.exists(os.path.join(folder, "W.npy")):
            w = torch.tensor(np.load(os.path.join(folder, "W.npy")).astype(np.float64))
        out = linear(torch, spec, x["q"], x["k"], x["v"], w)
    (out * d_out).sum().backward()
    for name, t in x.items():  # an input the output does not depend on has no .grad
        grad = t.grad if t.grad is not None else torch.zeros_like(t)
        np.save(os.path.join(folder, "d" + name + ".npy"), grad.numpy())


def main(argv):
    directory = argv[1]
    status = {"status": "ok", "message": ""}
    try:
        import numpy as np
        import torch
    except ImportError as e:
        status = {"status": "skipped", "message": "cannot import numpy and torch: %s" % e}
    else:
        torch.set_num_threads(1)
        try:
            for case in sorted(os.listdir(directory)):
                if case.startswith("case"):
                    run_case(np, torch, os.path.join(directory, case))
            status["message"] = "torch " + torch.__version__
        except Exception:
            status = {"status": "error", "message": traceback.format_exc()}
            print(status["message"], file=sys.stderr)
    with open(os.path.join(directory, "status.json"), "w") as f:
        json.dump(status, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
