#include "models/multi_head_attention.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "attnlab/decoder.hpp"
#include "attnlab/error.hpp"
#include "attnlab/factory.hpp"
#include "attnlab/kernels.hpp"
#include "models/norm.hpp"
#include "models/step_clock.hpp"

namespace attnlab::models {
namespace {

// Row-wise softmax of `scores` (length nk) under the row's visibility; an empty row is zero.
void masked_softmax(float* scores, std::size_t nk, const Mask& mask, std::size_t b, std::size_t h,
                    std::size_t i, const Dims& d) {
  double max = -std::numeric_limits<double>::infinity();
  for (std::size_t j = 0; j < nk; ++j)
    if (mask.may_attend(b, h, i, j, d)) max = std::max(max, double(scores[j]));
  double sum = 0;
  for (std::size_t j = 0; j < nk; ++j) {
    const double e = mask.may_attend(b, h, i, j, d) ? std::exp(scores[j] - max) : 0.0;
    scores[j] = static_cast<float>(e);
    sum += e;
  }
  for (std::size_t j = 0; j < nk; ++j)
    scores[j] = sum > 0 ? static_cast<float>(scores[j] / sum) : 0;
}

// One block's filters tap-major, taps[t * d + c] = w[c * kConvWidth + t], so that the loops
// below run over the d channels of a row in contiguous memory.
std::vector<float> conv_taps(const float* w, std::size_t d) {
  constexpr std::size_t width = MultiHeadAttention::kConvWidth;
  std::vector<float> taps(width * d);
  for (std::size_t c = 0; c < d; ++c)
    for (std::size_t t = 0; t < width; ++t) taps[t * d + c] = w[c * width + t];
  return taps;
}

// Row i of the causal convolution of one sequence's rows u (row stride d) into pre[0, d): the
// last tap on row i itself.
void causal_conv_row(const float* taps, const float* u, std::size_t i, std::size_t d, float* pre) {
  constexpr std::size_t width = MultiHeadAttention::kConvWidth;
  std::fill_n(pre, d, 0.0f);
  for (std::size_t t = width - std::min(i + 1, width); t < width; ++t) {
    const float* w = taps + t * d;
    const float* row = u + (i + t + 1 - width) * d;
    for (std::size_t c = 0; c < d; ++c) pre[c] += w[c] * row[c];
  }
}

}  // namespace

Tensor split_heads(const float* y, std::size_t batch, std::size_t n, std::size_t heads,
                   std::size_t dk) {
  Tensor t;
  split_heads(y, batch, n, heads, dk, t);
  return t;
}

void split_heads(const float* y, std::size_t batch, std::size_t n, std::size_t heads,
                 std::size_t dk, Tensor& t) {
  const std::size_t ld = heads * dk;
  shape_buffer(t, {batch, heads, n, dk});
  for (std::size_t b = 0; b < batch; ++b)
    for (std::size_t h = 0; h < heads; ++h)
      for (std::size_t i = 0; i < n; ++i)
        std::copy_n(y + (b * n + i) * ld + h * dk, dk, &t(b, h, i, 0));
}

Activations merge_heads(const Tensor& t) {
  Activations x;
  merge_heads(t, x);
  return x;
}

void merge_heads(const Tensor& t, Activations& x) {
  const std::size_t batch = t.shape()[0], heads = t.shape()[1], n = t.shape()[2], dk = t.shape()[3];
  shape_buffer(x, {batch, n, heads * dk});
  for (std::size_t b = 0; b < batch; ++b)
    for (std::size_t h = 0; h < heads; ++h)
      for (std::size_t i = 0; i < n; ++i) std::copy_n(&t(b, h, i, 0), dk, &x(b, i, h * dk));
}

MultiHeadAttention::MultiHeadAttention(std::size_t d_model, std::size_t heads,
                                       const std::string& spec, bool tied_qk, bool short_conv,
                                       bool head_norm)
    : MultiHeadAttention(d_model, heads, spec, [&] {
        AttentionOptions o;
        o.tied_qk = tied_qk;
        o.short_conv = short_conv;
        o.head_norm = head_norm;
        return o;
      }()) {}

MultiHeadAttention::MultiHeadAttention(std::size_t d_model, std::size_t heads,
                                       const std::string& spec, const AttentionOptions& options)
    : out_proj(d_model, d_model, options.bias),
      heads_(heads),
      kv_heads_(options.kv_heads ? options.kv_heads : heads),
      options_(options) {
  if (heads == 0 || d_model == 0 || d_model % heads != 0)
    throw Error("multi-head attention: d_model=" + std::to_string(d_model) + ", heads=" +
                std::to_string(heads) + ": d_model must be a positive multiple of heads");
  if (options.short_conv && options.tied_qk)
    throw Error(
        "multi-head attention: the short convolution with tied W_Q = W_K: k would no "
        "longer equal q (use one or the other)");
  if (options.kv_heads != 0 && (options.kv_heads > heads || heads % options.kv_heads != 0))
    throw Error("multi-head attention: kv_heads=" + std::to_string(options.kv_heads) +
                " does not divide heads=" + std::to_string(heads) +
                ": each key and value head serves the same number of query heads");
  if (options.tied_qk && kv_heads_ != heads)
    throw Error("multi-head attention: tied W_Q = W_K with kv_heads=" + std::to_string(kv_heads_) +
                " < heads=" + std::to_string(heads) + ": W_K has fewer rows than W_Q");
  if (options.rope_base != 0) rotary_.emplace(d_model / heads, options.rope_base);
  key_rows_ = make_attention(spec)->support().rows_per_token;  // W_K's, W_V's rows depend on it
  const std::size_t rows = block_offset(3);                    // W_Q, W_K, W_V stacked
  in_proj_weight = Matrix::from_shape({rows, d_model});
  in_proj_bias = Vector::from_shape({options.bias ? rows : 0});
  in_proj_weight.fill(0);
  in_proj_bias.fill(0);
  if (options.short_conv) conv_weight.emplace(Matrix::from_shape({rows, kConvWidth})).fill(0);
  if (options.head_norm) head_norm_weight.emplace(Vector::from_shape({d_model / heads})).fill(1);
  set_attention(spec);
}

MultiHeadAttention::Core::Core(const Core& other)
    : spec(other.spec),
      canonical(other.canonical),
      own(other.own),
      backend(other.own ? std::shared_ptr<Attention>(make_attention(other.spec)) : other.backend) {
}  // `held` empty: the first attention() hands all

MultiHeadAttention::Core& MultiHeadAttention::Core::operator=(const Core& other) {
  if (this != &other) *this = Core(other);
  return *this;
}

namespace {

bool same_values(const std::vector<ParameterTensor>& a, const std::vector<ParameterTensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)  // bitwise: any change is handed over
    if (a[i].name != b[i].name || a[i].shape != b[i].shape ||
        a[i].values.size() != b[i].values.size() ||
        std::memcmp(a[i].values.data(), b[i].values.data(), a[i].values.size() * sizeof(float)) !=
            0)
      return false;
  return true;
}

}  // namespace

