#include "variants/feature_maps.hpp"

#include <algorithm>
#include <cmath>
#include <random>

#include "attnlab/error.hpp"
#include "attnlab/kernels.hpp"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define ATTNLAB_FEATURES_AVX2 1
#endif

namespace attnlab {
namespace {

// GCC keeps min/max/select loops on floats scalar and branchy under the default trapping-math
// rules, which made the feature maps cost more than the products; hence the intrinsics.
constexpr float kLog2e = 1.4426950408889634f;

// out = elu(x) + 1 = x + 1 for x > 0, exp(x) otherwise.
void elu1(const float* x, float* out, std::size_t n) {
  std::size_t i = 0;
#ifdef ATTNLAB_FEATURES_AVX2
  const __m256 zero = _mm256_setzero_ps(), log2e = _mm256_set1_ps(kLog2e);
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_min_ps(_mm256_loadu_ps(x + i), zero), log2e));
#endif
  for (; i < n; ++i) out[i] = std::min(x[i], 0.0f) * kLog2e;
  kernels::exp2_inplace(out, n);
  i = 0;
#ifdef ATTNLAB_FEATURES_AVX2
  const __m256 one = _mm256_set1_ps(1.0f);
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 positive = _mm256_cmp_ps(v, zero, _CMP_GT_OQ);
    _mm256_storeu_ps(out + i,
                     _mm256_blendv_ps(_mm256_loadu_ps(out + i), _mm256_add_ps(v, one), positive));
  }
#endif
  for (; i < n; ++i)
    if (x[i] > 0.0f) out[i] = x[i] + 1.0f;
}

void relu(const float* x, float* out, std::size_t n) {
  std::size_t i = 0;
#ifdef ATTNLAB_FEATURES_AVX2
  const __m256 zero = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_max_ps(_mm256_loadu_ps(x + i), zero));
#endif
  for (; i < n; ++i) out[i] = std::max(x[i], 0.0f);
}

}  // namespace

const char* feature_name(Feature f) {
  switch (f) {
    case Feature::elu1:
      return "elu1";
    case Feature::relu:
      return "relu";
    case Feature::favor:
      return "favor";
    case Feature::dpfp:
      return "dpfp";
    case Feature::taylor:
      return "taylor";
  }
  return "?";
}

xt::xtensor<float, 2> favor_projection(std::size_t m, std::size_t dk, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  xt::xtensor<float, 2> w = xt::xtensor<float, 2>::from_shape({m, dk});
  std::vector<double> block(dk * dk);
  for (std::size_t r0 = 0; r0 < m; r0 += dk) {
    // Rows of a Gaussian matrix, orthonormalised (modified Gram-Schmidt): a uniformly random
    // orthonormal block, independent of the other blocks.
    for (double& x : block) x = normal(rng);
    for (std::size_t i = 0; i < dk; ++i) {
      double* row = &block[i * dk];
      for (std::size_t j = 0; j < i; ++j) {
        const double* prev = &block[j * dk];
        double dot = 0;
        for (std::size_t c = 0; c < dk; ++c) dot += row[c] * prev[c];
        for (std::size_t c = 0; c < dk; ++c) row[c] -= dot * prev[c];
      }
      double norm = 0;
      for (std::size_t c = 0; c < dk; ++c) norm += row[c] * row[c];
      norm = std::sqrt(norm);
      for (std::size_t c = 0; c < dk; ++c) row[c] /= norm;
    }
    // Each direction gets the length of an independent Gaussian vector (chi(Dk)), so every row
    // is marginally N(0, I): what makes the estimate unbiased.
    for (std::size_t i = 0; i < dk && r0 + i < m; ++i) {
      double len = 0;
      for (std::size_t c = 0; c < dk; ++c) {
        const double g = normal(rng);
        len += g * g;
      }
      len = std::sqrt(len);
      for (std::size_t c = 0; c < dk; ++c)
        w(r0 + i, c) = static_cast<float>(block[i * dk + c] * len);
    }
  }
  return w;
}

xt::xtensor<float, 2> taylor_projection(std::size_t rows, std::size_t dk, std::uint64_t seed) {
  xt::xtensor<float, 2> p = favor_projection(rows, dk, seed);
  for (std::size_t r = 0; r < rows; ++r) {
    double norm = 0;
    for (std::size_t c = 0; c < dk; ++c) norm += double(p(r, c)) * p(r, c);
    norm = std::sqrt(norm);
    for (std::size_t c = 0; c < dk; ++c) p(r, c) = static_cast<float>(p(r, c) / norm);
  }
  return p;
}

