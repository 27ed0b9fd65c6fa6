// gated-delta: Gated DeltaNet, the delta rule with a data-dependent decay (Yang, Kautz,
// Hatamizadeh 2024, "Gated Delta Networks: Improving Mamba2 with Delta Rule"). A thin client of
// the scan engine (variants/linear_scan.hpp: the recurrence, chunked form and costs).
//
// Spec: "gated-delta:beta=1" (the default).
//   beta  the write strength used when no per-token beta is given, 0 <= beta <= 1   default 1
// Per-token inputs (TokenInputs): the log-decay g [B, H, Nk] <= 0 (the paper's alpha_t =
//   exp(g_t); the model layer computes g = logsigmoid(x W_g) / tau), and beta [B, H, Nk] in
//   [0, 1]. Without g the decay is 1 (g = 0): the plain interface then computes delta. A
//   per-channel g [B, H, Nk, Dk] (channel_log_decay) in place of g makes it Kimi Delta
//   Attention, also registered as `kda` (variants/kda.hpp).
//
// What it computes, per batch item and head, q and k L2-normalised as in delta, q times the
// softmax scale:
//   S_t = a_t S_{t-1} + beta_t k_t (v_t - a_t S_{t-1}^T k_t)^T = a_t (I - beta_t k_t k_t^T)
//   S_{t-1} + beta_t k_t v_t^T, a_t = exp(g_t); causal out_t = S_t^T q_t (chunked WY/UT form
//   with the decay inside each chunk as exponentials of differences of cumulative g: no
//   overflow for any g <= 0, g = -1e4 included); non-causal: every query reads the last state.
// Cost, masks: as delta. Exact reductions: g = 0 equals delta; beta = 0 is pure decay of an
// empty memory, zeros. Backward: q, k, v, g and beta.
#pragma once

#include <memory>

#include "attnlab/factory.hpp"
#include "variants/linear_scan.hpp"

namespace attnlab {

/// Gated DeltaNet (see above).
class GatedDeltaAttention final : public ScanAttention {
 public:
  /// Throws Error unless 0 <= beta <= 1.
  explicit GatedDeltaAttention(double beta);
  std::string spec() const override;
};

/// The factory's maker for "gated-delta:...": reads and checks the keys (throws Error).
std::unique_ptr<Attention> make_gated_delta(Params& params);

}  // namespace attnlab
