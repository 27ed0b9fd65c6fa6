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

/// The smallest k with c[k - 1] >= share (c ascending, as normalized_cumulative gives it): the
/// rank that holds `share` of the singular values' sum.
std::size_t rank_for_share(const std::vector<double>& c, double share);

/// ||S - S^T||_F / ||S||_F of the scores S = q k^T of head (b, h) (q, k [B, H, N, dk], before
/// scaling, softmax and any mask; 0 for S = 0), accumulated in float64.
double score_asymmetry(const Tensor& q, const Tensor& k, std::size_t b, std::size_t h);

/// How far a matrix X [n, d] (row-major) is from rank one, relative to ||X||_F.
struct RankResiduals {
  double token_mean = 0;  ///< ||X - 1 x^T||_F / ||X||_F, x the mean row (Dong et al.'s res)
  double rank1 = 0;       ///< ||X - X_1||_F / ||X||_F, X_1 the best rank-1 approximation
};

/// RankResiduals of x [n, d] (all zero for X = 0).
RankResiduals rank_residuals(const float* x, std::size_t n, std::size_t d);

/// Where a head looks by position, averaged over its rows (Voita et al. 2019's positional heads).
struct PositionStats {
  double distance = 0;         ///< sum_j P_ij |i - j|: the mean distance attended over
  double previous_mass = 0;    ///< P_i,i-1, over the rows i >= 1
  double previous_argmax = 0;  ///< the share of rows i >= 1 whose largest weight is on i - 1
};

/// PositionStats of head (b, h) of self-attention probabilities p [B, H, N, N]; throws Error
/// when Nq != Nk.
PositionStats position_stats(const Tensor& p, std::size_t b, std::size_t h);

/// sum_j P_ij [flagged[j]] averaged over the rows of head (b, h) of p [B, H, Nq, Nk]: the weight
/// a head puts on the flagged keys (flagged has Nk entries; throws Error otherwise).
double flagged_mass(const Tensor& p, std::size_t b, std::size_t h,
                    const std::vector<bool>& flagged);

}  // namespace attnlab::studies
