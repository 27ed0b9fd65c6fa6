"""The PyTorch twin of what `attnlab train` trains (training/model.hpp), for the comparisons that
train both: tests/torch_train.py (step for step, from the same weights and batches) and
scripts/torch-mqar.py (the same model on its own batches).

TaskModel is attnlab's TaskModel layer for layer, with its state_dict names: the token embedding
("embedding.weight") scaled by sqrt(d_model) plus sinusoidal positions, nn.TransformerEncoder
("encoder.*"; post-LN, or pre-LN with a final LayerNorm as `norm=` unless final_norm is False,
attnlab's no-final-norm), no dropout, every attention call causal when `causal` (train --causal),
and a Linear head ("head.*") at every position or on the mean over the unpadded positions.
With `short_conv` or `head_norm` (attnlab's short-conv and head-norm switches) each layer's
self_attn is SelfAttention.
nn.TransformerEncoder deep-copies its layer, so every layer would start from the same weights;
here each layer is initialised on its own, as attnlab's are. adamw() is attnlab's Adam
(models/optimizer.hpp): torch.optim.AdamW under a linear warm-up.

LlamaTaskModel is `attnlab train --arch llama` (models/llama.hpp) in plain torch, with Hugging
Face's LlamaForCausalLM state_dict names ("model.embed_tokens.weight", "model.layers.0.self_attn.
q_proj.weight", ..., "model.norm.weight", "lm_head.weight"): RMSNorm, rotary embeddings with
rotate_half, SwiGLU, no biases, grouped key and value heads by repeating k and v, a causal core
(full, sliding:left=W,right=0, gated-delta with its learned gates, kda with KDA's per-channel
gate, delta-product:steps=R with R keys per token), and attnlab's short-conv, head-norm and
channel-gate (KDA's form) switches.
"""
import math
import os

import numpy as np
import torch
from torch import nn


def positions(n, d):
    """attnlab's sinusoidal_positions [n, d] (float32): sin at even, cos at odd channels."""
    position = torch.arange(n, dtype=torch.float64)[:, None]
    channel = torch.arange(d)
    angle = position * 10000.0 ** (-(channel - channel % 2).double() / d)
    return torch.where(channel % 2 == 0, torch.sin(angle), torch.cos(angle)).float()


