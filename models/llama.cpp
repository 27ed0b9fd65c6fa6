#include "models/llama.hpp"

#include <utility>

#include "attnlab/error.hpp"

namespace attnlab::models {
namespace {

AttentionOptions llama_attention(const LayerConfig& c) {
  AttentionOptions o;
  o.tied_qk = c.tied_qk;
  o.short_conv = c.short_conv;
  o.head_norm = c.head_norm;
  o.channel_gate = c.channel_gate;
  o.bias = false;
  o.rope_base = c.rope_base;
  o.names = AttentionNames::llama;
  o.kv_heads = c.kv_heads;
  return o;
}

const LayerConfig& validated(const LayerConfig& c) {
  ModelConfig m;
  m.layer = c;
  m.layers = 1;
  m.vocab = 1;
  m.arch = Arch::llama;
  m.validate();
  return c;
}

std::optional<RMSNorm> make_norm(const LayerConfig& c, bool present) {
  if (!c.layer_norm || !present) return std::nullopt;
  return RMSNorm(c.d_model, c.eps);
}

void add_parameters(std::optional<RMSNorm>& norm, const std::string& prefix, Parameters& out) {
  if (norm) norm->parameters(prefix, out);
}

}  // namespace

// ------------------------------------------------------------------------------ LlamaBlock

LlamaBlock::LlamaBlock(const LayerConfig& config)
    : self_attn(validated(config).d_model, config.heads, config.spec, llama_attention(config)),
      mlp(config.feed_forward ? std::optional<SwiGLU>(SwiGLU(config.d_model, config.ffn))
                              : std::nullopt),
      input_layernorm(make_norm(config, true)),
      post_attention_layernorm(make_norm(config, config.feed_forward)),
      config_(config) {
  config_.pre_ln = true;  // always pre-norm
}

Activations LlamaBlock::forward(const Activations& x, const Mask& mask) const {
  Activations y;
  forward(x, mask, y);
  return y;
}

void LlamaBlock::forward(const Activations& x, const Mask& mask, Activations& y,
                         LlamaBlockTrace* keep) const {
  forward_with(
      x,
      [&](const Activations& a, Activations& out) {
        self_attn.forward(a, a, mask, out, keep ? &keep->attention : nullptr);
      },
      y, keep);
}

void LlamaBlock::decode(const Activations& x, AttentionDecoding& state, Activations& y) const {
  forward_with(
      x, [&](const Activations& a, Activations& out) { self_attn.decode(a, state, out); }, y,
      nullptr);
}

void LlamaBlock::forward_with(const Activations& x, const SelfAttentionCall& attend, Activations& y,
                              LlamaBlockTrace* keep) const {
  Activations scratch;
  Activations& h = !mlp ? y : keep ? keep->attended : scratch;
  residual_forward(true, config_.skip, x, input_layernorm, h, keep ? &keep->sublayer1 : nullptr,
                   attend);
  if (!mlp) return;
  residual_forward(true, config_.skip, h, post_attention_layernorm, y,
                   keep ? &keep->sublayer2 : nullptr, [&](const Activations& a, Activations& out) {
                     mlp->forward(a, out, keep ? &keep->mlp : nullptr);
                   });
}

void LlamaBlock::initialize(std::uint64_t seed, const std::string& prefix) {
  self_attn.initialize(seed, prefix + "self_attn.");
  if (mlp) mlp->initialize(seed, prefix + "mlp.", MultiHeadAttention::kLlamaInitStd);
  for (auto* norm : {&input_layernorm, &post_attention_layernorm})
    if (*norm) (*norm)->initialize();
}

void LlamaBlock::parameters(const std::string& prefix, Parameters& out) {
  self_attn.parameters(prefix + "self_attn.", out);
  if (mlp) mlp->parameters(prefix + "mlp.", out);
  add_parameters(input_layernorm, prefix + "input_layernorm.", out);
  add_parameters(post_attention_layernorm, prefix + "post_attention_layernorm.", out);
}

void LlamaBlock::check(const std::string& prefix) const {
  self_attn.check_tied(prefix + "self_attn.");
}

void LlamaBlock::set_attention(const std::string& spec) {
  self_attn.set_attention(spec);
  config_.spec = spec;
}

const Activations& forward(const LlamaBlock& block, const Activations& x, const Mask& mask,
                           LlamaBlockTrace& trace) {
  block.forward(x, mask, trace.output, &trace);
  return trace.output;
}

Activations& backward(const LlamaBlock& block, LlamaBlockTrace& trace, const Activations& dy,
                      LlamaBlock& grad) {
  const bool skip = block.config().skip;
  const Activations* dh = &dy;
  if (block.mlp)
    dh = &residual_backward(true, skip, dy, block.post_attention_layernorm,
                            grad.post_attention_layernorm, trace.sublayer2,
                            [&](const Activations& d) -> Activations& {
                              return backward(*block.mlp, trace.mlp, d, *grad.mlp);
                            });
  return residual_backward(true, skip, *dh, block.input_layernorm, grad.input_layernorm,
                           trace.sublayer1, [&](const Activations& d) -> Activations& {
                             // self-attention: query and memory are one input
                             AttentionInputGrads& g =
                                 backward(block.self_attn, trace.attention, d, grad.self_attn);
                             add(g.query.data(), g.memory.data(), g.query.data(), g.query.size());
                             return g.query;
                           });
}

void swap_backward_scratch(LlamaBlockTrace& a, LlamaBlockTrace& b) {
  swap_backward_scratch(a.mlp, b.mlp);
  swap_backward_scratch(a.attention, b.attention);
}

// ------------------------------------------------------------------------------ LlamaModel

namespace {

const ModelConfig& validated(const ModelConfig& config) {
  if (config.arch != Arch::llama)
    throw Error("LlamaModel: arch=" + arch_name(config.arch) +
                " is another model (models/transformer.hpp: EncoderModel)");
  config.validate();  // before any member allocates what the sizes ask for
  return config;
}

}  // namespace

LlamaModel::LlamaModel(const ModelConfig& config) : LlamaModel(config, true) {}

LlamaModel::LlamaModel(const ModelConfig& config, bool initialise)
    : embed_tokens(validated(config).vocab, config.layer.d_model),
      layers(make_layers<LlamaBlock>(config.layer, config.layers)),
      norm(make_norm(config.layer, config.layer.final_norm)),
      config_(config) {
  config_.layer.pre_ln = true;
  if (!initialise) return;
  fill_normal(parameter("model.embed_tokens.weight", embed_tokens.weight),
              MultiHeadAttention::kLlamaInitStd, config.seed);
  for (std::size_t i = 0; i < layers.size(); ++i)
    layers[i].initialize(config.seed, "model.layers." + std::to_string(i) + ".");
  if (norm) norm->initialize();
}

Activations LlamaModel::forward(const Tokens& tokens, const Mask& mask,
                                const LayerObserver& observe) const {
  Activations y;
  forward(tokens, mask, y, nullptr, observe);
  return y;
}

void LlamaModel::forward(const Tokens& tokens, const Mask& mask, Activations& y, LlamaTrace* keep,
                         const LayerObserver& observe) const {
  Mask causal = mask;
  if (causal.causal == Causal::none) causal.causal = Causal::top_left;
  LlamaTrace scratch;  // without `keep`: freed on return
  LlamaTrace& t = keep ? *keep : scratch;
  if (keep) t.tokens = tokens;
  embed_tokens.forward(tokens, t.embedded);
  stack_forward<LlamaBlockTrace>(
      layers, norm, t.embedded, y, keep, observe,
      [&](const LlamaBlock& block, const Activations& h, Activations& out, LlamaBlockTrace* bt) {
        block.forward(h, causal, out, bt);
      });
}

Parameters LlamaModel::parameters() {
  Parameters out;
  embed_tokens.parameters("model.embed_tokens.", out);
  for (std::size_t i = 0; i < layers.size(); ++i)
    layers[i].parameters("model.layers." + std::to_string(i) + ".", out);
  add_parameters(norm, "model.norm.", out);
  return out;
}

void LlamaModel::save(const std::string& dir) const {
  save_weights(dir, const_cast<LlamaModel&>(*this).parameters());  // reads only
}

void LlamaModel::check(const std::string& prefix) const {
  for (std::size_t i = 0; i < layers.size(); ++i)
    layers[i].check(prefix + "model.layers." + std::to_string(i) + ".");
}

std::vector<std::string> LlamaModel::load(const std::string& dir) {
  LlamaModel fresh(config_, false);
  auto unused = load_weights(dir, fresh.parameters());
  fresh.check(dir + "/");
  *this = std::move(fresh);
  return unused;
}

LlamaModel LlamaModel::with_attention(const std::string& spec) const {
  LlamaModel copy = *this;
  const std::vector<std::string> specs = layer_specs(spec);
  for (std::size_t i = 0; i < copy.layers.size(); ++i)
    copy.layers[i].set_attention(specs[i % specs.size()]);
  copy.config_.layer.spec = spec;
  return copy;
}

const Activations& forward(const LlamaModel& model, const Tokens& tokens, const Mask& mask,
                           LlamaTrace& trace) {
  model.forward(tokens, mask, trace.output, &trace);
  return trace.output;
}

void backward(const LlamaModel& model, LlamaTrace& trace, const Activations& dy, LlamaModel& grad) {
  const Activations& dx =
      stack_backward(model.layers, model.norm, trace, dy, grad.layers, grad.norm);
  const std::size_t dim = model.embed_tokens.weight.shape()[1];
  for (std::size_t i = 0; i < trace.tokens.size(); ++i) {
    float* row =
        grad.embed_tokens.weight.data() + static_cast<std::size_t>(trace.tokens.data()[i]) * dim;
    add(row, dx.data() + i * dim, row, dim);
  }
}

LlamaModel zero_like(const LlamaModel& model) {
  LlamaModel grad = model;
  for (const ParameterRef& p : grad.parameters()) fill_constant(p, 0.0f);
  return grad;
}

}  // namespace attnlab::models