const Attention& MultiHeadAttention::attention() const {
  if (!attention_parameters.empty() && !same_values(attention_parameters, core_.held)) {
    core_.backend->set_parameters(attention_parameters);
    core_.held = attention_parameters;
  }
  return *core_.backend;
}

void MultiHeadAttention::set_attention(const std::string& spec) {
  std::shared_ptr<Attention> backend = make_attention(spec);
  // Refused here, not at the first forward (and before the layer changes): a model or a training
  // run fails before it starts.
  if (kv_heads_ != heads_ && !backend->support().grouped_heads)
    throw Unsupported(backend->name(),
                      "grouped heads (kv_heads=" + std::to_string(kv_heads_) +
                          " key and value heads for heads=" + std::to_string(heads_) +
                          " query heads; kv_heads=" + std::to_string(heads_) +
                          " gives each query head its own)");
  const std::size_t key_rows = backend->support().rows_per_token;
  if (key_rows != key_rows_)
    throw Error("multi-head attention: core '" + backend->spec() + "' takes " +
                std::to_string(key_rows) + " key rows per token, the layer projects " +
                std::to_string(key_rows_) + " (W_K and W_V are shaped for them)");
  if (options_.channel_gate && key_rows != 1)
    throw Unsupported(backend->name(),
                      "channel-gate with " + std::to_string(key_rows) + " key rows per token");
  core_.spec = spec;
  core_.backend = std::move(backend);
  core_.canonical = core_.backend->spec();
  attention_parameters = core_.backend->parameters(heads_);
  core_.own = !attention_parameters.empty();
  core_.held = attention_parameters;  // what the core drew
  const Support s = core_.backend->support();
  if (options_.channel_gate && !s.channel_decay)
    throw Unsupported(core_.backend->name(),
                      "channel-gate (a per-channel log-decay [B, H, N, Dk]; gla, kda and "
                      "gated-delta take one)");
  if (!options_.channel_gate) {
    channel_gate.reset();
  } else if (!channel_gate || channel_gate->kda() != s.beta) {
    const std::size_t dk = head_dim();  // KDA's rank is the head dimension, GLA's 16
    channel_gate.emplace(d_model(), s.beta ? dk : ChannelGate::kGlaRank, heads_, dk, s.beta);
  }
  const auto gate = [&](std::optional<Linear>& proj, bool wanted) {
    if (!wanted) {
      proj.reset();
    } else if (!proj) {
      proj.emplace(d_model(), &proj == &beta_proj ? key_rows_ * heads_ : heads_);
      proj->weight.fill(0);
      proj->bias.fill(0);
    }
  };
  gate(gate_proj, s.log_decay && !options_.channel_gate);
  gate(beta_proj, s.beta);
}

ChannelGate::ChannelGate(std::size_t d_model, std::size_t rank, std::size_t heads,
                         std::size_t head_dim, bool kda)
    : down(d_model, rank, false), up(rank, heads * head_dim) {
  down.weight.fill(0);
  up.weight.fill(0);
  up.bias.fill(0);
  if (kda) a_log.emplace(Vector::from_shape({heads})).fill(0);
}

