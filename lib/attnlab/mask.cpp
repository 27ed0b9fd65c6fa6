#include "attnlab/mask.hpp"

#include <algorithm>
#include <cmath>

#include "attnlab/error.hpp"

namespace attnlab {

const char* causal_name(Causal c) {
  switch (c) {
    case Causal::top_left:
      return "top-left";
    case Causal::bottom_right:
      return "bottom-right";
    default:
      return "none";
  }
}

Causal parse_causal(const std::string& text) {
  for (Causal c : {Causal::none, Causal::top_left, Causal::bottom_right})
    if (text == causal_name(c)) return c;
  throw Error("causal mode '" + text + "': expected none, top-left or bottom-right");
}

Mask& Mask::allow(const xt::xtensor<bool, 2>& m) {
  allowed = xt::xtensor<bool, 4>::from_shape({1, 1, m.shape()[0], m.shape()[1]});
  std::copy(m.begin(), m.end(), allowed.begin());
  return *this;
}

namespace {

// Offsets 0 = o_0 <= ... <= o_D = n (at least one document); throws Error naming `what` and
// its FlashAttention name `alias`.
void check_offsets(const std::vector<std::int64_t>& o, const char* what, const char* alias,
                   std::size_t n, const char* n_name) {
  const std::string name = std::string(what) + " (" + alias + ")";
  if (o.size() < 2)
    throw Error(name + " has " + std::to_string(o.size()) +
                " offsets: expected at least 2 (0 and the end of the first document)");
  if (o.front() != 0)
    throw Error(name + ": offset 0 is " + std::to_string(o.front()) + ": the offsets start at 0");
  for (std::size_t i = 1; i < o.size(); ++i)
    if (o[i] < o[i - 1])
      throw Error(name + ": offset " + std::to_string(i) + " is " + std::to_string(o[i]) +
                  ", below offset " + std::to_string(i - 1) + " = " + std::to_string(o[i - 1]) +
                  ": the offsets must not decrease");
  if (o.back() != static_cast<std::int64_t>(n))
    throw Error(name + " ends at " + std::to_string(o.back()) + ": expected " + n_name + " = " +
                std::to_string(n) + ", every token in one document");
}

}  // namespace

void Mask::validate(const Dims& d) const {
  if (has_key_lengths()) {
    if (key_lengths.size() != d.batch)
      throw Error("key_lengths has " + std::to_string(key_lengths.size()) +
                  " entries, expected one per batch item (" + std::to_string(d.batch) + ")");
    for (std::size_t b = 0; b < d.batch; ++b)
      if (key_lengths[b] < 0 || key_lengths[b] > static_cast<std::int64_t>(d.nk))
        throw Error("key_lengths[" + std::to_string(b) + "] = " + std::to_string(key_lengths[b]) +
                    ": expected 0 <= length <= Nk = " + std::to_string(d.nk));
  }
  if (has_allowed()) {
    const auto& s = allowed.shape();
    const bool shared = s[0] == 1 && s[1] == 1;
    const bool full = s[0] == d.batch && s[1] == d.heads;
    if (!(shared || full) || s[2] != d.nq || s[3] != d.nk)
      throw Error("boolean mask has shape [" + std::to_string(s[0]) + ", " + std::to_string(s[1]) +
                  ", " + std::to_string(s[2]) + ", " + std::to_string(s[3]) +
                  "], expected [Nq, Nk] = [" + std::to_string(d.nq) + ", " + std::to_string(d.nk) +
                  "] or [B, H, Nq, Nk]");
  }
  if (has_documents()) {
    if (d.batch != 1)
      throw Error("documents (cu_seqlens): packed documents take a batch of one, got B = " +
                  std::to_string(d.batch));
    check_offsets(documents, "documents", "cu_seqlens", d.nq, "Nq");
    if (!key_documents.empty()) {
      check_offsets(key_documents, "key_documents", "cu_seqlens_k", d.nk, "Nk");
      if (key_documents.size() != documents.size())
        throw Error("key_documents (cu_seqlens_k) has " + std::to_string(key_documents.size() - 1) +
                    " documents, documents " + std::to_string(documents.size() - 1) +
                    ": expected one key range per query range");
    } else if (d.nk != d.nq) {
      throw Error("documents end at Nq = " + std::to_string(d.nq) + " but there are Nk = " +
                  std::to_string(d.nk) + " keys: give key_documents (cu_seqlens_k) as well");
    }
  } else if (!key_documents.empty()) {
    throw Error("key_documents (cu_seqlens_k) given without documents (cu_seqlens)");
  }
  if (window)
    for (const auto& [side, value] : {std::pair{"left", window->left}, {"right", window->right}})
      if (value < -1)
        throw Error(std::string("window.") + side + " = " + std::to_string(value) +
                    ": expected -1 (unbounded) or an integer >= 0");
  if (!prefix_lengths.empty()) {
    if (causal == Causal::none)
      throw Error(
          "prefix_lengths: prefix-LM needs a causal mask (causal = top-left or "
          "bottom-right), which it relaxes for the prefix");
    const std::size_t want = has_documents() ? documents.size() - 1 : d.batch;
    if (prefix_lengths.size() != want)
      throw Error("prefix_lengths has " + std::to_string(prefix_lengths.size()) +
                  " entries, expected one per " +
                  (has_documents() ? "document (" : "batch item (") + std::to_string(want) + ")");
    for (std::size_t p = 0; p < want; ++p) {
      const std::int64_t keys =
          has_documents()
              ? static_cast<std::int64_t>(document_keys(p).second - document_keys(p).first)
              : static_cast<std::int64_t>(d.nk);
      if (prefix_lengths[p] < 0 || prefix_lengths[p] > keys)
        throw Error("prefix_lengths[" + std::to_string(p) +
                    "] = " + std::to_string(prefix_lengths[p]) + ": expected 0 <= length <= " +
                    (has_documents() ? "the document's keys = " : "Nk = ") + std::to_string(keys));
    }
  }
  if (custom && !custom->allows)
    throw Error(
        "custom mask: its allows callable is empty (give allows, and classify to skip "
        "tiles)");
  if (softcap && !(std::isfinite(*softcap) && *softcap > 0))
    throw Error("softcap = " + std::to_string(*softcap) + ": expected a finite number > 0");
  if (scale && !(std::isfinite(*scale) && *scale > 0))
    throw Error("scale = " + std::to_string(*scale) + ": expected a finite number > 0");
}

double Mask::softmax_scale(std::size_t dk) const {
  return scale ? *scale : 1.0 / std::sqrt(static_cast<double>(dk));
}

std::size_t Mask::visible_keys(std::size_t b, std::size_t i, const Dims& d) const {
  std::int64_t limit = static_cast<std::int64_t>(d.nk);
  if (causal == Causal::top_left) limit = static_cast<std::int64_t>(i) + 1;
  if (causal == Causal::bottom_right)
    limit = static_cast<std::int64_t>(i + d.nk) - static_cast<std::int64_t>(d.nq) + 1;
  if (has_key_lengths()) limit = std::min(limit, key_lengths[b]);
  return static_cast<std::size_t>(std::clamp<std::int64_t>(limit, 0, d.nk));
}

std::size_t Mask::valid_keys(std::size_t b, std::size_t nk) const {
  if (!has_key_lengths()) return nk;
  return static_cast<std::size_t>(
      std::clamp<std::int64_t>(key_lengths[b], 0, static_cast<std::int64_t>(nk)));
}

std::pair<std::size_t, std::size_t> Mask::document_queries(std::size_t doc) const {
  return {static_cast<std::size_t>(documents[doc]), static_cast<std::size_t>(documents[doc + 1])};
}

std::pair<std::size_t, std::size_t> Mask::document_keys(std::size_t doc) const {
  const auto& o = key_documents.empty() ? documents : key_documents;
  return {static_cast<std::size_t>(o[doc]), static_cast<std::size_t>(o[doc + 1])};
}

std::size_t Mask::document_of(std::size_t i) const {
  // The last offset <= i: among equal offsets (empty documents), the one that begins i's.
  const auto after =
      std::upper_bound(documents.begin(), documents.end(), static_cast<std::int64_t>(i));
  return static_cast<std::size_t>(after - documents.begin()) - 1;
}

std::int64_t Mask::position(std::size_t i, const Dims& d) const {
  const auto row = static_cast<std::int64_t>(i);
  if (!has_documents())
    return causal == Causal::bottom_right
               ? row + static_cast<std::int64_t>(d.nk) - static_cast<std::int64_t>(d.nq)
               : row;
  const std::size_t doc = document_of(i);
  const auto [q0, q1] = document_queries(doc);
  const auto [k0, k1] = document_keys(doc);
  const std::int64_t shift = causal == Causal::bottom_right ? static_cast<std::int64_t>(k1 - k0) -
                                                                  static_cast<std::int64_t>(q1 - q0)
                                                            : 0;
  return static_cast<std::int64_t>(k0) + (row - static_cast<std::int64_t>(q0)) + shift;
}

KeySpan Mask::key_span(std::size_t b, std::size_t i, const Dims& d) const {
  KeySpan s{0, static_cast<std::int64_t>(d.nk)};
  std::int64_t start = 0;  // the first key of i's sequence (its document)
  std::size_t doc = 0;
  if (has_documents()) {
    doc = document_of(i);
    const auto [k0, k1] = document_keys(doc);
    start = static_cast<std::int64_t>(k0);
    s = {start, static_cast<std::int64_t>(k1)};
  }
  const std::int64_t p = position(i, d);
  if (causal != Causal::none) {
    std::int64_t hi = p + 1;
    if (!prefix_lengths.empty())
      hi = std::max(hi, start + prefix_lengths[has_documents() ? doc : b]);
    s.hi = std::min(s.hi, hi);
  }
  if (window) {
    if (window->left >= 0) s.lo = std::max(s.lo, p - window->left);
    if (window->right >= 0) s.hi = std::min(s.hi, p + window->right + 1);
  }
  if (has_key_lengths()) s.hi = std::min(s.hi, key_lengths[b]);
  return s;
}

bool Mask::may_attend(std::size_t b, std::size_t h, std::size_t i, std::size_t j,
                      const Dims& d) const {
  const KeySpan s = key_span(b, i, d);
  const auto key = static_cast<std::int64_t>(j);
  if (key < s.lo || key >= s.hi) return false;
  if (const bool* row = allowed_row(b, h, i); row != nullptr && !row[j]) return false;
  return !custom || custom->allows(b, h, i, j);
}

const bool* Mask::allowed_row(std::size_t b, std::size_t h, std::size_t i) const {
  if (!has_allowed()) return nullptr;
  const bool shared = allowed.shape()[0] == 1 && allowed.shape()[1] == 1;
  return &allowed(shared ? 0 : b, shared ? 0 : h, i, 0);
}

}  // namespace attnlab
