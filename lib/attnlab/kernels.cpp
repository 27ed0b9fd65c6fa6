#include "attnlab/kernels.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define ATTNLAB_AVX2 1
#endif

namespace attnlab::kernels {

#ifdef ATTNLAB_AVX2
namespace {

// R rows of C by W vectors of 8 columns, kept in registers across the whole k loop.
template <int R, int W>
inline void block(std::size_t k, const float* a, std::size_t lda, const float* b,
                  std::size_t ldb, float* c, std::size_t ldc, bool accumulate) {
  __m256 acc[R][W];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int w = 0; w < W; ++w)
      acc[r][w] = accumulate ? _mm256_loadu_ps(c + r * ldc + 8 * w) : _mm256_setzero_ps();
  for (std::size_t p = 0; p < k; ++p) {
    __m256 row[W];
#pragma GCC unroll 4
    for (int w = 0; w < W; ++w) row[w] = _mm256_loadu_ps(b + p * ldb + 8 * w);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 s = _mm256_broadcast_ss(a + r * lda + p);
#pragma GCC unroll 4
      for (int w = 0; w < W; ++w) acc[r][w] = _mm256_fmadd_ps(s, row[w], acc[r][w]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int w = 0; w < W; ++w) _mm256_storeu_ps(c + r * ldc + 8 * w, acc[r][w]);
}

inline void scalar_cell(std::size_t k, const float* a, std::size_t lda, const float* b,
                        std::size_t ldb, float* c, bool accumulate) {
  (void)lda;
  float sum = accumulate ? *c : 0.0f;
  for (std::size_t p = 0; p < k; ++p) sum += a[p] * b[p * ldb];
  *c = sum;
}

template <int R>
inline void row_panel(std::size_t n, std::size_t k, const float* a, std::size_t lda,
                      const float* b, std::size_t ldb, float* c, std::size_t ldc,
                      bool accumulate) {
  std::size_t j = 0;
  for (; j + 16 <= n; j += 16) block<R, 2>(k, a, lda, b + j, ldb, c + j, ldc, accumulate);
  for (; j + 8 <= n; j += 8) block<R, 1>(k, a, lda, b + j, ldb, c + j, ldc, accumulate);
  for (; j < n; ++j)
    for (int r = 0; r < R; ++r)
      scalar_cell(k, a + r * lda, lda, b + j, ldb, c + r * ldc + j, accumulate);
}

}  // namespace

void gemm_tile(std::size_t m, std::size_t n, std::size_t k, const float* a, std::size_t lda,
               const float* b, std::size_t ldb, float* c, std::size_t ldc, bool accumulate) {
  std::size_t i = 0;
  for (; i + 6 <= m; i += 6)
    row_panel<6>(n, k, a + i * lda, lda, b, ldb, c + i * ldc, ldc, accumulate);
  // Leftover rows in panels of 4 and 2 before single rows: a 64-row block is 10 x 6 + 4.
  if (i + 4 <= m) {
    row_panel<4>(n, k, a + i * lda, lda, b, ldb, c + i * ldc, ldc, accumulate);
    i += 4;
  }
  if (i + 2 <= m) {
    row_panel<2>(n, k, a + i * lda, lda, b, ldb, c + i * ldc, ldc, accumulate);
    i += 2;
  }
  for (; i < m; ++i) row_panel<1>(n, k, a + i * lda, lda, b, ldb, c + i * ldc, ldc, accumulate);
}

// 2^v for one vector; lanes below -126 (including -inf) give exactly 0.
inline __m256 exp2_vec(__m256 v) {
  const __m256 lo = _mm256_set1_ps(-126.0f), hi = _mm256_set1_ps(127.0f);
  // Taylor series of 2^f = e^(f ln 2) on |f| <= 1/2: relative error below 1e-8.
  constexpr float c[] = {1.0f, 0.69314718f, 0.24022651f, 0.05550411f, 0.00961813f,
                         0.00133336f, 0.00015404f, 0.00001525f};
  const __m256 under = _mm256_cmp_ps(v, lo, _CMP_LT_OQ);
  v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
  const __m256 whole = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(v, whole);
  __m256 p = _mm256_set1_ps(c[7]);
  for (int d = 6; d >= 0; --d) p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(c[d]));
  const __m256i bits = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(whole), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(bits)));
}

