// moba: Mixture of Block Attention (Lu et al. 2025, "MoBA: Mixture of Block Attention for
// Long-Context LLMs", arXiv 2502.13189): keys cut into blocks; each query token attends only the
// blocks its parameter-free gate selects.
//
// Spec: "moba:block=B,topk=K", defaults 512 and 3 (the paper's).
//   block  B >= 1   keys per block: block j holds keys [jB, min((j+1)B, Nk)); the last block may
//                   be partial (the paper's ceil(N / B) blocks), so N need not be a multiple of B.
//   topk   K >= 1   blocks each query attends, its own block included (as the paper's top-k,
//                   where the own block's gate is +infinity): its own block plus the K - 1
//                   best-scored other candidate blocks (all of them when fewer remain).
// Selection (per query token, as the paper's gate: s_j = q_i · mean(K[block j]), one top-k for
// each query token, not one per query block): query i of item b, head h sits at key position
// p = p(i) (Mask::position); its own block is the block that holds p (none when p is outside
// the keys). Its candidates are the other blocks that hold a valid (not padded) key and, under a
// causal mask, lie wholly at or before p (the paper's "no future block"); they are ranked by s_j
// computed in float64 over the block's valid keys, ties to the lower block. The K - 1 best (K
// when there is no own block) are kept. Without a causal mask, every other block is a candidate
// (the bidirectional reading of the same gate). Grouped heads: each query head selects from its
// KV head's block means.
// Attention: softmax over the selected blocks' keys, intersected with every part of the Mask
// (the causal diagonal inside the own block, padding, boolean, window, prefix, custom) and with
// every softmax modifier (softcap, bias, sinks, ALiBi, the forgetting gate); the selection reads
// only q, k, the causal alignment and the padding. Packed documents are refused (the paper's
// varlen form restarts the blocks at each document; not implemented).
// Kernel: a client of the softmax engine (lib/attnlab/softmax_engine.hpp): query tiles never
// cross a block boundary of p(i); a tile reads the union of its rows' selected blocks, each block
// a key run whose rows that did not select it see nothing of it, so the engine runs a block
// every row chose as a full tile, skips a block no row chose, and masks the rest.
// Cost: selection O(B·H·Nq·(Nk/B)·Dk) plus O(B·Hkv·Nk·Dk) for the means; attention
// O(B·H·Nq·K·B·(Dk + Dv)) when a tile's rows agree (at most the union of their choices);
// memory O(B·H·Nq·K) for the selection, no Nq x Nk matrix.
// FLOPs (flops()): 2·(Dk + Dv) per attended pair: the own block's visible keys plus min(K - 1,
// candidates) whole blocks, which is exact for causal self-attention without padding and an
// upper bound where a chosen block is partial.
// Backward: the engine's, over the same key runs, with the selection recomputed from q and k
// (bitwise the same as the forward's): gradients flow through the selected blocks' attention,
// not through the selection (a top-k has no gradient), as in the paper. Deterministic as full's.
// Exact reduction: K >= ceil(Nk / B) selects every candidate block, which is full attention under
// the same mask (causal or not); so is B >= Nk (one block, the own block).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "attnlab/attention.hpp"
#include "attnlab/factory.hpp"

namespace attnlab {

/// MoBA's parameters, as in the factory string (see above).
struct MobaConfig {
  std::int64_t block = 512;  ///< keys per block (>= 1)
  std::int64_t topk = 3;     ///< blocks per query, its own included (>= 1)
};

/// The key blocks each query selected: the semantics, stated once (the kernel, the tests' dense
/// reference and any picture read it from here).
class MobaSelection {
 public:
  std::size_t block = 0;  ///< keys per block
  std::size_t heads = 0;  ///< query heads
  std::size_t nq = 0;     ///< queries
  std::size_t topk = 0;   ///< blocks kept per query, at most

  /// The blocks query i of item b, head h attends, ascending.
  std::span<const std::uint32_t> blocks(std::size_t b, std::size_t h, std::size_t i) const;
  /// Whether query i of item b, head h attends key j (before the mask's element-level parts).
  bool selects(std::size_t b, std::size_t h, std::size_t i, std::size_t j) const;

 private:
  friend MobaSelection moba_selection(const MobaConfig&, TensorRef, TensorRef, const Mask&);
  std::vector<std::uint32_t> blocks_;  // topk slots per (b, h, i)
  std::vector<std::uint32_t> counts_;  // the slots used per (b, h, i)
};

/// The selection of every query for q [B, H, Nq, Dk] and k [B, Hkv, Nk, Dk] under `mask` (its
/// causal alignment and key padding); throws Error for a config out of range.
MobaSelection moba_selection(const MobaConfig& config, TensorRef q, TensorRef k, const Mask& mask);

/// MoBA block-sparse attention with a per-query top-k block gate (see above).
class MobaAttention final : public Attention {
 public:
  /// Throws Error naming the first parameter out of range.
  explicit MobaAttention(const MobaConfig& config);
  std::string spec() const override;
  Support support() const override;
  double flops(const Dims& d, const Mask& mask) const override;
  /// The parameters it was built with.
  const MobaConfig& config() const { return config_; }

 protected:
  std::string why_unsupported(const std::string& feature) const override;
  void compute(TensorRef q, TensorRef k, TensorRef v, const Mask& mask, const TokenInputs& in,
               const Dims& d, Tensor& out, Saved* saved) const override;
  void compute_backward(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                        const TokenInputs& in, const Dims& d, TensorRef out, TensorRef d_out,
                        const Saved& saved, AllGradients& g) const override;

 private:
  MobaConfig config_;
};

/// The factory's maker for "moba:...": reads and checks the keys (throws Error).
std::unique_ptr<Attention> make_moba(Params& params);

}  // namespace attnlab