FeatureMap::FeatureMap(Feature f, std::size_t dk, std::size_t m, std::size_t nu, std::uint64_t seed,
                       double scale)
    : feature_(f), dk_(dk), dim_(dk), nu_(nu) {
  ATTNLAB_ASSERT(dk >= 1);
  if (f == Feature::dpfp) {
    ATTNLAB_ASSERT(nu >= 1 && nu < 2 * dk);
    dim_ = 2 * dk * nu;
  }
  if (f == Feature::taylor) {
    ATTNLAB_ASSERT(m >= 1 && m <= dk);
    taylor_dim_ = m;
    dim_ = 1 + m + m * m;
    const double root4 = std::pow(static_cast<double>(m), -0.25);
    if (m < dk) {
      const xt::xtensor<float, 2> p = taylor_projection(m, dk, seed);
      w_.resize(m * dk);
      for (std::size_t r = 0; r < m; ++r)
        for (std::size_t c = 0; c < dk; ++c) w_[r * dk + c] = static_cast<float>(p(r, c) * root4);
    } else {
      scale_ = static_cast<float>(root4);  // no projection: x' = x · d'^(-1/4)
    }
  }
  if (f == Feature::favor) {
    ATTNLAB_ASSERT(m >= 1);
    dim_ = m;
    scale_ = static_cast<float>(scale);
    log_norm_ = static_cast<float>(-0.5 * std::log(static_cast<double>(m)));
    const xt::xtensor<float, 2> w = favor_projection(m, dk, seed);
    const double root = std::sqrt(scale);
    wt_.resize(dk * m);
    w_.resize(m * dk);
    for (std::size_t r = 0; r < m; ++r)
      for (std::size_t c = 0; c < dk; ++c)
        w_[r * dk + c] = wt_[c * m + r] = static_cast<float>(w(r, c) * root);
  }
}

void FeatureMap::taylor_input(const float* x, float* xp) const {
  const std::size_t m = taylor_dim_;
  if (w_.empty()) {
    for (std::size_t a = 0; a < m; ++a) xp[a] = x[a] * scale_;
    return;
  }
  for (std::size_t r = 0; r < m; ++r) {
    float sum = 0.0f;
    for (std::size_t c = 0; c < dk_; ++c) sum += w_[r * dk_ + c] * x[c];
    xp[r] = sum;
  }
}

void FeatureMap::map(const float* x, std::size_t rows, float* out) const {
  switch (feature_) {
    case Feature::taylor: {
      const std::size_t m = taylor_dim_;
      const float half = static_cast<float>(std::sqrt(0.5));
      std::vector<float> xp(m);
      for (std::size_t i = 0; i < rows; ++i) {
        taylor_input(x + i * dk_, xp.data());
        float* o = out + i * dim_;
        o[0] = 1.0f;
        std::copy(xp.begin(), xp.end(), o + 1);
        float* outer = o + 1 + m;
        for (std::size_t a = 0; a < m; ++a)
          for (std::size_t b = 0; b < m; ++b) outer[a * m + b] = xp[a] * xp[b] * half;
      }
      return;
    }
    case Feature::elu1:
      elu1(x, out, rows * dk_);
      return;
    case Feature::relu:
      relu(x, out, rows * dk_);
      return;
    case Feature::favor:
      // log phi = w·x' - |x'|^2 / 2 - log sqrt(m), with x' = x sqrt(scale) folded into wt_.
      kernels::gemm_tile(rows, dim_, dk_, x, dk_, wt_.data(), dim_, out, dim_, false);
      for (std::size_t i = 0; i < rows; ++i) {
        const float* row = x + i * dk_;
        float sq = 0.0f;
        for (std::size_t c = 0; c < dk_; ++c) sq += row[c] * row[c];
        const float shift = 0.5f * scale_ * sq - log_norm_;
        float* o = out + i * dim_;
        for (std::size_t r = 0; r < dim_; ++r) o[r] -= shift;
      }
      return;
    case Feature::dpfp: {
      const std::size_t d2 = 2 * dk_;
      std::vector<float> xp(d2);
      for (std::size_t i = 0; i < rows; ++i) {
        const float* row = x + i * dk_;
        for (std::size_t c = 0; c < dk_; ++c) {
          xp[c] = std::max(row[c], 0.0f);
          xp[dk_ + c] = std::max(-row[c], 0.0f);
        }
        float* o = out + i * dim_;
        for (std::size_t j = 1; j <= nu_; ++j)
          for (std::size_t a = 0; a < d2; ++a) o[(j - 1) * d2 + a] = xp[a] * xp[(a + d2 - j) % d2];
      }
      return;
    }
  }
}