inline float horizontal_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float scalar_exp2(float x) { return x < -126.0f ? 0.0f : std::exp2(x); }

void exp2_inplace(float* x, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, exp2_vec(_mm256_loadu_ps(x + i)));
  for (; i < n; ++i) x[i] = scalar_exp2(x[i]);
}

float exp2_shifted_sum(float* x, std::size_t n, float shift) {
  const __m256 s = _mm256_set1_ps(shift);
  __m256 total = _mm256_setzero_ps();
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp2_vec(_mm256_sub_ps(_mm256_loadu_ps(x + i), s));
    _mm256_storeu_ps(x + i, e);
    total = _mm256_add_ps(total, e);
  }
  float sum = horizontal_sum(total);
  for (; i < n; ++i) sum += x[i] = scalar_exp2(x[i] - shift);
  return sum;
}

float row_max(const float* x, std::size_t n) {
  __m256 top = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) top = _mm256_max_ps(top, _mm256_loadu_ps(x + i));
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  float result = _mm_cvtss_f32(m);
  for (; i < n; ++i) result = std::max(result, x[i]);
  return result;
}

#else  // portable fallback: same results up to rounding, slower

void gemm_tile(std::size_t m, std::size_t n, std::size_t k, const float* a, std::size_t lda,
               const float* b, std::size_t ldb, float* c, std::size_t ldc, bool accumulate) {
  for (std::size_t i = 0; i < m; ++i) {
    float* row = c + i * ldc;
    if (!accumulate)
      for (std::size_t j = 0; j < n; ++j) row[j] = 0.0f;
    for (std::size_t p = 0; p < k; ++p) {
      const float s = a[i * lda + p];
      for (std::size_t j = 0; j < n; ++j) row[j] += s * b[p * ldb + j];
    }
  }
}

inline float scalar_exp2(float x) { return x < -126.0f ? 0.0f : std::exp2(x); }

void exp2_inplace(float* x, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) x[i] = scalar_exp2(x[i]);
}

float exp2_shifted_sum(float* x, std::size_t n, float shift) {
  float sum = 0.0f;
  for (std::size_t i = 0; i < n; ++i) sum += x[i] = scalar_exp2(x[i] - shift);
  return sum;
}

float row_max(const float* x, std::size_t n) {
  float result = -std::numeric_limits<float>::infinity();
  for (std::size_t i = 0; i < n; ++i) result = std::max(result, x[i]);
  return result;
}

#endif

}  // namespace attnlab::kernels

namespace attnlab::kernels {
namespace {
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
}  // namespace

std::vector<float> transpose_keys(const Tensor& k, const Dims& d, std::size_t block) {
  if (block == 0) block = d.nk;
  const std::size_t blocks = (d.nk + block - 1) / block, per_head = blocks * d.dk * block;
  std::vector<float> kt(d.batch * d.heads * per_head, 0.0f);
  const std::ptrdiff_t heads = static_cast<std::ptrdiff_t>(d.batch * d.heads);
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t bh = 0; bh < heads; ++bh) {
    const float* src = k.data() + bh * d.nk * d.dk;
    float* dst = kt.data() + bh * per_head;
    for (std::size_t j = 0; j < d.nk; ++j) {
      float* col = dst + (j / block) * d.dk * block + j % block;
      for (std::size_t c = 0; c < d.dk; ++c) col[c * block] = src[j * d.dk + c];
    }
  }
  return kt;
}

std::vector<float> transpose_values(const Tensor& v, const Dims& d, std::size_t block) {
  Dims values = d;
  values.dk = d.dv;  // transpose_keys reads the row length from dk
  return transpose_keys(v, values, block);
}

OnlineSoftmax::OnlineSoftmax(std::size_t dk, std::size_t dv)
    : dk_(dk), dv_(dv), q_(kRows * dk), scores_(kRows * kCols), acc_(kRows * dv), max_(kRows),
      sum_(kRows) {}

