// What a query may attend to, and the softmax scale.
//
// A key j is visible to query i of item b, head h when every part present allows it:
//   causal        none; top_left: j <= i; bottom_right: j <= i + Nk - Nq. This is the
//                 FlashAttention convention: for Nq == Nk both are the usual causal mask; for
//                 Nq != Nk top_left aligns the first query with the first key, bottom_right
//                 aligns the last query with the last key (a query may then see no key at all).
//   key_lengths   one valid length per batch item: keys j >= key_lengths[b] are padding.
//   allowed       boolean [1, 1, Nq, Nk] (shared by all items and heads) or [B, H, Nq, Nk];
//                 true means "may attend", as in PyTorch's scaled_dot_product_attention.
// A query that can see no key at all outputs a row of zeros (not NaN).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include <xtensor/xtensor.hpp>

#include "attnlab/tensor.hpp"

namespace attnlab {

/// The causal alignment (see above): none, top-left (j <= i) or bottom-right (j <= i + Nk - Nq).
enum class Causal { none, top_left, bottom_right };

/// "none", "top-left", "bottom-right" and back; parse throws Error quoting the text.
const char* causal_name(Causal c);
/// The inverse of causal_name.
Causal parse_causal(const std::string& text);

/// Every constraint on what a query may attend to, and the softmax scale (see above).
struct Mask {
  Causal causal = Causal::none;           ///< the causal alignment, or none
  std::vector<std::int64_t> key_lengths;  ///< empty: no padding
  xt::xtensor<bool, 4> allowed;           ///< empty: no boolean mask
  std::optional<double> scale;            ///< softmax scale; default 1 / sqrt(Dk)

  /// Whether key padding is given.
  bool has_key_lengths() const { return !key_lengths.empty(); }
  /// The keys of item b that are not padding: key_lengths[b] clamped to [0, nk], or nk when no
  /// padding is given.
  std::size_t valid_keys(std::size_t b, std::size_t nk) const;
  /// Whether a boolean mask is given.
  bool has_allowed() const { return allowed.size() != 0; }

  /// Sets the boolean mask from [Nq, Nk] (broadcast over batch and heads).
  Mask& allow(const xt::xtensor<bool, 2>& m);

  /// Throws Error when a part of the mask does not fit the problem sizes or is out of range.
  void validate(const Dims& d) const;

  /// `scale`, or 1 / sqrt(dk) when it is not set.
  double softmax_scale(std::size_t dk) const;

  /// Keys [0, visible_keys) pass the causal and padding parts for query i of item b.
  std::size_t visible_keys(std::size_t b, std::size_t i, const Dims& d) const;

  /// Row i of the boolean mask for (b, h): Nk flags, or nullptr when there is no boolean mask.
  const bool* allowed_row(std::size_t b, std::size_t h, std::size_t i) const;

  /// The whole rule, one key at a time: what the dense references use.
  bool may_attend(std::size_t b, std::size_t h, std::size_t i, std::size_t j, const Dims& d) const {
    if (j >= visible_keys(b, i, d)) return false;
    const bool* row = allowed_row(b, h, i);
    return row == nullptr || row[j];
  }
};

}  // namespace attnlab
