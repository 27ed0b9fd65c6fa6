// full: exact softmax attention, softmax(q k^T * scale) v (Vaswani et al. 2017).
//
// Spec: "full" (no parameters).
// Kernel: fused and tiled with the online softmax of FlashAttention (Dao et al. 2022): scores
// are computed one tile of queries x keys at a time and folded into a running max, sum and
// output, so no Nq x Nk matrix is ever formed. Tiles run in parallel (OpenMP) over batch, heads
// and query tiles; under a causal mask tiles that are fully masked are skipped.
// Cost: O(B·H·Nq·Nk·(Dk + Dv)) time, O(B·H·(Nq·Dv + Nk·Dk)) memory.
// FLOPs (flops()): 2·(Dk + Dv) per visible (query, key) pair, i.e. 4·B·H·N²·D without a mask and
// about half that causal; exponentials and the normalisation are not counted (FlashAttention's
// convention).
// Masks: everything in Mask (causal both alignments, key padding, boolean masks),
// cross-attention and Dv != Dk. A query that sees no key outputs zeros.
// Numerics: float32 with max-subtracted exponentials; logits of +-1e4 stay finite.
#pragma once

#include <memory>

#include "attnlab/attention.hpp"
#include "attnlab/factory.hpp"

namespace attnlab {

/// Exact softmax attention, fused and tiled (see above).
class FullAttention final : public Attention {
 public:
  std::string spec() const override { return "full"; }
  Support support() const override { return {}; }
  double flops(const Dims& d, const Mask& mask) const override;

 protected:
  void compute(const Tensor& q, const Tensor& k, const Tensor& v, const Mask& mask,
               const Dims& d, Tensor& out) const override;
};

/// The factory's maker for "full:...": reads and checks the keys (throws Error).
std::unique_ptr<Attention> make_full(Params& params);

}  // namespace attnlab
