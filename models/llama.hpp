// A Llama-style causal decoder-only model (Touvron et al. 2023, "LLaMA"; the block that
// linear-attention papers call Transformer++) with any attnlab backend as its attention core,
// without dropout: the block of the models researchers compare attention variants in today.
//
// Block (Hugging Face's LlamaDecoderLayer):
//   x = x + SelfAttn(RMSNorm1(x));   x = x + SwiGLU(RMSNorm2(x))
// SelfAttn is MultiHeadAttention with no biases, rotary embeddings on q and k (base
// LayerConfig::rope_base, Hugging Face's rotate_half convention; models/rotary.hpp) and the core
// make_attention(spec), every call causal (top-left; key padding and boolean masks pass through).
// SwiGLU is down_proj(silu(gate_proj(x)) ∘ up_proj(x)), hidden size LayerConfig::ffn. RMSNorm's
// epsilon is LayerConfig::eps. Model: embed_tokens (no scaling, no positions added: they enter
// through the rotation), L blocks, a final RMSNorm.
// The 2017 block's switches apply where they mean something: no-skip, no-ffn (no SwiGLU nor its
// norm), no-norm (no RMSNorm), no-final-norm, tied-qk, short-conv (before the rotation),
// head-norm. The block is always pre-norm, so pre-ln changes nothing.
// Grouped key and value heads (LayerConfig::kv_heads < heads; GQA, and MQA at 1): k_proj and
// v_proj have kv_heads·d_k rows and the core takes k and v with kv_heads heads as they are
// (models/multi_head_attention.hpp); a core that does not take grouped heads is refused
// (Unsupported naming it), and so is tied-qk with them (Error).
//
// Parameter names are Hugging Face's LlamaForCausalLM state dict's, so that one exported to
// .npy loads (models/weights.hpp):
//   model.embed_tokens.weight                           [vocab, d_model]
//   model.layers.<i>.self_attn.{q,o}_proj.weight        [d_model, d_model]
//   model.layers.<i>.self_attn.{k,v}_proj.weight        [kv_heads·d_k, d_model]
//   model.layers.<i>.mlp.{gate,up}_proj.weight          [ffn, d_model]
//   model.layers.<i>.mlp.down_proj.weight               [d_model, ffn]
//   model.layers.<i>.input_layernorm.weight             [d_model]
//   model.layers.<i>.post_attention_layernorm.weight    [d_model]
//   model.norm.weight                                   [d_model]
// plus the attention's own where a switch or core adds them (self_attn.conv_weight,
// self_attn.head_norm.weight, self_attn.gate_proj.*, ...). The head (lm_head.weight, tied to
// embed_tokens or not) is the task model's (training/model.hpp). Initialisation: Hugging Face's,
// every matrix N(0, 0.02²), RMSNorm gains 1.
// Each block, the stack and the model has one forward, which keeps what its backward needs in a
// trace when given one, and its backward beside it (conventions of models/layers.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attnlab/mask.hpp"
#include "models/feed_forward.hpp"
#include "models/layers.hpp"
#include "models/multi_head_attention.hpp"
#include "models/norm.hpp"
#include "models/residual.hpp"
#include "models/transformer.hpp"

namespace attnlab::models {

/// What a Llama block's backward needs: its sublayers' traces.
struct LlamaBlockTrace {
  AttentionTrace attention;  ///< the self-attention's
  SwiGLUTrace mlp;           ///< the SwiGLU's (unused under no-ffn)
  SublayerTrace sublayer1;   ///< around the self-attention (input_layernorm)
  SublayerTrace sublayer2;   ///< around the SwiGLU (post_attention_layernorm)
  Activations attended;      ///< the first sublayer's output, the second's input
  Activations output;        ///< the block's output
};

/// What a Llama model's backward needs: the tokens, the blocks' traces and what the final norm
/// saw.
struct LlamaTrace {
  Tokens tokens;                        ///< the input ids
  Activations embedded;                 ///< embed_tokens(tokens), the first block's input
  std::vector<LlamaBlockTrace> layers;  ///< one per block, in order
  Activations norm_input;               ///< what the final norm saw
  Activations output;                   ///< the model's output
  Activations d_norm;                   ///< the backward through the final norm
};

/// Hugging Face's LlamaDecoderLayer (see the header comment).
class LlamaBlock {
 public:
  /// Zero weights (config validated as ModelConfig::validate does for Llama); call initialize
  /// or load weights.
  explicit LlamaBlock(const LayerConfig& config);

  MultiHeadAttention self_attn;                     ///< causal self-attention, rotary q and k
  std::optional<SwiGLU> mlp;                        ///< absent under no-ffn
  std::optional<RMSNorm> input_layernorm;           ///< before the attention; absent: no-norm
  std::optional<RMSNorm> post_attention_layernorm;  ///< before the SwiGLU; absent: no-norm

