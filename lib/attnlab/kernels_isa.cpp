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

// R query rows against K keys, every (row, key) pair an accumulator of its own: R·K independent
// FMA chains hide the FMA's latency, each key chunk is loaded once for the R rows.
template <size_t R, size_t K>
void row_dots_block(size_t dk, const float* q, const float* keys, float* scores, size_t ld) {
  vec acc[R][K];
  for (size_t r = 0; r < R; ++r)
    for (size_t j = 0; j < K; ++j) acc[r][j] = splat(0.0f);
  size_t p = 0;
  for (; p + kWidth <= dk; p += kWidth)
    for (size_t j = 0; j < K; ++j) {
      const vec key = load(keys + j * dk + p);
      for (size_t r = 0; r < R; ++r) acc[r][j] = fma(load(q + r * dk + p), key, acc[r][j]);
    }
  if (p < dk)
    for (size_t j = 0; j < K; ++j) {
      const vec key = load(keys + j * dk + p, dk - p, splat(0.0f));
      for (size_t r = 0; r < R; ++r)
        acc[r][j] = fma(load(q + r * dk + p, dk - p, splat(0.0f)), key, acc[r][j]);
    }
  for (size_t r = 0; r < R; ++r)
    for (size_t j = 0; j < K; ++j) scores[r * ld + j] = reduce_add(acc[r][j]);
}

// Rows of R at a time, keys K at a time (8 accumulators), the last keys one at a time.
template <size_t R, size_t K>
void row_dots_rows(size_t cols, size_t dk, const float* q, const float* keys, float* scores,
                   size_t ld) {
  size_t j = 0;
  for (; j + K <= cols; j += K) row_dots_block<R, K>(dk, q, keys + j * dk, scores + j, ld);
  for (; j < cols; ++j) row_dots_block<R, 1>(dk, q, keys + j * dk, scores + j, ld);
}

