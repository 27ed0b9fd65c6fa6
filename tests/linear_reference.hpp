// Linear attention written out in float64 from its definitions (variants/linear.hpp), on
// float32 or float64 inputs: the O(N^2) kernel-matrix form of the sum rule and the fast-weight
// recurrence of the delta rule, independent of the kernels; and the scan family's recurrences
// (variants/linear_scan.hpp). What the forward tests compare against and the backward tests
// take finite differences of, from a zero or a given initial state.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attnlab/attnlab.hpp"
#include "variants/linear.hpp"
#include "variants/linear_scan.hpp"

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
    case Feature::taylor: {  // w: the projection P [d' x Dk], or empty for none (d' = Dk)
      const std::size_t m = w.size() ? w.shape()[0] : dk;
      std::vector<double> xp(m);
      for (std::size_t a = 0; a < m; ++a) {
        double proj = 0;
        if (w.size())
          for (std::size_t c2 = 0; c2 < dk; ++c2) proj += double(w(a, c2)) * x[c2];
        else
          proj = x[a];
        xp[a] = proj / std::pow(double(m), 0.25);
      }
      out.push_back(1.0);
      for (std::size_t a = 0; a < m; ++a) out.push_back(xp[a]);
      for (std::size_t a = 0; a < m; ++a)
        for (std::size_t b = 0; b < m; ++b) out.push_back(xp[a] * xp[b] / std::sqrt(2.0));
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

// The projection phi64 takes: favor's random features, taylor's P when d' < Dk, else none.
inline xt::xtensor<float, 2> feature_projection(const LinearConfig& c, std::size_t dk) {
  if (c.feature == Feature::favor) return favor_projection(c.m, dk, c.seed);
  if (c.feature == Feature::taylor && c.taylor_dim > 0 && std::size_t(c.taylor_dim) < dk)
    return taylor_projection(c.taylor_dim, dk, c.seed);
  return xt::xtensor<float, 2>();
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

// A recurrent state in fp64: S [B, H, P, Dv] and, for the sum rule, z [B, H, P].
struct State64 {
  xt::xarray<double> memory, key_sum;
};

// The O(N^2) form in fp64: the sum rule with the kernel matrix K_ij = phi(q_i)·phi(k_j)
// materialised row by row; the delta rule as its definition, W updated key by key. From
// `initial` (S_0, z_0; not favor's sum rule) when given: num_i = phi(q_i)^T S_0 + ..., den_i =
// phi(q_i)^T z_0 + ..., W_0 = S_0^T; `final` gets the state after the last valid key.
template <class T>
inline Tensor64 linear_reference(const LinearConfig& c, const xt::xtensor<T, 4>& q,
                                 const xt::xtensor<T, 4>& k, const xt::xtensor<T, 4>& v,
                                 const Mask& mask, const State64* initial = nullptr,
                                 State64* final = nullptr) {
  const Dims d{q.shape()[0], q.shape()[1], q.shape()[2], k.shape()[2], q.shape()[3], v.shape()[3]};
  const double scale = mask.softmax_scale(d.dk);
  const xt::xtensor<float, 2> w = feature_projection(c, d.dk);
  Tensor64 out = xt::zeros<double>({d.batch, d.heads, d.nq, d.dv});
  const bool causal = mask.causal != Causal::none;
  for (std::size_t b = 0; b < d.batch; ++b)
    for (std::size_t h = 0; h < d.heads; ++h) {
      std::vector<std::vector<double>> fk, fq;
      for (std::size_t j = 0; j < d.nk; ++j) fk.push_back(phi64(c, w, &k(b, h, j, 0), d.dk, scale));
      for (std::size_t i = 0; i < d.nq; ++i) fq.push_back(phi64(c, w, &q(b, h, i, 0), d.dk, scale));
      const std::size_t p = fq[0].size();
      const std::size_t valid = mask.valid_keys(b, d.nk);
      if (final && b == 0 && h == 0) {
        final->memory = xt::zeros<double>({d.batch, d.heads, p, d.dv});
        final->key_sum = c.rule == LinearRule::sum
                             ? xt::xarray<double>(xt::zeros<double>({d.batch, d.heads, p}))
                             : xt::xarray<double>();
      }
      if (c.rule == LinearRule::sum) {
        for (std::size_t i = 0; i < d.nq; ++i) {
          const std::size_t n = mask.visible_keys(b, i, d);
          const std::vector<double> phq = row_phi(c, fq[i], false);
          double ck = -std::numeric_limits<double>::infinity();  // favor: max over visible keys
          if (c.feature == Feature::favor)
            for (std::size_t j = 0; j < n; ++j) ck = std::max(ck, max_of(fk[j]));
          std::vector<double> num(d.dv, 0.0);
          double den = 0;
          if (initial)
            for (std::size_t r = 0; r < p; ++r) {
              for (std::size_t col = 0; col < d.dv; ++col)
                num[col] += phq[r] * initial->memory(b, h, r, col);
              den += phq[r] * initial->key_sum(b, h, r);
            }
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
        if (final)  // favor's is relative to its stabiliser: not compared
          for (std::size_t r = 0; r < p; ++r) {
            double z = initial ? initial->key_sum(b, h, r) : 0.0;
            for (std::size_t j = 0; j < valid; ++j) z += fk[j][r];
            final->key_sum(b, h, r) = z;
            for (std::size_t col = 0; col < d.dv; ++col) {
              double m = initial ? initial->memory(b, h, r, col) : 0.0;
              for (std::size_t j = 0; j < valid; ++j) m += fk[j][r] * v(b, h, j, col);
              final->memory(b, h, r, col) = m;
            }
          }
        continue;
      }
      std::vector<double> mem(d.dv * p, 0.0);  // W [Dv x P]
      if (initial)
        for (std::size_t r = 0; r < p; ++r)
          for (std::size_t col = 0; col < d.dv; ++col)
            mem[col * p + r] = initial->memory(b, h, r, col);
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
      if (final)  // after the causal loop's padded tokens too: they do not write
        for (std::size_t r = 0; r < p; ++r)
          for (std::size_t col = 0; col < d.dv; ++col)
            final->memory(b, h, r, col) = mem[col * p + r];
    }
  return out;
}

// The scan family's recurrence in float64, from the equations of DeltaNet (Schlag et al.
// 2021), RetNet (Sun et al. 2023), GLA / Mamba-2 scalar gates and Gated DeltaNet (Yang et al.
// 2024): S_t = a_t S_{t-1} + k_t u_t^T with u_t = v_t (sum) or beta_t (v_t - a_t S_{t-1}^T k_t),
// from S_0 = 0 or a given initial state.
struct Recurrence {
  bool delta = false, normalise = false, causal = true;
  double beta_value = 1.0;
  std::vector<double> head_g;  // per-head log-decay when no g is given (retnet)
  std::vector<std::int64_t> lengths;
  double scale = 0.0;

  // x = {q, k, v[, g][, beta][, S_0]}; has_g / has_beta / has_state say which are present. The
  // output [B, H, Nq, Dv]; `final`, when not null, gets the state after the last token
  // [B, H, Dk, Dv].
  xt::xarray<double> operator()(const std::vector<xt::xarray<double>>& x, bool has_g, bool has_beta,
                                bool has_state = false, xt::xarray<double>* final = nullptr) const {
    const auto& q = x[0];
    const auto& k = x[1];
    const auto& v = x[2];
    std::size_t next = 3;
    const xt::xarray<double>* g = has_g ? &x[next++] : nullptr;
    const xt::xarray<double>* beta = has_beta ? &x[next++] : nullptr;
    const xt::xarray<double>* s0 = has_state ? &x[next++] : nullptr;
    const std::size_t B = q.shape()[0], H = q.shape()[1], nq = q.shape()[2], nk = k.shape()[2];
    const std::size_t dk = q.shape()[3], dv = v.shape()[3];
    xt::xarray<double> out = xt::zeros<double>({B, H, nq, dv});
    if (final) *final = xt::zeros<double>({B, H, dk, dv});
    auto row = [&](const xt::xarray<double>& t, std::size_t b, std::size_t h, std::size_t i,
                   double s) {
      std::vector<double> r(dk);
      double sq = 0;
      for (std::size_t c = 0; c < dk; ++c) sq += t(b, h, i, c) * t(b, h, i, c);
      const double f = s / (normalise ? std::sqrt(sq + 1e-6) : 1.0);
      for (std::size_t c = 0; c < dk; ++c) r[c] = f * t(b, h, i, c);
      return r;
    };
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t h = 0; h < H; ++h) {
        std::vector<double> s(dk * dv, 0.0);
        if (s0)
          for (std::size_t r = 0; r < dk; ++r)
            for (std::size_t c = 0; c < dv; ++c) s[r * dv + c] = (*s0)(b, h, r, c);
        auto read = [&](std::size_t i) {
          const auto qi = row(q, b, h, i, scale);
          for (std::size_t c = 0; c < dv; ++c) {
            double acc = 0;
            for (std::size_t r = 0; r < dk; ++r) acc += s[r * dv + c] * qi[r];
            out(b, h, i, c) = acc;
          }
        };
        const std::size_t len = lengths.empty() ? nk : std::size_t(lengths[b]);
        for (std::size_t t = 0; t < nk; ++t) {
          if (t < len) {
            const double a = std::exp(g ? (*g)(b, h, t) : head_g.empty() ? 0.0 : head_g[h]);
            for (double& e : s) e *= a;
            const auto kt = row(k, b, h, t, 1.0);
            for (std::size_t c = 0; c < dv; ++c) {
              double u = v(b, h, t, c);
              if (delta) {
                double pred = 0;
                for (std::size_t r = 0; r < dk; ++r) pred += s[r * dv + c] * kt[r];
                u = (beta ? (*beta)(b, h, t) : beta_value) * (u - pred);
              }
              for (std::size_t r = 0; r < dk; ++r) s[r * dv + c] += kt[r] * u;
            }
          }
          if (causal) read(t);
        }
        if (!causal)
          for (std::size_t i = 0; i < nq; ++i) read(i);
        if (final)
          for (std::size_t r = 0; r < dk; ++r)
            for (std::size_t c = 0; c < dv; ++c) (*final)(b, h, r, c) = s[r * dv + c];
      }
    return out;
  }
};

// The recurrence `a` runs under `mask` for head size dk and `heads` heads.
inline Recurrence recurrence_of(const ScanAttention& a, const Mask& mask, std::size_t dk,
                                std::size_t heads) {
  Recurrence r;
  r.delta = a.rule().delta;
  r.normalise = a.rule().normalise;
  r.beta_value = a.rule().beta;
  r.causal = mask.causal != Causal::none;
  r.scale = mask.softmax_scale(dk);
  r.lengths = mask.key_lengths;
  for (std::size_t h = 0; h < heads; ++h) r.head_g.push_back(a.head_log_decay(h, heads));
  return r;
}

}  // namespace attnlab::test
