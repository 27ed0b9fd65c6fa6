#include "attnlab/reference.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <type_traits>

#include "attnlab/error.hpp"

namespace attnlab {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Whether an optional float64 input is given: a default xarray has no axes (and one element).
bool given(const xt::xarray<double>& x) {
  return x.dimension() != 0;
}

// Float64 shapes of q, k, v through the float32 checker (same rules, same messages).
template <class T>
Dims dims_of(const xt::xtensor<T, 4>& q, const xt::xtensor<T, 4>& k, const xt::xtensor<T, 4>& v) {
  const auto empty = [](const xt::xtensor<T, 4>& t) {
    return Tensor::from_shape({t.shape()[0], t.shape()[1], t.shape()[2], t.shape()[3]});
  };
  if constexpr (std::is_same_v<T, float>)
    return check_qkv(q, k, v);
  else
    return check_qkv(empty(q), empty(k), empty(v));
}

// One problem: which pairs are visible (the mask, a pattern, or both) and the modifiers.
struct Rule {
  const Mask* mask = nullptr;  // null: no mask (scale given)
  const Pattern* pattern = nullptr;
  const Modifiers64* mods = nullptr;
  double scale = 1;
  double cap = 0;                 // softcap; 0: none
  std::vector<double> fox;        // F per (b, h) over the keys, padded keys adding nothing
  std::vector<std::size_t> bias;  // bias's element strides, 0 on broadcast axes