void FeatureMap::backward(const float* x, std::size_t rows, const float* phi, const float* d_phi,
                          float* dx) const {
  switch (feature_) {
    case Feature::taylor: {
      // dx'_a = dphi[1 + a] + sum_b (G_ab + G_ba) x'_b / sqrt(2), G the outer block's gradient;
      // dx = (P / d'^(1/4))^T dx', or dx' · d'^(-1/4) without a projection.
      const std::size_t m = taylor_dim_;
      const float half = static_cast<float>(std::sqrt(0.5));
      std::vector<float> xp(m), dxp(m);
      for (std::size_t i = 0; i < rows; ++i) {
        taylor_input(x + i * dk_, xp.data());
        const float* g = d_phi + i * dim_;
        const float* outer = g + 1 + m;
        for (std::size_t a = 0; a < m; ++a) {
          float sum = 0.0f;
          for (std::size_t b = 0; b < m; ++b) sum += (outer[a * m + b] + outer[b * m + a]) * xp[b];
          dxp[a] = g[1 + a] + sum * half;
        }
        float* d = dx + i * dk_;
        if (w_.empty()) {
          for (std::size_t a = 0; a < m; ++a) d[a] = dxp[a] * scale_;
          continue;
        }
        std::fill(d, d + dk_, 0.0f);
        for (std::size_t r = 0; r < m; ++r)
          for (std::size_t c = 0; c < dk_; ++c) d[c] += w_[r * dk_ + c] * dxp[r];
      }
      return;
    }
    case Feature::elu1:  // d/dx (x + 1) = 1; d/dx exp(x) = exp(x) = phi
      for (std::size_t i = 0; i < rows * dk_; ++i) dx[i] = d_phi[i] * (x[i] > 0.0f ? 1.0f : phi[i]);
      return;
    case Feature::relu:
      for (std::size_t i = 0; i < rows * dk_; ++i) dx[i] = x[i] > 0.0f ? d_phi[i] : 0.0f;
      return;
    case Feature::favor: {
      // d log phi_r = d_phi_r · phi_r; log phi_r = w_r·x' - scale |x|^2 / 2 - log sqrt(m), so
      // dx = W' d(log phi) - scale · x · sum_r d(log phi_r), W' = W sqrt(scale) [m x Dk].
      std::vector<float> dlog(rows * dim_);
      std::vector<float> total(rows, 0.0f);
      for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t r = 0; r < dim_; ++r) {
          const float g = d_phi[i * dim_ + r] * phi[i * dim_ + r];
          dlog[i * dim_ + r] = g;
          total[i] += g;
        }
      kernels::gemm_tile(rows, dk_, dim_, dlog.data(), dim_, w_.data(), dk_, dx, dk_, false);
      for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t c = 0; c < dk_; ++c) dx[i * dk_ + c] -= scale_ * x[i * dk_ + c] * total[i];
      return;
    }
    case Feature::dpfp: {
      // phi[(j-1)·2Dk + a] = x'[a] · x'[(a - j) mod 2Dk]: each x'[b] appears as the first factor
      // (a = b) and as the second (a = b + j) of every roll j.
      const std::size_t d2 = 2 * dk_;
      std::vector<float> xp(d2), dxp(d2);
      for (std::size_t i = 0; i < rows; ++i) {
        const float* row = x + i * dk_;
        for (std::size_t c = 0; c < dk_; ++c) {
          xp[c] = std::max(row[c], 0.0f);
          xp[dk_ + c] = std::max(-row[c], 0.0f);
        }
        std::fill(dxp.begin(), dxp.end(), 0.0f);
        const float* g = d_phi + i * dim_;
        for (std::size_t j = 1; j <= nu_; ++j)
          for (std::size_t a = 0; a < d2; ++a) {
            const float ga = g[(j - 1) * d2 + a];
            dxp[a] += ga * xp[(a + d2 - j) % d2];
            dxp[(a + d2 - j) % d2] += ga * xp[a];
          }
        for (std::size_t c = 0; c < dk_; ++c)
          dx[i * dk_ + c] = (row[c] > 0.0f ? dxp[c] : 0.0f) - (row[c] < 0.0f ? dxp[dk_ + c] : 0.0f);
      }
      return;
    }
  }
}

}  // namespace attnlab
