#include "models/transformer.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
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
};

void add_into(Activations& y, const Activations& x) {
  add(y.data(), x.data(), y.data(), y.size());
}

// One residual sublayer: x + f(LN(x)) under pre-LN, LN(x + f(x)) under post-LN, without the
// parts that are switched off.
template <class F>
Activations sublayer(const LayerConfig& c, const Activations& x,
                     const std::optional<LayerNorm>& norm, F&& f) {
  Activations y = c.pre_ln && norm ? f(norm->forward(x)) : f(x);
  if (c.skip) add_into(y, x);
  if (!c.pre_ln && norm) return norm->forward(std::move(y));  // in y's storage
  return y;
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
  make_attention(spec);  // throws Error quoting the spec
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
    : self_attn(config.d_model, config.heads, config.spec, config.tied_qk, config.short_conv,
                config.head_norm),
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
  Activations h =
      sublayer(config_, x, norm1, [&](const Activations& a) { return self_attn.forward(a, mask); });
  if (!ffn) return h;
  return sublayer(config_, h, norm2, [&](const Activations& a) { return ffn->forward(a); });
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
    : self_attn(config.d_model, config.heads, config.spec, config.tied_qk, config.short_conv,
                config.head_norm),
      multihead_attn(config.d_model, config.heads, config.spec, config.tied_qk, false,
                     config.head_norm),
      ffn(make_ffn(config)),
      norm1(make_norm(config, true)),
      norm2(make_norm(config, true)),
      norm3(make_norm(config, config.feed_forward)),
      config_(config) {
  config.validate();
}

Activations DecoderLayer::forward(const Activations& x, const Activations& memory,
                                  const Mask& self_mask, const Mask& memory_mask) const {
  Mask causal = self_mask;
  if (causal.causal == Causal::none) causal.causal = Causal::top_left;
  Activations h = sublayer(config_, x, norm1,
                           [&](const Activations& a) { return self_attn.forward(a, causal); });
  h = sublayer(config_, h, norm2, [&](const Activations& a) {
    return multihead_attn.forward(a, memory, memory_mask);
  });
  if (!ffn) return h;
  return sublayer(config_, h, norm3, [&](const Activations& a) { return ffn->forward(a); });
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
    : layers(count, Layer(config)), norm(make_norm(config, config.pre_ln && config.final_norm)) {}

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
  for (auto& layer : layers) layer.set_attention(spec);
}

template class Stack<EncoderLayer>;
template class Stack<DecoderLayer>;

namespace {

// Runs `layers` in turn (step(layer, h) -> the layer's output), observed, then the final norm.
template <class Layers, class Step>
Activations run_layers(const Layers& layers, const std::optional<LayerNorm>& norm,
                       const Activations& x, const LayerObserver& observe, Step step) {
  Activations h = x;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    Activations next = step(layers[i], h);
    if (observe) observe(i, h, next);
    h = std::move(next);
  }
  if (norm) return norm->forward(std::move(h));
  return h;
}

}  // namespace

Activations Encoder::forward(const Activations& x, const Mask& mask,
                             const LayerObserver& observe) const {
  return run_layers(layers, norm, x, observe, [&](const EncoderLayer& layer, const Activations& h) {
    return layer.forward(h, mask);
  });
}

Activations Decoder::forward(const Activations& x, const Activations& memory, const Mask& self_mask,
                             const Mask& memory_mask, const LayerObserver& observe) const {
  return run_layers(layers, norm, x, observe, [&](const DecoderLayer& layer, const Activations& h) {
    return layer.forward(h, memory, self_mask, memory_mask);
  });
}

// ------------------------------------------------------------------------------ EncoderModel

void ModelConfig::validate() const {
  layer.validate();
  if (layers == 0) throw Error("model: layers=0, expected at least 1");
  if (vocab == 0) throw Error("model: vocab=0, expected at least 1");
  require_memory(4 * parameter_count(), "model: the weights of layers=" + std::to_string(layers) +
                                            ", d_model=" + std::to_string(layer.d_model) +
                                            ", ffn=" + std::to_string(layer.ffn) +
                                            ", vocab=" + std::to_string(vocab));
}

double ModelConfig::parameter_count() const {
  const double d = double(layer.d_model), ffn = layer.feed_forward ? double(layer.ffn) : 0;
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

void EncoderModel::embed(const Tokens& tokens, Activations& x, Matrix& positions) const {
  embedding.forward(tokens, x);
  const std::size_t n = tokens.shape()[1], d = config_.layer.d_model;
  if (positions.shape() != Matrix::shape_type{n, d}) positions = sinusoidal_positions(n, d);
  const float scale = static_cast<float>(std::sqrt(static_cast<double>(d)));
  const float* pe = positions.data();
  for (std::size_t b = 0; b < tokens.shape()[0]; ++b) {
    float* row = &x(b, 0, 0);
    for (std::size_t i = 0; i < n * d; ++i) row[i] = row[i] * scale + pe[i];
  }
}

Activations EncoderModel::forward(const Tokens& tokens, const Mask& mask,
                                  const LayerObserver& observe) const {
  return encoder.forward(embed(tokens), mask, observe);
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

}  // namespace attnlab::models
