// What a query may attend to, and what happens to a score before the softmax.
//
// A key j is visible to query i of item b, head h when every part present allows it (mask
// modifiers, FlexAttention's mask_mod):
//   causal        none; top_left: j <= i; bottom_right: j <= i + Nk - Nq. This is the
//                 FlashAttention convention: for Nq == Nk both are the usual causal mask; for
//                 Nq != Nk top_left aligns the first query with the first key, bottom_right
//                 aligns the last query with the last key (a query may then see no key at all).
//                 Query i's key position p(i) is i, or i + Nk - Nq under bottom_right (inside
//                 its document, with documents): its causal limit is j <= p(i), and the window
//                 and ALiBi measure distances from it.
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
//   window        (left, right), FlashAttention's window_size: p(i) - left <= j <= p(i) + right;
//                 -1 leaves a side unbounded.
//   prefix_lengths  prefix-LM (needs causal): the first P keys of each item (of each document,
//                 when documents are given) are visible to every query of it, so the prefix
//                 attends bidirectionally and the rest causally.
//   custom        a callable of the caller's (FlexAttention's mask_mod), evaluated only in
//                 partial tiles, with a declared tile classification (MaskMod).
// A query that can see no key at all outputs a row of zeros (not NaN).
//
// Constant score modifiers live here too (those with gradients, an additive bias, ALiBi slopes,
// sinks and the forgetting gate, are inputs: TokenInputs in attention.hpp): the score of a
// visible pair is s = scale · q·k, then softcap: s -> cap · tanh(s / cap), then the additive
// terms (ALiBi, bias, forgetting gate) are added.
#pragma once

#include <cstdint>
#include <functional>
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

/// How a rectangle of (query, key) pairs fares under a mask: no pair is visible (the engine
/// skips it), every pair is (no per-element mask work), or some are (masked element by element).
enum class TileClass : std::uint8_t { empty, partial, full };

/// A window around each query's key position p(i) (FlashAttention's window_size).
struct Window {
  std::int64_t left = -1;   ///< keys j >= p(i) - left are visible; -1: unbounded
  std::int64_t right = -1;  ///< keys j <= p(i) + right are visible; -1: unbounded
};

/// A mask of the caller's own (FlexAttention's mask_mod), intersected with the rest.
/// `allows` says whether query i of item b, head h may see key j; `classify` declares what is
/// known of the rectangle of queries [i0, i1) and keys [j0, j1) (any TileClass), so that the
/// engine skips empty tiles and runs full tiles without calling `allows`, which it calls in
/// partial tiles only. Without `classify` every tile is partial. Both must be pure and safe to
/// call from several threads at once, and `classify` must be right (a rectangle it declares
/// full or empty is not checked); the dense references call `allows` alone.
struct MaskMod {
  /// Whether query i of item b, head h may see key j.
  std::function<bool(std::size_t b, std::size_t h, std::size_t i, std::size_t j)> allows;
  /// What is known of queries [i0, i1) x keys [j0, j1) of item b, head h; empty: partial.
  std::function<TileClass(std::size_t b, std::size_t h, std::size_t i0, std::size_t i1,
                          std::size_t j0, std::size_t j1)>
      classify;
};

/// The keys [lo, hi) that the interval parts of a mask (causal with prefix, padding, window,
/// documents) leave to one query; empty when lo >= hi.
struct KeySpan {
  std::int64_t lo = 0;  ///< the first visible key
  std::int64_t hi = 0;  ///< one past the last visible key
};

/// Every constraint on what a query may attend to, and the constant score modifiers.
struct Mask {
  Causal causal = Causal::none;              ///< the causal alignment, or none
  std::vector<std::int64_t> key_lengths;     ///< empty: no padding
  xt::xtensor<bool, 4> allowed;              ///< empty: no boolean mask
  std::optional<double> scale;               ///< softmax scale; default 1 / sqrt(Dk)
  std::vector<std::int64_t> documents;       ///< query offsets (cu_seqlens); empty: none
  std::vector<std::int64_t> key_documents;   ///< key offsets (cu_seqlens_k); empty: documents'
  std::optional<Window> window;              ///< a sliding window, or none
  std::vector<std::int64_t> prefix_lengths;  ///< prefix-LM per item (document); empty: none
  std::optional<MaskMod> custom;             ///< a mask of the caller's, or none
  std::optional<double> softcap;             ///< tanh soft-capping cap > 0 (Gemma 2), or none

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
  /// The document that holds query i (of a validated mask with documents).
  std::size_t document_of(std::size_t i) const;
  /// Whether any part beyond causal, key padding, the boolean mask and documents is given
  /// (window, prefix, custom, softcap).
  bool has_modifiers() const { return window || !prefix_lengths.empty() || custom || softcap; }
  /// The sequences of a call with `batch` items: its documents when given, else its items.
  std::size_t sequences(std::size_t batch) const {
    return has_documents() ? documents.size() - 1 : batch;
  }
  /// The query rows [first, second) of document `doc` (a validated mask with documents).
  std::pair<std::size_t, std::size_t> document_queries(std::size_t doc) const;
  /// The key rows [first, second) of document `doc`: key_documents', or documents'.
  std::pair<std::size_t, std::size_t> document_keys(std::size_t doc) const;

  /// Throws Error naming the part (key_lengths, documents (cu_seqlens), window.left,
  /// prefix_lengths[1], softcap, ...), its value and what was expected when a part of the mask
  /// does not fit the problem sizes or is out of range.
  void validate(const Dims& d) const;

  /// `scale`, or 1 / sqrt(dk) when it is not set.
  double softmax_scale(std::size_t dk) const;

  /// Keys [0, visible_keys) pass the causal and padding parts for query i of item b (without
  /// documents, window or prefix: key_span has those).
  std::size_t visible_keys(std::size_t b, std::size_t i, const Dims& d) const;

  /// The key position p(i) of query i (see above). Negative or >= Nk when Nq != Nk can put it
  /// outside the keys.
  std::int64_t position(std::size_t i, const Dims& d) const;

  /// The keys the interval parts (causal with prefix, padding, window, documents) leave to
  /// query i of item b; the boolean and custom masks are not applied.
  KeySpan key_span(std::size_t b, std::size_t i, const Dims& d) const;

  /// Row i of the boolean mask for (b, h): Nk flags, or nullptr when there is no boolean mask.
  const bool* allowed_row(std::size_t b, std::size_t h, std::size_t i) const;

  /// The whole rule, one key at a time: what the dense references use.
  bool may_attend(std::size_t b, std::size_t h, std::size_t i, std::size_t j, const Dims& d) const;
};

}  // namespace attnlab
