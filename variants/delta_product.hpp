// delta-product: DeltaProduct (Siems et al. 2025, "DeltaProduct: Improving State-Tracking in
// Linear RNNs via Householder Products"): each token takes n_h delta-rule steps, each with its
// own key, value and beta, so that the state transition is a product of n_h generalised
// Householder matrices. A thin client of the scan engine through gated-delta
// (variants/gated_delta.hpp: its rule, forms and costs) run over the steps' rows.
//
// Spec: "delta-product:steps=1,beta=1" (the defaults).
//   steps  n_h >= 1, delta-rule steps per token. The default 1 is gated-delta itself, with its
//          support (cross-attention in either alignment, packed documents); the paper's n_h = 2
//          or 3 are asked for.
//   beta   the write strength used when no per-row beta is given, 0 <= beta <= 1   default 1
// Layout: q [B, H, N, Dk] one row per token; k [B, H, n_h·N, Dk], v [B, H, n_h·N, Dv] and the
//   per-row inputs beta and g ([B, H, n_h·N], or g [B, H, n_h·N, Dk] per channel) n_h rows per
//   token, row t·n_h + j the j-th step of token t. Causal: Nk != n_h·Nq is an Error naming
//   both; non-causal (every query reads the last state, Nq free): Nk must be a multiple of n_h.
// What it computes, per batch item and head, q and k L2-normalised as delta, q times the
// softmax scale:
//   for j = 0 .. n_h - 1: S <- (I - beta_{t,j} k_{t,j} k_{t,j}^T) a_{t,j} S + beta_{t,j} k_{t,j}
//   v_{t,j}^T, a_{t,j} = exp(g_{t,j}), so S_t = H_{t,n_h-1} ... H_{t,0} S_{t-1} + (the writes)
//   with H_{t,j} = a_{t,j} (I - beta_{t,j} k_{t,j} k_{t,j}^T); the paper's gate per token is g
//   on each token's first row and 0 on the others. Causal (either alignment): out_t = S_t^T q_t,
//   the state after all of token t's steps; non-causal: every query reads the last state.
// Kernel: the causal form runs gated-delta causally over the n_h·N rows with q_t placed at row
//   (t + 1)·n_h - 1 and zero queries elsewhere, and keeps those rows of its output; the backward
//   likewise (its d_out at those rows, dq read back from them). Non-causal: gated-delta as is.
// Cost: gated-delta's at n_h·N rows, about n_h times its time at N; state O(Dk·Dv) per head;
//   a forward that saves for the backward keeps the n_h·N-row output too.
// Masks: causal, key padding (in rows), non-causal cross-attention, Dv != Dk, an initial and
//   final state; packed documents Unsupported when n_h > 1. Exact reductions: n_h = 1 is
//   gated-delta, bitwise; with g = 0 it is delta. Backward: q, k, v, beta, g (per row or per
//   channel), initial state.
// Decoding (start_decoding): a thin wrapper of gated-delta's decoder, its state S per item and
//   head (O(Dk·Dv), whatever the context). A step takes q [B, H, 1, Dk] and k, v [B, Hkv, n_h,
//   D] (g, beta [B, H, n_h]): the first n_h - 1 rows go in without outputs (extend), the last
//   is stepped with q. prefill and extend likewise over n_h·N rows (q at row (t + 1)·n_h - 1;
//   lengths count tokens, n_h·lengths rows); tokens() counts tokens. k, v rows != n_h · tokens
//   is an Error naming both. n_h = 1 is gated-delta's decoder. A per-channel g is Unsupported
//   in decoding, as for every decoder.
#pragma once

#include <cstdint>
#include <memory>

#include "attnlab/factory.hpp"
#include "variants/gated_delta.hpp"

namespace attnlab {

/// DeltaProduct: n_h delta-rule steps per token (see above).
class DeltaProductAttention final : public Attention {
 public:
  /// Throws Error unless steps >= 1 and 0 <= beta <= 1.
  DeltaProductAttention(std::int64_t steps, double beta);
  std::string spec() const override;
  Support support() const override;
  /// gated-delta's at these sizes: n_h·N rows write, N queries read.
  double flops(const Dims& d, const Mask& mask) const override;
  /// Token-by-token decoding (lib/attnlab/decoder.hpp) through gated-delta's decoder over the
  /// steps' rows: k, v, g and beta take n_h rows per token (see Decoding above).
  std::unique_ptr<TokenDecoder> start_decoding(const DecodeConfig& config) const override;
  /// Delta-rule steps per token.
  std::int64_t steps() const { return steps_; }
  /// The rule run over the steps' rows.
  const GatedDeltaAttention& rows() const { return rows_; }

 protected:
  std::string why_unsupported(const std::string& feature) const override;
  void compute(TensorRef q, TensorRef k, TensorRef v, const Mask& mask, const TokenInputs& in,
               const Dims& d, Tensor& out, Saved* saved) const override;
  void compute_backward(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                        const TokenInputs& in, const Dims& d, TensorRef out, TensorRef d_out,
                        const Saved& saved, AllGradients& g) const override;

 private:
  /// Throws Error unless Nk = steps · Nq (causal) or a multiple of steps (non-causal).
  void check_rows(const Dims& d, bool causal) const;
  std::int64_t steps_;
  GatedDeltaAttention rows_;  // the rule, run over the steps' rows
};

/// The factory's maker for "delta-product:...": reads and checks the keys (throws Error).
std::unique_ptr<Attention> make_delta_product(Params& params);

}  // namespace attnlab
