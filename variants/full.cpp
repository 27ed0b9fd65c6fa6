#include "variants/full.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attnlab/kernels.hpp"

namespace attnlab {
namespace {

// A query tile is a multiple of the 6-row GEMM block; a key tile's scores (48 x 128 floats)
// stay in L1/L2 while they are exponentiated and multiplied into V.
constexpr std::size_t kQueryTile = 48;
constexpr std::size_t kKeyTile = 128;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// k[b, h] transposed to [Dk, Nk], so a score tile is a plain row-major GEMM.
std::vector<float> transpose_keys(const Tensor& k, const Dims& d) {
  std::vector<float> kt(d.batch * d.heads * d.dk * d.nk);
  const std::ptrdiff_t heads = static_cast<std::ptrdiff_t>(d.batch * d.heads);
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t bh = 0; bh < heads; ++bh) {
    const float* src = k.data() + bh * d.nk * d.dk;
    float* dst = kt.data() + bh * d.dk * d.nk;
    for (std::size_t j = 0; j < d.nk; ++j)
      for (std::size_t c = 0; c < d.dk; ++c) dst[c * d.nk + j] = src[j * d.dk + c];
  }
  return kt;
}

struct Workspace {
  std::vector<float> q, scores, acc, max, sum;
  explicit Workspace(const Dims& d)
      : q(kQueryTile * d.dk), scores(kQueryTile * kKeyTile), acc(kQueryTile * d.dv),
        max(kQueryTile), sum(kQueryTile) {}
};

// One query tile of one head, folded over key tiles with the online softmax.
void attend_tile(const Tensor& q, const float* kt, const Tensor& v, const Mask& mask,
                 const Dims& d, std::size_t b, std::size_t h, std::size_t i0, float scale,
                 Workspace& w, Tensor& out) {
  const std::size_t rows = std::min(kQueryTile, d.nq - i0);
  std::size_t all_see = d.nk, any_sees = 0;  // keys visible to every / to some row
  for (std::size_t r = 0; r < rows; ++r) {
    const std::size_t n = mask.visible_keys(b, i0 + r, d);
    all_see = std::min(all_see, n);
    any_sees = std::max(any_sees, n);
  }
  const float* qrow = &q(b, h, i0, 0);
  const float log2_scale = scale * kLog2e;  // softmax in base 2: exp(x) = 2^(x log2 e)
  for (std::size_t i = 0; i < rows * d.dk; ++i) w.q[i] = qrow[i] * log2_scale;
  std::fill(w.max.begin(), w.max.end(), kNegInf);
  std::fill(w.sum.begin(), w.sum.end(), 0.0f);
  std::fill(w.acc.begin(), w.acc.end(), 0.0f);
  const float* vhead = &v(b, h, 0, 0);

  for (std::size_t c0 = 0; c0 < any_sees; c0 += kKeyTile) {  // tiles past any_sees: skipped
    const std::size_t cols = std::min(kKeyTile, any_sees - c0);
    float* s = w.scores.data();
    kernels::gemm_tile(rows, cols, d.dk, w.q.data(), d.dk, kt + c0, d.nk, s, kKeyTile, false);
    for (std::size_t r = 0; r < rows; ++r) {
      float* row = s + r * kKeyTile;
      if (c0 + cols > all_see) {
        const std::size_t n = mask.visible_keys(b, i0 + r, d);
        for (std::size_t j = std::max(c0, n); j < c0 + cols; ++j) row[j - c0] = kNegInf;
      }
      if (const bool* allowed = mask.allowed_row(b, h, i0 + r))
        for (std::size_t j = 0; j < cols; ++j)
          if (!allowed[c0 + j]) row[j] = kNegInf;
      const float top = *std::max_element(row, row + cols);
      if (top == kNegInf) {  // nothing visible in this tile: contributes nothing
        std::fill(row, row + cols, 0.0f);
        continue;
      }
      const float new_max = std::max(w.max[r], top);
      for (std::size_t j = 0; j < cols; ++j) row[j] -= new_max;
      kernels::exp2_inplace(row, cols);
      float tile_sum = 0.0f;
      for (std::size_t j = 0; j < cols; ++j) tile_sum += row[j];
      const float rescale = std::exp2(w.max[r] - new_max);  // 0 on the first visible tile
      float* acc = w.acc.data() + r * d.dv;
      for (std::size_t c = 0; c < d.dv; ++c) acc[c] *= rescale;
      w.sum[r] = w.sum[r] * rescale + tile_sum;
      w.max[r] = new_max;
    }
    kernels::gemm_tile(rows, d.dv, cols, s, kKeyTile, vhead + c0 * d.dv, d.dv, w.acc.data(), d.dv,
                       true);
  }
  for (std::size_t r = 0; r < rows; ++r) {
    const float inv = w.sum[r] > 0 ? 1.0f / w.sum[r] : 0.0f;  // no visible key: zeros
    float* dst = &out(b, h, i0 + r, 0);
    for (std::size_t c = 0; c < d.dv; ++c) dst[c] = w.acc[r * d.dv + c] * inv;
  }
}

}  // namespace

Tensor FullAttention::compute(const Tensor& q, const Tensor& k, const Tensor& v, const Mask& mask,
                              const Dims& d) const {
  Tensor out = Tensor::from_shape({d.batch, d.heads, d.nq, d.dv});
  const std::vector<float> kt = transpose_keys(k, d);
  const float scale = static_cast<float>(mask.softmax_scale(d.dk));
  const std::size_t tiles = (d.nq + kQueryTile - 1) / kQueryTile;
  const std::ptrdiff_t tasks = static_cast<std::ptrdiff_t>(d.batch * d.heads * tiles);
#pragma omp parallel
  {
    Workspace w(d);
#pragma omp for schedule(dynamic, 1)
    for (std::ptrdiff_t t = 0; t < tasks; ++t) {
      // Last query tiles first: under a causal mask they are the longest.
      const std::size_t tile = tiles - 1 - static_cast<std::size_t>(t) % tiles;
      const std::size_t bh = static_cast<std::size_t>(t) / tiles;
      attend_tile(q, kt.data() + bh * d.dk * d.nk, v, mask, d, bh / d.heads, bh % d.heads,
                  tile * kQueryTile, scale, w, out);
    }
  }
  return out;
}

std::unique_ptr<Attention> make_full(Params&) { return std::make_unique<FullAttention>(); }

}  // namespace attnlab