class SelfAttention(nn.Module):
    """attnlab's softmax self-attention with its switches (models/multi_head_attention.hpp):
    short_conv: q, k, v = silu(causal depthwise conv of width 4 over x W_in^T + b_in);
    head_norm: each head's output row divided by its RMS (eps 1e-5), times a gain [d_k].
    torch.nn.MultiheadAttention's parameter names plus "conv_weight" [3 d_model, 4] and
    "head_norm.weight". Called as TransformerEncoderLayer calls its self_attn (batch first)."""

    WIDTH = 4
    batch_first = False  # keeps TransformerEncoderLayer off its fused path, which bypasses us
    _qkv_same_embed_dim = True

    def __init__(self, d_model, heads, short_conv, head_norm):
        super().__init__()
        self.num_heads = heads
        self.in_proj_weight = nn.Parameter(torch.empty(3 * d_model, d_model))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * d_model))
        self.out_proj = nn.Linear(d_model, d_model)
        nn.init.xavier_uniform_(self.in_proj_weight)
        nn.init.zeros_(self.out_proj.bias)
        self.conv_weight = None
        if short_conv:
            self.conv_weight = nn.Parameter(torch.empty(3 * d_model, self.WIDTH))
            nn.init.uniform_(self.conv_weight, -self.WIDTH ** -0.5, self.WIDTH ** -0.5)
        self.head_norm = nn.ParameterDict({"weight": nn.Parameter(torch.ones(d_model // heads))}) \
            if head_norm else None

    def forward(self, x, key, value, attn_mask=None, key_padding_mask=None, need_weights=False):
        b, n, d = x.shape
        h = self.num_heads
        qkv = nn.functional.linear(x, self.in_proj_weight, self.in_proj_bias)
        if self.conv_weight is not None:
            conv = nn.functional.conv1d(qkv.transpose(1, 2), self.conv_weight[:, None, :],
                                        padding=self.WIDTH - 1, groups=3 * d)[..., :n]
            qkv = nn.functional.silu(conv).transpose(1, 2)
        q, k, v = (t.reshape(b, n, h, d // h).transpose(1, 2) for t in qkv.split(d, dim=2))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // h)
        if attn_mask is not None:
            scores = scores + attn_mask
        if key_padding_mask is not None:
            scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
        heads = torch.softmax(scores, dim=-1) @ v
        if self.head_norm is not None:
            heads = heads * torch.rsqrt(heads.pow(2).mean(-1, keepdim=True) + 1e-5) \
                * self.head_norm["weight"]
        return self.out_proj(heads.transpose(1, 2).reshape(b, n, d)), None


class TaskModel(nn.Module):
    def __init__(self, vocab, classes, d_model=64, heads=4, ffn=256, layers=2, pre_ln=True,
                 final_norm=True, causal=False, per_token=True, short_conv=False,
                 head_norm=False):
        super().__init__()
        self.embedding = nn.Embedding(vocab, d_model)
        nn.init.normal_(self.embedding.weight, std=d_model ** -0.5)  # attnlab's Embedding
        layer = nn.TransformerEncoderLayer(d_model, heads, ffn, dropout=0.0, batch_first=True,
                                           norm_first=pre_ln)
        norm = nn.LayerNorm(d_model) if pre_ln and final_norm else None
        self.encoder = nn.TransformerEncoder(layer, layers, norm=norm, enable_nested_tensor=False)
        for copy in self.encoder.layers:  # independent inits, not deep copies of one layer
            if short_conv or head_norm:
                copy.self_attn = SelfAttention(d_model, heads, short_conv, head_norm)
            else:
                copy.self_attn._reset_parameters()
            copy.linear1.reset_parameters()
            copy.linear2.reset_parameters()
        self.head = nn.Linear(d_model, classes)
        self.scale = math.sqrt(d_model)
        self.causal = causal
        self.per_token = per_token

    def forward(self, tokens, lengths=None):
        """tokens [B, N] (int64), lengths [B] (None: no padding) -> logits [B, N or 1, classes]."""
        return self.head(self.features(tokens, lengths))

    def features(self, tokens, lengths=None):
        """What the head reads: [B, N or 1, d_model] (the head alone can then run on chosen rows,
        as attnlab's scored-rows head does)."""
        n = tokens.shape[1]
        x = self.embedding(tokens) * self.scale + positions(n, self.embedding.embedding_dim)
        mask = None
        if self.causal:
            mask = torch.triu(torch.full((n, n), float("-inf"), dtype=x.dtype), diagonal=1)
        padding = None
        if lengths is not None and bool((lengths < n).any()):
            padding = torch.arange(n)[None, :] >= lengths[:, None]  # True: a padded key
        h = self.encoder(x, mask=mask, src_key_padding_mask=padding)
        if not self.per_token:
            keep = (torch.arange(n)[None, :] < lengths[:, None]).float()[:, :, None]
            h = (h * keep).sum(1, keepdim=True) / lengths.float()[:, None, None]
        return h


def rotary_tables(n, head_dim, base):
    """attnlab's cos and sin [n, head_dim] (models/rotary.hpp): angles p * base^(-2j / head_dim) in
    float64, rounded to float32, each of the head_dim / 2 frequencies twice (Hugging Face's
    layout)."""
    theta = base ** (-2.0 * torch.arange(head_dim // 2, dtype=torch.float64) / head_dim)
    angle = torch.arange(n, dtype=torch.float64)[:, None] * theta[None, :]
    angle = torch.cat([angle, angle], dim=-1)
    return torch.cos(angle).float(), torch.sin(angle).float()


def rotate_half(x):
    """Hugging Face's: [-x2, x1] for x = [x1, x2] split at the middle of the last axis."""
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight (LlamaRMSNorm)."""

    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def gated_delta(q, k, v, g, beta):
    """attnlab's gated-delta core (variants/gated_delta.hpp), token by token: q and k
    L2-normalised, q times 1/sqrt(d_k); S_t = a_t S_{t-1} + beta_t k_t (v_t - a_t S_{t-1}^T k_t)^T,
    a_t = exp(g_t), out_t = S_t^T q_t. q, k, v [B, H, N, d]; g, beta [B, H, N], or g [B, H, N, d]
    per key channel (kda: a_t = Diag(exp g_t))."""
    q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6) / math.sqrt(q.shape[-1])
    k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    state = torch.zeros(q.shape[0], q.shape[1], k.shape[-1], v.shape[-1], dtype=q.dtype)
    outs = []
    for t in range(q.shape[2]):
        decay = torch.exp(g[:, :, t])
        prior = (decay[..., None] if g.dim() == 4 else decay[:, :, None, None]) * state
        read = torch.einsum("bhkv,bhk->bhv", prior, k[:, :, t])
        u = beta[:, :, t, None] * (v[:, :, t] - read)
        state = prior + k[:, :, t, :, None] * u[:, :, None, :]
        outs.append(torch.einsum("bhkv,bhk->bhv", state, q[:, :, t]))
    return torch.stack(outs, dim=2)


class LlamaAttention(nn.Module):
    """LlamaAttention with attnlab's core `spec` (full, sliding:left=W,right=0, gated-delta,
    kda with channel_gate, delta-product:steps=R), causal; k and v have kv_heads heads, repeated
    for the query heads they serve. delta-product: k_proj, v_proj and beta_proj project R rows
    per token (key j of token t from output rows j kv d_k..), the gate on each token's first row.
    channel_gate: KDA's per-channel gate (models/multi_head_attention.hpp),
    g = -exp(a_log[h]) softplus(up(down(x)))."""

    WIDTH = 4

    def __init__(self, d_model, heads, kv_heads, spec, rope_base, short_conv, head_norm,
                 channel_gate=False):
        super().__init__()
        self.heads, self.kv_heads, self.spec, self.rope_base = heads, kv_heads, spec, rope_base
        dk = d_model // heads
        self.rows = int(spec.split("steps=")[1].split(",")[0]) \
            if spec.startswith("delta-product") else 1
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, self.rows * kv_heads * dk, bias=False)
        self.v_proj = nn.Linear(d_model, self.rows * kv_heads * dk, bias=False)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)
        self.conv_weight = None
        if short_conv:
            self.conv_weight = nn.Parameter(
                torch.empty(d_model + 2 * self.rows * kv_heads * dk, self.WIDTH))
            nn.init.uniform_(self.conv_weight, -self.WIDTH ** -0.5, self.WIDTH ** -0.5)
        self.head_norm = nn.ParameterDict({"weight": nn.Parameter(torch.ones(dk))}) \
            if head_norm else None
        self.delta = spec.startswith(("gated-delta", "kda", "delta-product"))
        self.channel_gate = None
        if channel_gate:  # KDA's: rank d_k, a_log per head
            self.channel_gate = nn.Module()
            self.channel_gate.down = nn.Linear(d_model, dk, bias=False)
            self.channel_gate.up = nn.Linear(dk, heads * dk)
            self.channel_gate.a_log = nn.Parameter(torch.zeros(heads))
        elif self.delta:  # attnlab's learned gates, one per head and token
            self.gate_proj = nn.Linear(d_model, heads)
        if self.delta:
            self.beta_proj = nn.Linear(d_model, self.rows * heads)

    def forward(self, x, lengths=None):
        b, n, d = x.shape
        h, kv, r = self.heads, self.kv_heads, self.rows
        dk = d // h
        qkv = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        if self.conv_weight is not None:
            conv = nn.functional.conv1d(qkv.transpose(1, 2), self.conv_weight[:, None, :],
                                        padding=self.WIDTH - 1, groups=qkv.shape[-1])[..., :n]
            qkv = nn.functional.silu(conv).transpose(1, 2)
        q, k, v = qkv.split([d, r * kv * dk, r * kv * dk], dim=-1)
        q = q.reshape(b, n, h, dk).transpose(1, 2)
        k = k.reshape(b, n * r, kv, dk).transpose(1, 2)  # row t r + j: key j of token t
        v = v.reshape(b, n * r, kv, dk).transpose(1, 2)
        cos, sin = rotary_tables(n, dk, self.rope_base)
        q = q * cos + rotate_half(q) * sin
        if r > 1:  # a token's r keys at its position
            cos, sin = cos.repeat_interleave(r, dim=0), sin.repeat_interleave(r, dim=0)
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(h // kv, dim=1)  # grouped heads: query head i reads kv head i // g
        v = v.repeat_interleave(h // kv, dim=1)
        if self.delta and r == 1:  # the plain layer (the same torch operations as before)
            beta = torch.sigmoid(self.beta_proj(x)).transpose(1, 2)
            if self.channel_gate is not None:
                pre = self.channel_gate.up(self.channel_gate.down(x)).reshape(b, n, h, dk)
                g = -torch.exp(self.channel_gate.a_log)[None, :, None, None] \
                    * nn.functional.softplus(pre.transpose(1, 2))
            else:
                g = nn.functional.logsigmoid(self.gate_proj(x)).transpose(1, 2) / 16.0
            heads = gated_delta(q, k, v, g, beta)
        elif self.delta:  # r rows per token: the gate on the first, the query on the last
            beta = torch.sigmoid(self.beta_proj(x)).reshape(b, n, r, h).permute(0, 3, 1, 2) \
                .reshape(b, h, n * r)
            g = x.new_zeros(b, h, n * r)
            g[:, :, ::r] = nn.functional.logsigmoid(self.gate_proj(x)).transpose(1, 2) / 16.0
            spread = q.new_zeros(b, h, n * r, dk)
            spread[:, :, r - 1::r] = q
            heads = gated_delta(spread, k, v, g, beta)[:, :, r - 1::r]
        else:
            i = torch.arange(n)[:, None]
            j = torch.arange(n)[None, :]
            allowed = j <= i
            if self.spec.startswith("sliding"):
                left = int(self.spec.split("left=")[1].split(",")[0])
                allowed = allowed & (j >= i - left)
            scores = q @ k.transpose(-1, -2) / math.sqrt(dk)
            scores = scores.masked_fill(~allowed, float("-inf"))
            if lengths is not None and bool((lengths < n).any()):
                padded = torch.arange(n)[None, :] >= lengths[:, None]
                scores = scores.masked_fill(padded[:, None, None, :], float("-inf"))
            heads = torch.softmax(scores, dim=-1) @ v
        if self.head_norm is not None:
            heads = heads * torch.rsqrt(heads.pow(2).mean(-1, keepdim=True) + 1e-5) \
                * self.head_norm["weight"]
        return self.o_proj(heads.transpose(1, 2).reshape(b, n, d))


class LlamaMLP(nn.Module):
    def __init__(self, d_model, ffn):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, ffn, bias=False)
        self.up_proj = nn.Linear(d_model, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, d_model, bias=False)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaBlock(nn.Module):
    def __init__(self, d_model, heads, kv_heads, ffn, spec, rope_base, eps, short_conv,
                 head_norm, channel_gate=False):
        super().__init__()
        self.self_attn = LlamaAttention(d_model, heads, kv_heads, spec, rope_base, short_conv,
                                        head_norm, channel_gate)
        self.mlp = LlamaMLP(d_model, ffn)
        self.input_layernorm = RMSNorm(d_model, eps)
        self.post_attention_layernorm = RMSNorm(d_model, eps)

    def forward(self, x, lengths=None):
        h = x + self.self_attn(self.input_layernorm(x), lengths)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaTaskModel(nn.Module):
    """`attnlab train --arch llama` (see the module's comment): model.* and lm_head, tied to the
    embedding when `tied`, applied at every position or to the mean over the unpadded ones.
    Hugging Face's initialisation: every matrix N(0, 0.02^2), gains 1; the gate projections as
    nn.Linear's default."""

    def __init__(self, vocab, classes, d_model=64, heads=4, ffn=256, layers=2, spec="full",
                 kv_heads=None, rope_base=10000.0, eps=1e-5, tied=False, per_token=True,
                 short_conv=False, head_norm=False, channel_gate=False):
        super().__init__()
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(vocab, d_model)
        self.model.layers = nn.ModuleList(
            LlamaBlock(d_model, heads, kv_heads or heads, ffn, spec, rope_base, eps, short_conv,
                       head_norm, channel_gate) for _ in range(layers))
        self.model.norm = RMSNorm(d_model, eps)
        self.lm_head = nn.Linear(d_model, classes, bias=False)
        own = ("self_attn.gate_proj", "self_attn.beta_proj", "conv_weight",  # attnlab's additions
               "channel_gate")
        for name, p in self.named_parameters():
            if p.dim() == 2 and not any(part in name for part in own):
                nn.init.normal_(p, std=0.02)
        if tied:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.per_token = per_token

    def forward(self, tokens, lengths=None):
        return self.lm_head(self.features(tokens, lengths))

    def features(self, tokens, lengths=None):
        x = self.model.embed_tokens(tokens)
        for block in self.model.layers:
            x = block(x, lengths)
        h = self.model.norm(x)
        if not self.per_token:
            n = tokens.shape[1]
            keep = (torch.arange(n)[None, :] < lengths[:, None]).float()[:, :, None]
            h = (h * keep).sum(1, keepdim=True) / lengths.float()[:, None, None]
        return h


def export(model, folder):
    """Writes the weights folder attnlab reads (models/weights.hpp): <state_dict key>.npy."""
    os.makedirs(folder, exist_ok=True)
    for key, t in model.state_dict().items():
        np.save(os.path.join(folder, key + ".npy"), t.detach().numpy())


def adamw(model, lr, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.01, warmup=100):
    """attnlab's Adam: AdamW with lr · min(1, t / warmup) at step t (1-based); step both."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=betas, eps=eps,
                            weight_decay=weight_decay)
    ramp = (lambda e: min(1.0, (e + 1) / warmup)) if warmup else (lambda e: 1.0)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, ramp)


def loss_of(model, tokens, targets, lengths=None):
    """Mean cross-entropy over the scored targets (kNoTarget = -1 is not scored)."""
    logits = model(tokens, lengths)
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                       ignore_index=-1)
