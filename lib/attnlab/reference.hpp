// The exact result: dense attention accumulated in float64. Simple enough to be obviously
// right; every test and the harness compare against it.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "attnlab/mask.hpp"
#include "attnlab/tensor.hpp"

namespace attnlab {

/// allowed(b, h, i, j): may query i attend key j? Describes any variant's sparsity pattern.
using Pattern = std::function<bool(std::size_t b, std::size_t h, std::size_t i, std::size_t j)>;

/// softmax(q k^T * scale restricted to the pattern) v in float64. Rows with no allowed key are
/// zero. `rows` picks query indices (all when empty): the output is then [B, H, rows, Dv].
Tensor64 reference_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                             const Pattern& allowed, const std::vector<std::size_t>& rows = {});

/// Exact attention under a Mask (validated here).
Tensor64 reference_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Mask& mask,
                             const std::vector<std::size_t>& rows = {});

}  // namespace attnlab
