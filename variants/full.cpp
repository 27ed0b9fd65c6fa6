#include "variants/full.hpp"

#include <memory>

#include "attnlab/decoder.hpp"
#include "attnlab/softmax_engine.hpp"
#include "variants/kv_cache.hpp"

namespace attnlab {

double FullAttention::flops(const Dims& d, const Mask& mask) const {
  return 2.0 * engine::visible_pairs(mask, d) * static_cast<double>(d.dk + d.dv);
}

void FullAttention::compute(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                            const TokenInputs& in, const Dims& d, Tensor& out, Saved* saved) const {
  engine::forward(q, k, v, mask, in, d, engine::Sparsity(), out, saved_lse(saved, d));
}

void FullAttention::compute_backward(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                                     const TokenInputs& in, const Dims& d, TensorRef out,
                                     TensorRef d_out, const Saved& saved, AllGradients& g) const {
  RowLogSumExp storage;
  const RowLogSumExp& lse = lse_or_recompute(q, k, v, mask, in, d, saved, storage);
  engine::backward(q, k, v, mask, in, d, engine::Sparsity(), out, d_out, lse, g);
}

std::unique_ptr<TokenDecoder> FullAttention::start_decoding(const DecodeConfig& config) const {
  KvCacheLayout layout;  // every held key
  layout.pattern = [](std::size_t, std::size_t p, PositionRanges& out) {
    out.push_back({0, p + 1});
  };
  return make_kv_cache_decoder(*this, config, std::move(layout));
}

std::unique_ptr<Attention> make_full(Params&) {
  return std::make_unique<FullAttention>();
}

namespace {
// Position 10 in attention_names() and the --help listing.
const AttentionRegistrar kRegistrar("full", make_full, 10);
}  // namespace

}  // namespace attnlab
