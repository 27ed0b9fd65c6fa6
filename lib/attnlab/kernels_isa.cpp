// The hot loops of one instruction-set path, written once against simd.hpp and compiled once per
// path (see meson.build: plain x86-64, x86-64-v3 for AVX2, x86-64-v4 for AVX-512).
// ATTNLAB_KERNEL_TABLE names the table of kernels_table.hpp that this compilation defines.
//
// Nothing here has external linkage but that table. An inline function with external linkage
// (std::min, std::exp2, a std::vector member) compiled here with AVX-512 flags could be the one
// copy the linker keeps for the whole library and then run on a CPU without AVX-512: hence the
// anonymous namespace, compiler builtins and no standard library beyond <cstddef>.
#include "attnlab/kernels_table.hpp"
#include "attnlab/simd.hpp"

#ifndef ATTNLAB_KERNEL_TABLE
#error "define ATTNLAB_KERNEL_TABLE as the table to define (see meson.build)"
#endif

namespace attnlab::kernels::detail {
namespace {

using namespace simd;
using std::size_t;

// R rows of C by W vectors, kept in registers across the whole k loop. With Tail the last vector
// holds only `last` columns (masked loads and stores: nothing past them is touched). With AT, A
// is given transposed: element (r, p) at a[p * lda + r] (the backward's P^T dO and dS^T Q read
// the score tiles in place instead of transposing them).
template <bool AT>
inline float a_at(const float* a, size_t lda, size_t r, size_t p) {
  return AT ? a[p * lda + r] : a[r * lda + p];
}

// Where row block i (AT: column block) and depth slice p of A start.
template <bool AT>
inline const float* a_rows(const float* a, size_t lda, size_t i) {
  return AT ? a + i : a + i * lda;
}
template <bool AT>
inline const float* a_depth(const float* a, size_t lda, size_t p) {
  return AT ? a + p * lda : a + p;
}

template <bool AT, size_t R, size_t W, bool Tail>
void block(size_t k, const float* a, size_t lda, const float* b, size_t ldb, float* c, size_t ldc,
           bool accumulate, size_t last) {
  const vec zero = splat(0.0f);
  auto load_col = [&](const float* p, size_t w) {
    return Tail && w == W - 1 ? load(p, last, zero) : load(p);
  };
  vec acc[R][W];
#pragma GCC unroll 8
  for (size_t r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (size_t w = 0; w < W; ++w)
      acc[r][w] = accumulate ? load_col(c + r * ldc + w * kWidth, w) : zero;
  for (size_t p = 0; p < k; ++p) {
    vec row[W];
#pragma GCC unroll 4
    for (size_t w = 0; w < W; ++w) row[w] = load_col(b + p * ldb + w * kWidth, w);
#pragma GCC unroll 8
    for (size_t r = 0; r < R; ++r) {
      const vec s = splat(a_at<AT>(a, lda, r, p));
#pragma GCC unroll 4
      for (size_t w = 0; w < W; ++w) acc[r][w] = fma(s, row[w], acc[r][w]);
    }
  }
#pragma GCC unroll 8
  for (size_t r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (size_t w = 0; w < W; ++w) {
      float* out = c + r * ldc + w * kWidth;
      if (Tail && w == W - 1)
        store(out, acc[r][w], last);
      else
        store(out, acc[r][w]);
    }
}

// The last m % kBlockRows rows of a panel: one block of exactly that many (R counts down).
template <bool AT, size_t R, size_t W, bool Tail>
void last_rows(size_t rows, size_t k, const float* a, size_t lda, const float* b, size_t ldb,
               float* c, size_t ldc, bool accumulate, size_t last) {
  if constexpr (R > 0) {
    if (rows == R) return block<AT, R, W, Tail>(k, a, lda, b, ldb, c, ldc, accumulate, last);
    last_rows<AT, R - 1, W, Tail>(rows, k, a, lda, b, ldb, c, ldc, accumulate, last);
  }
}

// All m rows against one panel of W vectors of columns; B's panel stays in L1 across the rows.
template <bool AT, size_t W, bool Tail>
void panel(size_t m, size_t k, const float* a, size_t lda, const float* b, size_t ldb, float* c,
           size_t ldc, bool accumulate, size_t last) {
  size_t i = 0;
  for (; i + kBlockRows <= m; i += kBlockRows)
    block<AT, kBlockRows, W, Tail>(k, a_rows<AT>(a, lda, i), lda, b, ldb, c + i * ldc, ldc,
                                   accumulate, last);
  last_rows<AT, kBlockRows - 1, W, Tail>(m - i, k, a_rows<AT>(a, lda, i), lda, b, ldb, c + i * ldc,
                                         ldc, accumulate, last);
}

// The last n < kBlockVecs·kWidth columns: ceil(n / kWidth) vectors, the last one masked when
// partial (W counts down).
template <bool AT, size_t W>
void last_columns(size_t n, size_t m, size_t k, const float* a, size_t lda, const float* b,
                  size_t ldb, float* c, size_t ldc, bool accumulate) {
  if constexpr (W > 0) {
    if (n > (W - 1) * kWidth) {
      const size_t last = n - (W - 1) * kWidth;
      if (last == kWidth)
        return panel<AT, W, false>(m, k, a, lda, b, ldb, c, ldc, accumulate, last);
      return panel<AT, W, true>(m, k, a, lda, b, ldb, c, ldc, accumulate, last);
    }
    last_columns<AT, W - 1>(n, m, k, a, lda, b, ldb, c, ldc, accumulate);
  }
}

// C (+)= A·B over the columns of B in panels of kBlockVecs vectors.
template <bool AT>
void gemm_panels(size_t m, size_t n, size_t k, const float* a, size_t lda, const float* b,
                 size_t ldb, float* c, size_t ldc, bool accumulate) {
  constexpr size_t width = kBlockVecs * kWidth;
  size_t j = 0;
  for (; j + width <= n; j += width)
    panel<AT, kBlockVecs, false>(m, k, a, lda, b + j, ldb, c + j, ldc, accumulate, kWidth);
  if (j < n) last_columns<AT, kBlockVecs>(n - j, m, k, a, lda, b + j, ldb, c + j, ldc, accumulate);
}

// In slices of kDepth rows of B, so that a slice of a panel (kDepth x kBlockVecs vectors: 16 KiB
// at AVX-512) stays in L1 while every row block of A passes over it.
template <bool AT>
void gemm_depth_slices(size_t m, size_t n, size_t k, const float* a, size_t lda, const float* b,
                       size_t ldb, float* c, size_t ldc, bool accumulate) {
  constexpr size_t kDepth = 64;
  for (size_t p = 0; p < k || p == 0; p += kDepth)
    gemm_panels<AT>(m, n, k - p < kDepth ? k - p : kDepth, a_depth<AT>(a, lda, p), lda, b + p * ldb,
                    ldb, c, ldc, accumulate || p > 0);
}

void gemm_tile(size_t m, size_t n, size_t k, const float* a, size_t lda, const float* b, size_t ldb,
               float* c, size_t ldc, bool accumulate) {
  gemm_depth_slices<false>(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
}

void gemm_tile_at(size_t m, size_t n, size_t k, const float* a, size_t lda, const float* b,
                  size_t ldb, float* c, size_t ldc, bool accumulate) {
  gemm_depth_slices<true>(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
}

float row_max(const float* x, size_t n) {
  vec top = splat(-kInf);
  size_t i = 0;
  for (; i + kWidth <= n; i += kWidth) top = max(top, load(x + i));
  if (i < n) top = max(top, load(x + i, n - i, splat(-kInf)));
  return reduce_max(top);
}

void exp2_inplace(float* x, size_t n) {
  size_t i = 0;
  for (; i + kWidth <= n; i += kWidth) store(x + i, exp2(load(x + i)));
  if (i < n) store(x + i, exp2(load(x + i, n - i, splat(0.0f))), n - i);
}

float exp2_shifted_sum(float* x, size_t n, float shift) {
  const vec s = splat(shift);
  vec total = splat(0.0f);
  size_t i = 0;
  for (; i + kWidth <= n; i += kWidth) {
    const vec e = exp2(sub(load(x + i), s));
    store(x + i, e);
    total = add(total, e);
  }
  if (i < n) {  // the missing lanes are -inf: they add 2^-inf = 0
    const vec e = exp2(sub(load(x + i, n - i, splat(-kInf)), s));
    store(x + i, e, n - i);
    total = add(total, e);
  }
  return reduce_add(total);
}

void scale(float* x, size_t n, float factor) {
  const vec f = splat(factor);
  size_t i = 0;
  for (; i + kWidth <= n; i += kWidth) store(x + i, mul(load(x + i), f));
  if (i < n) store(x + i, mul(load(x + i, n - i, f), f), n - i);
}

void transpose(size_t rows, size_t cols, const float* src, size_t lds, float* dst, size_t ldd) {
  size_t j = 0;
  for (; j + kWidth <= rows; j += kWidth) {
    size_t c = 0;
    for (; c + kWidth <= cols; c += kWidth)
      transpose_block(src + j * lds + c, lds, dst + c * ldd + j, ldd);
    for (; c < cols; ++c)
      for (size_t t = j; t < j + kWidth; ++t) dst[c * ldd + t] = src[t * lds + c];
  }
  for (; j < rows; ++j)
    for (size_t c = 0; c < cols; ++c) dst[c * ldd + j] = src[j * lds + c];
}

void fold(const SoftmaxTile& t, const float* v, size_t ldv, size_t cols) {
  for (size_t r = 0; r < t.rows; ++r) {
    float* row = t.scores + r * t.ld;
    const float top = row_max(row, cols);
    if (top == -kInf) {  // nothing visible in this block: it contributes nothing
      for (size_t j = 0; j < cols; ++j) row[j] = 0.0f;
      continue;
    }
    if (top > t.max[r]) {  // a new running max: rescale what was summed so far
      const float rescale = exp2_one(t.max[r] - top);  // 0 on the first visible block
      scale(t.acc + r * t.dv, t.dv, rescale);
      t.sum[r] *= rescale;
      t.max[r] = top;
    }
    t.sum[r] += exp2_shifted_sum(row, cols, t.max[r]);
  }
  gemm_tile(t.rows, t.dv, cols, t.scores, t.ld, v, ldv, t.acc, t.dv, true);
}

void softmax_grad(const SoftmaxGradTile& t, size_t cols) {
  for (size_t r = 0; r < t.rows; ++r) {
    float* p = t.scores + r * t.ld;
    float* ds = t.dp + r * t.ld;
    if (t.lse2[r] == -kInf) {  // a row that sees no key: no probability, no gradient
      for (size_t j = 0; j < cols; ++j) p[j] = ds[j] = 0.0f;
      continue;
    }
    const vec lse = splat(t.lse2[r]), delta = splat(t.delta[r]), factor = splat(t.factor);
    size_t j = 0;
    for (; j + kWidth <= cols; j += kWidth) {
      const vec e = exp2(sub(load(p + j), lse));  // masked -inf scores give exactly 0
      store(p + j, e);
      store(ds + j, mul(mul(e, sub(load(ds + j), delta)), factor));
    }
    if (j < cols) {
      const size_t n = cols - j;
      const vec e = exp2(sub(load(p + j, n, splat(-kInf)), lse));
      store(p + j, e, n);
      store(ds + j, mul(mul(e, sub(load(ds + j, n, delta), delta)), factor), n);
    }
  }
}

}  // namespace

extern const Table ATTNLAB_KERNEL_TABLE;
const Table ATTNLAB_KERNEL_TABLE = {gemm_tile, gemm_tile_at, exp2_inplace, exp2_shifted_sum,
                                    row_max,   transpose,    fold,         softmax_grad};

}  // namespace attnlab::kernels::detail
