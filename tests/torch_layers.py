#!/usr/bin/python3
"""PyTorch twins of attnlab's model layers for tests/test_models_torch.cpp.

Usage: torch_layers.py OUT_DIR

For each case below, builds the torch.nn module (seeded), perturbs its biases and LayerNorms so
they are not 0 and 1, runs it on seeded float32 inputs, and writes OUT_DIR/<case>/:
  weights/<state_dict key>.npy   the module's weights exactly as exported for attnlab
  x.npy, memory.npy              inputs [B, N, d_model] (memory: the cross-attention's keys)
  tokens.npy                     token ids [B, N] (float32) of a whole model's input
  out.npy                        the module's output
The Llama cases are scripts/torch_twin.py's plain-torch Llama (Hugging Face's names): a block, and
whole models (full, sliding, gated-delta with the short convolution and head norm as the core;
full with 2 key and value heads for 4 query heads, sliding with the short convolution and head
norm and 1, gated-delta with them and 2; kda with KDA's per-channel gate, delta-product with two
keys per token and 2), whose output is the final norm's (the features
lm_head reads).
Runs with autograd on (the default): torch's inference fast paths, which pad and pack
differently, are then not taken. Exits 3 with a message when torch cannot be imported.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))

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


LLAMA_BASE = 100.0  # a small rotary base turns every pair of channels visibly over 7 tokens
LLAMA_MODELS = {  # case: (spec, short-conv and head-norm, key and value heads[, channel-gate])
    "llama_model_full": ("full", False, HEADS),
    "llama_model_sliding": ("sliding:left=3,right=0", False, HEADS),
    "llama_model_gated_delta": ("gated-delta", True, HEADS),
    "llama_model_full_gqa": ("full", False, 2),  # grouped heads: the twin repeats k and v
    "llama_model_sliding_mqa": ("sliding:left=3,right=0", True, 1),
    "llama_model_gated_delta_gqa": ("gated-delta", True, 2),  # a recurrent state per query head
    "llama_model_kda": ("kda", True, HEADS, True),  # KDA's per-channel gate
    "llama_model_delta_product_gqa": ("delta-product:steps=2", True, 2),  # 2 keys per token
}


def llama_cases(out_dir, x):
    import torch_twin
    with torch.no_grad():
        model = torch_twin.LlamaTaskModel(20, 20, D_MODEL, HEADS, FFN, 2, rope_base=LLAMA_BASE)
        block = model.model.layers[0]
        for p in block.parameters():  # away from Hugging Face's 0.02 and 1
            p.add_(0.3 * torch.randn_like(p))
    save(out_dir, "llama_block", block, block(x), x=x)
    tokens = torch.randint(0, 20, (2, 7))
    for case, (spec, switches, kv_heads, *channel) in LLAMA_MODELS.items():
        with torch.no_grad():
            model = torch_twin.LlamaTaskModel(20, 20, D_MODEL, HEADS, FFN, 2, spec=spec,
                                              kv_heads=kv_heads, rope_base=LLAMA_BASE,
                                              short_conv=switches, head_norm=switches,
                                              channel_gate=bool(channel))
            for p in model.parameters():
                p.add_(0.3 * torch.randn_like(p))
        save(out_dir, case, model, model.features(tokens), tokens=tokens.float())


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

    llama_cases(out_dir, x)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    main(sys.argv[1])
