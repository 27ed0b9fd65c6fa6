// The dense attention patterns of the sparse variants, one key at a time and independent of
// their kernels: what their fp64 references (forward and backward) are built from.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "attnlab/attnlab.hpp"
#include "variants/bigbird.hpp"
#include "variants/sliding.hpp"

namespace attnlab::test {

/// sliding's definition: query i (at key position p = i, or i + Nk - Nq under a bottom-right
/// causal mask) attends j when j = p - S·a for some a in 0..L or j = p + S·b for some b in 0..R,
/// or when i < G or j < G; and the Mask must allow (i, j) too.
inline Pattern sliding_pattern(const SlidingConfig& c, const Mask& mask, const Dims& d) {
  return [c, &mask, d](std::size_t b, std::size_t h, std::size_t i, std::size_t j) {
    if (!mask.may_attend(b, h, i, j, d)) return false;
    const std::int64_t gi = static_cast<std::int64_t>(i), gj = static_cast<std::int64_t>(j);
    if (gi < c.global || gj < c.global) return true;
    std::int64_t p = gi;
    if (mask.causal == Causal::bottom_right)
      p += static_cast<std::int64_t>(d.nk) - static_cast<std::int64_t>(d.nq);
    for (std::int64_t a = 0; a <= c.left; ++a)
      if (gj == p - c.dilation * a) return true;
    for (std::int64_t b2 = 0; b2 <= c.right; ++b2)
      if (gj == p + c.dilation * b2) return true;
    return false;
  };
}

/// bigbird's block layout under `mask` (each item's: prefix-LM moves its causal cut) expanded to
/// tokens, then the Mask's own rule (causal diagonal with prefix, padding, boolean). Written
/// without the kernel's key ranges or tiles; keep `mask` alive.
inline Pattern bigbird_pattern(const BigBirdConfig& c, const Mask& mask, const Dims& d) {
  auto layouts = std::make_shared<std::vector<BigBirdLayout>>();
  for (std::size_t b = 0; b < d.batch; ++b) layouts->push_back(bigbird_layout(c, d, mask, b));
  return [layouts, &mask, d](std::size_t b, std::size_t h, std::size_t i, std::size_t j) {
    const BigBirdLayout& layout = (*layouts)[b];
    return layout.kind(h, i / layout.block, j / layout.block) != BlockKind::none &&
           mask.may_attend(b, h, i, j, d);
  };
}

}  // namespace attnlab::test