void ChannelGate::initialize(std::uint64_t seed, const std::string& prefix) {
  down.initialize(seed, prefix + "down.");
  up.initialize(seed, prefix + "up.");
  if (!a_log) return;
  // fla's KimiDeltaAttention: A uniform in [1, 16]; dt = exp(u (log 0.1 - log 0.001) +
  // log 0.001), at least 1e-4, and b_up = softplus^-1(dt) = dt + log(-expm1(-dt)).
  fill_uniform(parameter(prefix + "a_log", *a_log), 1.0, seed);
  for (float& a : *a_log) a = static_cast<float>(std::log(1.0 + 15.0 * (a + 1.0) / 2.0));
  fill_uniform(parameter(prefix + "up.bias", up.bias), 1.0, seed);
  for (float& b : up.bias) {
    const double u = (b + 1.0) / 2.0;
    const double dt =
        std::max(1e-4, std::exp(u * (std::log(0.1) - std::log(0.001)) + std::log(0.001)));
    b = static_cast<float>(dt + std::log(-std::expm1(-dt)));
  }
}

void ChannelGate::parameters(const std::string& prefix, Parameters& out) {
  down.parameters(prefix + "down.", out);
  up.parameters(prefix + "up.", out);
  if (a_log) out.push_back(parameter(prefix + "a_log", *a_log));
}

TokenInputs Gates::inputs() const {
  TokenInputs in = TokenInputs::of(g.size() ? &g : nullptr, beta.size() ? &beta : nullptr);
  if (channel_g.size()) in.channel_log_decay = TensorRef(channel_g);
  return in;
}

Gates MultiHeadAttention::gates(const Activations& memory) const {
  Gates out;
  const std::size_t batch = memory.shape()[0], n = memory.shape()[1];
  // [B, Nk, r·H] pre-activations -> [B, H, key_rows·Nk] through f: column c to head c % H and
  // row j·key_rows + c / H (r = 1: each token's first row; the others stay 0).
  const auto heads_of = [&](const Activations& pre, auto f) {
    TokenTensor t = TokenTensor::from_shape({batch, heads_, key_rows_ * n});
    t.fill(0);
    const std::size_t columns = pre.shape()[2];
    for (std::size_t b = 0; b < batch; ++b)
      for (std::size_t j = 0; j < n; ++j)
        for (std::size_t c = 0; c < columns; ++c)
          t(b, c % heads_, j * key_rows_ + c / heads_) = f(double(pre(b, j, c)));
    return t;
  };
  if (gate_proj) {
    out.g_pre = gate_proj->forward(memory);
    out.g = heads_of(out.g_pre, [](double x) {  // logsigmoid(x) = -log(1 + e^-x), stably
      return static_cast<float>((std::min(x, 0.0) - std::log1p(std::exp(-std::abs(x)))) / kGateTau);
    });
  }
  if (channel_gate) {
    const ChannelGate& c = *channel_gate;
    const std::size_t dk = head_dim();
    out.channel_hidden = c.down.forward(memory);
    out.channel_pre = c.up.forward(out.channel_hidden);
    out.channel_g = Tensor::from_shape({batch, heads_, n, dk});
    for (std::size_t b = 0; b < batch; ++b)
      for (std::size_t j = 0; j < n; ++j)
        for (std::size_t h = 0; h < heads_; ++h)
          for (std::size_t i = 0; i < dk; ++i) {
            const double x = out.channel_pre(b, j, h * dk + i);
            // softplus(x) = -logsigmoid(-x) = max(x, 0) + log1p(e^-|x|), stably
            const double softplus = std::max(x, 0.0) + std::log1p(std::exp(-std::abs(x)));
            out.channel_g(b, h, j, i) = static_cast<float>(
                c.kda() ? -std::exp(double((*c.a_log)(h))) * softplus
                        : (x - softplus) / kGateTau);  // logsigmoid(x) = x - softplus(x)
          }
  }
  if (beta_proj) {
    out.beta_pre = beta_proj->forward(memory);
    out.beta = heads_of(out.beta_pre,
                        [](double x) { return static_cast<float>(1.0 / (1.0 + std::exp(-x))); });
  }
  return out;
}

void MultiHeadAttention::check_input(const Activations& x, const char* what) const {
  if (x.shape()[2] != d_model() || x.shape()[0] == 0 || x.shape()[1] == 0)
    throw Error(std::string("multi-head attention (d_model ") + std::to_string(d_model()) +
                "): " + what + " " + shape_text(x) + ", expected [B >= 1, N >= 1, " +
                std::to_string(d_model()) + "]");
}

QKV MultiHeadAttention::project(const Activations& query, const Activations& memory) const {
  QKV out;
  Matrix scratch;
  project(query, memory, out, scratch);
  return out;
}

void MultiHeadAttention::project(const Activations& query, const Activations& memory, QKV& out,
                                 Matrix& y) const {
  project(query, memory, out, y, nullptr);
}

