// Token-by-token decoding, one interface for every causal variant: what a model keeps between
// the tokens it generates. Attention::start_decoding makes one; its prefill takes a whole prompt
// (chunked, returning its outputs) and its step one token per batch item. full keeps a KV cache,
// sliding a ring buffer of its window, bigbird a KV cache read through its causal block
// pattern, the linear family its recurrent state (O(1) per token). A KV cache holds Hkv heads
// (grouped heads share them, never repeated) and applies the forward's window, softcap, sinks,
// ALiBi and forgetting gate (variants/kv_cache.hpp). Whatever the variant,
// prefill of N0 tokens followed by N - N0 steps gives the rows of the causal forward of all N
// tokens (tests/test_decoding.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attnlab/attention.hpp"

namespace attnlab {

/// The sizes a decoder is made for, and its options. The softmax variants' options (window,
/// softcap, sinks, ALiBi slopes) mean what they mean in a causal forward (mask.hpp,
/// attention.hpp); a variant that does not take one in its forward refuses it here
/// (Unsupported), as it refuses grouped heads.
struct DecodeConfig {
  std::size_t batch = 1;            ///< B: sequences decoded side by side
  std::size_t heads = 1;            ///< H, the query heads
  std::size_t dk = 0;               ///< Dk
  std::size_t dv = 0;               ///< Dv
  std::size_t kv_heads = 0;         ///< Hkv, the key and value heads (H a multiple); 0: H
  std::optional<double> scale;      ///< the softmax scale; default 1 / sqrt(Dk)
  std::size_t max_tokens = 0;       ///< tokens per item it may hold; 0: no limit (but bigbird)
  std::optional<Window> window;     ///< Mask::window: keys p - left <= j <= p; none: all
  std::optional<double> softcap;    ///< Mask::softcap, or none
  std::vector<float> sinks;         ///< TokenInputs::sinks [H]; empty: none
  std::vector<float> alibi_slopes;  ///< TokenInputs::alibi_slopes [H]; empty: none

  DecodeConfig() = default;
  /// B items of H heads (and as many KV heads) of sizes Dk, Dv; the options at their defaults.
  DecodeConfig(std::size_t batch_, std::size_t heads_, std::size_t dk_, std::size_t dv_)
      : batch(batch_), heads(heads_), dk(dk_), dv(dv_) {}
  /// Hkv: kv_heads, or H when it is 0.
  std::size_t kv() const { return kv_heads == 0 ? heads : kv_heads; }
  /// The (item, KV head) slice b·Hkv + h / (H / Hkv) of k and v that the (item, query head)
  /// slice bh = b·H + h reads.
  std::size_t kv_slice(std::size_t bh) const {
    return bh / heads * kv() + bh % heads / (heads / kv());
  }
};

/// A decoder (see above). Not thread-safe: one caller at a time; its calls use every core.
class TokenDecoder {
 public:
  virtual ~TokenDecoder() = default;

  /// A prompt of N tokens per item after the tokens already held: q [B, H, N, Dk], k
  /// [B, Hkv, N, Dk], v [B, Hkv, N, Dv] and, where the variant takes them, g (a linear
  /// variant's log-decay, softmax's forgetting gate) and beta [B, H, N]. Item b's first
  /// lengths[b] tokens are real (all N when `lengths` is empty), the rest padding, not kept.
  /// Returns [B, H, N, Dv]: the rows the causal forward of the held tokens and these gives
  /// (padding rows: zeros). delta-product's decoder takes its steps rows of k, v, g and beta
  /// per token (rows_per_token below; its lengths still count tokens). Throws Error for shapes
  /// that are
  /// not the decoder's, non-finite inputs, lengths outside [0, N], or tokens past max_tokens;
  /// Error for sinks or ALiBi slopes here (they are the decoder's: DecodeConfig), Unsupported
  /// for an additive bias (its [Nq, Nk] shape has no meaning while Nk grows).
  Tensor prefill(TensorRef q, TensorRef k, TensorRef v, const TokenInputs& in = {},
                 const std::vector<std::int64_t>& lengths = {});

  /// One token per item: q [B, H, 1, Dk], k [B, Hkv, 1, Dk], v [B, Hkv, 1, Dv] (g, beta
  /// [B, H, 1]) appended
  /// after each item's tokens -> [B, H, 1, Dv]. Throws Error as prefill.
  Tensor step(TensorRef q, TensorRef k, TensorRef v, const TokenInputs& in = {});

  /// Appends a context whose outputs are not wanted (a prompt answered before, a benchmark's
  /// context): k [B, Hkv, N, Dk], v [B, Hkv, N, Dv] (g, beta [B, H, N]) after each item's
  /// tokens, N real tokens per item. A KV cache only stores them (O(N·(Dk + Dv)) per KV head,
  /// no attention); a recurrent decoder updates its state (its prefill on zero queries).
  /// Throws Error as prefill.
  void extend(TensorRef k, TensorRef v, const TokenInputs& in = {});

  /// Tokens held for item b (its real prompt tokens and its steps).
  std::size_t tokens(std::size_t b = 0) const { return held_.at(b); }
  /// Bytes of memory the decoder holds for its state: the KV cache's or ring's storage (as
  /// allocated), or the recurrent states.
  virtual std::size_t bytes() const = 0;
  /// The sizes it was made for.
  const DecodeConfig& config() const { return config_; }

 protected:
  /// A decoder of `variant` (its messages name it) for `config`, validated here: the sizes,
  /// then the options by one causal forward of one token with them, so that the variant
  /// refuses (Unsupported) or rejects (Error) them with the words its forward uses.
  /// `rows_per_token` > 1: each token brings that many rows of k, v, g and beta (delta-product's
  /// steps), so a call of N tokens takes k, v [B, Hkv, rows_per_token·N, D] and g, beta
  /// [B, H, rows_per_token·N], and its lengths count tokens.
  TokenDecoder(const Attention& variant, const DecodeConfig& config,
               std::size_t rows_per_token = 1);

  /// prefill with validated input: `lengths` has B entries; held_ is updated by the caller
  /// afterwards. Writes every real row of `out` ([B, H, N, Dv]); the caller zeroes the rest.
  virtual void do_prefill(TensorRef q, TensorRef k, TensorRef v, const TokenInputs& in,
                          const std::vector<std::size_t>& lengths, Tensor& out) = 0;
  /// extend with validated input (q: zeros); the default prefills and drops the outputs.
  virtual void do_extend(TensorRef q, TensorRef k, TensorRef v, const TokenInputs& in);
  /// step with validated input; held_ counts the tokens before this one.
  virtual void do_step(TensorRef q, TensorRef k, TensorRef v, const TokenInputs& in,
                       Tensor& out) = 0;

  std::string name_;               ///< the variant's name
  DecodeConfig config_;            ///< its sizes, scale filled in
  std::vector<std::size_t> held_;  ///< tokens held per item
  std::size_t rows_per_token_;     ///< rows of k, v, g and beta per token (1 but delta-product)

 private:
  void validate(TensorRef q, TensorRef k, TensorRef v, const TokenInputs& in, std::size_t n,
                const std::vector<std::size_t>& lengths) const;
  Support support_;
};

}  // namespace attnlab
