// Tensors and their shapes.
//
// Layout, used everywhere in attnlab: float32, row-major, [batch, heads, seq, dim].
//   q [B, H, Nq, Dk], k [B, H, Nk, Dk], v [B, H, Nk, Dv]  ->  output [B, H, Nq, Dv].
// Nq may differ from Nk (cross-attention) and Dv from Dk.
#pragma once

#include <cstddef>
#include <string>

#include <xtensor/xtensor.hpp>

namespace attnlab {

using Tensor = xt::xtensor<float, 4>;     ///< float32 [batch, heads, seq, dim]
using Tensor64 = xt::xtensor<double, 4>;  ///< float64, for the reference

/// The sizes of one attention problem, read off validated q, k, v.
struct Dims {
  std::size_t batch = 0;  ///< B
  std::size_t heads = 0;  ///< H
  std::size_t nq = 0;     ///< query sequence length
  std::size_t nk = 0;     ///< key (and value) sequence length
  std::size_t dk = 0;     ///< query and key head dim
  std::size_t dv = 0;     ///< value head dim
  /// Every size equal.
  bool operator==(const Dims&) const = default;
};

/// Checks that q, k, v fit together (see the layout above); throws Error naming the mismatch.
Dims check_qkv(const Tensor& q, const Tensor& k, const Tensor& v);

/// "[2, 8, 128, 64]": for error messages.
std::string shape_string(const Tensor& t);

}  // namespace attnlab
