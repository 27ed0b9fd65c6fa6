// sliding: local attention with a (dilated) sliding window and Longformer-style global tokens
// (Beltagy et al. 2020, "Longformer", arXiv 2004.05150; dilation as in its dilated windows).
//
// Spec: "sliding:left=L,right=R,dilation=S,global=G", defaults left=128, right=128, dilation=1,
// global=0.
//   left     L >= 0   query i attends keys i - S·a for a = 0..L (the key at i itself included)
//   right    R >= 0   ... and keys i + S·b for b = 0..R
//   dilation S >= 1   distance between two attended window keys
//   global   G >= 0   queries i < G attend every key, and every query attends keys j < G
// Keys outside the sequence are simply absent: any N, no padding visible, no divisibility rule.
// Cross-attention (Nq != Nk): query i sits at key position p(i) = i, except under a causal
// bottom-right mask, where p(i) = i + Nk - Nq (the last query at the last key, as in decoding
// with a KV cache); the window is then centred on p(i). For Nq == Nk both are p(i) = i.
// Masks and modifiers: the pattern is ANDed with every part of Mask (causal both alignments,
// key padding, boolean masks shared or per head, a window, documents, prefix-LM, a custom mask)
// and takes every softmax modifier (softcap, bias, sinks, ALiBi, the forgetting gate), grouped
// KV heads and Dv != Dk. Causal drops the right half of the window. A query that sees no key
// outputs zeros. Nothing is refused.
// Kernel: a client of the softmax engine (lib/attnlab/softmax_engine.hpp): keys laid out in
// residue classes mod S (with S > 1 the dilated window is a plain window inside one class),
// the global keys as a leading block, query tiles of 24 rows of one class (global rows: 48),
// each reading its window with per-row limits; the engine classifies, skips, masks and runs.
// Cost: O(B·H·Nq·(L + R + 1 + G)·(Dk + Dv)) time (plus O(Nq·Nk) for the G global query rows),
// O(B·H·(Nq·Dv + Nk·(Dk + Dv))) memory; no Nq x Nk matrix is ever formed.
// Backward: the engine's, over the same classes, windows, global keys and masks as the forward,
// keys' gradients added in place (no gather), from the saved row log-sum-exp; each task lays
// out its KV head's keys and values (transposed) as the forward does. Cost 2.5-3.5x the
// forward's; extra memory: those per-thread layouts and, when KV heads are fewer than 16, the
// per-group dK/dV sums (O(16·Nk·(Dk + Dv))). Deterministic as full's: bitwise the same
// gradients with any number of threads.
// Exact: dilation=1 with left, right >= N - 1 (self-attention; >= Nq + Nk in general), or
// global >= Nq, equals full attention.
#pragma once

#include <cstdint>
#include <memory>

#include "attnlab/attention.hpp"
#include "attnlab/factory.hpp"

namespace attnlab {

/// Sliding-window parameters, as in the factory string (see above).
struct SlidingConfig {
  std::int64_t left = 128;    ///< keys to the left (L >= 0)
  std::int64_t right = 128;   ///< keys to the right (R >= 0)
  std::int64_t dilation = 1;  ///< stride S between window keys (>= 1)
  std::int64_t global = 0;    ///< leading global tokens (>= 0)
};

/// Local (sliding-window) attention with Longformer global tokens (see above).
class SlidingAttention final : public Attention {
 public:
  /// Takes validated parameters (make_sliding checks them).
  explicit SlidingAttention(const SlidingConfig& config);

  std::string spec() const override;
  /// Decoding: a KV cache read through its causal window: a ring of its last left·dilation + 1
  /// positions after its global ones, O(window) memory; dilation > 1 reads key by key
  /// (variants/kv_cache.hpp).
  std::unique_ptr<TokenDecoder> start_decoding(const DecodeConfig& config) const override;
  Support support() const override { return Support::softmax_engine(); }

  /// 2 · (Dk + Dv) per attended (query, key) pair, counting the window, global and mask
  /// (causal, padding; not the boolean mask) exactly: the useful work, not the computed tiles.
  double flops(const Dims& d, const Mask& mask) const override;

  /// The parameters it was built with.
  const SlidingConfig& config() const { return config_; }

 protected:
  void compute(TensorRef q, TensorRef k, TensorRef v, const Mask& mask, const TokenInputs& in,
               const Dims& d, Tensor& out, Saved* saved) const override;
  void compute_backward(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                        const TokenInputs& in, const Dims& d, TensorRef out, TensorRef d_out,
                        const Saved& saved, AllGradients& g) const override;

 private:
  SlidingConfig config_;
};

/// The factory's maker for "sliding:...": reads and checks the keys (throws Error).
std::unique_ptr<Attention> make_sliding(Params& params);

}  // namespace attnlab
