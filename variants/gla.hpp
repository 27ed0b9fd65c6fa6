// gla: linear attention with a data-dependent scalar decay per token and head, as Gated Linear
// Attention with scalar gates (Yang et al. 2024, "Gated Linear Attention Transformers with
// Hardware-Efficient Training") and Mamba-2's SSD (Dao, Gu 2024, "Transformers are SSMs"). A
// thin client of the scan engine (variants/linear_scan.hpp: the recurrence, chunked form, costs).
//
// Spec: "gla" (no parameters).
// Per-token input: the log-decay g [B, H, Nk] <= 0 (TokenInputs::log_decay; the model layer
//   computes g = logsigmoid(x W_g) / tau). Without g the decay is 1: plain causal linear
//   attention with the identity feature map and no normaliser. Or, in its place, a log-decay
//   per key channel g [B, H, Nk, Dk] (TokenInputs::channel_log_decay): GLA as published,
//   S_t = Diag(exp g_t) S_{t-1} + k_t v_t^T, in the engine's chunked form with sub-chunks and
//   the decay inside a chunk in log space (see variants/linear_scan.hpp: no overflow for any
//   g <= 0, a decay of -1e4 per step gives exact zeros, not NaN).
//
// What it computes, per batch item and head, q times the softmax scale (Mask::scale), no
// feature map and no denominator (GLA normalises the output afterwards, outside attention):
//   S_t = exp(g_t) S_{t-1} + k_t v_t^T, S_0 = 0; causal out_t = S_t^T q_t
//       = sum_{j <= t} exp(g_{j+1} + ... + g_t) (q_t·k_j) v_j;
//   non-causal: every query reads the last state.
// Chunked form with the decay as exponentials of differences of cumulative g inside each chunk
// of 64 tokens: no overflow for any g <= 0. Cost O(B·H·N·(64·(Dk + Dv) + Dk·Dv)), O(Dk·Dv) state
// (per-channel g: plus O(B·H·N·16·Dk) for the weights of the pairs inside 16-token sub-chunks).
// Masks: as the engine (causal Nq == Nk, key padding, non-causal cross-attention, Dv != Dk,
// grouped KV heads with a state and a g per query head).
// Exact reductions: g = 0 is unnormalised causal linear attention; a constant g per head is
// retnet; a per-channel g equal across channels is the scalar g. Backward: q, k, v and g (per
// channel when given so).
#pragma once

#include <memory>

#include "attnlab/factory.hpp"
#include "variants/linear_scan.hpp"

namespace attnlab {

/// Scalar-gated linear attention (see above).
class GlaAttention final : public ScanAttention {
 public:
  GlaAttention();
  std::string spec() const override { return "gla"; }
};

/// The factory's maker for "gla" (no keys).
std::unique_ptr<Attention> make_gla(Params& params);

}  // namespace attnlab
