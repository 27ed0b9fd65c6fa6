#include "variants/full.hpp"

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "attnlab/kernels.hpp"

namespace attnlab {
namespace {
using kernels::OnlineSoftmax;
}  // namespace

double FullAttention::flops(const Dims& d, const Mask& mask) const {
  double pairs = 0;  // visible (query, key) pairs of one head, summed over the batch
  for (std::size_t b = 0; b < d.batch; ++b)
    for (std::size_t i = 0; i < d.nq; ++i) pairs += static_cast<double>(mask.visible_keys(b, i, d));
  return 2.0 * pairs * static_cast<double>(d.heads * (d.dk + d.dv));
}

void FullAttention::compute(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                            const TokenInputs&, const Dims& d, Tensor& out, Saved* saved) const {
  run(q, k, v, mask, d, out, saved_lse(saved, d));
}

void FullAttention::run(TensorRef q, TensorRef k, TensorRef v, const Mask& mask, const Dims& d,
                        Tensor& out, float* lse) const {
  // transpose_keys' tiles, left uninitialised (not zeroed: the padding is never read).
  constexpr std::size_t kCols = OnlineSoftmax::kCols;
  const std::size_t per_head = (d.nk + kCols - 1) / kCols * kCols * d.dk;
  const auto kt = kernels::scratch_floats(d.batch * d.heads * per_head);
  const std::vector<std::pair<std::size_t, std::size_t>> all_keys = {{0, d.nk}};
  const float scale = static_cast<float>(mask.softmax_scale(d.dk));
  const std::size_t tiles = (d.nq + OnlineSoftmax::kRows - 1) / OnlineSoftmax::kRows;
  const std::ptrdiff_t tasks = static_cast<std::ptrdiff_t>(d.batch * d.heads * tiles);
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (std::ptrdiff_t bh = 0; bh < static_cast<std::ptrdiff_t>(d.batch * d.heads); ++bh)
      kernels::transpose_key_tiles(k.data() + bh * d.nk * d.dk, d.dk, kCols, 0, d.nk,
                                   kt.get() + bh * per_head);
    OnlineSoftmax softmax(d.dk, d.dv);
#pragma omp for schedule(dynamic, 1)
    for (std::ptrdiff_t t = 0; t < tasks; ++t) {
      // Last query tiles first: under a causal mask they are the longest.
      const std::size_t tile = tiles - 1 - static_cast<std::size_t>(t) % tiles;
      const std::size_t bh = static_cast<std::size_t>(t) / tiles;
      const std::size_t i0 = tile * OnlineSoftmax::kRows;
      kernels::attend_key_ranges(q, kt.get() + bh * per_head, v, mask, d, bh / d.heads,
                                 bh % d.heads, i0, std::min(OnlineSoftmax::kRows, d.nq - i0),
                                 all_keys, scale, softmax, out,
                                 lse ? lse + bh * d.nq + i0 : nullptr);
    }
  }
}

void FullAttention::compute_backward(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                                     const TokenInputs& in, const Dims& d, TensorRef out,
                                     TensorRef d_out, const Saved& saved,
                                     AllGradients& grads) const {
  RowLogSumExp storage;
  const RowLogSumExp& lse = lse_or_recompute(q, k, v, mask, in, d, saved, storage);
  Gradients& g = grads.qkv;
  const std::vector<std::pair<std::size_t, std::size_t>> all_keys = {{0, d.nk}};
  const float scale = static_cast<float>(mask.softmax_scale(d.dk));
  constexpr std::size_t kRows = kernels::SoftmaxBackward::kRows;
  const std::size_t tiles = (d.nq + kRows - 1) / kRows;
  kernels::run_backward_tiles(
      d, tiles, &k, &v,
      [&](std::size_t bh, std::size_t t, const float* kt, const float* vt, float* dk, float* dv,
          kernels::SoftmaxBackward& grad) {
        const std::size_t i0 = t * kRows;
        kernels::backprop_key_ranges(q, kt, k, vt, out, d_out, lse.data() + bh * d.nq + i0, mask, d,
                                     bh / d.heads, bh % d.heads, i0, std::min(kRows, d.nq - i0),
                                     all_keys, scale, grad, g.dq, dk, dv);
      },
      g.dk, g.dv);
}

std::unique_ptr<Attention> make_full(Params&) {
  return std::make_unique<FullAttention>();
}

namespace {
// Position 10 in attention_names() and the --help listing.
const AttentionRegistrar kRegistrar("full", make_full, 10);
}  // namespace

}  // namespace attnlab