  Rule(const Mask* m, const Pattern* p, const Modifiers64* mo, double s, const Dims& d)
      : mask(m), pattern(p), mods(mo), scale(s) {
    if (m && m->softcap) cap = *m->softcap;
    if (mo && given(mo->log_decay)) {
      fox.assign(d.batch * d.heads * d.nk, 0.0);
      for (std::size_t b = 0; b < d.batch; ++b)
        for (std::size_t h = 0; h < d.heads; ++h) {
          double sum = 0;
          for (std::size_t t = 0; t < d.nk; ++t) {
            if (t < (m ? m->valid_keys(b, d.nk) : d.nk)) sum += mo->log_decay(b, h, t);
            fox[(b * d.heads + h) * d.nk + t] = sum;
          }
        }
    }
    if (mo && given(mo->bias)) {
      if (mo->bias.dimension() != 4) throw Error("reference: bias must have 4 axes");
      bias.assign(4, 0);
      std::size_t stride = 1;
      for (std::size_t a = 4; a-- > 0;) {
        bias[a] = mo->bias.shape()[a] == 1 ? 0 : stride;
        stride *= mo->bias.shape()[a];
      }
    }
  }
  bool visible(std::size_t b, std::size_t h, std::size_t i, std::size_t j, const Dims& d) const {
    if (pattern && !(*pattern)(b, h, i, j)) return false;
    return !mask || mask->may_attend(b, h, i, j, d);
  }
  double position(std::size_t i, const Dims& d) const {
    return mask ? static_cast<double>(mask->position(i, d)) : static_cast<double>(i);
  }
  double f_at(std::size_t b, std::size_t h, std::int64_t t, const Dims& d) const {
    const auto at = std::clamp<std::int64_t>(t, 0, static_cast<std::int64_t>(d.nk) - 1);
    return fox[(b * d.heads + h) * d.nk + static_cast<std::size_t>(at)];
  }
  std::size_t bias_at(std::size_t b, std::size_t h, std::size_t i, std::size_t j) const {
    return b * bias[0] + h * bias[1] + i * bias[2] + j * bias[3];
  }
  double sink(std::size_t h) const {
    return mods && !mods->sinks.empty() ? mods->sinks[h] : kNegInf;
  }
};

// Query i of head (b, h): p[j] its probabilities (0 where not visible), s[j] the scaled score
// before the softcap, and p_sink the sink's share. False when it sees nothing (no key, no sink).
template <class T>
bool softmax_row(const xt::xtensor<T, 4>& q, const xt::xtensor<T, 4>& k, const Dims& d,
                 const Rule& rule, std::size_t b, std::size_t h, std::size_t i,
                 std::vector<double>& p, std::vector<double>& s, double& p_sink) {
  const std::size_t kh = d.kv_head(h);
  const double sink = rule.sink(h);
  double top = sink;
  for (std::size_t j = 0; j < d.nk; ++j) {
    p[j] = kNegInf;
    if (!rule.visible(b, h, i, j, d)) continue;
    double dot = 0;
    for (std::size_t c = 0; c < d.dk; ++c)
      dot += static_cast<double>(q(b, h, i, c)) * static_cast<double>(k(b, kh, j, c));
    s[j] = dot * rule.scale;
    double z = rule.cap > 0 ? rule.cap * std::tanh(s[j] / rule.cap) : s[j];
    if (rule.mods) {
      const Modifiers64& m = *rule.mods;
      const double pos = rule.position(i, d);
      if (!m.alibi_slopes.empty()) z -= m.alibi_slopes[h] * std::abs(pos - static_cast<double>(j));
      if (given(m.bias)) z += m.bias.data()[rule.bias_at(b, h, i, j)];
      if (!rule.fox.empty())
        z += rule.f_at(b, h, static_cast<std::int64_t>(pos), d) -
             rule.f_at(b, h, static_cast<std::int64_t>(j), d);
    }
    p[j] = z;
    top = std::max(top, z);
  }
  if (top == kNegInf) return false;
  double total = sink == kNegInf ? 0.0 : std::exp(sink - top);
  for (std::size_t j = 0; j < d.nk; ++j) {
    p[j] = p[j] == kNegInf ? 0.0 : std::exp(p[j] - top);
    total += p[j];
  }
  for (std::size_t j = 0; j < d.nk; ++j) p[j] /= total;
  p_sink = sink == kNegInf ? 0.0 : std::exp(sink - top) / total;
  return true;
}

template <class T>
Tensor64 attention64(const xt::xtensor<T, 4>& q, const xt::xtensor<T, 4>& k,
                     const xt::xtensor<T, 4>& v, const Rule& rule,
                     const std::vector<std::size_t>& rows) {
  const Dims d = dims_of(q, k, v);
  std::vector<std::size_t> queries = rows;
  if (queries.empty())
    for (std::size_t i = 0; i < d.nq; ++i) queries.push_back(i);
  for (std::size_t i : queries)
    if (i >= d.nq) throw Error("reference row " + std::to_string(i) + " is not below Nq");

  Tensor64 out = xt::zeros<double>({d.batch, d.heads, queries.size(), d.dv});
  std::vector<double> p(d.nk), s(d.nk);
  double p_sink = 0;
  for (std::size_t b = 0; b < d.batch; ++b)
    for (std::size_t h = 0; h < d.heads; ++h)
      for (std::size_t r = 0; r < queries.size(); ++r) {
        if (!softmax_row(q, k, d, rule, b, h, queries[r], p, s, p_sink)) continue;  // zeros
        for (std::size_t j = 0; j < d.nk; ++j)
          for (std::size_t c = 0; c < d.dv; ++c)
            out(b, h, r, c) += p[j] * static_cast<double>(v(b, d.kv_head(h), j, c));
      }
  return out;
}

Gradients64 backward64(const Tensor64& q, const Tensor64& k, const Tensor64& v, const Rule& rule,
                       const Tensor64& d_out) {
  const Dims d = dims_of(q, k, v);
  const std::array<std::size_t, 4> out_shape = {d.batch, d.heads, d.nq, d.dv};
  if (!std::equal(out_shape.begin(), out_shape.end(), d_out.shape().begin()))
    throw Error("reference backward: d_out does not have the output's shape [B, H, Nq, Dv]");
  Gradients64 g;
  g.dq = xt::zeros<double>(q.shape());
  g.dk = xt::zeros<double>(k.shape());
  g.dv = xt::zeros<double>(v.shape());
  const Modifiers64* m = rule.mods;
  if (m && given(m->bias)) g.d_bias = xt::zeros<double>(m->bias.shape());
  if (m && !m->sinks.empty()) g.d_sinks.assign(d.heads, 0.0);
  if (m && !m->alibi_slopes.empty()) g.d_alibi_slopes.assign(d.heads, 0.0);
  std::vector<double> df;  // dL/dF per (b, h) over the keys
  if (!rule.fox.empty()) df.assign(d.batch * d.heads * d.nk, 0.0);
  std::vector<double> p(d.nk), s(d.nk), dz(d.nk);
  double p_sink = 0;
  for (std::size_t b = 0; b < d.batch; ++b)
    for (std::size_t h = 0; h < d.heads; ++h)
      for (std::size_t i = 0; i < d.nq; ++i) {
        if (!softmax_row(q, k, d, rule, b, h, i, p, s, p_sink)) continue;
        const std::size_t kh = d.kv_head(h);
        double delta = 0;  // rowsum(dO ∘ O) = sum_j p_j (dO_i · v_j)
        for (std::size_t j = 0; j < d.nk; ++j) {
          double dp = 0;
          for (std::size_t c = 0; c < d.dv; ++c) dp += d_out(b, h, i, c) * v(b, kh, j, c);
          dz[j] = dp;
          delta += p[j] * dp;
        }
        if (!g.d_sinks.empty()) g.d_sinks[h] -= p_sink * delta;
        const double pos = rule.position(i, d);
        for (std::size_t j = 0; j < d.nk; ++j) {
          if (p[j] == 0) continue;
          const double z = p[j] * (dz[j] - delta);  // dL/d(modified score)
          if (given(g.d_bias)) g.d_bias.data()[rule.bias_at(b, h, i, j)] += z;
          if (!g.d_alibi_slopes.empty())
            g.d_alibi_slopes[h] -= z * std::abs(pos - static_cast<double>(j));
          if (!df.empty()) {
            const auto last = static_cast<std::int64_t>(d.nk) - 1;
            df[(b * d.heads + h) * d.nk +
               static_cast<std::size_t>(std::clamp<std::int64_t>(std::int64_t(pos), 0, last))] += z;
            df[(b * d.heads + h) * d.nk + j] -= z;
          }
          double ds = z * rule.scale;
          if (rule.cap > 0) {
            const double t = std::tanh(s[j] / rule.cap);
            ds *= 1 - t * t;
          }
          for (std::size_t c = 0; c < d.dk; ++c) {
            g.dq(b, h, i, c) += ds * k(b, kh, j, c);
            g.dk(b, kh, j, c) += ds * q(b, h, i, c);
          }
          for (std::size_t c = 0; c < d.dv; ++c) g.dv(b, kh, j, c) += p[j] * d_out(b, h, i, c);
        }
      }
  if (!df.empty()) {  // F_t = g_0 + ... + g_t over the unpadded keys
    g.d_log_decay = xt::zeros<double>({d.batch, d.heads, d.nk});
    for (std::size_t b = 0; b < d.batch; ++b)
      for (std::size_t h = 0; h < d.heads; ++h) {
        const std::size_t valid = rule.mask ? rule.mask->valid_keys(b, d.nk) : d.nk;
        double sum = 0;
        for (std::size_t t = d.nk; t-- > 0;) {
          sum += df[(b * d.heads + h) * d.nk + t];
          if (t < valid) g.d_log_decay(b, h, t) = sum;
        }
      }
  }
  return g;
}

template <class T>
void check_mask(const Mask& mask, const xt::xtensor<T, 4>& q, const xt::xtensor<T, 4>& k,
                const xt::xtensor<T, 4>& v) {
  mask.validate(dims_of(q, k, v));
}

}  // namespace

