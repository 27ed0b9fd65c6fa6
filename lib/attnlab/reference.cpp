#include "attnlab/reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "attnlab/error.hpp"

namespace attnlab {

Tensor64 reference_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                             const Pattern& allowed, const std::vector<std::size_t>& rows) {
  const Dims d = check_qkv(q, k, v);
  std::vector<std::size_t> queries = rows;
  if (queries.empty())
    for (std::size_t i = 0; i < d.nq; ++i) queries.push_back(i);
  for (std::size_t i : queries)
    if (i >= d.nq) throw Error("reference row " + std::to_string(i) + " is not below Nq");

  Tensor64 out = xt::zeros<double>({d.batch, d.heads, queries.size(), d.dv});
  std::vector<double> logits(d.nk);
  for (std::size_t b = 0; b < d.batch; ++b)
    for (std::size_t h = 0; h < d.heads; ++h)
      for (std::size_t r = 0; r < queries.size(); ++r) {
        const std::size_t i = queries[r];
        double top = -std::numeric_limits<double>::infinity();
        for (std::size_t j = 0; j < d.nk; ++j) {
          logits[j] = -std::numeric_limits<double>::infinity();
          if (!allowed(b, h, i, j)) continue;
          double dot = 0;
          for (std::size_t c = 0; c < d.dk; ++c)
            dot += static_cast<double>(q(b, h, i, c)) * static_cast<double>(k(b, h, j, c));
          logits[j] = dot * scale;
          top = std::max(top, logits[j]);
        }
        if (top == -std::numeric_limits<double>::infinity()) continue;  // no key: zeros
        double total = 0;
        for (std::size_t j = 0; j < d.nk; ++j) {
          if (logits[j] == -std::numeric_limits<double>::infinity()) continue;
          const double p = std::exp(logits[j] - top);
          total += p;
          for (std::size_t c = 0; c < d.dv; ++c) out(b, h, r, c) += p * v(b, h, j, c);
        }
        for (std::size_t c = 0; c < d.dv; ++c) out(b, h, r, c) /= total;
      }
  return out;
}

Tensor64 reference_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Mask& mask,
                             const std::vector<std::size_t>& rows) {
  const Dims d = check_qkv(q, k, v);
  mask.validate(d);
  return reference_attention(
      q, k, v, mask.softmax_scale(d.dk),
      [&](std::size_t b, std::size_t h, std::size_t i, std::size_t j) {
        return mask.may_attend(b, h, i, j, d);
      },
      rows);
}

}  // namespace attnlab
