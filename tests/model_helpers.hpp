// Test helpers for the model layers: random activations, parameter perturbation and a direct
// float64 computation of every layer, written from the formulas (not from the layers' code).
#pragma once

#include <cmath>
#include <optional>
#include <random>
#include <string>

#include <catch2/catch.hpp>

#include "attnlab/attnlab.hpp"
#include "models/transformer.hpp"

namespace attnlab::test {

using models::Activations;
using Act64 = xt::xtensor<double, 3>;

/// Standard normal activations [b, n, d] times `stddev`.
inline Activations random_activations(std::size_t b, std::size_t n, std::size_t d,
                                      std::uint64_t seed, float stddev = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  Activations x = Activations::from_shape({b, n, d});
  for (float& v : x) v = normal(rng);
  return x;
}

/// Adds N(0, 0.1^2) to every bias and LayerNorm entry (zero and one after initialisation), so
/// the tests see them; keeps tied K blocks equal to their Q blocks.
inline void perturb(models::Parameters params, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.1f);
  for (const auto& p : params)
    if (p.name.find("bias") != std::string::npos || p.name.find("norm") != std::string::npos)
      for (std::size_t i = 0; i < p.size(); ++i) p.data[i] += normal(rng);
}

/// Re-ties the K bias block to the Q block after perturb().
inline void retie(models::MultiHeadAttention& m) {
  if (m.tied_qk())
    std::copy_n(m.in_proj_bias.data(), m.d_model(), m.in_proj_bias.data() + m.d_model());
}

/// |out - ref| <= atol + rtol·|ref| everywhere; on failure reports the first bad element.
inline void require_close(const Activations& out, const Act64& ref, double rtol, double atol) {
  REQUIRE(out.shape() == ref.shape());
  for (std::size_t i = 0; i < out.size(); ++i) {
    const double o = out.data()[i], r = ref.data()[i];
    if (!(std::abs(o - r) <= atol + rtol * std::abs(r)))
      FAIL("element " << i << " of " << models::shape_text(out) << ": got " << o << ", expected "
                      << r << " (rtol " << rtol << ", atol " << atol << ")");
  }
}

/// y = x W^T + b, rows of W from `row0` (a block of a stacked matrix), in float64.
inline Act64 linear64(const Act64& x, const models::Matrix& w, const float* b, std::size_t row0,
                      std::size_t out) {
  const std::size_t in = w.shape()[1];
  Act64 y = Act64::from_shape({x.shape()[0], x.shape()[1], out});
  for (std::size_t bi = 0; bi < x.shape()[0]; ++bi)
    for (std::size_t i = 0; i < x.shape()[1]; ++i)
      for (std::size_t o = 0; o < out; ++o) {
        double s = b[row0 + o];
        for (std::size_t c = 0; c < in; ++c) s += x(bi, i, c) * double(w(row0 + o, c));
        y(bi, i, o) = s;
      }
  return y;
}

inline Act64 linear64(const Act64& x, const models::Linear& l) {
  return linear64(x, l.weight, l.bias.data(), 0, l.weight.shape()[0]);
}

inline Act64 layer_norm64(const Act64& x, const models::LayerNorm& n) {
  Act64 y = x;
  const std::size_t d = x.shape()[2];
  for (std::size_t b = 0; b < x.shape()[0]; ++b)
    for (std::size_t i = 0; i < x.shape()[1]; ++i) {
      double mean = 0, var = 0;
      for (std::size_t c = 0; c < d; ++c) mean += x(b, i, c) / double(d);
      for (std::size_t c = 0; c < d; ++c)
        var += (x(b, i, c) - mean) * (x(b, i, c) - mean) / double(d);
      for (std::size_t c = 0; c < d; ++c)
        y(b, i, c) = (x(b, i, c) - mean) / std::sqrt(var + n.eps) * n.weight[c] + n.bias[c];
    }
  return y;
}

inline Act64 ffn64(const Act64& x, const models::FeedForward& f) {
  Act64 h = linear64(x, f.linear1);
  for (double& v : h) v = std::max(v, 0.0);
  return linear64(h, f.linear2);
}

