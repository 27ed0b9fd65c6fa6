#!/usr/bin/python3
"""Gradients of attnlab's model layers by their PyTorch twins, for tests/test_model_backward.cpp.

Usage: torch_model_grads.py OUT_DIR

For each case: builds the torch.nn module (seeded, float32), perturbs its biases and LayerNorms
away from 0 and 1, writes OUT_DIR/<case>/weights/<state_dict key>.npy (float32, as exported for
attnlab) and the inputs, then runs the module in float64 on the same values, differentiates
loss = sum(out * d_out), and writes out.npy, grads/<input>.npy and grads/<state_dict key>.npy
(float64). Decoder layers get a causal target mask and the memory's key padding. Case "adamw" instead steps torch.optim.AdamW with a linear warm-up (LambdaLR) on a
fixed sequence of gradients and writes the parameter after every step. Exits 3 with a message
when torch cannot be imported.
"""
import math
import os
import sys

try:
    import numpy as np
    import torch
    from torch import nn
except ImportError as e:
    print(f"torch_model_grads.py: cannot import {e.name}: {e}", file=sys.stderr)
    sys.exit(3)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_layers import D_MODEL, FFN, HEADS, padding, perturb  # noqa: E402 (the twins' sizes)

VOCAB = 11


def save(folder, name, t):
    np.save(os.path.join(folder, name + ".npy"), t.detach().numpy())


def run(out_dir, case, module, forward, inputs):
    """Saves the float32 weights and inputs, then differentiates in float64."""
    folder = os.path.join(out_dir, case)
    os.makedirs(os.path.join(folder, "weights"), exist_ok=True)
    os.makedirs(os.path.join(folder, "grads"), exist_ok=True)
    perturb(module)
    for key, t in module.state_dict().items():
        save(os.path.join(folder, "weights"), key, t)
    for name, t in inputs.items():
        save(folder, name, t)
    module = module.double()
    x = {name: t.double().requires_grad_(t.is_floating_point()) for name, t in inputs.items()}
    out = forward(module, x)
    d_out = torch.randn(out.shape, dtype=torch.float32)
    save(folder, "d_out", d_out)
    (out * d_out.double()).sum().backward()
    save(folder, "out", out)
    for name, t in x.items():
        if t.grad is not None:  # token ids are inputs without a gradient
            save(os.path.join(folder, "grads"), name, t.grad)
    for name, p in module.named_parameters():
        save(os.path.join(folder, "grads"), name, p.grad)


def positions(n, dim):
    """attnlab's sinusoidal_positions: sin at even, cos at odd columns."""
    pe = torch.zeros(n, dim, dtype=torch.float64)
    for p in range(n):
        for c in range(dim):
            angle = p * 10000.0 ** (-(c - c % 2) / dim)
            pe[p, c] = math.sin(angle) if c % 2 == 0 else math.cos(angle)
    return pe


class EmbeddingModel(nn.Module):
    """attnlab's EncoderModel: embedding * sqrt(d) + positions -> encoder."""

    def __init__(self, layers, pre_ln):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, D_MODEL)
        layer = nn.TransformerEncoderLayer(D_MODEL, HEADS, FFN, dropout=0.0, batch_first=True,
                                           norm_first=pre_ln)
        norm = nn.LayerNorm(D_MODEL) if pre_ln else None
        self.encoder = nn.TransformerEncoder(layer, layers, norm=norm, enable_nested_tensor=False)

    def forward(self, tokens, mask):
        x = self.embedding(tokens) * math.sqrt(D_MODEL) + positions(tokens.shape[1], D_MODEL)
        return self.encoder(x, src_key_padding_mask=mask)


def adamw(out_dir):
    folder = os.path.join(out_dir, "adamw")
    os.makedirs(folder, exist_ok=True)
    p = nn.Parameter(torch.randn(5, 3, dtype=torch.float64))
    grads = torch.randn(8, 5, 3, dtype=torch.float64)
    save(folder, "initial", p.float())
    save(folder, "grads", grads.float())
    p.data = p.data.float().double()  # the float32 values attnlab starts from
    grads = grads.float().double()
    opt = torch.optim.AdamW([p], lr=0.05, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
    warmup = 3
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda e: min(1.0, (e + 1) / warmup))
    steps = []
    for g in grads:
        p.grad = g.clone()
        opt.step()
        schedule.step()
        steps.append(p.detach().clone())
    save(folder, "steps", torch.stack(steps))


def main(out_dir):
    torch.manual_seed(0)
    x = torch.randn(2, 7, D_MODEL)
    memory = torch.randn(2, 9, D_MODEL)
    lengths9 = torch.arange(9)[None, :] >= torch.tensor([9, 5])[:, None]

    run(out_dir, "mha_self", nn.MultiheadAttention(D_MODEL, HEADS, batch_first=True),
        lambda m, i: m(i["x"], i["x"], i["x"], need_weights=False)[0], {"x": x})
    run(out_dir, "mha_cross", nn.MultiheadAttention(D_MODEL, HEADS, batch_first=True),
        lambda m, i: m(i["x"], i["memory"], i["memory"], key_padding_mask=lengths9,
                       need_weights=False)[0], {"x": x, "memory": memory})
    for pre_ln in (False, True):
        layer = nn.TransformerEncoderLayer(D_MODEL, HEADS, FFN, dropout=0.0, batch_first=True,
                                           norm_first=pre_ln)
        run(out_dir, "encoder_layer_" + ("pre" if pre_ln else "post"), layer,
            lambda m, i: m(i["x"], src_key_padding_mask=padding(7)), {"x": x})
    causal = torch.triu(torch.full((7, 7), float("-inf")), diagonal=1)
    for pre_ln in (False, True):
        layer = nn.TransformerDecoderLayer(D_MODEL, HEADS, FFN, dropout=0.0, batch_first=True,
                                           norm_first=pre_ln)
        run(out_dir, "decoder_layer_" + ("pre" if pre_ln else "post"), layer,
            lambda m, i: m(i["x"], i["memory"], tgt_mask=causal.double(),
                           memory_key_padding_mask=lengths9), {"x": x, "memory": memory})
    tokens = torch.randint(0, VOCAB, (2, 7))
    for pre_ln in (False, True):
        run(out_dir, "model_" + ("pre" if pre_ln else "post"), EmbeddingModel(2, pre_ln),
            lambda m, i: m(i["tokens"].long(), padding(7)), {"tokens": tokens.float()})
    adamw(out_dir)


if __name__ == "__main__":
    main(sys.argv[1])