void MultiHeadAttention::project(const Activations& query, const Activations& memory, QKV& out,
                                 Matrix& y, AttentionDecoding* state) const {
  check_input(query, "query");
  check_input(memory, "memory");
  if (query.shape()[0] != memory.shape()[0])
    throw Error("multi-head attention: query " + shape_text(query) + " and memory " +
                shape_text(memory) + " have different batch sizes");
  const std::size_t d = d_model(), batch = query.shape()[0];
  const std::size_t rows = batch * std::max(query.shape()[1], memory.shape()[1]);
  // One product per block (with W_K = W_Q and memory = query, k is then bitwise q), into one
  // buffer reused by the three: a fresh one each costs page faults (milliseconds per MiB here).
  // The short convolution's backward needs all three: then each block has its own rows.
  // A row holds the widest block: W_K's and W_V's are wider than d_model with several key rows
  // per token (DeltaProduct).
  const std::size_t columns = std::max(d, block_size(1));
  shape_buffer(y, {short_conv() ? 3 * rows : rows, columns});
  // Block `which` (0: q, 1: k, 2: v): block_size(which) = its heads · dk columns.
  auto block = [&](const Activations& x, std::size_t which, Tensor& heads) {
    const std::size_t n = x.shape()[1], width = block_size(which), offset = block_offset(which);
    const std::size_t dk = head_dim(), count = which == 0 ? heads_ : kv_heads_;
    float* u = y.data() + (short_conv() ? which * rows * columns : 0);
    affine(x.data(), batch * n, d, d, in_proj_weight.data() + offset * d, width, d,
           bias() ? in_proj_bias.data() + offset : nullptr, u, width);
    // Keys and values: key_rows rows of width count·dk per token (u's rows split in as many).
    const std::size_t rows_per_token = which == 0 ? 1 : key_rows_;
    if (!short_conv()) return split_heads(u, batch, n * rows_per_token, count, dk, heads);
    const std::vector<float> taps = conv_taps(conv_weight->data() + offset * kConvWidth, width);
    std::vector<float> pre(width), s(width);
    // Decoding: the kConvWidth - 1 rows held (zeros before the first token, as the forward's
    // padding) go in front of this call's rows, and the last of them are held for the next.
    constexpr std::size_t history = kConvWidth - 1;
    std::vector<float> joined(state ? (history + n) * width : 0);
    shape_buffer(heads, {batch, count, n * rows_per_token, dk});
    for (std::size_t b = 0; b < batch; ++b) {
      const float* rows = u + b * n * width;
      std::size_t first = 0;
      if (state) {
        float* held = state->conv_rows[which].data() + b * history * width;
        std::copy_n(held, history * width, joined.data());
        std::copy_n(rows, n * width, joined.data() + history * width);
        std::copy_n(joined.data() + n * width, history * width, held);
        rows = joined.data();
        first = history;
      }
      for (std::size_t i = 0; i < n; ++i) {
        causal_conv_row(taps.data(), rows, first + i, width, pre.data());
        sigmoid(pre.data(), width, s.data());
        for (std::size_t c = 0; c < width; ++c) s[c] *= pre[c];
        for (std::size_t r = 0; r < rows_per_token; ++r)
          for (std::size_t h = 0; h < count; ++h)
            std::copy_n(&s[(r * count + h) * dk], dk, &heads(b, h, i * rows_per_token + r, 0));
      }
    }
  };
  block(query, 0, out.q);
  block(memory, 1, out.k);
  block(memory, 2, out.v);
  if (rotary_) {  // positions enter q and k alone, before the core (and its feature map)
    const std::size_t first = state ? state->position : 0;  // decoding: after the held tokens
    rotary_->apply(out.q, false, first);
    rotary_->apply(out.k, false, first, key_rows_);
  }
}

Activations MultiHeadAttention::forward(const Activations& x, const Mask& mask) const {
  return forward(x, x, mask);
}

Activations MultiHeadAttention::forward(const Activations& query, const Activations& memory,
                                        const Mask& mask) const {
  Activations y;
  forward(query, memory, mask, y);
  return y;
}

void MultiHeadAttention::forward(const Activations& query, const Activations& memory,
                                 const Mask& mask, Activations& y, AttentionTrace* keep) const {
  AttentionTrace scratch;  // without `keep`: freed on return
  AttentionTrace& t = keep ? *keep : scratch;
  if (keep) {
    t.query = query;  // copies into the same storage each step
    t.memory = memory;
    t.mask = mask;
  }
  project(query, memory, t.in, t.projected);
  t.gates = gates(memory);
  Mask rows_mask;  // several key rows per token: key padding counted in rows
  if (key_rows_ != 1 && mask.has_key_lengths()) {
    rows_mask = mask;
    for (std::int64_t& length : rows_mask.key_lengths) length *= std::int64_t(key_rows_);
    if (keep) t.mask = rows_mask;
  }
  const Mask& core_mask = rows_mask.has_key_lengths() ? rows_mask : mask;
  {
    const Attention& core = attention();
    const TimedPart timed(StepPart::attention);
    if (keep)
      core.forward(t.in.q, t.in.k, t.in.v, core_mask, t.gates.inputs(), t.heads, t.saved);
    else
      core.forward(t.in.q, t.in.k, t.in.v, core_mask, t.gates.inputs(), t.heads);
  }
  output(t, keep != nullptr, y);
}

