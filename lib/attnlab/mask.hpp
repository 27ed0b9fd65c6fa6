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
//   documents     packed variable-length sequences (FlashAttention's cu_seqlens, a batch of
//                 one): offsets 0 = o_0 <= o_1 <= ... <= o_D = Nq cut the queries into D
//                 documents, key_documents (cu_seqlens_k; the same offsets when empty) cut the
//                 keys, ending at Nk; query i of document d sees keys of document d only. Causal
//                 alignment and the boolean mask then apply within each document, its first query
//                 and first key (top-left) or its last ones (bottom-right) aligned; key padding
//                 (key_lengths[0]) on the packed positions. An empty document holds no token.
// A query that can see no key at all outputs a row of zeros (not NaN).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
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
  Causal causal = Causal::none;             ///< the causal alignment, or none
  std::vector<std::int64_t> key_lengths;    ///< empty: no padding
  xt::xtensor<bool, 4> allowed;             ///< empty: no boolean mask
  std::optional<double> scale;              ///< softmax scale; default 1 / sqrt(Dk)
  std::vector<std::int64_t> documents;      ///< query offsets (cu_seqlens); empty: none
  std::vector<std::int64_t> key_documents;  ///< key offsets (cu_seqlens_k); empty: documents'

  /// Whether key padding is given.
  bool has_key_lengths() const { return !key_lengths.empty(); }
  /// The keys of item b that are not padding: key_lengths[b] clamped to [0, nk], or nk when no
  /// padding is given.
  std::size_t valid_keys(std::size_t b, std::size_t nk) const;
  /// Whether a boolean mask is given.
  bool has_allowed() const { return allowed.size() != 0; }

  /// Sets the boolean mask from [Nq, Nk] (broadcast over batch and heads).
  Mask& allow(const xt::xtensor<bool, 2>& m);

  /// Whether packed documents are given.
  bool has_documents() const { return !documents.empty(); }
  /// The sequences of a call with `batch` items: its documents when given, else its items.
  std::size_t sequences(std::size_t batch) const {
    return has_documents() ? documents.size() - 1 : batch;
  }
  /// The query rows [first, second) of document `doc` (a validated mask with documents).
  std::pair<std::size_t, std::size_t> document_queries(std::size_t doc) const;
  /// The key rows [first, second) of document `doc`: key_documents', or documents'.
  std::pair<std::size_t, std::size_t> document_keys(std::size_t doc) const;

  /// Throws Error when a part of the mask does not fit the problem sizes or is out of range.
  void validate(const Dims& d) const;

  /// `scale`, or 1 / sqrt(dk) when it is not set.
  double softmax_scale(std::size_t dk) const;

  /// Keys [0, visible_keys) pass the causal and padding parts for query i of item b (without
  /// documents: may_attend applies them).
  std::size_t visible_keys(std::size_t b, std::size_t i, const Dims& d) const;

  /// Row i of the boolean mask for (b, h): Nk flags, or nullptr when there is no boolean mask.
  const bool* allowed_row(std::size_t b, std::size_t h, std::size_t i) const;

  /// The whole rule, one key at a time: what the dense references use.
  bool may_attend(std::size_t b, std::size_t h, std::size_t i, std::size_t j, const Dims& d) const;
};

}  // namespace attnlab
