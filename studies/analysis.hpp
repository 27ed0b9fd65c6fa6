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

/// Attention statistics of one head, averaged over its rows.
struct HeadStats {
  double self_mass = 0;    ///< the weight a query puts on its own position
  double entropy = 0;      ///< the row entropy in nats
  double self_argmax = 0;  ///< the share of rows whose largest weight is on the diagonal
};

/// HeadStats of head (b, h) of self-attention probabilities p [B, H, N, N] (rows sum to 1);
/// throws Error when Nq != Nk.
HeadStats head_stats(const Tensor& p, std::size_t b, std::size_t h);

}  // namespace attnlab::studies
