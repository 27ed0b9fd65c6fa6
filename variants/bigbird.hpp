// bigbird: block-sparse attention, the ITC construction of BigBird (Zaheer et al. 2020,
// arXiv 2007.14062): window, global and random key blocks per query block.
//
// Spec: "bigbird:block=B,window=W,global=G,random=R,seed=S", defaults 64, 3, 2, 3, 0 (the paper's).
//   block   B >= 1    tokens per block; the last block may be partial (any N works).
//   window  W >= 1, odd: query block i attends key blocks i-(W-1)/2 .. i+(W-1)/2.
//   global  G >= 0    the first ceil(G/2) and the last floor(G/2) blocks attend to every block and
//                     are attended by every block.
//   random  R >= 0    every other query block also attends R key blocks drawn, per head and per
//                     query block, from the blocks it does not already attend (all of them when
//                     fewer than R remain). Draws for R + 1 extend those for R (same seed).
//   seed    S >= 0    the only source of randomness: same seed, bitwise-same output.
// The layout (which key blocks each query block of each head attends) is bigbird_layout() below:
// the kernel, the tests' dense reference and `attnlab mask` all read it from there.
// Cost: O(B·H·Nq·(W+G+R)·block·(Dk+Dv)) time (global query blocks: O(block·Nk) each),
// O(B·H·(Nq·Dv + Nk·Dk)) memory; never a dense Nq x Nk mask or score matrix.
// FLOPs (flops()): 2·(Dk + Dv) per computed (query, key) pair: the layout's pairs inside each
// query's key interval (Mask::key_span: causal with prefix, padding, window, documents; a
// boolean or custom mask is not subtracted, as for full).
// Masks: causal for Nq == Nk (blocks above the diagonal are dropped, random blocks come only from
// the past, and the element-level diagonal applies inside the diagonal block); prefix-LM
// relaxes that cut as it relaxes the causal mask: a query block keeps every block up to the
// last one holding prefix keys its queries see (its item's prefix, or each document's), random
// blocks drawn from all of those, so a prefix of 0 is the causal layout and a prefix of every
// key the non-causal one; key padding, boolean masks, a window, documents and a custom mask
// (intersected with the layout); every softmax modifier (softcap, bias, sinks, ALiBi, the
// forgetting gate); grouped KV heads; cross-attention (Nq != Nk, blocks counted on each side,
// not causal); Dv != Dk. A query that sees no key outputs zeros.
// Kernel: a client of the softmax engine (lib/attnlab/softmax_engine.hpp): each query block's
// row tiles read its key blocks as runs of contiguous keys; the engine classifies, skips, masks
// and runs them.
// Backward: the engine's, over the same key runs as the forward, from the saved row
// log-sum-exp; every mask and modifier the forward takes. Cost about 2.5x the forward's (five
// tile GEMMs for two); extra memory as full's; deterministic as full's (bitwise the same
// gradients with any number of threads).
// Exact reduction: G >= number of blocks, or W >= 2·blocks - 1, gives full attention under the
// same mask, prefix-LM included (so does N <= block: the single block attends itself).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "attnlab/attention.hpp"
#include "attnlab/factory.hpp"

namespace attnlab {

/// BigBird's parameters, as in the factory string (see above).
struct BigBirdConfig {
  std::int64_t block = 64;  ///< tokens per block (>= 1)
  std::int64_t window = 3;  ///< key blocks around the query block (odd, >= 1)
  std::int64_t global = 2;  ///< leading global blocks (>= 0)
  std::int64_t random = 3;  ///< random key blocks per query block (>= 0)
  std::int64_t seed = 0;    ///< seed of the random blocks (>= 0)

  /// Throws Error naming the first parameter out of range.
  void validate() const;
};

/// Why a query block attends a key block (none: it does not).
enum class BlockKind : std::uint8_t { none, window, global, random };

/// Which key blocks each query block of each head attends: the semantics, stated once.
class BigBirdLayout {
 public:
  std::size_t heads = 0;         ///< heads laid out
  std::size_t query_blocks = 0;  ///< ceil(Nq / block)
  std::size_t key_blocks = 0;    ///< ceil(Nk / block)
  std::size_t block = 0;         ///< tokens per block
  bool causal = false;           ///< laid out for a causal mask

  /// Key blocks of query block i in head h, ascending, without duplicates.
  std::span<const std::uint32_t> blocks(std::size_t h, std::size_t i) const;

  /// The kind of (query block i, key block j) in head h; none when not attended.
  BlockKind kind(std::size_t h, std::size_t i, std::size_t j) const;

  /// Number of attended (query, key) token pairs, before element-level masks.
  double pairs(std::size_t nq, std::size_t nk) const;

  /// The last key block query block i may attend: key_blocks - 1, or when causal its diagonal
  /// block i, or past it the last block of the prefix its queries see under prefix-LM.
  std::size_t last_key_block(std::size_t i) const;

 private:
  friend BigBirdLayout bigbird_layout(const BigBirdConfig&, const Dims&, const Mask&, std::size_t);
  std::vector<std::size_t> reach_;    // causal: last_key_block per query block
  std::vector<std::size_t> offsets_;  // heads * query_blocks + 1 entries into blocks_/kinds_
  std::vector<std::uint32_t> blocks_;
  std::vector<BlockKind> kinds_;
};

/// The layout for `heads` heads, nq queries and nk keys (blocks of config.block on each side).
/// causal (needs nq == nk): blocks above the diagonal dropped, random blocks drawn from the past.
BigBirdLayout bigbird_layout(const BigBirdConfig& config, std::size_t heads, std::size_t nq,
                             std::size_t nk, bool causal);

/// The layout batch item `item` runs under `mask` (validated against d by the caller) at sizes
/// d: the one above, causal when the mask is, with each query block's causal cut moved out to
/// the last block of the prefix its queries see under prefix-LM (Mask::prefix_lengths: the
/// item's, or each document's). What the kernel reads and the tests' reference expands.
BigBirdLayout bigbird_layout(const BigBirdConfig& config, const Dims& d, const Mask& mask,
                             std::size_t item);

/// BigBird ITC block-sparse attention (see above).
class BigBirdAttention final : public Attention {
 public:
  /// Throws Error naming the first parameter out of range.
  explicit BigBirdAttention(const BigBirdConfig& config);
  std::string spec() const override;
  /// Decoding: a KV cache read through its causal block pattern for max_tokens
  /// tokens, which it needs (the pattern of the last blocks depends on the length)
  /// (variants/kv_cache.hpp); a prompt into an empty cache runs the engine over the first N
  /// tokens of that pattern, chunked.
  std::unique_ptr<TokenDecoder> start_decoding(const DecodeConfig& config) const override;
  Support support() const override;
  double flops(const Dims& d, const Mask& mask) const override;
  /// The parameters it was built with.
  const BigBirdConfig& config() const { return config_; }

 protected:
  std::string why_unsupported(const std::string& feature) const override;
  void compute(TensorRef q, TensorRef k, TensorRef v, const Mask& mask, const TokenInputs& in,
               const Dims& d, Tensor& out, Saved* saved) const override;
  void compute_backward(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                        const TokenInputs& in, const Dims& d, TensorRef out, TensorRef d_out,
                        const Saved& saved, AllGradients& g) const override;

 private:
  BigBirdConfig config_;
};

/// The factory's maker for "bigbird:...": reads and checks the keys (throws Error).
std::unique_ptr<Attention> make_bigbird(Params& params);

}  // namespace attnlab
