// delta: DeltaNet, linear attention whose memory is written by the delta rule (Schlag, Irie,
// Schmidhuber 2021, "Linear Transformers Are Secretly Fast Weight Programmers"; Yang et al.
// 2024, "Parallelizing Linear Transformers with the Delta Rule over Sequence Length"). A thin
// client of the scan engine (variants/linear_scan.hpp: the recurrence, chunked form and costs).
//
// Spec: "delta:beta=1" (the default).
//   beta  the write strength used when no per-token beta is given, 0 <= beta <= 1   default 1
// Per-token input: beta [B, H, Nk] in [0, 1] (TokenInputs::beta), as DeltaNet computes it,
//   sigmoid(x W_beta). No decay (g: Unsupported; see gated-delta).
//
// What it computes, per batch item and head: q and k L2-normalised as DeltaNet does,
// x / sqrt(|x|^2 + 1e-6) (without it the delta rule's transition I - beta k k^T has
// eigenvalues below -1 for |k|^2 beta > 2 and the memory diverges; keys of norm 1e3 stay finite),
// q then times the softmax scale (Mask::scale, default 1/sqrt(Dk)):
//   S_t = S_{t-1} + beta_t k_t (v_t - S_{t-1}^T k_t)^T, S_0 = 0;
//   causal out_t = S_t^T q_t (chunked WY/UT form, matrix products per chunk of 64 tokens);
//   non-causal: every query reads S after the last valid key.
// Cost: O(B·H·N·(64·(Dk + Dv) + Dk·Dv)) time, O(Dk·Dv) state per head. Masks: causal
// (Nq == Nk), key padding, cross-attention non-causal, Dv != Dk, grouped KV heads (a state per
// query head, as the engine); boolean masks Unsupported.
// Exact reductions: beta = 0 outputs zeros; with beta = 1 and orthonormal keys each write
// replaces the value stored under its key exactly (tests/test_linear_family.cpp).
// Backward: q, k, v and the per-token beta (the engine's chunked backward: matrix products per
// chunk).
#pragma once

#include <memory>

#include "attnlab/factory.hpp"
#include "variants/linear_scan.hpp"

namespace attnlab {

/// DeltaNet (see above).
class DeltaAttention final : public ScanAttention {
 public:
  /// Throws Error unless 0 <= beta <= 1.
  explicit DeltaAttention(double beta);
  std::string spec() const override;
};

/// The factory's maker for "delta:...": reads and checks the keys (throws Error).
std::unique_ptr<Attention> make_delta(Params& params);

}  // namespace attnlab
