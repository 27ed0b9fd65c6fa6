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

// The softmax row of query i of head (b, h) over the allowed keys: p (zeros where not
// allowed); false when no key is allowed.
template <class T>
bool softmax_row(const xt::xtensor<T, 4>& q, const xt::xtensor<T, 4>& k, const Dims& d,
                 double scale, const Pattern& allowed, std::size_t b, std::size_t h, std::size_t i,
                 std::vector<double>& p) {
  double top = kNegInf;
  for (std::size_t j = 0; j < d.nk; ++j) {
    p[j] = kNegInf;
    if (!allowed(b, h, i, j)) continue;
    double dot = 0;
    for (std::size_t c = 0; c < d.dk; ++c)
      dot += static_cast<double>(q(b, h, i, c)) * static_cast<double>(k(b, h, j, c));
    p[j] = dot * scale;
    top = std::max(top, p[j]);
  }
  if (top == kNegInf) return false;
  double total = 0;
  for (std::size_t j = 0; j < d.nk; ++j) {
    p[j] = p[j] == kNegInf ? 0.0 : std::exp(p[j] - top);
    total += p[j];
  }
  for (std::size_t j = 0; j < d.nk; ++j) p[j] /= total;
  return true;
}

template <class T>
Tensor64 attention64(const xt::xtensor<T, 4>& q, const xt::xtensor<T, 4>& k,
                     const xt::xtensor<T, 4>& v, double scale, const Pattern& allowed,
                     const std::vector<std::size_t>& rows) {
  const Dims d = dims_of(q, k, v);
  std::vector<std::size_t> queries = rows;
  if (queries.empty())
    for (std::size_t i = 0; i < d.nq; ++i) queries.push_back(i);
  for (std::size_t i : queries)
    if (i >= d.nq) throw Error("reference row " + std::to_string(i) + " is not below Nq");

  Tensor64 out = xt::zeros<double>({d.batch, d.heads, queries.size(), d.dv});
  std::vector<double> p(d.nk);
  for (std::size_t b = 0; b < d.batch; ++b)
    for (std::size_t h = 0; h < d.heads; ++h)
      for (std::size_t r = 0; r < queries.size(); ++r) {
        if (!softmax_row(q, k, d, scale, allowed, b, h, queries[r], p)) continue;  // zeros
        for (std::size_t j = 0; j < d.nk; ++j)
          for (std::size_t c = 0; c < d.dv; ++c)
            out(b, h, r, c) += p[j] * static_cast<double>(v(b, h, j, c));
      }
  return out;
}

Pattern mask_pattern(const Mask& mask, const Dims& d) {
  return [&mask, d](std::size_t b, std::size_t h, std::size_t i, std::size_t j) {
    return mask.may_attend(b, h, i, j, d);
  };
}

}  // namespace

Tensor64 reference_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                             const Pattern& allowed, const std::vector<std::size_t>& rows) {
  return attention64(q, k, v, scale, allowed, rows);
}

Tensor64 reference_attention(const Tensor64& q, const Tensor64& k, const Tensor64& v, double scale,
                             const Pattern& allowed) {
  return attention64(q, k, v, scale, allowed, {});
}

Gradients64 reference_attention_backward(const Tensor64& q, const Tensor64& k, const Tensor64& v,
                                         double scale, const Pattern& allowed,
                                         const Tensor64& d_out) {
  const Dims d = dims_of(q, k, v);
  const std::array<std::size_t, 4> out_shape = {d.batch, d.heads, d.nq, d.dv};
  if (!std::equal(out_shape.begin(), out_shape.end(), d_out.shape().begin()))
    throw Error("reference backward: d_out does not have the output's shape [B, H, Nq, Dv]");
  Gradients64 g{xt::zeros<double>(q.shape()), xt::zeros<double>(k.shape()),
                xt::zeros<double>(v.shape())};
  std::vector<double> p(d.nk), ds(d.nk);
  for (std::size_t b = 0; b < d.batch; ++b)
    for (std::size_t h = 0; h < d.heads; ++h)
      for (std::size_t i = 0; i < d.nq; ++i) {
        if (!softmax_row(q, k, d, scale, allowed, b, h, i, p)) continue;
        double delta = 0;  // rowsum(dO ∘ O) = sum_j p_j (dO_i · v_j)
        for (std::size_t j = 0; j < d.nk; ++j) {
          double dp = 0;
          for (std::size_t c = 0; c < d.dv; ++c) dp += d_out(b, h, i, c) * v(b, h, j, c);
          ds[j] = dp;
          delta += p[j] * dp;
        }
        for (std::size_t j = 0; j < d.nk; ++j) {
          if (p[j] == 0) continue;
          const double s = p[j] * (ds[j] - delta) * scale;
          for (std::size_t c = 0; c < d.dk; ++c) {
            g.dq(b, h, i, c) += s * k(b, h, j, c);
            g.dk(b, h, j, c) += s * q(b, h, i, c);
          }
          for (std::size_t c = 0; c < d.dv; ++c) g.dv(b, h, j, c) += p[j] * d_out(b, h, i, c);
        }
      }
  return g;
}

Gradients64 reference_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                         const Mask& mask, const Tensor& d_out) {
  const Dims d = check_qkv(q, k, v);
  mask.validate(d);
  return reference_attention_backward(xt::cast<double>(q), xt::cast<double>(k), xt::cast<double>(v),
                                      mask.softmax_scale(d.dk), mask_pattern(mask, d),
                                      xt::cast<double>(d_out));
}

Tensor64 reference_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Mask& mask,
                             const std::vector<std::size_t>& rows) {
  const Dims d = check_qkv(q, k, v);
  mask.validate(d);
  return reference_attention(q, k, v, mask.softmax_scale(d.dk), mask_pattern(mask, d), rows);
}

}  // namespace attnlab
