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

/// The same on float64 inputs (all rows): what finite differences in fp64 perturb.
Tensor64 reference_attention(const Tensor64& q, const Tensor64& k, const Tensor64& v, double scale,
                             const Pattern& allowed);

/// dL/dq, dL/dk, dL/dv in float64, shaped like q, k, v.
struct Gradients64 {
  Tensor64 dq;  ///< dL/dq [B, H, Nq, Dk]
  Tensor64 dk;  ///< dL/dk [B, H, Nk, Dk]
  Tensor64 dv;  ///< dL/dv [B, H, Nk, Dv]
};

/// The gradients of reference_attention(q, k, v, scale, allowed) given d_out = dL/d(out)
/// [B, H, Nq, Dv], dense and in float64: dS = P ∘ (dO V^T - rowsum(dO ∘ O)), dQ = scale · dS K,
/// dK = scale · dS^T Q, dV = P^T dO. A row with no allowed key has no gradient.
Gradients64 reference_attention_backward(const Tensor64& q, const Tensor64& k, const Tensor64& v,
                                         double scale, const Pattern& allowed,
                                         const Tensor64& d_out);

/// The same under a Mask (validated here), from the float32 inputs a backend sees.
Gradients64 reference_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                         const Mask& mask, const Tensor& d_out);

}  // namespace attnlab
