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

const bool* Mask::allowed_row(std::size_t b, std::size_t h, std::size_t i) const {
  if (!has_allowed()) return nullptr;
  const bool shared = allowed.shape()[0] == 1 && allowed.shape()[1] == 1;
  return &allowed(shared ? 0 : b, shared ? 0 : h, i, 0);
}

}  // namespace attnlab
