// retnet: retention, linear attention with a fixed decay per head (Sun et al. 2023, "Retentive
// Network: A Successor to Transformer for Large Language Models"). A thin client of the scan
// engine (variants/linear_scan.hpp: the recurrence, chunked form and costs).
//
// Spec: "retnet:schedule=retnet" (the default) or "retnet:schedule=fixed,gamma=0.9".
//   schedule  retnet: head h of H decays by gamma_h = 1 - 2^(-5-h) (the paper's schedule,
//             h = 0 .. H-1); fixed: every head by gamma                       default retnet
//   gamma     fixed's decay, 0 < gamma <= 1 (only with schedule=fixed)       default 1
//
// What it computes, per batch item and head, q times the softmax scale, no feature map and no
// denominator (RetNet normalises the output by GroupNorm afterwards, outside attention):
//   S_t = gamma_h S_{t-1} + k_t v_t^T, causal out_t = S_t^T q_t = sum_{j <= t}
//   gamma_h^(t-j) (q_t·k_j) v_j: the parallel form (Q K^T ∘ D) V with D_tj = gamma^(t-j).
//   Non-causal: every query reads the last state (gamma^(N-1-j) on key j).
// Chunked form as the engine's (log gamma per token); cost O(B·H·N·(64·(Dk + Dv) + Dk·Dv)).
// Masks, grouped KV heads: as the engine. Exact reductions: gamma = 1 is unnormalised linear
// attention with the identity map (gla with g = 0). Backward: q, k, v (the decays are constants).
// No token inputs.
#pragma once

#include <memory>

#include "attnlab/factory.hpp"
#include "variants/linear_scan.hpp"

namespace attnlab {

/// Retention (see above).
class RetNetAttention final : public ScanAttention {
 public:
  /// gamma <= 0: the RetNet schedule; else one gamma (<= 1) for every head. Throws Error for
  /// gamma > 1 or NaN.
  explicit RetNetAttention(double gamma);
  std::string spec() const override;
  /// log gamma_h.
  double head_log_decay(std::size_t h, std::size_t heads) const override;

 private:
  double gamma_;
};

/// The factory's maker for "retnet:...": reads and checks the keys (throws Error).
std::unique_ptr<Attention> make_retnet(Params& params);

}  // namespace attnlab