/// MultiHead(query, memory) under `mask`, one head and one query at a time.
inline Act64 mha64(const Act64& query, const Act64& memory, const models::MultiHeadAttention& m,
                   const Mask& mask) {
  const std::size_t d = m.d_model(), h = m.heads(), dk = d / h, batch = query.shape()[0],
                    nq = query.shape()[1], nk = memory.shape()[1];
  const Act64 q = linear64(query, m.in_proj_weight, m.in_proj_bias.data(), 0, d);
  const Act64 k = linear64(memory, m.in_proj_weight, m.in_proj_bias.data(), d, d);
  const Act64 v = linear64(memory, m.in_proj_weight, m.in_proj_bias.data(), 2 * d, d);
  const Dims dims{batch, h, nq, nk, dk, dk};
  const double scale = mask.scale ? *mask.scale : 1.0 / std::sqrt(double(dk));
  Act64 concat = xt::zeros<double>({batch, nq, d});
  for (std::size_t b = 0; b < batch; ++b)
    for (std::size_t head = 0; head < h; ++head)
      for (std::size_t i = 0; i < nq; ++i) {
        std::vector<double> w(nk, 0.0);
        double max = -INFINITY, sum = 0;
        for (std::size_t j = 0; j < nk; ++j) {
          if (!mask.may_attend(b, head, i, j, dims)) continue;
          double s = 0;
          for (std::size_t c = 0; c < dk; ++c) s += q(b, i, head * dk + c) * k(b, j, head * dk + c);
          w[j] = s * scale;
          max = std::max(max, w[j]);
        }
        for (std::size_t j = 0; j < nk; ++j) {
          w[j] = mask.may_attend(b, head, i, j, dims) ? std::exp(w[j] - max) : 0.0;
          sum += w[j];
        }
        for (std::size_t j = 0; j < nk; ++j)
          for (std::size_t c = 0; c < dk; ++c)
            concat(b, i, head * dk + c) += sum > 0 ? w[j] / sum * v(b, j, head * dk + c) : 0.0;
      }
  return linear64(concat, m.out_proj);
}

/// A residual sublayer by the paper's formulas: post-LN LN(x + f(x)), pre-LN x + f(LN(x)).
template <class F>
Act64 sublayer64(const models::LayerConfig& c, const std::optional<models::LayerNorm>& norm,
                 const Act64& x, F f) {
  auto ln = [&](const Act64& a) { return norm ? layer_norm64(a, *norm) : a; };
  const Act64 branch = c.pre_ln ? f(ln(x)) : f(x);
  const Act64 sum = c.skip ? Act64(x + branch) : branch;
  return c.pre_ln ? sum : ln(sum);
}

inline Act64 encoder_layer64(const models::EncoderLayer& l, const Act64& x, const Mask& mask) {
  const auto& c = l.config();
  Act64 h =
      sublayer64(c, l.norm1, x, [&](const Act64& a) { return mha64(a, a, l.self_attn, mask); });
  if (!l.ffn) return h;
  return sublayer64(c, l.norm2, h, [&](const Act64& a) { return ffn64(a, *l.ffn); });
}

inline Act64 decoder_layer64(const models::DecoderLayer& l, const Act64& x, const Act64& memory,
                             const Mask& memory_mask) {
  const auto& c = l.config();
  Mask causal;
  causal.causal = Causal::top_left;
  Act64 h =
      sublayer64(c, l.norm1, x, [&](const Act64& a) { return mha64(a, a, l.self_attn, causal); });
  h = sublayer64(c, l.norm2, h,
                 [&](const Act64& a) { return mha64(a, memory, l.multihead_attn, memory_mask); });
  if (!l.ffn) return h;
  return sublayer64(c, l.norm3, h, [&](const Act64& a) { return ffn64(a, *l.ffn); });
}

/// float32 -> float64 activations.
inline Act64 to64(const Activations& x) {
  return xt::cast<double>(x);
}

}  // namespace attnlab::test