void MultiHeadAttention::output(AttentionTrace& t, bool keep, Activations& y) const {
  // Kept, t.heads stays the core's own output, which its backward needs; else in place.
  Tensor* heads = &t.heads;
  if (head_norm_weight) {
    Tensor& normed = keep ? t.normed_heads : t.heads;
    normalise_heads(t.heads, normed);
    heads = &normed;
  }
  if (!head_mask.empty()) {
    if (keep) heads = &(t.masked_heads = *heads);
    apply_head_mask(*heads);
  }
  merge_heads(*heads, t.merged);
  out_proj.forward(t.merged, y);
}

std::size_t AttentionDecoding::bytes() const {
  std::size_t total = core ? core->bytes() : 0;
  for (const std::vector<float>& rows : conv_rows) total += rows.size() * sizeof(float);
  return total;
}

AttentionDecoding MultiHeadAttention::start_decoding(std::size_t batch,
                                                     std::size_t max_tokens) const {
  DecodeConfig config(batch, heads_, head_dim(), head_dim());
  config.kv_heads = kv_heads_;
  config.max_tokens = max_tokens;
  AttentionDecoding state;
  state.core = attention().start_decoding(config);  // Unsupported for a core without decoding
  if (short_conv())
    for (std::size_t which = 0; which < 3; ++which)
      state.conv_rows[which].assign(batch * (kConvWidth - 1) * block_size(which), 0.0f);
  return state;
}

void MultiHeadAttention::decode(const Activations& x, AttentionDecoding& state,
                                Activations& y) const {
  if (!state.core) throw Error("multi-head attention: decode before start_decoding");
  check_input(x, "new tokens");
  const DecodeConfig& c = state.core->config();
  const std::size_t n = x.shape()[1];
  // Checked before anything changes, so that a refused call leaves the state as it was.
  if (x.shape()[0] != c.batch)
    throw Error("multi-head attention: decoding " + std::to_string(x.shape()[0]) +
                " sequences with a state started for batch=" + std::to_string(c.batch));
  if (c.max_tokens && state.position + n > c.max_tokens)
    throw Error("multi-head attention: decoding " + std::to_string(n) + " tokens after " +
                std::to_string(state.position) +
                " would pass max_tokens=" + std::to_string(c.max_tokens));
  AttentionTrace t;
  project(x, x, t.in, t.projected, &state);
  t.gates = gates(x);
  const TokenInputs in = t.gates.inputs();
  t.heads = n == 1 ? state.core->step(t.in.q, t.in.k, t.in.v, in)
                   : state.core->prefill(t.in.q, t.in.k, t.in.v, in);
  state.position += n;
  output(t, false, y);
}

void MultiHeadAttention::short_conv_backward(std::size_t which, std::size_t batch, std::size_t n,
                                             const float* u, float* d_out, float* du,
                                             Matrix& grad_weight) const {
  const std::size_t d = block_size(which), width = kConvWidth;
  const std::vector<float> taps = conv_taps(conv_weight->data() + block_offset(which) * width, d);
  std::vector<float> pre(d), s(d);
  std::vector<double> d_taps(width * d, 0.0);  // summed in order over the rows: deterministic
  for (std::size_t b = 0; b < batch; ++b) {
    const float* us = u + b * n * d;
    float* ds = d_out + b * n * d;
    for (std::size_t i = 0; i < n; ++i) {  // silu'(x) = s (1 + x (1 - s)), s = sigmoid(x)
      causal_conv_row(taps.data(), us, i, d, pre.data());
      sigmoid(pre.data(), d, s.data());
      float* row = ds + i * d;
      for (std::size_t c = 0; c < d; ++c) row[c] *= s[c] * (1 + pre[c] * (1 - s[c]));
    }
    for (std::size_t j = 0; j < n; ++j) {  // row j feeds rows j .. j + width - 1
      float* out = du + (b * n + j) * d;
      std::fill_n(out, d, 0.0f);
      for (std::size_t t = j + width > n ? j + width - n : 0; t < width; ++t) {
        const float* w = taps.data() + t * d;
        const float* g = ds + (j + width - 1 - t) * d;
        for (std::size_t c = 0; c < d; ++c) out[c] += w[c] * g[c];
      }
    }
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t t = width - std::min(i + 1, width); t < width; ++t) {
        double* dw = d_taps.data() + t * d;
        const float* g = ds + i * d;
        const float* row = us + (i + t + 1 - width) * d;
        for (std::size_t c = 0; c < d; ++c) dw[c] += double(g[c]) * row[c];
      }
  }
  float* g = grad_weight.data() + block_offset(which) * width;
  for (std::size_t c = 0; c < d; ++c)
    for (std::size_t t = 0; t < width; ++t)
      g[c * width + t] += static_cast<float>(d_taps[t * d + c]);
}

void MultiHeadAttention::normalise_heads(const Tensor& heads, Tensor& out) const {
  shape_buffer(out, heads.shape());
  rms_normalize(heads.data(), heads.size() / head_dim(), head_dim(), head_norm_weight->data(),
                kHeadNormEps, out.data());
}

