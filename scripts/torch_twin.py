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
