// The bf16 conversions, and Attention's bf16 overloads (declared in attention.hpp, kept here
// so that the bf16 paths live in one file pair: the kernels of issue 47 plug in below).
#include "attnlab/bf16.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>

#include "attnlab/attention.hpp"
#include "attnlab/error.hpp"
#include "attnlab/kernels.hpp"

namespace attnlab {
namespace {

const std::uint16_t* bits_of(const bf16* p) {
  return reinterpret_cast<const std::uint16_t*>(p);  // bf16 is its bits (standard layout)
}
std::uint16_t* bits_of(bf16* p) {
  return reinterpret_cast<std::uint16_t*>(p);
}

// Conversions run at memory speed; large ones are shared among the threads in chunks.
constexpr std::size_t kChunk = std::size_t{1} << 16;

template <class Convert>
void chunked(std::size_t n, Convert convert) {
  const auto chunks = static_cast<std::ptrdiff_t>((n + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static) if (n > 4 * kChunk)
  for (std::ptrdiff_t c = 0; c < chunks; ++c) {
    const std::size_t begin = static_cast<std::size_t>(c) * kChunk;
    convert(begin, std::min(kChunk, n - begin));
  }
}

// Makes sure the call can take the bf16 path in force: kernels::active_bf16_path() throws when
// ATTNLAB_ISA asks for one that is not supported, so such a call fails, named, instead of running
// another path; the converted path is the only one with kernels today (issue 47).
void check_bf16_path() {
  const kernels::Bf16Path path = kernels::active_bf16_path();
  ATTNLAB_ASSERT(path == kernels::Bf16Path::via_f32);
  (void)path;
}

// q, k, v widened to float32: the converted path's inputs.
struct Widened {
  Tensor q, k, v;
  Widened(TensorRefBf16 q16, TensorRefBf16 k16, TensorRefBf16 v16)
      : q(to_float32(q16)), k(to_float32(k16)), v(to_float32(v16)) {}
};

}  // namespace

bf16 to_bf16(float x) {
  bf16 out;
  kernels::round_to_bf16_bits(&x, &out.bits, 1);
  return out;
}

void round_to_bf16(const float* src, bf16* dst, std::size_t n) {
  chunked(n, [&](std::size_t i, std::size_t m) {
    kernels::round_to_bf16_bits(src + i, bits_of(dst + i), m);
  });
}

void widen_bf16(const bf16* src, float* dst, std::size_t n) {
  chunked(n, [&](std::size_t i, std::size_t m) {
    kernels::widen_bf16_bits(bits_of(src + i), dst + i, m);
  });
}

TensorRefBf16::TensorRefBf16(const bf16* data, const Shape& shape) : data_(data), shape_(shape) {
  if (data || size() == 0) return;
  std::string dims;
  for (std::size_t extent : shape) dims += (dims.empty() ? "" : ", ") + std::to_string(extent);
  throw Error("bf16 tensor view [" + dims + "]: no data (a null pointer)");
}

void to_float32(TensorRefBf16 t, Tensor& out) {
  kernels::shape_buffer(out, t.shape());
  widen_bf16(t.data(), out.data(), t.size());
}

Tensor to_float32(TensorRefBf16 t) {
  Tensor out;
  to_float32(t, out);
  return out;
}

void to_bf16(TensorRef t, TensorBf16& out) {
  kernels::shape_buffer(out, t.shape());
  round_to_bf16(t.data(), out.data(), t.size());
}

TensorBf16 to_bf16(TensorRef t) {
  TensorBf16 out;
  to_bf16(t, out);
  return out;
}

TensorBf16 Attention::forward(TensorRefBf16 q, TensorRefBf16 k, TensorRefBf16 v, const Mask& mask,
                              const TokenInputs& in) const {
  TensorBf16 out;
  forward(q, k, v, mask, in, out, nullptr);
  return out;
}

void Attention::forward(TensorRefBf16 q, TensorRefBf16 k, TensorRefBf16 v, const Mask& mask,
                        const TokenInputs& in, Tensor& out, Saved* saved) const {
  check_bf16_path();
  const Widened w(q, k, v);
  if (saved)
    forward(w.q, w.k, w.v, mask, in, out, *saved);
  else
    forward(w.q, w.k, w.v, mask, in, out);
}

void Attention::forward(TensorRefBf16 q, TensorRefBf16 k, TensorRefBf16 v, const Mask& mask,
                        const TokenInputs& in, TensorBf16& out, Saved* saved) const {
  Tensor out32;
  forward(q, k, v, mask, in, out32, saved);
  to_bf16(out32, out);  // rounded once, from float32
}

void Attention::backward(TensorRefBf16 q, TensorRefBf16 k, TensorRefBf16 v, const Mask& mask,
                         const TokenInputs& in, TensorRef out, TensorRef d_out, const Saved& saved,
                         AllGradients& g) const {
  check_bf16_path();
  const Widened w(q, k, v);
  backward(w.q, w.k, w.v, mask, in, out, d_out, saved, g);
}

void Attention::backward(TensorRefBf16 q, TensorRefBf16 k, TensorRefBf16 v, const Mask& mask,
                         const TokenInputs& in, TensorRefBf16 out, TensorRefBf16 d_out,
                         const Saved& saved, AllGradientsBf16& g) const {
  const Tensor out32 = to_float32(out), d_out32 = to_float32(d_out);
  backward(q, k, v, mask, in, out32, d_out32, saved, g.rest);
  to_bf16(g.rest.qkv.dq, g.dq);
  to_bf16(g.rest.qkv.dk, g.dk);
  to_bf16(g.rest.qkv.dv, g.dv);
}

}  // namespace attnlab
