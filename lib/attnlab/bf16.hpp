// bfloat16 tensors: the storage type, a read-only view beside TensorRef, and the conversions.
//
// bfloat16 is float32's top 16 bits: the same exponent range, 8 significant bits (unit roundoff
// u = 2^-8). Rounding float32 to it is round to nearest, ties to even, like the hardware's
// (vcvtneps2bf16); NaN stays NaN (quieted), infinities stay infinities, subnormals round like
// any other value, and a finite float32 beyond bf16's largest finite value rounds to infinity.
// Widening bf16 to float32 is exact. Attention takes bf16 q, k, v (and a backward's out and
// d_out) through Attention's bf16 overloads (attention.hpp); the layout is the same as float32's
// (tensor.hpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include <xtensor/xtensor.hpp>

#include "attnlab/tensor.hpp"

namespace attnlab {

/// One bfloat16 number, as its bits: a distinct type, so that a bf16 tensor cannot be passed
/// where float32 is read (or the reverse) without a conversion the caller writes.
struct bf16 {
  std::uint16_t bits = 0;  ///< sign, 8 exponent bits, 7 mantissa bits
  /// Bitwise equal (so +0 != -0 and a NaN equals itself: what tests of the rounding compare).
  bool operator==(const bf16&) const = default;
};
static_assert(sizeof(bf16) == 2, "bf16 is stored as two bytes, as torch.bfloat16");

using TensorBf16 = xt::xtensor<bf16, 4>;  ///< bfloat16 [batch, heads, seq, dim]

/// x rounded to the nearest bf16, ties to even (see the header comment).
bf16 to_bf16(float x);

/// The float32 value of x (exact).
inline float to_float(bf16 x) {
  const std::uint32_t bits = std::uint32_t{x.bits} << 16;
  float f;
  __builtin_memcpy(&f, &bits, sizeof f);
  return f;
}

/// dst[i] = to_bf16(src[i]) for i < n, on the fastest kernel path (AVX2 where present).
void round_to_bf16(const float* src, bf16* dst, std::size_t n);

/// dst[i] = to_float(src[i]) for i < n, on the fastest kernel path.
void widen_bf16(const bf16* src, float* dst, std::size_t n);

/// A read-only bfloat16 [batch, heads, seq, dim] array in someone else's row-major storage, as
/// TensorRef is for float32: a TensorBf16 converts to one implicitly; a caller's buffer (a
/// torch.bfloat16 tensor's, through the Python package) is wrapped without a copy.
class TensorRefBf16 {
 public:
  using Shape = std::array<std::size_t, 4>;  ///< [batch, heads, seq, dim]

  /// A view of t's storage (implicit: every TensorBf16 argument reads in place).
  TensorRefBf16(const TensorBf16& t)  // NOLINT(google-explicit-constructor)
      : data_(t.data()), shape_{t.shape()[0], t.shape()[1], t.shape()[2], t.shape()[3]} {}
  /// A view of `shape`'s product values at `data`. Throws Error when `data` is null and the
  /// shape holds a value.
  TensorRefBf16(const bf16* data, const Shape& shape);

  const bf16* data() const { return data_; }                          ///< the first value
  const Shape& shape() const { return shape_; }                       ///< [B, H, N, D]
  std::size_t shape(std::size_t axis) const { return shape_[axis]; }  ///< one extent
  /// The number of values, B·H·N·D.
  std::size_t size() const { return shape_[0] * shape_[1] * shape_[2] * shape_[3]; }

 private:
  const bf16* data_;
  Shape shape_;
};

/// t rounded to bf16 (round_to_bf16), in t's shape.
TensorBf16 to_bf16(TensorRef t);

/// t widened to float32 (exact), in t's shape.
Tensor to_float32(TensorRefBf16 t);

/// t widened to float32 into `out`, which is reshaped only when its shape differs (its storage
/// kept from call to call).
void to_float32(TensorRefBf16 t, Tensor& out);

/// t rounded to bf16 into `out`, reshaped only when its shape differs.
void to_bf16(TensorRef t, TensorBf16& out);

}  // namespace attnlab