Modifiers64 Modifiers64::of(const TokenInputs& in) {
  Modifiers64 m;
  if (in.bias) {
    const auto& s = in.bias->shape();
    m.bias = xt::zeros<double>({s[0], s[1], s[2], s[3]});
    std::copy(in.bias->data(), in.bias->data() + in.bias->size(), m.bias.begin());
  }
  if (in.sinks) m.sinks.assign(in.sinks->begin(), in.sinks->end());
  if (in.alibi_slopes) m.alibi_slopes.assign(in.alibi_slopes->begin(), in.alibi_slopes->end());
  if (in.log_decay) {
    const auto& s = in.log_decay->shape();
    m.log_decay = xt::zeros<double>({s[0], s[1], s[2]});
    std::copy(in.log_decay->data(), in.log_decay->data() + s[0] * s[1] * s[2], m.log_decay.begin());
  }
  return m;
}

Tensor64 reference_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                             const Pattern& allowed, const std::vector<std::size_t>& rows) {
  return attention64(q, k, v, Rule(nullptr, &allowed, nullptr, scale, dims_of(q, k, v)), rows);
}

Tensor64 reference_attention(const Tensor64& q, const Tensor64& k, const Tensor64& v, double scale,
                             const Pattern& allowed) {
  return attention64(q, k, v, Rule(nullptr, &allowed, nullptr, scale, dims_of(q, k, v)), {});
}

Tensor64 reference_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Mask& mask,
                             const std::vector<std::size_t>& rows) {
  return reference_attention(q, k, v, mask, TokenInputs{}, rows);
}

Tensor64 reference_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Mask& mask,
                             const TokenInputs& in, const std::vector<std::size_t>& rows) {
  const Dims d = check_qkv(q, k, v);
  mask.validate(d);
  const Modifiers64 mods = Modifiers64::of(in);
  return attention64(q, k, v, Rule(&mask, nullptr, &mods, mask.softmax_scale(d.dk), d), rows);
}

Tensor64 reference_attention(const Tensor64& q, const Tensor64& k, const Tensor64& v,
                             const Mask& mask, const Modifiers64& mods, const Pattern& also) {
  check_mask(mask, q, k, v);
  const Dims d = dims_of(q, k, v);
  return attention64(q, k, v,
                     Rule(&mask, also ? &also : nullptr, &mods, mask.softmax_scale(d.dk), d), {});
}

Gradients64 reference_attention_backward(const Tensor64& q, const Tensor64& k, const Tensor64& v,
                                         double scale, const Pattern& allowed,
                                         const Tensor64& d_out) {
  return backward64(q, k, v, Rule(nullptr, &allowed, nullptr, scale, dims_of(q, k, v)), d_out);
}

Gradients64 reference_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                         const Mask& mask, const Tensor& d_out) {
  return reference_attention_backward(xt::cast<double>(q), xt::cast<double>(k), xt::cast<double>(v),
                                      mask, Modifiers64{}, xt::cast<double>(d_out));
}

Gradients64 reference_attention_backward(const Tensor64& q, const Tensor64& k, const Tensor64& v,
                                         const Mask& mask, const Modifiers64& mods,
                                         const Tensor64& d_out, const Pattern& also) {
  check_mask(mask, q, k, v);
  const Dims d = dims_of(q, k, v);
  return backward64(q, k, v,
                    Rule(&mask, also ? &also : nullptr, &mods, mask.softmax_scale(d.dk), d), d_out);
}

}  // namespace attnlab