  /// x [B, N, d_model] -> [B, N, d_model]; `mask` goes to the self-attention as it is (the
  /// model makes it causal).
  Activations forward(const Activations& x, const Mask& mask = {}) const;
  /// The same into y (shaped by shape_buffer; not x), keeping what the backward needs in `keep`
  /// when given.
  void forward(const Activations& x, const Mask& mask, Activations& y,
               LlamaBlockTrace* keep = nullptr) const;

  /// The block on n new tokens x [B, n, d_model] after the tokens `state` holds
  /// (self_attn.start_decoding): the same forward with self_attn.decode as its self-attention,
  /// q and k rotated at the tokens' positions (models/decoding.hpp).
  void decode(const Activations& x, AttentionDecoding& state, Activations& y) const;

  /// Hugging Face's initialisation (see the header comment), streams from (seed, prefix + name).
  void initialize(std::uint64_t seed, const std::string& prefix);
  /// Appends the block's parameters, names prefixed (see the header comment).
  void parameters(const std::string& prefix, Parameters& out);
  /// Throws Error (names prefixed) when a constraint of the loaded weights fails (tied W_Q = W_K).
  void check(const std::string& prefix) const;
  /// Replaces the attention core, keeping the weights.
  void set_attention(const std::string& spec);
  /// The configuration it was built with.
  const LayerConfig& config() const { return config_; }

 private:
  // The one forward, with `attend` as the self-attention sublayer's function.
  void forward_with(const Activations& x, const SelfAttentionCall& attend, Activations& y,
                    LlamaBlockTrace* keep) const;
  LayerConfig config_;
};

/// Hugging Face's LlamaModel: tokens -> embed_tokens -> L blocks -> norm (see the header
/// comment). Parameters "model.*".
class LlamaModel {
 public:
  /// Builds and initialises the model from config.seed (config validated; config.arch must be
  /// Arch::llama).
  explicit LlamaModel(const ModelConfig& config);

  Embedding embed_tokens;          ///< [vocab, d_model]
  std::vector<LlamaBlock> layers;  ///< in order
  std::optional<RMSNorm> norm;     ///< the final norm (absent under no-norm, no-final-norm)

  /// tokens [B, N] -> the final norm's output [B, N, d_model]. Every attention call is causal:
  /// `mask` with Causal::none becomes top-left (its key padding and boolean parts pass through).
  /// `observe` sees every block's input and output.
  Activations forward(const Tokens& tokens, const Mask& mask = {},
                      const LayerObserver& observe = {}) const;
  /// The same into y (shaped by shape_buffer), keeping what the backward needs in `keep` when
  /// given.
  void forward(const Tokens& tokens, const Mask& mask, Activations& y, LlamaTrace* keep,
               const LayerObserver& observe = {}) const;

  /// Every parameter, in Hugging Face's state_dict order.
  Parameters parameters();

  /// Writes the weights folder (models/weights.hpp).
  void save(const std::string& dir) const;
  /// Reads the weights folder; on any error (missing or mis-shaped file, broken tie) the model
  /// is unchanged. Returns the unused .npy files' names (e.g. lm_head.weight).
  std::vector<std::string> load(const std::string& dir);

  /// A copy with every attention core replaced by make_attention(spec), same weights.
  LlamaModel with_attention(const std::string& spec) const;
  /// Checks every block's loaded weights (names prefixed by `prefix`, e.g. the folder).
  void check(const std::string& prefix) const;

  /// The configuration it was built with (spec as given).
  const ModelConfig& config() const { return config_; }

 private:
  LlamaModel(const ModelConfig& config, bool initialise);
  ModelConfig config_;
};

/// LlamaBlock::forward(x, mask), keeping the trace; returns trace.output.
const Activations& forward(const LlamaBlock& block, const Activations& x, const Mask& mask,
                           LlamaBlockTrace& trace);

/// dL/dx given dy (in a buffer of the trace, returned); adds every parameter's gradient into
/// grad.
Activations& backward(const LlamaBlock& block, LlamaBlockTrace& trace, const Activations& dy,
                      LlamaBlock& grad);

/// Swaps the buffers that the blocks' backward uses only while it runs (stack_backward).
void swap_backward_scratch(LlamaBlockTrace& a, LlamaBlockTrace& b);

/// LlamaModel::forward(tokens, mask), keeping the trace; returns trace.output.
const Activations& forward(const LlamaModel& model, const Tokens& tokens, const Mask& mask,
                           LlamaTrace& trace);

/// Adds every parameter's gradient into grad given dy = dL/d(the model's output): the blocks',
/// the final norm's and the embedding rows of the tokens seen.
void backward(const LlamaModel& model, LlamaTrace& trace, const Activations& dy, LlamaModel& grad);

/// The same as zero_like(layer) for a whole model (its parameters() takes no prefix).
LlamaModel zero_like(const LlamaModel& model);

}  // namespace attnlab::models