void MultiHeadAttention::normalise_heads_backward(const Tensor& heads, Tensor& d_out,
                                                  Vector& grad_weight) const {
  rms_normalize_backward(heads.data(), d_out.data(), heads.size() / head_dim(), head_dim(),
                         head_norm_weight->data(), kHeadNormEps, d_out.data(), grad_weight.data());
}

void MultiHeadAttention::apply_head_mask(Tensor& heads) const {
  if (head_mask.empty()) return;
  if (head_mask.size() != heads_)
    throw Error("multi-head attention: head_mask has " + std::to_string(head_mask.size()) +
                " entries, expected one per head (" + std::to_string(heads_) + ")");
  const std::size_t batch = heads.shape()[0], block = heads.shape()[2] * heads.shape()[3];
  for (std::size_t b = 0; b < batch; ++b)
    for (std::size_t h = 0; h < heads_; ++h) {
      float* x = heads.data() + (b * heads_ + h) * block;
      for (std::size_t i = 0; i < block; ++i) x[i] *= head_mask[h];
    }
}

Tensor MultiHeadAttention::attention_probabilities(const Activations& query,
                                                   const Activations& memory,
                                                   const Mask& mask) const {
  const QKV in = project(query, memory);
  return models::attention_probabilities(in.q, in.k, mask);
}

Tensor attention_probabilities(const Tensor& q, const Tensor& k, const Mask& mask) {
  const Dims d = check_qkv(q, k, k);
  mask.validate(d);
  const float scale = static_cast<float>(mask.softmax_scale(d.dk));
  Tensor p = Tensor::from_shape({d.batch, d.heads, d.nq, d.nk});
  for (std::size_t b = 0; b < d.batch; ++b)
    for (std::size_t h = 0; h < d.heads; ++h) {
      float* s = &p(b, h, 0, 0);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(d.nq), int(d.nk), int(d.dk), scale,
                  &q(b, h, 0, 0), int(d.dk), &k(b, d.kv_head(h), 0, 0), int(d.dk), 0.0f, s,
                  int(d.nk));
      for (std::size_t i = 0; i < d.nq; ++i) masked_softmax(s + i * d.nk, d.nk, mask, b, h, i, d);
    }
  return p;
}

void MultiHeadAttention::initialize(std::uint64_t seed, const std::string& prefix) {
  const std::size_t d = d_model();
  if (options_.names == AttentionNames::llama) {
    for (std::size_t which = 0; which < 3; ++which)
      fill_normal(block_parameter(prefix, which, false), kLlamaInitStd, seed);
    fill_normal(parameter(prefix + "o_proj.weight", out_proj.weight), kLlamaInitStd, seed);
  } else {
    // Xavier-uniform over the whole [3d, d] matrix, as torch.nn.MultiheadAttention does.
    fill_uniform(parameter(prefix + "in_proj_weight", in_proj_weight),
                 std::sqrt(6.0 / double(d + block_offset(3))), seed);
    fill_uniform(parameter(prefix + "out_proj.weight", out_proj.weight), 1.0 / std::sqrt(double(d)),
                 seed);
  }
  in_proj_bias.fill(0);
  out_proj.bias.fill(0);
  if (tied_qk()) std::copy_n(in_proj_weight.data(), d * d, in_proj_weight.data() + d * d);
  if (conv_weight)
    fill_uniform(parameter(prefix + "conv_weight", *conv_weight),
                 1.0 / std::sqrt(double(kConvWidth)), seed);
  if (head_norm_weight) head_norm_weight->fill(1);
  if (gate_proj) gate_proj->initialize(seed, prefix + "gate_proj.");
  if (channel_gate) channel_gate->initialize(seed, prefix + "channel_gate.");
  if (beta_proj) beta_proj->initialize(seed, prefix + "beta_proj.");
}

void MultiHeadAttention::parameters(const std::string& prefix, Parameters& out) {
  if (options_.names == AttentionNames::llama) {
    for (std::size_t which = 0; which < 3; ++which) {
      out.push_back(block_parameter(prefix, which, false));
      if (bias()) out.push_back(block_parameter(prefix, which, true));
    }
    out_proj.parameters(prefix + "o_proj.", out);
  } else {
    out.push_back(parameter(prefix + "in_proj_weight", in_proj_weight));
    if (bias()) out.push_back(parameter(prefix + "in_proj_bias", in_proj_bias));
    out_proj.parameters(prefix + "out_proj.", out);
  }
  if (conv_weight) out.push_back(parameter(prefix + "conv_weight", *conv_weight));
  if (head_norm_weight) out.push_back(parameter(prefix + "head_norm.weight", *head_norm_weight));
  if (gate_proj) gate_proj->parameters(prefix + "gate_proj.", out);
  if (channel_gate) channel_gate->parameters(prefix + "channel_gate.", out);
  if (beta_proj) beta_proj->parameters(prefix + "beta_proj.", out);
  for (ParameterTensor& p : attention_parameters)
    out.push_back({prefix + "attention_" + p.name, p.shape, p.values.data()});
}

