#include "studies/analysis.hpp"

#include <algorithm>
#include <cmath>

#include <xtensor-blas/xlinalg.hpp>

#include "attnlab/error.hpp"

namespace attnlab::studies {

std::vector<double> singular_values(const float* a, std::size_t rows, std::size_t cols) {
  xt::xtensor<double, 2> m = xt::xtensor<double, 2>::from_shape({rows, cols});
  std::copy(a, a + rows * cols, m.begin());
  const auto [u, s, vt] = xt::linalg::svd(m, false, false);
  std::vector<double> out(s.begin(), s.end());
  std::sort(out.rbegin(), out.rend());
  return out;
}

std::vector<double> normalized_cumulative(const std::vector<double>& s) {
  double total = 0;
  for (double x : s) total += x;
  std::vector<double> c(s.size(), 1.0);
  if (total <= 0) return c;
  double sum = 0;
  for (std::size_t i = 0; i < s.size(); ++i) c[i] = (sum += s[i]) / total;
  return c;
}

HeadStats head_stats(const Tensor& p, std::size_t b, std::size_t h) {
  const std::size_t nq = p.shape()[2], nk = p.shape()[3];
  if (nq != nk) throw Error("head_stats: needs self-attention probabilities (Nq == Nk)");
  HeadStats s;
  for (std::size_t i = 0; i < nq; ++i) {
    const float* row = &p(b, h, i, 0);
    s.self_mass += row[i];
    s.self_argmax += std::max_element(row, row + nk) == row + i ? 1 : 0;
    for (std::size_t j = 0; j < nk; ++j)
      if (row[j] > 0) s.entropy -= row[j] * std::log(double(row[j]));
  }
  s.self_mass /= double(nq);
  s.entropy /= double(nq);
  s.self_argmax /= double(nq);
  return s;
}

std::size_t rank_for_share(const std::vector<double>& c, double share) {
  return std::size_t(std::lower_bound(c.begin(), c.end(), share - 1e-12) - c.begin()) + 1;
}

double score_asymmetry(const Tensor& q, const Tensor& k, std::size_t b, std::size_t h) {
  const std::size_t n = q.shape()[2], dk = q.shape()[3];
  std::vector<double> s(n * n, 0.0);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < n; ++j)
      for (std::size_t c = 0; c < dk; ++c) s[i * n + j] += double(q(b, h, i, c)) * k(b, h, j, c);
  double anti = 0, all = 0;
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      anti += (s[i * n + j] - s[j * n + i]) * (s[i * n + j] - s[j * n + i]);
      all += s[i * n + j] * s[i * n + j];
    }
  return all > 0 ? std::sqrt(anti / all) : 0.0;
}

RankResiduals rank_residuals(const float* x, std::size_t n, std::size_t d) {
  std::vector<double> mean(d, 0.0);
  double total = 0, off_mean = 0;
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t c = 0; c < d; ++c) mean[c] += x[i * d + c] / double(n);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t c = 0; c < d; ++c) {
      const double v = x[i * d + c];
      total += v * v;
      off_mean += (v - mean[c]) * (v - mean[c]);
    }
  if (total == 0) return {0, 0};
  const auto s = singular_values(x, n, d);
  double tail = 0;
  for (std::size_t k = 1; k < s.size(); ++k) tail += s[k] * s[k];
  return {std::sqrt(off_mean / total), std::sqrt(tail / total)};
}

PositionStats position_stats(const Tensor& p, std::size_t b, std::size_t h) {
  const std::size_t nq = p.shape()[2], nk = p.shape()[3];
  if (nq != nk) throw Error("position_stats: needs self-attention probabilities (Nq == Nk)");
  PositionStats s;
  for (std::size_t i = 0; i < nq; ++i) {
    const float* row = &p(b, h, i, 0);
    for (std::size_t j = 0; j < nk; ++j) s.distance += row[j] * double(i > j ? i - j : j - i);
    if (i == 0) continue;
    s.previous_mass += row[i - 1];
    s.previous_argmax += std::max_element(row, row + nk) == row + i - 1 ? 1 : 0;
  }
  s.distance /= double(nq);
  if (nq > 1) s.previous_mass /= double(nq - 1), s.previous_argmax /= double(nq - 1);
  return s;
}

double flagged_mass(const Tensor& p, std::size_t b, std::size_t h,
                    const std::vector<bool>& flagged) {
  const std::size_t nq = p.shape()[2], nk = p.shape()[3];
  if (flagged.size() != nk)
    throw Error("flagged_mass: " + std::to_string(flagged.size()) + " flags for " +
                std::to_string(nk) + " keys");
  double mass = 0;
  for (std::size_t i = 0; i < nq; ++i)
    for (std::size_t j = 0; j < nk; ++j)
      if (flagged[j]) mass += p(b, h, i, j);
  return mass / double(nq);
}

}  // namespace attnlab::studies
