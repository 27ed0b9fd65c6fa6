// Tensors and their shapes.
//
// Layout, used everywhere in attnlab: float32, row-major, [batch, heads, seq, dim].
//   q [B, H, Nq, Dk], k [B, Hkv, Nk, Dk], v [B, Hkv, Nk, Dv]  ->  output [B, H, Nq, Dv].
// Nq may differ from Nk (cross-attention) and Dv from Dk. Grouped KV heads (GQA; MQA when
// Hkv = 1): H is a multiple of Hkv and query head h reads KV head h / (H / Hkv); Hkv = H is
// ordinary multi-head attention.
#pragma once

#include <array>
#include <cstddef>
#include <string>

#include <xtensor/xtensor.hpp>

namespace attnlab {

using Tensor = xt::xtensor<float, 4>;     ///< float32 [batch, heads, seq, dim]
using Tensor64 = xt::xtensor<double, 4>;  ///< float64, for the reference

/// A read-only float32 [batch, heads, seq, dim] array in someone else's row-major storage: what
/// attention reads q, k, v (and a backward's out and d_out) through. A Tensor converts to one
/// implicitly; a caller with a buffer of its own (NumPy's, through the Python package) wraps it
/// without a copy. The storage must outlive the call and not change during it.
class TensorRef {
 public:
  using Shape = std::array<std::size_t, 4>;  ///< [batch, heads, seq, dim]

  /// A view of t's storage (implicit: every Tensor argument reads in place).
  TensorRef(const Tensor& t)  // NOLINT(google-explicit-constructor)
      : data_(t.data()), shape_{t.shape()[0], t.shape()[1], t.shape()[2], t.shape()[3]} {}
  /// A view of `shape`'s product floats at `data`, row-major. Throws Error when `data` is null
  /// and the shape holds a float.
  TensorRef(const float* data, const Shape& shape);

  const float* data() const { return data_; }                         ///< the first float
  const Shape& shape() const { return shape_; }                       ///< [B, H, N, D]
  std::size_t shape(std::size_t axis) const { return shape_[axis]; }  ///< one extent
  /// The number of floats, B·H·N·D.
  std::size_t size() const { return shape_[0] * shape_[1] * shape_[2] * shape_[3]; }
  /// Element [b, h, i, c].
  const float& operator()(std::size_t b, std::size_t h, std::size_t i, std::size_t c) const {
    return data_[((b * shape_[1] + h) * shape_[2] + i) * shape_[3] + c];
  }
  /// Whether this view and `t`'s storage share any float.
  bool overlaps(const Tensor& t) const {
    return size() != 0 && t.size() != 0 && data_ < t.data() + t.size() && t.data() < data_ + size();
  }

 private:
  const float* data_;
  Shape shape_;
};

/// The sizes of one attention problem, read off validated q, k, v.
struct Dims {
  std::size_t batch = 0;     ///< B
  std::size_t heads = 0;     ///< H, the query heads
  std::size_t nq = 0;        ///< query sequence length
  std::size_t nk = 0;        ///< key (and value) sequence length
  std::size_t dk = 0;        ///< query and key head dim
  std::size_t dv = 0;        ///< value head dim
  std::size_t kv_heads = 0;  ///< Hkv, the key and value heads; 0 (a Dims written by hand): H
  /// Hkv: kv_heads, or H when it is 0.
  std::size_t kv() const { return kv_heads == 0 ? heads : kv_heads; }
  /// Whether query heads share KV heads (Hkv < H).
  bool grouped() const { return kv() != heads; }
  /// The KV head that query head h reads: h / (H / Hkv).
  std::size_t kv_head(std::size_t h) const { return h / (heads / kv()); }
  /// Every size equal.
  bool operator==(const Dims&) const = default;
};

/// Checks that q, k, v fit together (see the layout above); throws Error naming the mismatch
/// (H not a multiple of Hkv among them).
Dims check_qkv(TensorRef q, TensorRef k, TensorRef v);

/// "[2, 8, 128, 64]": for error messages.
std::string shape_string(TensorRef t);

}  // namespace attnlab
