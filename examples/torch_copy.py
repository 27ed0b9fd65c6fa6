#!/usr/bin/python3
"""A PyTorch Transformer trained on the copy task, with attnlab attention in every layer.

Usage: examples/torch_copy.py [--attention attnlab|torch] [--spec full] [--n 32] [--steps 400]
                              [--seed 1] [--lr 5e-3] [--threads 1]
The model is torch's own: token embedding, learned positions, nn.TransformerEncoder (2 layers,
d_model 64, 4 heads, FFN 128, no dropout) and a Linear head. --attention attnlab replaces each
layer's self_attn by attnlab.torch.MultiheadAttention(spec=...) with the same weights; the
optimiser (Adam) and everything else stay torch's. The task is attnlab's copy (training/tasks.hpp):
x1 .. xm, a delimiter, m blanks; the model must write x at the blanks. Prints the held-out
accuracy (512 examples) at the end: "accuracy 0.998".
"""
import argparse
import copy

import torch
from torch import nn

import attnlab.torch


def copy_batch(generator, size, n, vocab=10):
    """Tokens: 0 blank, 1 delimiter, 2.. symbols; targets -100 (not scored) but at the blanks."""
    m = (n - 1) // 2
    symbols = torch.randint(2, vocab, (size, m), generator=generator)
    x = torch.zeros(size, n, dtype=torch.long)
    y = torch.full((size, n), -100, dtype=torch.long)
    x[:, :m], x[:, m] = symbols, 1
    y[:, m + 1:2 * m + 1] = symbols
    return x, y


class Model(nn.Module):
    def __init__(self, n, vocab, attention, spec, d=64, heads=4, ffn=128, layers=2):
        super().__init__()
        self.embedding = nn.Embedding(vocab, d)
        self.position = nn.Parameter(torch.randn(n, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, heads, ffn, 0.0, batch_first=True, norm_first=True)
        if attention == "attnlab":  # the swap: same weights, attnlab inside
            with torch.random.fork_rng():  # its own initialisation must not shift the head's
                swapped = attnlab.torch.MultiheadAttention(d, heads, batch_first=True, spec=spec)
            swapped.load_state_dict(layer.self_attn.state_dict())
            layer.self_attn = swapped
        self.encoder = nn.TransformerEncoder(copy.deepcopy(layer), layers,
                                             enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)

    def forward(self, x):
        return self.head(self.encoder(self.embedding(x) + self.position))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--attention", choices=["attnlab", "torch"], default="attnlab")
    p.add_argument("--spec", default="full", help="attnlab factory string (--attention attnlab)")
    p.add_argument("--n", type=int, default=32)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--threads", type=int, default=1, help="torch's and attnlab's threads")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)  # the same initial weights for both attentions
    data = torch.Generator().manual_seed(a.seed)
    vocab = 10
    model = Model(a.n, vocab, a.attention, a.spec)
    optimizer = torch.optim.Adam(model.parameters(), lr=a.lr)
    for step in range(1, a.steps + 1):
        x, y = copy_batch(data, 32, a.n, vocab)
        loss = nn.functional.cross_entropy(model(x).reshape(-1, vocab), y.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 50 == 0:
            print(f"step {step}  loss {loss.item():.4f}", flush=True)
    x, y = copy_batch(torch.Generator().manual_seed(10_000 + a.seed), 512, a.n, vocab)
    with torch.no_grad():
        scored = y >= 0
        accuracy = (model(x).argmax(-1)[scored] == y[scored]).float().mean().item()
    print(f"accuracy {accuracy:.3f}")


if __name__ == "__main__":
    main()
