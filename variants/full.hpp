// full: exact softmax attention, softmax(q k^T * scale) v (Vaswani et al. 2017).
//
// Spec: "full" (no parameters).
// Kernel: the softmax engine (lib/attnlab/softmax_engine.hpp) with no sparsity of its own:
// FlashAttention's online softmax (Dao et al. 2022), tiles of 48 queries x 128 keys folded into a
// running max, sum and output, so no Nq x Nk matrix is ever formed; tiles the mask leaves empty
// are skipped, full ones run without per-element mask work. Parallel (OpenMP) over batch, heads
// and query tiles.
// Cost: O(B·H·Nq·Nk·(Dk + Dv)) time without a mask (the visible pairs' share of it with one),
// O(B·H·(Nq·Dv + Nk·Dk)) memory.
// FLOPs (flops()): 2·(Dk + Dv) per visible (query, key) pair of the mask's interval parts
// (causal, prefix, padding, window, documents; engine::visible_pairs), i.e. 4·B·H·N²·D without a
// mask and about half that causal; exponentials and the normalisation are not counted
// (FlashAttention's convention).
// Masks and modifiers: everything in Mask (causal both alignments, key padding, boolean masks,
// window, documents, prefix-LM, a custom mask, softcap) and in TokenInputs for softmax (additive
// bias, sinks, ALiBi slopes, the forgetting gate as log_decay), grouped KV heads,
// cross-attention and Dv != Dk. A query that sees no key outputs zeros.
// Numerics: float32 with max-subtracted exponentials; logits of +-1e4 stay finite.
// Backward: FlashAttention-2 (Dao 2023): per tile of 96 queries x 128 keys the probabilities
// are rebuilt from the forward's saved row log-sum-exp (recomputed by one more forward when not
// saved), dS = P ∘ (dO V^T - rowsum(dO ∘ O)), then dQ += dS K, dK += dS^T Q, dV += P^T dO: five
// tile GEMMs against the forward's two (P and dS read transposed in place); gradients of every
// modifier input. Deterministic: the gradients are bitwise the same on every run and with any
// number of threads (the split of the work depends on the shape only). Extra memory
// O(max(B·Hkv, 16)·N·(Dk + Dv)): transposed K and V, and dK/dV partial sums when there are
// fewer than 16 KV heads; a dense [B, H, Nq, Nk] dS when a bias is given.
// Exact: it is the exact backend; every other variant's degenerate setting equals it.
#pragma once

#include <memory>

#include "attnlab/attention.hpp"
#include "attnlab/factory.hpp"

namespace attnlab {

/// Exact softmax attention, fused and tiled (see above).
class FullAttention final : public Attention {
 public:
  std::string spec() const override { return "full"; }
  /// Decoding: a KV cache read through every held key (variants/kv_cache.hpp).
  std::unique_ptr<TokenDecoder> start_decoding(const DecodeConfig& config) const override;
  Support support() const override { return Support::softmax_engine(); }
  double flops(const Dims& d, const Mask& mask) const override;

 protected:
  void compute(TensorRef q, TensorRef k, TensorRef v, const Mask& mask, const TokenInputs& in,
               const Dims& d, Tensor& out, Saved* saved) const override;
  void compute_backward(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                        const TokenInputs& in, const Dims& d, TensorRef out, TensorRef d_out,
                        const Saved& saved, AllGradients& g) const override;
};

/// The factory's maker for "full:...": reads and checks the keys (throws Error).
std::unique_ptr<Attention> make_full(Params& params);

}  // namespace attnlab
