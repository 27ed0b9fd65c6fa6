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

// e^x - 1 without cancellation near 0: its Taylor series up to x^8 for |x| < 1/2 (relative
// error below 1e-8 there), 2^(x log2 e) - 1 beyond.
inline vec expm1(vec x) {
  constexpr float c[] = {1.0f,       1.0f / 2,   1.0f / 6,    1.0f / 24,
                         1.0f / 120, 1.0f / 720, 1.0f / 5040, 1.0f / 40320};
  vec p = splat(c[7]);
  for (int d = 6; d >= 0; --d) p = fma(p, x, splat(c[d]));
  const vec series = mul(p, x);
  const vec direct = sub(exp2(mul(x, splat(1.4426950408889634f))), splat(1.0f));
  return where_below(abs(x), 0.5f, series, direct);
}

// tanh(x) = (e^(2x) - 1) / (e^(2x) + 1): about 1e-7 relative error near 0 too (a soft cap far
// above the scores leaves them as they are), exact at both saturations (2^127 and 0).
inline vec tanh(vec x) {
  const vec e = expm1(add(x, x));
  return div(e, add(e, splat(2.0f)));
}

// Lanes [c, c + n) of row_pos - (col_pos + col_step · (c + lane)), n <= kWidth.
inline vec distance(float row_pos, float col_pos, float col_step, size_t c) {
  float lanes[kWidth];
  for (size_t l = 0; l < kWidth; ++l) lanes[l] = row_pos - (col_pos + col_step * float(c + l));
  return load(lanes);
}

void score_mods(const ScoreMods& t) {
  for (size_t r = 0; r < t.rows; ++r) {
    float* s = t.scores + r * t.ld;
    float* cap_grad = t.cap_grad ? t.cap_grad + r * t.ld : nullptr;
    const float* bias = t.bias_rows ? t.bias_rows[r] : nullptr;
    const float row_add = t.row_add ? t.row_add[r] : 0.0f;
    for (size_t c = 0; c < t.cols; c += kWidth) {
      const size_t n = t.cols - c < kWidth ? t.cols - c : kWidth;
      vec x = load(s + c, n, splat(0.0f));
      if (t.cap > 0.0f) {
        const vec th = tanh(mul(x, splat(1.0f / t.cap)));
        x = mul(th, splat(t.cap));
        if (cap_grad) store(cap_grad + c, sub(splat(1.0f), mul(th, th)), n);
      }
      vec extra = splat(row_add);
      if (t.col_add) extra = add(extra, load(t.col_add + c, n, splat(0.0f)));
      if (t.slope != 0.0f)
        extra =
            sub(extra, mul(splat(t.slope), abs(distance(t.row_pos[r], t.col_pos, t.col_step, c))));
      if (bias) {
        float lanes[kWidth];
        for (size_t l = 0; l < n; ++l) lanes[l] = bias[(c + l) * t.bias_step];
        extra = add(extra, mul(splat(t.bias_scale), load(lanes, n, splat(0.0f))));
      }
      store(s + c, add(x, extra), n);
    }
  }
}

void score_mods_grad(const ScoreModsGrad& t) {
  const vec unit = splat(t.unit);
  for (size_t r = 0; r < t.rows; ++r) {
    float* ds = t.ds + r * t.ld;
    float* bias = t.bias_rows ? t.bias_rows[r] : nullptr;
    const float* cap_grad = t.cap_grad ? t.cap_grad + r * t.ld : nullptr;
    vec row_sum = splat(0.0f), alibi = splat(0.0f);
    for (size_t c = 0; c < t.cols; c += kWidth) {
      const size_t n = t.cols - c < kWidth ? t.cols - c : kWidth;
      const vec raw = load(ds + c, n, splat(0.0f));
      const vec g = mul(raw, unit);
      if (bias) {
        float lanes[kWidth];
        store(lanes, g);
        for (size_t l = 0; l < n; ++l) bias[(c + l) * t.bias_step] = lanes[l];
      }
      row_sum = add(row_sum, g);
      if (t.col_sums) {
        float lanes[kWidth];
        store(lanes, g);
        for (size_t l = 0; l < n; ++l) t.col_sums[(c + l) * t.col_sums_step] += lanes[l];
      }
      if (t.alibi_rows)
        alibi = fma(g, abs(distance(t.row_pos[r], t.col_pos, t.col_step, c)), alibi);
      if (cap_grad) store(ds + c, mul(raw, load(cap_grad + c, n, splat(0.0f))), n);
    }
    if (t.row_sums) t.row_sums[r] += reduce_add(row_sum);
    if (t.alibi_rows) t.alibi_rows[r] += reduce_add(alibi);
  }
}

// float32 to bfloat16, round to nearest even: adding 0x7FFF plus the kept part's lowest bit
// carries into the kept 16 bits exactly when the dropped half is above a tie, or a tie with an
// odd kept part (an infinity's dropped half is 0 and stays put). A NaN keeps its sign and top
// mantissa bits and is quieted (bit 6), so that no NaN turns into an infinity.
inline std::uint16_t round_one(float x) {
  unsigned bits;
  __builtin_memcpy(&bits, &x, sizeof bits);
  if (x != x) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);
  return static_cast<std::uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

void round_to_bf16(const float* src, std::uint16_t* dst, size_t n) {
  size_t i = 0;
#if defined(__AVX2__)
  const __m256i bias = _mm256_set1_epi32(0x7FFF), one = _mm256_set1_epi32(1);
  const __m256i quiet = _mm256_set1_epi32(0x40);
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(src + i);
    const __m256i bits = _mm256_castps_si256(x);
    const __m256i top = _mm256_srli_epi32(bits, 16);
    const __m256i lowest = _mm256_and_si256(top, one);
    const __m256i rounded =
        _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(bias, lowest)), 16);
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    const __m256i result = _mm256_blendv_epi8(rounded, _mm256_or_si256(top, quiet), nan);
    // Eight 32-bit lanes below 2^16 packed to 16 bits: packus works per 128-bit half, so the
    // halves' results sit in 64-bit quarters 0 and 2.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(result, result), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_castsi256_si128(packed));
  }
#endif
  for (; i < n; ++i) dst[i] = round_one(src[i]);
}

void widen_bf16(const std::uint16_t* src, float* dst, size_t n) {
  size_t i = 0;
#if defined(__AVX2__)
  for (; i + 8 <= n; i += 8) {
    const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m256i bits = _mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16);
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(bits));
  }
#endif
  for (; i < n; ++i) {
    const unsigned bits = static_cast<unsigned>(src[i]) << 16;
    __builtin_memcpy(dst + i, &bits, sizeof bits);
  }
}

}  // namespace

extern const Table ATTNLAB_KERNEL_TABLE;
const Table ATTNLAB_KERNEL_TABLE = {gemm_tile,  gemm_tile_at,    exp2_inplace,  exp2_shifted_sum,
                                    row_max,    transpose,       fold,          softmax_grad,
                                    score_mods, score_mods_grad, round_to_bf16, widen_bf16};

}  // namespace attnlab::kernels::detail
