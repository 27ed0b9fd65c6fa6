#include "models/transformer.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <utility>

#include "attnlab/error.hpp"
#include "attnlab/factory.hpp"

namespace attnlab::models {
namespace {

struct Switch {
  const char* name;
  bool LayerConfig::*field;
  bool value;  // what the switch sets the field to
};
constexpr Switch kSwitches[] = {
    {"pre-ln", &LayerConfig::pre_ln, true},
    {"no-skip", &LayerConfig::skip, false},
    {"no-ffn", &LayerConfig::feed_forward, false},
    {"no-norm", &LayerConfig::layer_norm, false},
    {"tied-qk", &LayerConfig::tied_qk, true},
    {"no-final-norm", &LayerConfig::final_norm, false},
    {"short-conv", &LayerConfig::short_conv, true},
    {"head-norm", &LayerConfig::head_norm, true},
    {"channel-gate", &LayerConfig::channel_gate, true},
};

void add_into(Activations& y, const Activations& x) {
  add(y.data(), x.data(), y.data(), y.size());
}

// One residual sublayer (models/residual.hpp) under the config's switches.
template <class F>
void sublayer(const LayerConfig& c, const Activations& x, const std::optional<LayerNorm>& norm,
              Activations& y, SublayerTrace* keep, F&& f) {
  residual_forward(c.pre_ln, c.skip, x, norm, y, keep, std::forward<F>(f));
}

template <class B>
Activations& sublayer_backward(const LayerConfig& c, const Activations& dy,
                               const std::optional<LayerNorm>& norm,
                               std::optional<LayerNorm>& norm_grad, SublayerTrace& t, B&& back) {
  return residual_backward(c.pre_ln, c.skip, dy, norm, norm_grad, t, std::forward<B>(back));
}

// Self-attention's input gradient: the query's and the memory's summed (one input), in the
// query's buffer.
Activations& self_attention_backward(const MultiHeadAttention& mha, AttentionTrace& trace,
                                     const Activations& dy, MultiHeadAttention& grad) {
  AttentionInputGrads& g = backward(mha, trace, dy, grad);
  add_into(g.query, g.memory);
  return g.query;
}

std::optional<LayerNorm> make_norm(const LayerConfig& c, bool present) {
  if (!c.layer_norm || !present) return std::nullopt;
  return LayerNorm(c.d_model, c.eps);
}

std::optional<FeedForward> make_ffn(const LayerConfig& c) {
  if (!c.feed_forward) return std::nullopt;
  return FeedForward(c.d_model, c.ffn);
}

void norm_parameters(std::optional<LayerNorm>& norm, const std::string& name, Parameters& out) {
  if (norm) norm->parameters(name, out);
}

// The options of a layer's attention: `self` for self-attention (the short convolution is
// self-attention's alone).
AttentionOptions attention_options(const LayerConfig& c, bool self) {
  AttentionOptions o;
  o.tied_qk = c.tied_qk;
  o.short_conv = self && c.short_conv;
  o.head_norm = c.head_norm;
  o.channel_gate = c.channel_gate;
  return o;
}

std::string layer_prefix(const std::string& prefix, std::size_t i) {
  return prefix + "layers." + std::to_string(i) + ".";
}

}  // namespace

void LayerConfig::validate() const {
  auto fail = [&](const std::string& what) { throw Error("model layer: " + what); };
  if (d_model == 0 || heads == 0 || d_model % heads != 0)
    fail("d_model=" + std::to_string(d_model) +
         " is not a positive multiple of heads=" + std::to_string(heads));
  if (feed_forward && ffn == 0) fail("ffn=0: the FFN needs a hidden size >= 1 (or no-ffn)");
  if (!(eps > 0) || !std::isfinite(eps)) fail("eps=" + std::to_string(eps) + ": expected > 0");
  if (!final_norm && !pre_ln)
    fail("no-final-norm without pre-ln: only a pre-LN stack ends in a final LayerNorm");
  if (short_conv && tied_qk)
    fail("short-conv with tied-qk: the convolution would make k differ from q");
  for (const std::string& part : layer_specs(spec)) {
    const std::unique_ptr<Attention> core = make_attention(part);  // throws Error quoting it
    if (channel_gate && !core->support().channel_decay)
      fail("channel-gate with spec '" + part +
           "': its core takes no per-channel log-decay (gla, kda and gated-delta do)");
  }
}

std::vector<std::string> layer_specs(const std::string& spec) {
  std::vector<std::string> parts;
  for (std::size_t start = 0;;) {
    const std::size_t end = spec.find(';', start);
    parts.push_back(spec.substr(start, end == std::string::npos ? end : end - start));
    if (parts.back().empty())
      throw Error("model spec '" + spec +
                  "': an empty layer spec (the layers' specs are separated by ';')");
    if (end == std::string::npos) return parts;
    start = end + 1;
  }
}

void apply_switches(LayerConfig& config, const std::string& list) {
  LayerConfig result = config;  // all or nothing
  std::size_t start = 0;
  while (start < list.size()) {
    const auto comma = list.find(',', start);
    const std::string token =
        list.substr(start, comma == std::string::npos ? comma : comma - start);
    bool known = false;
    for (const Switch& s : kSwitches)
      if (token == s.name) {
        result.*s.field = s.value;
        known = true;
      }
    if (!known)
      throw Error("model switches '" + list + "': unknown switch '" + token +
                  "' (known: " + switch_names() + ")");
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  config = result;
}

std::string switch_names() {
  std::string names;
  for (const Switch& s : kSwitches) names += (names.empty() ? "" : ", ") + std::string(s.name);
  return names;
}

std::string switches_text(const LayerConfig& config) {
  std::string out;
  for (const Switch& s : kSwitches)
    if (config.*s.field == s.value) out += std::string(out.empty() ? "" : ",") + s.name;
  return out;
}

// ------------------------------------------------------------------------------ EncoderLayer

EncoderLayer::EncoderLayer(const LayerConfig& config)
    : self_attn(config.d_model, config.heads, config.spec, attention_options(config, true)),
      ffn(make_ffn(config)),
      norm1(make_norm(config, true)),
      norm2(make_norm(config, config.feed_forward)),
      config_(config) {
  config.validate();
}

Activations EncoderLayer::attention_input(const Activations& x) const {
  return config_.pre_ln && norm1 ? norm1->forward(x) : x;
}

Activations EncoderLayer::forward(const Activations& x, const Mask& mask) const {
  Activations y;
  forward(x, mask, y);
  return y;
}

void EncoderLayer::forward(const Activations& x, const Mask& mask, Activations& y,
                           EncoderLayerTrace* keep) const {
  forward_with(
      x,
      [&](const Activations& a, Activations& out) {
        self_attn.forward(a, a, mask, out, keep ? &keep->attention : nullptr);
      },
      y, keep);
}

void EncoderLayer::decode(const Activations& x, AttentionDecoding& state, Activations& y) const {
  forward_with(
      x, [&](const Activations& a, Activations& out) { self_attn.decode(a, state, out); }, y,
      nullptr);
}

void EncoderLayer::forward_with(const Activations& x, const SelfAttentionCall& attend,
                                Activations& y, EncoderLayerTrace* keep) const {
  Activations scratch;
  Activations& h = !ffn ? y : keep ? keep->attended : scratch;
  sublayer(config_, x, norm1, h, keep ? &keep->sublayer1 : nullptr, attend);
  if (!ffn) return;
  sublayer(config_, h, norm2, y, keep ? &keep->sublayer2 : nullptr,
           [&](const Activations& a, Activations& out) {
             ffn->forward(a, out, keep ? &keep->ffn : nullptr);
           });
}

void EncoderLayer::initialize(std::uint64_t seed, const std::string& prefix) {
  self_attn.initialize(seed, prefix + "self_attn.");
  if (ffn) ffn->initialize(seed, prefix);
  for (auto* norm : {&norm1, &norm2})
    if (*norm) (*norm)->initialize();
}

void EncoderLayer::parameters(const std::string& prefix, Parameters& out) {
  self_attn.parameters(prefix + "self_attn.", out);
  if (ffn) ffn->parameters(prefix, out);
  norm_parameters(norm1, prefix + "norm1.", out);
  norm_parameters(norm2, prefix + "norm2.", out);
}

void EncoderLayer::check(const std::string& prefix) const {
  self_attn.check_tied(prefix + "self_attn.");
}

void EncoderLayer::set_attention(const std::string& spec) {
  self_attn.set_attention(spec);
  config_.spec = spec;
}

// ------------------------------------------------------------------------------ DecoderLayer

DecoderLayer::DecoderLayer(const LayerConfig& config)
    : self_attn(config.d_model, config.heads, config.spec, attention_options(config, true)),
      multihead_attn(config.d_model, config.heads, config.spec, attention_options(config, false)),
      ffn(make_ffn(config)),
      norm1(make_norm(config, true)),
      norm2(make_norm(config, true)),
      norm3(make_norm(config, config.feed_forward)),
      config_(config) {
  config.validate();
}

Activations DecoderLayer::forward(const Activations& x, const Activations& memory,
                                  const Mask& self_mask, const Mask& memory_mask) const {
  Activations y;
  forward(x, memory, self_mask, memory_mask, y);
  return y;
}

void DecoderLayer::forward(const Activations& x, const Activations& memory, const Mask& self_mask,
                           const Mask& memory_mask, Activations& y, DecoderLayerTrace* keep) const {
  Mask causal = self_mask;
  if (causal.causal == Causal::none) causal.causal = Causal::top_left;
  Activations scratch1, scratch2;
  Activations& h1 = keep ? keep->attended : scratch1;
  Activations& h2 = !ffn ? y : keep ? keep->crossed : scratch2;
  sublayer(config_, x, norm1, h1, keep ? &keep->sublayer1 : nullptr,
           [&](const Activations& a, Activations& out) {
             self_attn.forward(a, a, causal, out, keep ? &keep->self_attention : nullptr);
           });
  sublayer(config_, h1, norm2, h2, keep ? &keep->sublayer2 : nullptr,
           [&](const Activations& a, Activations& out) {
             multihead_attn.forward(a, memory, memory_mask, out,
                                    keep ? &keep->cross_attention : nullptr);
           });
  if (!ffn) return;
  sublayer(config_, h2, norm3, y, keep ? &keep->sublayer3 : nullptr,
           [&](const Activations& a, Activations& out) {
             ffn->forward(a, out, keep ? &keep->ffn : nullptr);
           });
}

void DecoderLayer::initialize(std::uint64_t seed, const std::string& prefix) {
  self_attn.initialize(seed, prefix + "self_attn.");
  multihead_attn.initialize(seed, prefix + "multihead_attn.");
  if (ffn) ffn->initialize(seed, prefix);
  for (auto* norm : {&norm1, &norm2, &norm3})
    if (*norm) (*norm)->initialize();
}

void DecoderLayer::parameters(const std::string& prefix, Parameters& out) {
  self_attn.parameters(prefix + "self_attn.", out);
  multihead_attn.parameters(prefix + "multihead_attn.", out);
  if (ffn) ffn->parameters(prefix, out);
  norm_parameters(norm1, prefix + "norm1.", out);
  norm_parameters(norm2, prefix + "norm2.", out);
  norm_parameters(norm3, prefix + "norm3.", out);
}

void DecoderLayer::check(const std::string& prefix) const {
  self_attn.check_tied(prefix + "self_attn.");
  multihead_attn.check_tied(prefix + "multihead_attn.");
}

void DecoderLayer::set_attention(const std::string& spec) {
  self_attn.set_attention(spec);
  multihead_attn.set_attention(spec);
  config_.spec = spec;
}

// ------------------------------------------------------------------------------ stacks

template <class Layer>
Stack<Layer>::Stack(const LayerConfig& config, std::size_t count)
    : layers(make_layers<Layer>(config, count)),
      norm(make_norm(config, config.pre_ln && config.final_norm)) {}

template <class Layer>
void Stack<Layer>::initialize(std::uint64_t seed, const std::string& prefix) {
  for (std::size_t i = 0; i < layers.size(); ++i)
    layers[i].initialize(seed, layer_prefix(prefix, i));
  if (norm) norm->initialize();
}

template <class Layer>
void Stack<Layer>::parameters(const std::string& prefix, Parameters& out) {
  for (std::size_t i = 0; i < layers.size(); ++i)
    layers[i].parameters(layer_prefix(prefix, i), out);
  norm_parameters(norm, prefix + "norm.", out);
}

template <class Layer>
void Stack<Layer>::check(const std::string& prefix) const {
  for (std::size_t i = 0; i < layers.size(); ++i) layers[i].check(layer_prefix(prefix, i));
}

template <class Layer>
void Stack<Layer>::set_attention(const std::string& spec) {
  const std::vector<std::string> specs = layer_specs(spec);
  for (std::size_t i = 0; i < layers.size(); ++i) layers[i].set_attention(specs[i % specs.size()]);
}

template class Stack<EncoderLayer>;
template class Stack<DecoderLayer>;

Activations Encoder::forward(const Activations& x, const Mask& mask,
                             const LayerObserver& observe) const {
  Activations y;
  forward(x, mask, y, nullptr, observe);
  return y;
}

void Encoder::forward(const Activations& x, const Mask& mask, Activations& y, EncoderTrace* keep,
                      const LayerObserver& observe) const {
  stack_forward<EncoderLayerTrace>(
      layers, norm, x, y, keep, observe,
      [&](const EncoderLayer& layer, const Activations& h, Activations& out, EncoderLayerTrace* t) {
        layer.forward(h, mask, out, t);
      });
}

Activations Decoder::forward(const Activations& x, const Activations& memory, const Mask& self_mask,
                             const Mask& memory_mask, const LayerObserver& observe) const {
  Activations y;
  forward(x, memory, self_mask, memory_mask, y, nullptr, observe);
  return y;
}

void Decoder::forward(const Activations& x, const Activations& memory, const Mask& self_mask,
                      const Mask& memory_mask, Activations& y, DecoderTrace* keep,
                      const LayerObserver& observe) const {
  stack_forward<DecoderLayerTrace>(
      layers, norm, x, y, keep, observe,
      [&](const DecoderLayer& layer, const Activations& h, Activations& out, DecoderLayerTrace* t) {
        layer.forward(h, memory, self_mask, memory_mask, out, t);
      });
}

// ------------------------------------------------------------------------------ EncoderModel

Arch parse_arch(const std::string& name) {
  if (name == "transformer") return Arch::transformer;
  if (name == "llama") return Arch::llama;
  throw Error("arch '" + name + "': unknown (known: transformer, llama)");
}

std::string arch_name(Arch arch) {
  return arch == Arch::llama ? "llama" : "transformer";
}

void ModelConfig::validate() const {
  const LayerConfig& l = layer;
  if (arch == Arch::llama) {
    LayerConfig pre_norm = l;  // the Llama block is pre-norm whatever pre_ln says
    pre_norm.pre_ln = true;
    pre_norm.validate();
    if (l.kv_heads != 0 && (l.kv_heads > l.heads || l.heads % l.kv_heads != 0))
      throw Error("model: kv_heads=" + std::to_string(l.kv_heads) +
                  " does not divide heads=" + std::to_string(l.heads) +
                  ": each key and value head must serve the same number of query heads");
    if (l.kv_heads != 0 && l.kv_heads != l.heads && l.tied_qk)
      throw Error("model: kv_heads=" + std::to_string(l.kv_heads) + " < heads=" +
                  std::to_string(l.heads) + " with tied-qk: W_K has fewer rows than W_Q");
    if (!(l.rope_base > 0) || !std::isfinite(l.rope_base))
      throw Error("model: rope_base=" + std::to_string(l.rope_base) +
                  ", expected a finite number > 0 (the rotary embeddings' base)");
    if ((l.d_model / l.heads) % 2 != 0)
      throw Error("model: head dimension d_model / heads = " + std::to_string(l.d_model) + " / " +
                  std::to_string(l.heads) + " = " + std::to_string(l.d_model / l.heads) +
                  " is odd: rotary embeddings turn channel j with channel j + head_dim / 2");
  } else {
    l.validate();
    if (l.kv_heads != 0 && l.kv_heads != l.heads)
      throw Error("model: kv_heads=" + std::to_string(l.kv_heads) +
                  ": the 2017 Transformer has as many key and value heads as query heads "
                  "(grouped heads: arch llama)");
    if (l.rope_base != LayerConfig{}.rope_base)
      throw Error("model: rope_base=" + std::to_string(l.rope_base) +
                  ": the 2017 Transformer adds sinusoidal positions, it has no rotary embeddings "
                  "(arch llama)");
  }
  if (layers == 0) throw Error("model: layers=0, expected at least 1");
  if (vocab == 0) throw Error("model: vocab=0, expected at least 1");
  require_memory(4 * parameter_count(), "model: the weights of layers=" + std::to_string(layers) +
                                            ", d_model=" + std::to_string(layer.d_model) +
                                            ", ffn=" + std::to_string(layer.ffn) +
                                            ", vocab=" + std::to_string(vocab));
}

double ModelConfig::parameter_count() const {
  const double d = double(layer.d_model), ffn = layer.feed_forward ? double(layer.ffn) : 0;
  if (arch == Arch::llama) {  // no biases, a SwiGLU, RMSNorms with a gain only
    const double kv = layer.kv_heads ? d / double(layer.heads) * double(layer.kv_heads) : d;
    const double attention = (layer.tied_qk ? 1 : 2) * d * d + 2 * d * kv;
    const double norms = layer.layer_norm ? 2 * d : 0;
    const double final_norm = layer.layer_norm && layer.final_norm ? d : 0;
    return double(vocab) * d + double(layers) * (attention + 3 * d * ffn + norms) + final_norm;
  }
  const double attention = (layer.tied_qk ? 2 : 3) * d * d + 3 * d + d * d + d;
  const double feed_forward = layer.feed_forward ? 2 * d * ffn + ffn + d : 0;
  const double norms = layer.layer_norm ? 2 * 2 * d : 0;
  const double final_norm = layer.layer_norm && layer.pre_ln ? 2 * d : 0;
  return double(vocab) * d + double(layers) * (attention + feed_forward + norms) + final_norm;
}

double memory_limit_bytes() {
  double limit = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
  rlimit as{};
  if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY)
    limit = std::min(limit, double(as.rlim_cur));
  return limit;
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (u < 4 && bytes >= 1024) bytes /= 1024, ++u;
  char text[64];
  std::snprintf(text, sizeof text, bytes < 1e4 ? "%.1f %s" : "%.2g %s", bytes, units[u]);
  return text;
}

void require_memory(double bytes, const std::string& what) {
  const double limit = memory_limit_bytes();
  if (bytes > limit)
    throw Error(what + " need at least " + format_bytes(bytes) + ", more than the " +
                format_bytes(limit) + " this process may use (physical memory or ulimit -v)");
}

EncoderModel::EncoderModel(const ModelConfig& config) : EncoderModel(config, true) {}

namespace {
const ModelConfig& validated(const ModelConfig& config) {
  if (config.arch != Arch::transformer)
    throw Error("EncoderModel: arch=" + arch_name(config.arch) +
                " is another model (models/llama.hpp: LlamaModel)");
  config.validate();  // before any member allocates what the sizes ask for
  return config;
}
}  // namespace

EncoderModel::EncoderModel(const ModelConfig& config, bool initialise)
    : embedding(validated(config).vocab, config.layer.d_model),
      encoder(config.layer, config.layers),
      config_(config) {
  if (!initialise) return;
  embedding.initialize(config.seed, "embedding.");
  encoder.initialize(config.seed, "encoder.");
}

Activations EncoderModel::embed(const Tokens& tokens) const {
  Activations x;
  Matrix positions;
  embed(tokens, x, positions);
  return x;
}

namespace {
// x [B, N, d] <- x · sqrt(d) + positions [N, d], for every item.
void scale_and_add_positions(Activations& x, const Matrix& positions) {
  const std::size_t n = x.shape()[1], d = x.shape()[2];
  const float scale = static_cast<float>(std::sqrt(static_cast<double>(d)));
  const float* pe = positions.data();
  for (std::size_t b = 0; b < x.shape()[0]; ++b) {
    float* row = &x(b, 0, 0);
    for (std::size_t i = 0; i < n * d; ++i) row[i] = row[i] * scale + pe[i];
  }
}
}  // namespace

void EncoderModel::embed(const Tokens& tokens, Activations& x, Matrix& positions) const {
  embedding.forward(tokens, x);
  const std::size_t n = tokens.shape()[1], d = config_.layer.d_model;
  if (positions.shape() != Matrix::shape_type{n, d}) positions = sinusoidal_positions(n, d);
  scale_and_add_positions(x, positions);
}

void EncoderModel::embed(const Tokens& tokens, std::size_t first, Activations& x) const {
  embedding.forward(tokens, x);
  scale_and_add_positions(x, sinusoidal_positions(tokens.shape()[1], config_.layer.d_model, first));
}

Activations EncoderModel::forward(const Tokens& tokens, const Mask& mask,
                                  const LayerObserver& observe) const {
  Activations y;
  forward(tokens, mask, y, nullptr, observe);
  return y;
}

void EncoderModel::forward(const Tokens& tokens, const Mask& mask, Activations& y, ModelTrace* keep,
                           const LayerObserver& observe) const {
  ModelTrace scratch;  // without `keep`: freed on return
  ModelTrace& t = keep ? *keep : scratch;
  if (keep) t.tokens = tokens;
  embed(tokens, t.embedded, t.positions);
  encoder.forward(t.embedded, mask, y, keep ? &keep->encoder : nullptr, observe);
}

Parameters EncoderModel::parameters() {
  Parameters out;
  embedding.parameters("embedding.", out);
  encoder.parameters("encoder.", out);
  return out;
}

void EncoderModel::save(const std::string& dir) const {
  save_weights(dir, const_cast<EncoderModel&>(*this).parameters());  // reads only
}

std::vector<std::string> EncoderModel::load(const std::string& dir) {
  EncoderModel fresh(config_, false);
  auto unused = load_weights(dir, fresh.parameters());
  fresh.encoder.check(dir + "/encoder.");
  *this = std::move(fresh);
  return unused;
}

EncoderModel EncoderModel::with_attention(const std::string& spec) const {
  EncoderModel copy = *this;
  copy.encoder.set_attention(spec);
  copy.config_.layer.spec = spec;
  return copy;
}

// ------------------------------------------------------------------------------ backward

const Activations& forward(const EncoderLayer& layer, const Activations& x, const Mask& mask,
                           EncoderLayerTrace& trace) {
  layer.forward(x, mask, trace.output, &trace);
  return trace.output;
}

const Activations& forward(const Encoder& encoder, const Activations& x, const Mask& mask,
                           EncoderTrace& trace) {
  encoder.forward(x, mask, trace.output, &trace);
  return trace.output;
}

const Activations& forward(const DecoderLayer& layer, const Activations& x,
                           const Activations& memory, const Mask& self_mask,
                           const Mask& memory_mask, DecoderLayerTrace& trace) {
  layer.forward(x, memory, self_mask, memory_mask, trace.output, &trace);
  return trace.output;
}

const Activations& forward(const Decoder& decoder, const Activations& x, const Activations& memory,
                           const Mask& self_mask, const Mask& memory_mask, DecoderTrace& trace) {
  decoder.forward(x, memory, self_mask, memory_mask, trace.output, &trace);
  return trace.output;
}

const Activations& forward(const EncoderModel& model, const Tokens& tokens, const Mask& mask,
                           ModelTrace& trace) {
  model.forward(tokens, mask, trace.encoder.output, &trace);
  return trace.encoder.output;
}

EncoderModel zero_like(const EncoderModel& model) {
  EncoderModel grad = model;
  for (const ParameterRef& p : grad.parameters()) fill_constant(p, 0.0f);
  return grad;
}

Activations& backward(const EncoderLayer& layer, EncoderLayerTrace& trace, const Activations& dy,
                      EncoderLayer& grad) {
  const LayerConfig& c = layer.config();
  const Activations* dh = &dy;
  if (layer.ffn)
    dh = &sublayer_backward(c, dy, layer.norm2, grad.norm2, trace.sublayer2,
                            [&](const Activations& d) -> Activations& {
                              return backward(*layer.ffn, trace.ffn, d, *grad.ffn);
                            });
  return sublayer_backward(
      c, *dh, layer.norm1, grad.norm1, trace.sublayer1, [&](const Activations& d) -> Activations& {
        return self_attention_backward(layer.self_attn, trace.attention, d, grad.self_attn);
      });
}

// The buffers that a layer's backward uses only while it runs (all but its result): one set
// serves every layer of a stack in turn (models/residual.hpp: stack_backward).
void swap_backward_scratch(EncoderLayerTrace& a, EncoderLayerTrace& b) {
  swap_backward_scratch(a.ffn, b.ffn);
  swap_backward_scratch(a.attention, b.attention);
}

const Activations& backward(const Encoder& encoder, EncoderTrace& trace, const Activations& dy,
                            Encoder& grad) {
  return stack_backward(encoder.layers, encoder.norm, trace, dy, grad.layers, grad.norm);
}

DecoderInputGrads backward(const DecoderLayer& layer, DecoderLayerTrace& trace,
                           const Activations& dy, DecoderLayer& grad) {
  const LayerConfig& c = layer.config();
  const Activations* dh = &dy;
  if (layer.ffn)
    dh = &sublayer_backward(c, dy, layer.norm3, grad.norm3, trace.sublayer3,
                            [&](const Activations& d) -> Activations& {
                              return backward(*layer.ffn, trace.ffn, d, *grad.ffn);
                            });
  Activations* dmemory = nullptr;
  dh = &sublayer_backward(
      c, *dh, layer.norm2, grad.norm2, trace.sublayer2, [&](const Activations& d) -> Activations& {
        AttentionInputGrads& g =
            backward(layer.multihead_attn, trace.cross_attention, d, grad.multihead_attn);
        dmemory = &g.memory;
        return g.query;
      });
  const Activations& dx = sublayer_backward(
      c, *dh, layer.norm1, grad.norm1, trace.sublayer1, [&](const Activations& d) -> Activations& {
        return self_attention_backward(layer.self_attn, trace.self_attention, d, grad.self_attn);
      });
  return {dx, *dmemory};
}

DecoderInputGrads backward(const Decoder& decoder, DecoderTrace& trace, const Activations& dy,
                           Decoder& grad) {
  if (decoder.norm) backward(*decoder.norm, trace.norm_input, dy, *grad.norm, trace.d_norm);
  DecoderInputGrads out{decoder.norm ? trace.d_norm : dy, {}};
  for (std::size_t i = decoder.layers.size(); i-- > 0;) {
    DecoderInputGrads g = backward(decoder.layers[i], trace.layers[i], out.x, grad.layers[i]);
    out.x = std::move(g.x);
    if (out.memory.size() == 0)
      out.memory = std::move(g.memory);
    else
      add_into(out.memory, g.memory);
  }
  return out;
}

void backward(const EncoderModel& model, ModelTrace& trace, const Activations& dy,
              EncoderModel& grad) {
  const Activations& dx = backward(model.encoder, trace.encoder, dy, grad.encoder);
  const std::size_t dim = model.embedding.weight.shape()[1];
  const float scale = static_cast<float>(std::sqrt(static_cast<double>(dim)));
  for (std::size_t i = 0; i < trace.tokens.size(); ++i) {  // the positions add no parameter
    float* row =
        grad.embedding.weight.data() + static_cast<std::size_t>(trace.tokens.data()[i]) * dim;
    for (std::size_t c = 0; c < dim; ++c) row[c] += scale * dx.data()[i * dim + c];
  }
}

}  // namespace attnlab::models