void OnlineSoftmax::start(const float* q, std::size_t rows, float scale) {
  rows_ = rows;
  const float log2_scale = scale * kLog2e;  // softmax in base 2: exp(x) = 2^(x log2 e)
  for (std::size_t i = 0; i < rows * dk_; ++i) q_[i] = q[i] * log2_scale;
  std::fill(max_.begin(), max_.end(), kNegInf);
  std::fill(sum_.begin(), sum_.end(), 0.0f);
  std::fill(acc_.begin(), acc_.end(), 0.0f);
}

float* OnlineSoftmax::scores(const float* kt, std::size_t ldk, std::size_t cols) {
  gemm_tile(rows_, cols, dk_, q_.data(), dk_, kt, ldk, scores_.data(), kCols, false);
  return scores_.data();
}

void OnlineSoftmax::fold(const float* v, std::size_t ldv, std::size_t cols) {
  for (std::size_t r = 0; r < rows_; ++r) {
    float* row = scores_.data() + r * kCols;
    const float top = row_max(row, cols);
    if (top == kNegInf) {  // nothing visible in this block: contributes nothing
      std::fill(row, row + cols, 0.0f);
      continue;
    }
    const float new_max = std::max(max_[r], top);
    const float block_sum = exp2_shifted_sum(row, cols, new_max);
    const float rescale = std::exp2(max_[r] - new_max);  // 0 on the first visible block
    float* acc = acc_.data() + r * dv_;
    for (std::size_t c = 0; c < dv_; ++c) acc[c] *= rescale;
    sum_[r] = sum_[r] * rescale + block_sum;
    max_[r] = new_max;
  }
  gemm_tile(rows_, dv_, cols, scores_.data(), kCols, v, ldv, acc_.data(), dv_, true);
}

void OnlineSoftmax::finish(float* out, std::size_t ldo, float* lse, std::size_t ld_lse) const {
  for (std::size_t r = 0; r < rows_; ++r) {
    const float inv = sum_[r] > 0 ? 1.0f / sum_[r] : 0.0f;  // no visible key: zeros
    for (std::size_t c = 0; c < dv_; ++c) out[r * ldo + c] = acc_[r * dv_ + c] * inv;
    if (lse) lse[r * ld_lse] = sum_[r] > 0 ? (max_[r] + std::log2(sum_[r])) * kLn2 : kNegInf;
  }
}

SoftmaxBackward::SoftmaxBackward(std::size_t dk, std::size_t dv)
    : dk_(dk), dv_(dv), q_(kRows * dk), do_(kRows * dv), delta_(kRows), lse2_(kRows),
      scores_(kRows * kCols), dp_(kRows * kCols), pt_(kCols * kRows), dst_(kCols * kRows),
      dq_(kRows * dk) {}

void SoftmaxBackward::start(const float* q, std::size_t ldq, const float* out,
                            const float* d_out, std::size_t ldo, const float* lse,
                            std::size_t ld_lse, std::size_t rows, float scale) {
  rows_ = rows;
  scale_ = scale;
  const float log2_scale = scale * kLog2e;  // scores in base 2, as in the forward
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t c = 0; c < dk_; ++c) q_[r * dk_ + c] = q[r * ldq + c] * log2_scale;
    float delta = 0.0f;  // rowsum(dO ∘ O): the softmax Jacobian's rank-one part
    for (std::size_t c = 0; c < dv_; ++c) {
      do_[r * dv_ + c] = d_out[r * ldo + c];
      delta += d_out[r * ldo + c] * out[r * ldo + c];
    }
    delta_[r] = delta;
    lse2_[r] = lse[r * ld_lse] * kLog2e;
  }
  std::fill(dq_.begin(), dq_.end(), 0.0f);
}

float* SoftmaxBackward::scores(const float* kt, std::size_t ldk, std::size_t cols) {
  gemm_tile(rows_, cols, dk_, q_.data(), dk_, kt, ldk, scores_.data(), kCols, false);
  return scores_.data();
}

