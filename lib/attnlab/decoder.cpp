#include "attnlab/decoder.hpp"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "attnlab/error.hpp"

namespace attnlab {

std::unique_ptr<TokenDecoder> Attention::start_decoding(const DecodeConfig&) const {
  const std::string why = why_unsupported("decoding");
  throw Unsupported(name(), why.empty() ? "decoding" : "decoding: " + why);
}

TokenDecoder::TokenDecoder(const Attention& variant, const DecodeConfig& config,
                           std::size_t rows_per_token)
    : name_(variant.name()),
      config_(config),
      held_(config.batch, 0),
      rows_per_token_(rows_per_token),
      support_(variant.support()) {
  const std::size_t kv = config.kv();
  if (config.batch == 0 || config.heads == 0 || config.dk == 0 || config.dv == 0)
    throw Error(name_ + ": decoding needs batch, heads, dk and dv >= 1 (got " +
                std::to_string(config.batch) + ", " + std::to_string(config.heads) + ", " +
                std::to_string(config.dk) + ", " + std::to_string(config.dv) + ")");
  if (config.heads % kv != 0)
    throw Error(name_ + ": decoding kv_heads = " + std::to_string(kv) +
                ": expected a divisor of heads = " + std::to_string(config.heads));
  if (config.scale && !(std::isfinite(*config.scale) && *config.scale > 0))
    throw Error(name_ + ": decoding scale=" + std::to_string(*config.scale) +
                ": expected a finite number > 0");
  if (!config_.scale) config_.scale = 1.0 / std::sqrt(double(config.dk));
  // The options, checked by the variant's own forward on one token of zeros.
  Mask mask;
  mask.causal = Causal::top_left;
  mask.scale = config_.scale;
  mask.window = config.window;
  mask.softcap = config.softcap;
  TokenInputs in;
  if (!config.sinks.empty()) in.sinks = std::span<const float>(config.sinks);
  if (!config.alibi_slopes.empty()) in.alibi_slopes = std::span<const float>(config.alibi_slopes);
  const Tensor q = xt::zeros<float>({std::size_t(1), config.heads, std::size_t(1), config.dk});
  const Tensor k = xt::zeros<float>({std::size_t(1), kv, rows_per_token, config.dk});
  const Tensor v = xt::zeros<float>({std::size_t(1), kv, rows_per_token, config.dv});
  variant.forward(q, k, v, mask, in);
}

void TokenDecoder::validate(TensorRef q, TensorRef k, TensorRef v, const TokenInputs& in,
                            std::size_t n, const std::vector<std::size_t>& lengths) const {
  const DecodeConfig& c = config_;
  const std::string who = name_ + " decoder: ";
  const std::size_t per = rows_per_token_, rows = per * n;  // k, v, g and beta rows
  if (per > 1 && (k.shape()[2] != rows || v.shape()[2] != rows))
    throw Error(who + "k and v have " + std::to_string(k.shape()[2]) + " and " +
                std::to_string(v.shape()[2]) + " rows, expected " + std::to_string(per) +
                " rows per token · " + std::to_string(n) + " tokens = " + std::to_string(rows));
  for (const auto& [t, label, heads, count, dim] :
       {std::tuple{q, "q", c.heads, n, c.dk}, std::tuple{k, "k", c.kv(), rows, c.dk},
        std::tuple{v, "v", c.kv(), rows, c.dv}}) {
    const auto& s = t.shape();
    if (s[0] != c.batch || s[1] != heads || s[2] != count || s[3] != dim)
      throw Error(who + label + " has shape " + shape_string(t) + ", expected [" +
                  std::to_string(c.batch) + ", " + std::to_string(heads) + ", " +
                  std::to_string(count) + ", " + std::to_string(dim) + "]");
  }
  for (std::size_t b = 0; b < c.batch; ++b) {
    if (c.max_tokens && held_[b] + lengths[b] > c.max_tokens)
      throw Error(who + "item " + std::to_string(b) + " would hold " +
                  std::to_string(held_[b] + lengths[b]) +
                  " tokens, past max_tokens = " + std::to_string(c.max_tokens));
    for (const auto& [t, label, real] :
         {std::tuple{q, "q", n}, std::tuple{k, "k", per * lengths[b]},
          std::tuple{v, "v", per * lengths[b]}})
      for (std::size_t h = 0; h < t.shape()[1]; ++h)
        for (std::size_t i = 0; i < real * t.shape()[3]; ++i)
          if (!std::isfinite(t.data()[((b * t.shape()[1] + h) * t.shape()[2]) * t.shape()[3] + i]))
            throw Error(who + label + " is not finite at [" + std::to_string(b) + ", " +
                        std::to_string(h) + ", " + std::to_string(i / t.shape()[3]) + ", " +
                        std::to_string(i % t.shape()[3]) + "]: inputs must be finite");
  }
  for (const auto& [t, label, taken, high] :
       {std::tuple{in.log_decay, "log-decay g", support_.log_decay || support_.forgetting_gate,
                   0.0f},
        std::tuple{in.beta, "beta", support_.beta, 1.0f}}) {
    if (!t) continue;
    if (!taken) throw Unsupported(name_, std::string("a per-token ") + label + " input");
    if (t->shape() != TokenRef::Shape{c.batch, c.heads, rows})
      throw Error(who + label + " must have shape [" + std::to_string(c.batch) + ", " +
                  std::to_string(c.heads) + ", " + std::to_string(rows) + "]");
    for (std::size_t b = 0; b < c.batch; ++b)
      for (std::size_t h = 0; h < c.heads; ++h)
        for (std::size_t j = 0; j < per * lengths[b]; ++j) {
          const float x = (*t)(b, h, j);
          if (x <= high && (high == 0.0f ? std::isfinite(x) : x >= 0.0f)) continue;
          throw Error(who + label + " is " + std::to_string(x) + " at [" + std::to_string(b) +
                      ", " + std::to_string(h) + ", " + std::to_string(j) + "]: it must be " +
                      (high == 0.0f ? "finite and <= 0" : "in [0, 1]"));
        }
  }
  if (in.channel_log_decay)
    throw Unsupported(name_,
                      "a per-channel log-decay (channel_log_decay) in token-by-token decoding "
                      "(forward and backward take it)");
  if (in.bias) throw Unsupported(name_, "an additive bias (TokenInputs::bias) in decoding");
  if (in.sinks || in.alibi_slopes)
    throw Error(who +
                "sinks and ALiBi slopes are the decoder's: give them to start_decoding "
                "(DecodeConfig::sinks, alibi_slopes), not to each call");
  if (in.initial_state || in.d_final_state)
    throw Error(who +
                "a decoder holds its own state: initial_state and d_final_state are "
                "for forward and backward");
}

Tensor TokenDecoder::prefill(TensorRef q, TensorRef k, TensorRef v, const TokenInputs& in,
                             const std::vector<std::int64_t>& lengths) {
  const std::size_t n = q.shape()[2];
  std::vector<std::size_t> real(config_.batch, n);
  if (!lengths.empty()) {
    if (lengths.size() != config_.batch)
      throw Error(name_ + " decoder: lengths has " + std::to_string(lengths.size()) +
                  " entries, expected one per batch item (" + std::to_string(config_.batch) + ")");
    for (std::size_t b = 0; b < config_.batch; ++b) {
      if (lengths[b] < 0 || lengths[b] > std::int64_t(n))
        throw Error(name_ + " decoder: lengths[" + std::to_string(b) +
                    "] = " + std::to_string(lengths[b]) +
                    ": expected 0 <= length <= N = " + std::to_string(n));
      real[b] = std::size_t(lengths[b]);
    }
  }
  validate(q, k, v, in, n, real);
  Tensor out = Tensor::from_shape({config_.batch, config_.heads, n, config_.dv});
  if (n > 0) do_prefill(q, k, v, in, real, out);
  const std::size_t dv = config_.dv;
  for (std::size_t bh = 0; bh < config_.batch * config_.heads; ++bh)  // padding rows: zeros
    std::fill(out.data() + (bh * n + real[bh / config_.heads]) * dv, out.data() + (bh + 1) * n * dv,
              0.0f);
  for (std::size_t b = 0; b < config_.batch; ++b) held_[b] += real[b];
  return out;
}

void TokenDecoder::extend(TensorRef k, TensorRef v, const TokenInputs& in) {
  if (k.shape()[2] % rows_per_token_ != 0)
    throw Error(name_ + " decoder: k has " + std::to_string(k.shape()[2]) + " rows, expected " +
                std::to_string(rows_per_token_) + " rows per token · a whole number of tokens");
  const std::size_t n = k.shape()[2] / rows_per_token_;
  const Tensor q = xt::zeros<float>({config_.batch, config_.heads, n, config_.dk});
  const std::vector<std::size_t> all(config_.batch, n);
  validate(q, k, v, in, n, all);
  if (n > 0) do_extend(q, k, v, in);
  for (std::size_t& held : held_) held += n;
}

void TokenDecoder::do_extend(TensorRef q, TensorRef k, TensorRef v, const TokenInputs& in) {
  Tensor out = Tensor::from_shape({config_.batch, config_.heads, q.shape()[2], config_.dv});
  do_prefill(q, k, v, in, std::vector<std::size_t>(config_.batch, q.shape()[2]), out);
}

Tensor TokenDecoder::step(TensorRef q, TensorRef k, TensorRef v, const TokenInputs& in) {
  validate(q, k, v, in, 1, std::vector<std::size_t>(config_.batch, 1));
  Tensor out = Tensor::from_shape({config_.batch, config_.heads, 1, config_.dv});
  do_step(q, k, v, in, out);
  for (std::size_t& n : held_) ++n;
  return out;
}

}  // namespace attnlab
