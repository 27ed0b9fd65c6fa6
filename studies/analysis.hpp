// Small numerical helpers of the studies (not installed): singular values, attention statistics.
#pragma once

#include <cstddef>
#include <vector>

#include "attnlab/tensor.hpp"

namespace attnlab::studies {

/// Singular values of the row-major [rows, cols] matrix `a`, descending, computed in float64
/// (LAPACK gesdd through xtensor-blas).
std::vector<double> singular_values(const float* a, std::size_t rows, std::size_t cols);

/// c_k = (s_1 + ... + s_k) / (s_1 + ... + s_n) for k = 1..n: Linformer's normalised cumulative
/// singular values. All zeros -> all ones.
std::vector<double> normalized_cumulative(const std::vector<double>& s);

/// Attention statistics of one head's probabilities p [Nq, Nk] (rows sum to 1), averaged over
/// rows: the weight each query puts on its own position (Nq == Nk), the row entropy in nats,
/// and the share of rows whose largest weight is on the diagonal.
struct HeadStats {
  double self_mass = 0, entropy = 0, self_argmax = 0;
};
HeadStats head_stats(const Tensor& p, std::size_t b, std::size_t h);

/// Median of `x` (not empty; the mean of the middle two for an even count).
double median(std::vector<double> x);

}  // namespace attnlab::studies