void SoftmaxBackward::backprop(const float* k, std::size_t ldk, const float* vt,
                               std::size_t ldvt, float* dk, std::size_t lddk, float* dv,
                               std::size_t lddv, std::size_t cols) {
  float* p = scores_.data();
  float* ds = dp_.data();
  gemm_tile(rows_, cols, dv_, do_.data(), dv_, vt, ldvt, ds, kCols, false);  // dP = dO V^T
  for (std::size_t r = 0; r < rows_; ++r) {
    float* prow = p + r * kCols;
    float* dsrow = ds + r * kCols;
    if (lse2_[r] == kNegInf)  // a row that sees no key: no probability, no gradient
      std::fill(prow, prow + cols, 0.0f);
    else
      exp2_shifted_sum(prow, cols, lse2_[r]);  // P = 2^(S - lse); masked -inf entries give 0
    for (std::size_t j = 0; j < cols; ++j) dsrow[j] = prow[j] * (dsrow[j] - delta_[r]);
  }
  // P^T and dS^T as GEMM operands; dS^T carries 1/log2(e) since q_ holds q · scale · log2(e).
  for (std::size_t j = 0; j < cols; ++j)
    for (std::size_t r = 0; r < rows_; ++r) {
      pt_[j * kRows + r] = p[r * kCols + j];
      dst_[j * kRows + r] = ds[r * kCols + j] * kLn2;
    }
  gemm_tile(cols, dv_, rows_, pt_.data(), kRows, do_.data(), dv_, dv, lddv, true);  // P^T dO
  gemm_tile(cols, dk_, rows_, dst_.data(), kRows, q_.data(), dk_, dk, lddk, true);  // dS^T Q
  gemm_tile(rows_, dk_, cols, ds, kCols, k, ldk, dq_.data(), dk_, true);            // dS K
}

void SoftmaxBackward::finish(float* dq, std::size_t lddq) const {
  for (std::size_t r = 0; r < rows_; ++r)
    for (std::size_t c = 0; c < dk_; ++c) dq[r * lddq + c] = dq_[r * dk_ + c] * scale_;
}

void run_backward_tiles(const Dims& d, std::size_t tiles, const BackwardTile& tile, Tensor& dk,
                        Tensor& dv) {
  const std::size_t heads = d.batch * d.heads, kd = d.nk * d.dk, vd = d.nk * d.dv;
  const std::size_t threads = static_cast<std::size_t>(std::max(1, omp_get_max_threads()));
  const std::size_t groups =
      heads >= 2 * threads ? 1 : std::clamp<std::size_t>((2 * threads + heads - 1) / heads, 1, tiles);
  std::fill(dk.begin(), dk.end(), 0.0f);
  std::fill(dv.begin(), dv.end(), 0.0f);
  std::vector<float> partial((groups - 1) * heads * (kd + vd), 0.0f);
  const auto tasks = static_cast<std::ptrdiff_t>(heads * groups);
#pragma omp parallel
  {
    SoftmaxBackward grad(d.dk, d.dv);
#pragma omp for schedule(dynamic, 1)
    for (std::ptrdiff_t task = 0; task < tasks; ++task) {
      const std::size_t bh = static_cast<std::size_t>(task) / groups;
      const std::size_t group = static_cast<std::size_t>(task) % groups;
      float* dkh = group == 0 ? dk.data() + bh * kd
                              : partial.data() + ((group - 1) * heads + bh) * (kd + vd);
      float* dvh = group == 0 ? dv.data() + bh * vd : dkh + kd;
      for (std::size_t t = group; t < tiles; t += groups) tile(bh, t, dkh, dvh, grad);
    }
    if (groups > 1) {
#pragma omp for schedule(static)
      for (std::ptrdiff_t bh = 0; bh < static_cast<std::ptrdiff_t>(heads); ++bh)
        for (std::size_t group = 1; group < groups; ++group) {
          const float* src = partial.data() + ((group - 1) * heads + bh) * (kd + vd);
          float* dkh = dk.data() + bh * kd;
          float* dvh = dv.data() + bh * vd;
          for (std::size_t i = 0; i < kd; ++i) dkh[i] += src[i];
          for (std::size_t i = 0; i < vd; ++i) dvh[i] += src[kd + i];
        }
    }
  }
}