ParameterRef MultiHeadAttention::block_parameter(const std::string& prefix, std::size_t which,
                                                 bool bias_block) {
  static const char* const names[] = {"q_proj.", "k_proj.", "v_proj."};
  const std::size_t rows = block_size(which), offset = block_offset(which), d = d_model();
  if (bias_block) return {prefix + names[which] + "bias", {rows}, in_proj_bias.data() + offset};
  return {prefix + names[which] + "weight", {rows, d}, in_proj_weight.data() + offset * d};
}

void MultiHeadAttention::check_tied(const std::string& where) const {
  if (!tied_qk()) return;
  const std::size_t d = d_model();
  const float* w = in_proj_weight.data();
  const float* b = in_proj_bias.data();
  if (!std::equal(w, w + d * d, w + d * d) || (bias() && !std::equal(b, b + d, b + d)))
    throw Error(where + "in_proj_weight / in_proj_bias: tied W_Q = W_K needs the K block (rows " +
                std::to_string(d) + ".." + std::to_string(2 * d - 1) +
                ") equal to the Q block (rows 0.." + std::to_string(d - 1) + ")");
}

const Activations& forward(const MultiHeadAttention& mha, const Activations& query,
                           const Activations& memory, const Mask& mask, AttentionTrace& trace) {
  mha.forward(query, memory, mask, trace.output, &trace);
  return trace.output;
}

