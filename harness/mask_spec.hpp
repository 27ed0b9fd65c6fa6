// Mask specs: the sweep's mask axis (harness/config.hpp) and `attnlab mask --mask`, in the
// factory's syntax ("name:key=value,..."), made into the parts of a Mask for a problem's sizes:
//   none                       nothing beyond the point's causal setting
//   documents:count=D          D packed documents of about N / D tokens each (document d holds
//                              tokens [d·N/D, (d+1)·N/D)), FlashAttention's cu_seqlens; packed
//                              documents take a batch of one (Mask::documents)
//   prefix:frac=F              prefix-LM: the first floor(F·N) keys of every batch item are
//                              visible to all its queries, the rest causal; F in [0, 1]; causal
//                              settings only (Mask::prefix_lengths)
//   window:left=L,right=R      FlashAttention's window_size around each query (Mask::window):
//                              right defaults to left, -1 leaves a side unbounded
// spec text() prints every key in a fixed order, so parse_mask_spec(s.text()).text() == s.text()
// and rows can be keyed by it. Errors quote the spec and name the key.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "attnlab/mask.hpp"

namespace attnlab::harness {

struct MaskSpec {
  enum class Kind { none, documents, prefix, window };
  Kind kind = Kind::none;
  std::int64_t count = 0;              ///< documents
  double frac = 0;                     ///< prefix
  std::int64_t left = -1, right = -1;  ///< window

  /// The canonical text: "none", "documents:count=16", "prefix:frac=0.25",
  /// "window:left=512,right=512".
  std::string text() const;
  /// Whether it needs a causal mask (prefix-LM relaxes one).
  bool needs_causal() const { return kind == Kind::prefix; }
};

/// Parses a mask spec; throws Error "mask 'text': ..." naming the key and the value.
MaskSpec parse_mask_spec(const std::string& text);

/// Adds the spec's part to `mask` for `n` queries and keys and `batch` items; throws Error
/// quoting the spec when the sizes cannot take it (documents with batch > 1 or count > n).
void add_mask_part(const MaskSpec& spec, std::size_t n, std::size_t batch, Mask& mask);

/// "--mask", "documents:count=16;window:left=64" -> canonical texts (';' separates entries, as
/// their keys are separated by ','); Error naming the flag.
std::vector<std::string> parse_mask_list(const std::string& flag, const std::string& text);

}  // namespace attnlab::harness
