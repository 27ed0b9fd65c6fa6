#include "variants/full.hpp"

#include <algorithm>
#include <limits>

#include "attnlab/kernels.hpp"

namespace attnlab {
namespace {

using kernels::OnlineSoftmax;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// One query tile of one head, folded over the key blocks that any of its rows can see.
void attend_tile(const Tensor& q, const float* kt, const Tensor& v, const Mask& mask,
                 const Dims& d, std::size_t b, std::size_t h, std::size_t i0, float scale,
                 OnlineSoftmax& softmax, Tensor& out) {
  const std::size_t rows = std::min(OnlineSoftmax::kRows, d.nq - i0);
  std::size_t all_see = d.nk, any_sees = 0;  // keys visible to every / to some row
  for (std::size_t r = 0; r < rows; ++r) {
    const std::size_t n = mask.visible_keys(b, i0 + r, d);
    all_see = std::min(all_see, n);
    any_sees = std::max(any_sees, n);
  }
  softmax.start(&q(b, h, i0, 0), rows, scale);
  for (std::size_t c0 = 0; c0 < any_sees; c0 += OnlineSoftmax::kCols) {  // later blocks: skipped
    const std::size_t cols = std::min(OnlineSoftmax::kCols, any_sees - c0);
    float* s = softmax.scores(kt + c0 * d.dk, OnlineSoftmax::kCols, cols);  // tile c0 / kCols
    for (std::size_t r = 0; r < rows; ++r) {
      float* row = s + r * OnlineSoftmax::kCols;
      if (c0 + cols > all_see) {
        const std::size_t n = mask.visible_keys(b, i0 + r, d);
        for (std::size_t j = std::max(c0, n); j < c0 + cols; ++j) row[j - c0] = kNegInf;
      }
      if (const bool* allowed = mask.allowed_row(b, h, i0 + r))
        for (std::size_t j = 0; j < cols; ++j)
          if (!allowed[c0 + j]) row[j] = kNegInf;
    }
    softmax.fold(&v(b, h, c0, 0), d.dv, cols);
  }
  softmax.finish(&out(b, h, i0, 0), d.dv);
}

}  // namespace

double FullAttention::flops(const Dims& d, const Mask& mask) const {
  double pairs = 0;  // visible (query, key) pairs of one head, summed over the batch
  for (std::size_t b = 0; b < d.batch; ++b)
    for (std::size_t i = 0; i < d.nq; ++i) pairs += static_cast<double>(mask.visible_keys(b, i, d));
  return 2.0 * pairs * static_cast<double>(d.heads * (d.dk + d.dv));
}

Tensor FullAttention::compute(const Tensor& q, const Tensor& k, const Tensor& v, const Mask& mask,
                              const Dims& d) const {
  Tensor out = Tensor::from_shape({d.batch, d.heads, d.nq, d.dv});
  const std::vector<float> kt = kernels::transpose_keys(k, d, OnlineSoftmax::kCols);
  const std::size_t per_head = kt.size() / (d.batch * d.heads);
  const float scale = static_cast<float>(mask.softmax_scale(d.dk));
  const std::size_t tiles = (d.nq + OnlineSoftmax::kRows - 1) / OnlineSoftmax::kRows;
  const std::ptrdiff_t tasks = static_cast<std::ptrdiff_t>(d.batch * d.heads * tiles);
#pragma omp parallel
  {
    OnlineSoftmax softmax(d.dk, d.dv);
#pragma omp for schedule(dynamic, 1)
    for (std::ptrdiff_t t = 0; t < tasks; ++t) {
      // Last query tiles first: under a causal mask they are the longest.
      const std::size_t tile = tiles - 1 - static_cast<std::size_t>(t) % tiles;
      const std::size_t bh = static_cast<std::size_t>(t) / tiles;
      attend_tile(q, kt.data() + bh * per_head, v, mask, d, bh / d.heads, bh % d.heads,
                  tile * OnlineSoftmax::kRows, scale, softmax, out);
    }
  }
  return out;
}

std::unique_ptr<Attention> make_full(Params&) { return std::make_unique<FullAttention>(); }

}  // namespace attnlab