AttentionInputGrads& backward(const MultiHeadAttention& mha, AttentionTrace& trace,
                              const Activations& dy, MultiHeadAttention& grad) {
  const std::size_t d = mha.d_model(), batch = trace.query.shape()[0];
  const std::size_t nq = trace.query.shape()[1];
  require_gradient_shape(dy, batch, nq, d, "multi-head attention backward");
  backward(mha.out_proj, trace.merged, dy, grad.out_proj, trace.d_merged);
  split_heads(trace.d_merged.data(), batch, nq, mha.heads(), mha.head_dim(), trace.d_heads);
  mha.apply_head_mask(trace.d_heads);  // d(heads · m) / d(heads) = m
  if (mha.head_norm_weight)
    mha.normalise_heads_backward(trace.heads, trace.d_heads, *grad.head_norm_weight);
  AllGradients& all = trace.core_grads;
  {
    const Attention& core = mha.attention();
    const TimedPart timed(StepPart::attention);
    core.backward(trace.in.q, trace.in.k, trace.in.v, trace.mask, trace.gates.inputs(), trace.heads,
                  trace.d_heads, trace.saved, all);
  }
  Gradients& g = all.qkv;
  if (mha.rotary()) {  // back through the rotation of q and k
    mha.rotary()->apply(g.dq, true);
    mha.rotary()->apply(g.dk, true, 0, mha.key_rows());
  }
  // q = query W_Q^T + b_Q, k = memory W_K^T + b_K, v = memory W_V^T + b_V: this call's block
  // gradients first (a tie adds them before they join the accumulator).
  merge_heads(g.dq, trace.dq);
  merge_heads(g.dk, trace.dk);
  merge_heads(g.dv, trace.dv);
  const std::size_t stacked = mha.block_offset(3);
  Matrix& dw = shape_buffer(trace.d_in_proj_weight, {stacked, d});
  Vector& db = shape_buffer(trace.d_in_proj_bias, {mha.bias() ? stacked : 0});
  AttentionInputGrads& out = trace.grads;
  shape_buffer(out.query, trace.query.shape());
  shape_buffer(out.memory, trace.memory.shape());
  Activations& dmemory_v = shape_buffer(trace.d_memory_v, trace.memory.shape());
  const float* w = mha.in_proj_weight.data();
  Activations* blocks[] = {&trace.dq, &trace.dk, &trace.dv};
  const std::size_t rows = trace.projected.shape()[0] / (mha.short_conv() ? 3 : 1);
  for (std::size_t which = 0; which < 3; ++which) {
    const Activations& x = which == 0 ? trace.query : trace.memory;
    const std::size_t n = x.shape()[1], width = mha.block_size(which);
    const std::size_t offset = mha.block_offset(which);
    float* dx = which == 0 ? out.query.data() : which == 1 ? out.memory.data() : dmemory_v.data();
    const float* d_projection = blocks[which]->data();
    if (mha.short_conv()) {  // back through SiLU and the convolution to the projection
      shape_buffer(trace.d_projection, {batch, n, width});
      mha.short_conv_backward(which, batch, n,
                              trace.projected.data() + which * rows * trace.projected.shape()[1],
                              blocks[which]->data(), trace.d_projection.data(), *grad.conv_weight);
      d_projection = trace.d_projection.data();
    }
    affine_backward(x.data(), batch * n, d, d, w + offset * d, width, d, d_projection, width, dx, d,
                    dw.data() + offset * d, mha.bias() ? db.data() + offset : nullptr, false);
  }
  add(out.memory.data(), dmemory_v.data(), out.memory.data(), out.memory.size());
  // g = logsigmoid(pre) / tau: dpre = dg sigmoid(-pre) / tau; beta = sigmoid(pre): dpre =
  // dbeta beta (1 - beta). Then the projections' own backward adds to dmemory.
  const auto gate_backward = [&](const TokenTensor& d_token, const Activations& pre,
                                 const std::optional<Linear>& proj,
                                 std::optional<Linear>& proj_grad, bool log_decay) {
    if (!proj || d_token.size() == 0) return;
    Activations d_pre = Activations::from_shape(pre.shape());
    const std::size_t heads = mha.heads(), rows = mha.key_rows();
    for (std::size_t b = 0; b < pre.shape()[0]; ++b)
      for (std::size_t j = 0; j < pre.shape()[1]; ++j)
        for (std::size_t c = 0; c < pre.shape()[2]; ++c) {  // as gates(): head c % H, row c / H
          const double x = pre(b, j, c), s = 1.0 / (1.0 + std::exp(-x));
          d_pre(b, j, c) = static_cast<float>(
              d_token(b, c % heads, j * rows + c / heads) *
              (log_decay ? (1.0 - s) / MultiHeadAttention::kGateTau : s * (1.0 - s)));
        }
    const Activations d_memory = backward(*proj, trace.memory, d_pre, *proj_grad);
    add(out.memory.data(), d_memory.data(), out.memory.data(), out.memory.size());
  };
  gate_backward(all.d_log_decay, trace.gates.g_pre, mha.gate_proj, grad.gate_proj, true);
  if (mha.channel_gate && all.d_channel_log_decay.size()) {
    // GLA: g = logsigmoid(pre) / tau, dpre = dg sigmoid(-pre) / tau. KDA: g = -A softplus(pre),
    // A = exp(a_log): dpre = -A sigmoid(pre) dg, da_log = sum dg g.
    const ChannelGate& c = *mha.channel_gate;
    ChannelGate& cg = *grad.channel_gate;
    const Activations& pre = trace.gates.channel_pre;
    const Tensor& dg = all.d_channel_log_decay;
    const std::size_t dk = mha.head_dim(), heads = mha.heads();
    Activations d_pre = Activations::from_shape(pre.shape());
    std::vector<double> d_a_log(heads, 0.0);
    for (std::size_t b = 0; b < pre.shape()[0]; ++b)
      for (std::size_t j = 0; j < pre.shape()[1]; ++j)
        for (std::size_t h = 0; h < heads; ++h)
          for (std::size_t i = 0; i < dk; ++i) {
            const double x = pre(b, j, h * dk + i), s = 1.0 / (1.0 + std::exp(-x));
            const double d = dg(b, h, j, i);
            if (c.kda()) {
              const double a = std::exp(double((*c.a_log)(h)));
              d_pre(b, j, h * dk + i) = static_cast<float>(-a * s * d);
              d_a_log[h] += d * trace.gates.channel_g(b, h, j, i);
            } else {
              d_pre(b, j, h * dk + i) =
                  static_cast<float>(d * (1.0 - s) / MultiHeadAttention::kGateTau);
            }
          }
    if (c.kda())
      for (std::size_t h = 0; h < heads; ++h) (*cg.a_log)(h) += static_cast<float>(d_a_log[h]);
    const Activations d_hidden = backward(c.up, trace.gates.channel_hidden, d_pre, cg.up);
    const Activations d_memory = backward(c.down, trace.memory, d_hidden, cg.down);
    add(out.memory.data(), d_memory.data(), out.memory.data(), out.memory.size());
  }
  gate_backward(all.d_beta, trace.gates.beta_pre, mha.beta_proj, grad.beta_proj, false);
  // The core's learned tensors: its gradients, named and shaped as attention_parameters.
  for (const ParameterTensor& d_core : all.parameters) {
    const auto into =
        std::find_if(grad.attention_parameters.begin(), grad.attention_parameters.end(),
                     [&](const ParameterTensor& p) { return p.name == d_core.name; });
    if (into == grad.attention_parameters.end() || into->values.size() != d_core.values.size())
      throw Error("multi-head attention backward: the core's gradient of " + d_core.name +
                  " has no parameter of its size in the gradients");
    add(into->values.data(), d_core.values.data(), into->values.data(), into->values.size());
  }
  if (mha.tied_qk()) {  // one matrix in two places: both blocks get the sum
    for (std::size_t i = 0; i < d * d; ++i) dw.data()[i] = dw.data()[d * d + i] += dw.data()[i];
    for (std::size_t i = 0; i < db.size() / 3; ++i) db.data()[i] = db.data()[d + i] += db.data()[i];
  }
  for (std::size_t i = 0; i < dw.size(); ++i) grad.in_proj_weight.data()[i] += dw.data()[i];
  for (std::size_t i = 0; i < db.size(); ++i) grad.in_proj_bias.data()[i] += db.data()[i];
  return out;
}

void swap_backward_scratch(AttentionTrace& a, AttentionTrace& b) {
  std::swap(a.d_merged, b.d_merged);
  std::swap(a.d_heads, b.d_heads);
  std::swap(a.core_grads, b.core_grads);
  std::swap(a.dq, b.dq);
  std::swap(a.dk, b.dk);
  std::swap(a.dv, b.dv);
  std::swap(a.d_memory_v, b.d_memory_v);
  std::swap(a.grads.memory, b.grads.memory);
}

}  // namespace attnlab::models
