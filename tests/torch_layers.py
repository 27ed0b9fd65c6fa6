#!/usr/bin/python3
"""PyTorch twins of attnlab's model layers for tests/test_models_torch.cpp.

Usage: torch_layers.py OUT_DIR

For each case below, builds the torch.nn module (seeded), perturbs its biases and LayerNorms so
they are not 0 and 1, runs it on seeded float32 inputs, and writes OUT_DIR/<case>/:
  weights/<state_dict key>.npy   the module's weights exactly as exported for attnlab
  x.npy, memory.npy              inputs [B, N, d_model] (memory: the cross-attention's keys)
  out.npy                        the module's output
Runs with autograd on (the default): torch's inference fast paths, which pad and pack
differently, are then not taken. Exits 3 with a message when torch cannot be imported.
"""
import os
import sys

try:
    import numpy as np
    import torch
    from torch import nn
except ImportError as e:  # the C++ test turns this into a failure naming the missing module
    print(f"torch_layers.py: cannot import {e.name}: {e}", file=sys.stderr)
    sys.exit(3)

D_MODEL, HEADS, FFN = 16, 4, 24
LENGTHS = [7, 4]  # key padding: item 1 has 4 valid keys (the C++ side uses key_lengths)


def padding(n):
    """True = ignore (torch's key_padding_mask convention)."""
    return torch.arange(n)[None, :] >= torch.tensor(LENGTHS)[:, None]


def perturb(module):
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "bias" in name or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))


def save(out_dir, case, module, out, **inputs):
    folder = os.path.join(out_dir, case)
    os.makedirs(os.path.join(folder, "weights"), exist_ok=True)
    for key, t in module.state_dict().items():
        np.save(os.path.join(folder, "weights", key + ".npy"), t.detach().numpy())
    for name, t in inputs.items():
        np.save(os.path.join(folder, name + ".npy"), t.detach().numpy())
    np.save(os.path.join(folder, "out.npy"), out.detach().numpy())


def main(out_dir):
    torch.manual_seed(0)
    x = torch.randn(2, 7, D_MODEL)
    memory = torch.randn(2, 7, D_MODEL)

    mha = nn.MultiheadAttention(D_MODEL, HEADS, batch_first=True).eval()
    perturb(mha)
    out, _ = mha(x, x, x, need_weights=False)
    save(out_dir, "mha_self", mha, out, x=x)
    out, _ = mha(x, memory, memory, key_padding_mask=padding(7), need_weights=False)
    save(out_dir, "mha_cross_padded", mha, out, x=x, memory=memory)

    for case, norm_first in (("encoder_post_ln", False), ("encoder_pre_ln", True)):
        layer = nn.TransformerEncoderLayer(D_MODEL, HEADS, FFN, dropout=0.0, batch_first=True,
                                           norm_first=norm_first).eval()
        perturb(layer)
        save(out_dir, case, layer, layer(x, src_key_padding_mask=padding(7)), x=x)

    decoder = nn.TransformerDecoderLayer(D_MODEL, HEADS, FFN, dropout=0.0,
                                         batch_first=True).eval()
    perturb(decoder)
    causal = nn.Transformer.generate_square_subsequent_mask(7)
    out = decoder(x, memory, tgt_mask=causal, memory_key_padding_mask=padding(7))
    save(out_dir, "decoder_post_ln", decoder, out, x=x, memory=memory)

    stack_layer = nn.TransformerEncoderLayer(D_MODEL, HEADS, FFN, dropout=0.0, batch_first=True,
                                             norm_first=True)
    stack = nn.TransformerEncoder(stack_layer, 2, norm=nn.LayerNorm(D_MODEL),
                                  enable_nested_tensor=False).eval()
    perturb(stack)
    save(out_dir, "encoder_stack_pre_ln", stack, stack(x), x=x)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    main(sys.argv[1])