namespace {

// The masked tiles of rows [i0, i0 + rows) of one head over the given key ranges, shared by the
// forward and the backward so that both see exactly the same masks: engine.scores for each chunk
// of at most kCols keys (chunks never cross a transpose_keys tile), every part of the mask
// applied with -inf, then consume(c0, cols). Keys past what any row can see are skipped.
template <class Engine, class Consume>
void for_each_masked_tile(const float* kt, const Mask& mask, const Dims& d, std::size_t b,
                          std::size_t h, std::size_t i0, std::size_t rows,
                          const std::vector<std::pair<std::size_t, std::size_t>>& ranges,
                          Engine& engine, Consume consume) {
  std::size_t all_see = d.nk, any_sees = 0;  // keys visible to every / to some row
  for (std::size_t r = 0; r < rows; ++r) {
    const std::size_t n = mask.visible_keys(b, i0 + r, d);
    all_see = std::min(all_see, n);
    any_sees = std::max(any_sees, n);
  }
  for (const auto& [lo, hi] : ranges) {
    constexpr std::size_t tile = OnlineSoftmax::kCols;
    for (std::size_t c0 = lo, cols = 0; c0 < std::min(hi, any_sees); c0 += cols) {
      cols = std::min({tile - c0 % tile, hi - c0, any_sees - c0});
      float* s = engine.scores(kt + (c0 / tile) * d.dk * tile + c0 % tile, tile, cols);
      for (std::size_t r = 0; r < rows; ++r) {
        float* row = s + r * OnlineSoftmax::kCols;
        if (c0 + cols > all_see) {
          const std::size_t n = mask.visible_keys(b, i0 + r, d);
          for (std::size_t j = std::max(c0, n); j < c0 + cols; ++j) row[j - c0] = kNegInf;
        }
        if (const bool* allowed = mask.allowed_row(b, h, i0 + r))
          for (std::size_t j = 0; j < cols; ++j)
            if (!allowed[c0 + j]) row[j] = kNegInf;
      }
      consume(c0, cols);
    }
  }
}

}  // namespace

void attend_key_ranges(const Tensor& q, const float* kt, const Tensor& v, const Mask& mask,
                       const Dims& d, std::size_t b, std::size_t h, std::size_t i0,
                       std::size_t rows,
                       const std::vector<std::pair<std::size_t, std::size_t>>& ranges,
                       float scale, OnlineSoftmax& softmax, Tensor& out, float* lse) {
  softmax.start(&q(b, h, i0, 0), rows, scale);
  for_each_masked_tile(kt, mask, d, b, h, i0, rows, ranges, softmax,
                       [&](std::size_t c0, std::size_t cols) {
                         softmax.fold(&v(b, h, c0, 0), d.dv, cols);
                       });
  softmax.finish(&out(b, h, i0, 0), d.dv, lse);
}

void backprop_key_ranges(const Tensor& q, const float* kt, const Tensor& k, const float* vt,
                         const Tensor& out, const Tensor& d_out, const float* lse,
                         const Mask& mask, const Dims& d, std::size_t b, std::size_t h,
                         std::size_t i0, std::size_t rows,
                         const std::vector<std::pair<std::size_t, std::size_t>>& ranges,
                         float scale, SoftmaxBackward& grad, Tensor& dq, float* dk, float* dv) {
  grad.start(&q(b, h, i0, 0), d.dk, &out(b, h, i0, 0), &d_out(b, h, i0, 0), d.dv, lse, 1, rows,
             scale);
  constexpr std::size_t tile = OnlineSoftmax::kCols;
  for_each_masked_tile(kt, mask, d, b, h, i0, rows, ranges, grad,
                       [&](std::size_t c0, std::size_t cols) {
                         grad.backprop(&k(b, h, c0, 0), d.dk,
                                       vt + (c0 / tile) * d.dv * tile + c0 % tile, tile,
                                       dk + c0 * d.dk, d.dk, dv + c0 * d.dv, d.dv, cols);
                       });
  grad.finish(&dq(b, h, i0, 0), d.dk);
}

}  // namespace attnlab::kernels
