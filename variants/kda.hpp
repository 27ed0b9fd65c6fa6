// kda: Kimi Delta Attention (Kimi Team 2025, "Kimi Linear: An Expressive, Efficient Attention
// Architecture"): Gated DeltaNet with a decay per key channel in place of one per token. A thin
// client of the scan engine (variants/linear_scan.hpp: the recurrence, its forms and costs); the
// same rule as gated-delta, under the name the field uses.
//
// Spec: "kda:beta=1" (the default).
//   beta  the write strength used when no per-token beta is given, 0 <= beta <= 1   default 1
// Per-token inputs (TokenInputs): the per-channel log-decay g [B, H, Nk, Dk] <= 0
//   (channel_log_decay; the paper's alpha_t = exp(g_t), one per key channel, from a low-rank
//   projection and logsigmoid in the model layer), or a scalar one [B, H, Nk] (log_decay: then
//   it is gated-delta); beta [B, H, Nk] in [0, 1].
//
// What it computes, per batch item and head, q and k L2-normalised as in delta, q times the
// softmax scale:
//   S_t = (I - beta_t k_t k_t^T) Diag(exp g_t) S_{t-1} + beta_t k_t v_t^T; causal
//   out_t = S_t^T q_t; non-causal: every query reads the last state. With the per-channel
//   decay the engine runs the chunked WY form with 16-token sub-chunks and the decay inside a
//   chunk in log space (variants/linear_scan.hpp: no overflow for any g <= 0, g = -1e4
//   underflows to exact zeros without NaN).
// Cost: O(B·H·N·(64·(Dk + Dv) + Dk·Dv)) time, O(Dk·Dv) state per head; the backward saves one
//   state per 64 tokens. Masks: as delta.
// Exact reductions: equal channels (g_t,c = g_t) equal gated-delta with that g; g = 0 equals
//   delta; beta = 0 is pure decay of an empty memory, zeros. Backward: q, k, v, g per channel,
//   beta, and the initial state.
#pragma once

#include <memory>

#include "attnlab/factory.hpp"
#include "variants/linear_scan.hpp"

namespace attnlab {

/// Kimi Delta Attention (see above).
class KdaAttention final : public ScanAttention {
 public:
  /// Throws Error unless 0 <= beta <= 1.
  explicit KdaAttention(double beta);
  std::string spec() const override;
};

/// The factory's maker for "kda:...": reads and checks the keys (throws Error).
std::unique_ptr<Attention> make_kda(Params& params);

}  // namespace attnlab
