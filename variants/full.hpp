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
// Backward: FlashAttention-2 (Dao 2023): per tile of 48 queries x 128 keys the probabilities
// are rebuilt from the forward's saved row log-sum-exp (forward(..., lse); recomputed by one
// more forward when not given), dS = P ∘ (dO V^T - rowsum(dO ∘ O)), then dQ += dS K,
// dK += dS^T Q, dV += P^T dO: five tile GEMMs against the forward's two (P and dS read
// transposed in place). Every mask kind. Deterministic: the gradients are bitwise the same on
// every run and with any number of threads (the split of the work depends on the shape only).
// Extra memory O(max(B·H, 16)·N·(Dk + Dv)): transposed K and V, and dK/dV partial sums when
// there are fewer than 16 heads (kernels::run_backward_tiles).
#pragma once

#include <memory>

#include "attnlab/attention.hpp"
#include "attnlab/factory.hpp"

namespace attnlab {

/// Exact softmax attention, fused and tiled (see above).
class FullAttention final : public Attention {
 public:
  std::string spec() const override { return "full"; }
  Support support() const override {
    Support s;
    s.backward = true;
    return s;
  }
  double flops(const Dims& d, const Mask& mask) const override;

 protected:
  void compute(TensorRef q, TensorRef k, TensorRef v, const Mask& mask, const TokenInputs& in,
               const Dims& d, Tensor& out, Saved* saved) const override;
  void compute_backward(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                        const TokenInputs& in, const Dims& d, TensorRef out, TensorRef d_out,
                        const Saved& saved, AllGradients& g) const override;

 private:
  void run(TensorRef q, TensorRef k, TensorRef v, const Mask& mask, const Dims& d, Tensor& out,
           float* lse) const;
};

/// The factory's maker for "full:...": reads and checks the keys (throws Error).
std::unique_ptr<Attention> make_full(Params& params);

}  // namespace attnlab
