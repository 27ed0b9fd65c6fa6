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

}  // namespace attnlab::studies
