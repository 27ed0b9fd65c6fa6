// Linear attention written out in float64 from its definitions (variants/linear.hpp), on
// float32 or float64 inputs: the O(N^2) kernel-matrix form of the sum rule and the fast-weight
// recurrence of the delta rule, independent of the kernels. What the forward tests compare
// against and the backward tests take finite differences of.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attnlab/attnlab.hpp"
#include "variants/linear.hpp"

namespace attnlab::test {

// phi(x) in fp64, written from the definitions (favor: log phi, unstabilised).
template <class T>
inline std::vector<double> phi64(const LinearConfig& c, const xt::xtensor<float, 2>& w, const T* x,
                                 std::size_t dk, double scale) {
  std::vector<double> out;
  switch (c.feature) {
    case Feature::elu1:
      for (std::size_t a = 0; a < dk; ++a) out.push_back(x[a] > 0 ? x[a] + 1.0 : std::exp(x[a]));
      break;
    case Feature::relu:
      for (std::size_t a = 0; a < dk; ++a) out.push_back(std::max<double>(x[a], 0.0));
      break;
    case Feature::favor: {
      double sq = 0;
      for (std::size_t a = 0; a < dk; ++a) sq += double(x[a]) * x[a] * scale;
      for (std::size_t r = 0; r < w.shape()[0]; ++r) {
        double proj = 0;
        for (std::size_t a = 0; a < dk; ++a) proj += double(w(r, a)) * x[a] * std::sqrt(scale);
        out.push_back(proj - sq / 2 - 0.5 * std::log(double(w.shape()[0])));
      }
      break;
    }
    case Feature::dpfp: {
      std::vector<double> xp(2 * dk);
      for (std::size_t a = 0; a < dk; ++a) {
        xp[a] = std::max<double>(x[a], 0.0);
        xp[dk + a] = std::max<double>(-x[a], 0.0);
      }
      for (std::size_t j = 1; j <= std::size_t(c.nu); ++j)
        for (std::size_t a = 0; a < 2 * dk; ++a)
          out.push_back(xp[a] * xp[(a + 2 * dk - j) % (2 * dk)]);
      break;
    }
  }
  return out;
}

inline double max_of(const std::vector<double>& x) {
  return *std::max_element(x.begin(), x.end());
}

// Stabilised and (delta rule) sum-normalised features of one row, per the header.
inline std::vector<double> row_phi(const LinearConfig& c, std::vector<double> f, bool normalise) {
  if (c.feature == Feature::favor) {
    const double top = max_of(f);
    for (double& x : f) x = std::exp(x - top);
  }
  if (normalise) {
    double total = 0;
    for (double x : f) total += x;
    if (total > 0)
      for (double& x : f) x /= total;
  }
  return f;
}

// The O(N^2) form in fp64: the sum rule with the kernel matrix K_ij = phi(q_i)·phi(k_j)
// materialised row by row; the delta rule as its definition, W updated key by key.
template <class T>
inline Tensor64 linear_reference(const LinearConfig& c, const xt::xtensor<T, 4>& q,
                                 const xt::xtensor<T, 4>& k, const xt::xtensor<T, 4>& v,
                                 const Mask& mask) {
  const Dims d{q.shape()[0], q.shape()[1], q.shape()[2], k.shape()[2], q.shape()[3], v.shape()[3]};
  const double scale = mask.softmax_scale(d.dk);
  const xt::xtensor<float, 2> w =
      c.feature == Feature::favor ? favor_projection(c.m, d.dk, c.seed) : xt::xtensor<float, 2>();
  Tensor64 out = xt::zeros<double>({d.batch, d.heads, d.nq, d.dv});
  const bool causal = mask.causal != Causal::none;
  for (std::size_t b = 0; b < d.batch; ++b)
    for (std::size_t h = 0; h < d.heads; ++h) {
      std::vector<std::vector<double>> fk, fq;
      for (std::size_t j = 0; j < d.nk; ++j) fk.push_back(phi64(c, w, &k(b, h, j, 0), d.dk, scale));
      for (std::size_t i = 0; i < d.nq; ++i) fq.push_back(phi64(c, w, &q(b, h, i, 0), d.dk, scale));
      const std::size_t p = fk[0].size();
      if (c.rule == LinearRule::sum) {
        for (std::size_t i = 0; i < d.nq; ++i) {
          const std::size_t n = mask.visible_keys(b, i, d);
          const std::vector<double> phq = row_phi(c, fq[i], false);
          double ck = -std::numeric_limits<double>::infinity();  // favor: max over visible keys
          if (c.feature == Feature::favor)
            for (std::size_t j = 0; j < n; ++j) ck = std::max(ck, max_of(fk[j]));
          std::vector<double> num(d.dv, 0.0);
          double den = 0;
          for (std::size_t j = 0; j < n; ++j) {
            double kij = 0;
            for (std::size_t r = 0; r < p; ++r)
              kij += phq[r] * (c.feature == Feature::favor ? std::exp(fk[j][r] - ck) : fk[j][r]);
            for (std::size_t col = 0; col < d.dv; ++col) num[col] += kij * v(b, h, j, col);
            den += kij;
          }
          for (std::size_t col = 0; col < d.dv; ++col)
            out(b, h, i, col) = den > 0 ? num[col] / (den + c.eps) : 0.0;
        }
        continue;
      }
      std::vector<double> mem(d.dv * p, 0.0);  // W [Dv x P]
      const std::size_t valid = mask.has_key_lengths() ? mask.key_lengths[b] : d.nk;
      auto write = [&](std::size_t j) {
        const std::vector<double> phk = row_phi(c, fk[j], true);
        for (std::size_t col = 0; col < d.dv; ++col) {
          double vbar = 0;
          for (std::size_t r = 0; r < p; ++r) vbar += mem[col * p + r] * phk[r];
          const double delta = c.beta * (v(b, h, j, col) - vbar);
          for (std::size_t r = 0; r < p; ++r) mem[col * p + r] += delta * phk[r];
        }
      };
      auto read = [&](std::size_t i) {
        const std::vector<double> phq = row_phi(c, fq[i], true);
        for (std::size_t col = 0; col < d.dv; ++col) {
          double y = 0;
          for (std::size_t r = 0; r < p; ++r) y += mem[col * p + r] * phq[r];
          out(b, h, i, col) = y;
        }
      };
      if (causal) {
        for (std::size_t i = 0; i < d.nq; ++i) {
          if (i < valid) write(i);
          read(i);
        }
      } else {
        for (std::size_t j = 0; j < valid; ++j) write(j);
        for (std::size_t i = 0; i < d.nq; ++i) read(i);
      }
    }
  return out;
}

}  // namespace attnlab::test