void row_dots(size_t rows, size_t cols, size_t dk, const float* q, const float* keys, float* scores,
              size_t ld) {
  size_t r = 0;
  for (; r + 4 <= rows; r += 4)
    row_dots_rows<4, 2>(cols, dk, q + r * dk, keys, scores + r * ld, ld);
  switch (rows - r) {
    case 3:
      row_dots_rows<3, 2>(cols, dk, q + r * dk, keys, scores + r * ld, ld);
      break;
    case 2:
      row_dots_rows<2, 4>(cols, dk, q + r * dk, keys, scores + r * ld, ld);
      break;
    case 1:
      row_dots_rows<1, 8>(cols, dk, q + r * dk, keys, scores + r * ld, ld);
      break;
    default:
      break;
  }
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

// tanh(x) as a rational function of degree 13 over 6 on x clamped to +-7.905 (Eigen's float
// tanh, generic_fast_tanh_float): at most 3.5e-7 relative error over all floats, 7e-7 absolute in
// 1 - tanh^2, exact saturation beyond the clamp; a NaN stays NaN (min and max return their second
// operand then). A third of the work of (e^2x - 1) / (e^2x + 1), with no exp2 and no select: a
// soft cap costs the forward's and backward's pass over the scores little more than its divide.
inline vec tanh(vec x) {
  constexpr float a[] = {4.89352455891786e-03f, 6.37261928875436e-04f,  1.48572235717979e-05f,
                         5.12229709037114e-08f, -8.60467152213735e-11f, 2.00018790482477e-13f,
                         -2.76076847742355e-16f};
  constexpr float b[] = {4.89352518554385e-03f, 2.26843463243900e-03f, 1.18534705686654e-04f,
                         1.19825839466702e-06f};
  constexpr float clamp = 7.90531110763549805f;
  const vec y = max(splat(-clamp), min(splat(clamp), x));
  const vec y2 = mul(y, y);
  vec p = splat(a[6]);
  for (int d = 5; d >= 0; --d) p = fma(p, y2, splat(a[d]));
  vec q = splat(b[3]);
  for (int d = 2; d >= 0; --d) q = fma(q, y2, splat(b[d]));
  return div(mul(p, y), q);
}

// The lowest finite float: only -infinity lies below it.
constexpr float kLowest = -3.40282347e38f;

inline vec lane_index() {
  float lanes[kWidth];
  for (size_t l = 0; l < kWidth; ++l) lanes[l] = float(l);
  return load(lanes);
}

// Which parts of a ScoreMods are present: the fused loops are compiled per combination, so that
// a modifier costs its own few vector operations per score and no test in the loop.
struct Parts {
  bool cap, alibi, ranged, other;  // other: row_add, col_add or bias
};

inline Parts parts_of(const ScoreMods& m) {
  return {m.cap > 0.0f, m.row_pos != nullptr, m.col_lo != nullptr,
          m.row_add || m.col_add || m.bias_rows};
}

// Calls f.template operator()<Cap, Alibi, Ranged, Other>() for the parts present.
template <class F>
void with_parts(const Parts& p, F&& f) {
  const auto ranged = [&]<bool Cap, bool Alibi>() {
    if (p.ranged) {
      if (p.other) return f.template operator()<Cap, Alibi, true, true>();
      return f.template operator()<Cap, Alibi, true, false>();
    }
    if (p.other) return f.template operator()<Cap, Alibi, false, true>();
    return f.template operator()<Cap, Alibi, false, false>();
  };
  if (p.cap) {
    if (p.alibi) return ranged.template operator()<true, true>();
    return ranged.template operator()<true, false>();
  }
  if (p.alibi) return ranged.template operator()<false, true>();
  return ranged.template operator()<false, false>();
}

// One row of a ScoreMods, as locals of its column loop.
template <bool Cap, bool Alibi, bool Ranged, bool Other>
struct RowMods {
  vec cap, inv_cap;           // soft-capping
  vec slope, lane_steps;      // ALiBi: slope, col_step · lane
  float distance0, col_step;  // ALiBi: row_pos - col_pos, col_step
  float lo, hi;               // the row's range
  vec row_add;                // other terms
  const float* col_add;
  const float* bias;
  size_t bias_step;
  vec bias_scale;

  RowMods(const ScoreMods& m, size_t r) {
    if constexpr (Cap) cap = splat(m.cap), inv_cap = splat(1.0f / m.cap);
    if constexpr (Alibi) {
      slope = splat(m.slope);
      lane_steps = mul(lane_index(), splat(m.col_step));
      distance0 = m.row_pos[r] - m.col_pos;
      col_step = m.col_step;
    }
    if constexpr (Ranged) lo = m.col_lo[r], hi = m.col_hi[r];
    if constexpr (Other) {
      row_add = splat(m.row_add ? m.row_add[r] : 0.0f);
      col_add = m.col_add;
      bias = m.bias_rows ? m.bias_rows[r] : nullptr;
      bias_step = m.bias_step;
      bias_scale = splat(m.bias_scale);
    }
  }

  // Lanes of row_pos - (col_pos + col_step · (c + lane)): whole numbers below 2^24, exact in
  // float whichever way they are summed.
  vec distance(size_t c) const { return sub(splat(distance0 - col_step * float(c)), lane_steps); }

  // Whether lanes [c, c + kWidth) all lie outside the row's range.
  bool outside(size_t c) const {
    if constexpr (Ranged) return float(c + kWidth) <= lo || float(c) >= hi;
    return false;
  }

  // The modifiers on lanes [c, c + n) of raw scores; th receives tanh(raw / cap) (for the
  // soft-cap's derivative).
  vec apply(vec raw, size_t c, size_t n, vec& th) const {
    vec x = raw;
    if constexpr (Cap) {
      th = tanh(mul(raw, inv_cap));
      x = where_below(raw, kLowest, raw, mul(th, cap));  // masked stays masked
    }
    if constexpr (Alibi || Other) {
      vec extra = splat(0.0f);
      if constexpr (Other) {
        extra = row_add;
        if (col_add) extra = add(extra, load(col_add + c, n, splat(0.0f)));
      }
      if constexpr (Alibi) extra = sub(extra, mul(slope, abs(distance(c))));
      if constexpr (Other) {
        if (bias) {
          float lanes[kWidth];
          for (size_t l = 0; l < n; ++l) lanes[l] = bias[(c + l) * bias_step];
          extra = add(extra, mul(bias_scale, load(lanes, n, splat(0.0f))));
        }
      }
      x = add(x, extra);
    }
    if constexpr (Ranged) {
      const vec index = add(splat(float(c)), lane_index());
      x = where_below(index, lo, splat(-kInf), where_below(index, hi, x, splat(-kInf)));
    }
    return x;
  }
};

void score_mods(const ScoreMods& m, float* scores, size_t ld, size_t rows, size_t cols) {
  with_parts(parts_of(m), [&]<bool Cap, bool Alibi, bool Ranged, bool Other>() {
    for (size_t r = 0; r < rows; ++r) {
      float* s = scores + r * ld;
      const RowMods<Cap, Alibi, Ranged, Other> rm(m, r);
      vec th;
      for (size_t c = 0; c < cols; c += kWidth) {
        const size_t n = cols - c < kWidth ? cols - c : kWidth;
        store(s + c, rm.apply(load(s + c, n, splat(0.0f)), c, n, th), n);
      }
    }
  });
}

// The modifiers on one row of `cols` scores in place, returning the row's max afterwards.
template <bool Cap, bool Alibi, bool Ranged, bool Other>
float modify_row_max(const ScoreMods& m, size_t r, float* row, size_t cols) {
  const RowMods<Cap, Alibi, Ranged, Other> rm(m, r);
  vec top = splat(-kInf), th;
  size_t c = 0;
  for (; c + kWidth <= cols; c += kWidth) {
    if (rm.outside(c)) {
      store(row + c, splat(-kInf));
      continue;
    }
    const vec x = rm.apply(load(row + c), c, kWidth, th);
    store(row + c, x);
    top = max(top, x);
  }
  if (c < cols) {  // the missing lanes are -inf, and stay so
    const size_t n = cols - c;
    const vec x = rm.apply(load(row + c, n, splat(-kInf)), c, n, th);
    store(row + c, x, n);
    top = max(top, x);
  }
  return reduce_max(top);
}

// One row of fold after its max is known.
inline void fold_row(const SoftmaxTile& t, size_t r, float* row, size_t cols, float top) {
  if (top == -kInf) {  // nothing visible in this block: it contributes nothing
    for (size_t j = 0; j < cols; ++j) row[j] = 0.0f;
    return;
  }
  if (top > t.max[r]) {  // a new running max: rescale what was summed so far
    const float rescale = exp2_one(t.max[r] - top);  // 0 on the first visible block
    scale(t.acc + r * t.dv, t.dv, rescale);
    t.sum[r] *= rescale;
    t.max[r] = top;
  }
  t.sum[r] += exp2_shifted_sum(row, cols, t.max[r]);
}

void fold(const SoftmaxTile& t, const ScoreMods* mods, const float* v, size_t ldv, size_t cols) {
  if (mods) {
    with_parts(parts_of(*mods), [&]<bool Cap, bool Alibi, bool Ranged, bool Other>() {
      for (size_t r = 0; r < t.rows; ++r) {
        float* row = t.scores + r * t.ld;
        fold_row(t, r, row, cols, modify_row_max<Cap, Alibi, Ranged, Other>(*mods, r, row, cols));
      }
    });
  } else {
    for (size_t r = 0; r < t.rows; ++r) {
      float* row = t.scores + r * t.ld;
      fold_row(t, r, row, cols, row_max(row, cols));
    }
  }
  gemm_tile(t.rows, t.dv, cols, t.scores, t.ld, v, ldv, t.acc, t.dv, true);
}

// softmax_grad's row r with modifiers: each score modified as the forward did, P and dS from it,
// the modifiers' gradients taken from dS (Grads), and the soft-cap's derivative applied, in one
// pass.
template <bool Cap, bool Alibi, bool Ranged, bool Other, bool Grads>
void softmax_grad_row(const SoftmaxGradTile& t, size_t r, size_t cols) {
  float* p = t.scores + r * t.ld;
  float* ds = t.dp + r * t.ld;
  const RowMods<Cap, Alibi, Ranged, Other> rm(*t.mods, r);
  const vec lse = splat(t.lse2[r]), delta = splat(t.delta[r]), factor = splat(t.factor);
  const ScoreModsGrad* grads = t.grads;
  vec unit, row_sum = splat(0.0f), alibi = splat(0.0f);
  float* bias = nullptr;
  if constexpr (Grads) {
    unit = splat(grads->unit);
    if (grads->bias_rows) bias = grads->bias_rows[r];
  }
  // Lanes [c, c + n): full vectors with plain loads and stores (masked ones are slow on AMD).
  const auto lanes = [&]<bool Tail>(size_t c, size_t n) {
    vec th;
    const vec raw = Tail ? load(p + c, n, splat(-kInf)) : load(p + c);
    const vec x = rm.apply(raw, c, n, th);
    const vec e = exp2(sub(x, lse));  // masked -inf scores give exactly 0
    const vec dp = Tail ? load(ds + c, n, delta) : load(ds + c);
    vec g = mul(mul(e, sub(dp, delta)), factor);
    if constexpr (Grads) {
      const vec d = mul(g, unit);
      if constexpr (Other) {
        if (bias || grads->col_sums) {
          float each[kWidth];
          store(each, d);
          if (bias)
            for (size_t l = 0; l < n; ++l) bias[(c + l) * grads->bias_step] = each[l];
          if (grads->col_sums)
            for (size_t l = 0; l < n; ++l)
              grads->col_sums[(c + l) * grads->col_sums_step] += each[l];
        }
        row_sum = add(row_sum, d);
      }
      if constexpr (Alibi) alibi = fma(d, abs(rm.distance(c)), alibi);
    }
    if constexpr (Cap) g = mul(g, sub(splat(1.0f), mul(th, th)));
    if constexpr (Tail) {
      store(p + c, e, n);
      store(ds + c, g, n);
    } else {
      store(p + c, e);
      store(ds + c, g);
    }
  };
  size_t c = 0;
  for (; c + kWidth <= cols; c += kWidth) {
    if (rm.outside(c)) {  // P = dS = 0: nothing to take either
      store(p + c, splat(0.0f));
      store(ds + c, splat(0.0f));
      continue;
    }
    lanes.template operator()<false>(c, kWidth);
  }
  if (c < cols) lanes.template operator()<true>(c, cols - c);
  if constexpr (Grads) {
    if (grads->row_sums) grads->row_sums[r] += reduce_add(row_sum);
    if (grads->alibi_rows) grads->alibi_rows[r] += reduce_add(alibi);
  }
}

void softmax_grad(const SoftmaxGradTile& t, size_t cols) {
  const auto no_key = [&](size_t r) {  // a row that sees no key: no probability, no gradient
    if (t.lse2[r] != -kInf) return false;
    float* p = t.scores + r * t.ld;
    float* ds = t.dp + r * t.ld;
    for (size_t j = 0; j < cols; ++j) p[j] = ds[j] = 0.0f;
    return true;
  };
  if (t.mods) {
    with_parts(parts_of(*t.mods), [&]<bool Cap, bool Alibi, bool Ranged, bool Other>() {
      for (size_t r = 0; r < t.rows; ++r) {
        if (no_key(r)) continue;
        if (t.grads)
          softmax_grad_row<Cap, Alibi, Ranged, Other, true>(t, r, cols);
        else
          softmax_grad_row<Cap, Alibi, Ranged, Other, false>(t, r, cols);
      }
    });
    return;
  }
  for (size_t r = 0; r < t.rows; ++r) {
    if (no_key(r)) continue;
    float* p = t.scores + r * t.ld;
    float* ds = t.dp + r * t.ld;
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
const Table ATTNLAB_KERNEL_TABLE = {gemm_tile,    gemm_tile_at, exp2_inplace,  exp2_shifted_sum,
                                    row_max,      row_dots,     transpose,     fold,
                                    softmax_grad, score_mods,   round_to_bf16, widen_bf16};

}  // namespace attnlab::kernels::detail
