// Transformer layers as in Vaswani et al. 2017 ("Attention Is All You Need"), with any attnlab
// backend as the attention core (LayerConfig::spec), without dropout. Each layer, stack and the
// model has one forward, which keeps what its backward needs in a trace when given one, and its
// backward beside it (conventions of models/layers.hpp).
//
// Encoder layer, post-LN (the paper):  x = LN1(x + SelfAttn(x));  x = LN2(x + FFN(x))
//                pre-LN (pre_ln):      x = x + SelfAttn(LN1(x));  x = x + FFN(LN2(x))
// Decoder layer: the same with three sublayers: causal self-attention (norm1), cross-attention
// to the encoder's output (norm2), FFN (norm3).
// FFN(x) = linear2(relu(linear1(x))), hidden size `ffn` (4 x d_model in the paper).
// Switches (the studies' ablations; apply_switches parses them):
//   pre-ln   LayerNorm at the start of each sublayer's branch; stacks then end in a final
//            LayerNorm ("norm.*"), as pre-LN models do
//   no-skip  no residual connections: x = LN(Sublayer(x)) (post-LN) or Sublayer(LN(x)) (pre-LN)
//   no-ffn   no FFN sublayer (nor its LayerNorm)
//   no-norm  no LayerNorm anywhere
//   tied-qk  W_Q = W_K (and b_Q = b_K) in every attention (models/multi_head_attention.hpp)
//   no-final-norm  no final LayerNorm at the end of a pre-LN stack (needs pre-ln): torch's
//                  nn.TransformerEncoder without norm=
//   short-conv  q, k and v of every self-attention through a causal depthwise convolution of
//               width 4 and SiLU (DeltaNet's short convolution, models/multi_head_attention.hpp;
//               not with tied-qk); the parameters "self_attn.conv_weight"
//   head-norm   every attention's heads normalised (RMS) with a learned gain before W_O (Gated
//               DeltaNet's output norm; models/multi_head_attention.hpp): "*.head_norm.weight"
//   channel-gate  every attention's log-decay per key channel [B, H, N, Dk] from a low-rank
//               projection (GLA's with gla, Kimi Delta Attention's with kda or gated-delta;
//               models/multi_head_attention.hpp) in place of the scalar gate: "*.channel_gate.*";
//               needs a core that takes one (Support::channel_decay)
// Stacks: Encoder and Decoder run L layers in turn; EncoderModel adds the token embedding scaled
// by sqrt(d_model) and the sinusoidal positional encoding in front of an Encoder. What is not
// learned gets no gradient: the positional encoding is a constant added to the scaled embedding.
// A stack's backward moves one set of backward scratch down the layers (the FFN's d_hidden alone
// is B·N·ffn floats) instead of keeping one set per layer.
//
// Parameter names (the weights folder, models/weights.hpp) are torch.nn's:
//   EncoderLayer   self_attn.{in_proj_weight, in_proj_bias, out_proj.weight, out_proj.bias},
//                  linear1.{weight, bias}, linear2.{weight, bias}, norm1.*, norm2.*
//                  = torch.nn.TransformerEncoderLayer(d_model, nhead, ffn, dropout=0,
//                    batch_first=True, norm_first=pre_ln)
//   DecoderLayer   self_attn.*, multihead_attn.*, linear1.*, linear2.*, norm1.*, norm2.*, norm3.*
//                  = torch.nn.TransformerDecoderLayer(...) with a causal tgt_mask
//   Encoder        layers.<i>.<layer names>, norm.* (pre-LN without no-final-norm only)
//                  = torch.nn.TransformerEncoder(layer, L, norm=LayerNorm(d_model) under pre-LN)
//   Decoder        layers.<i>.<layer names>, norm.* (the same) = torch.nn.TransformerDecoder
//   EncoderModel   embedding.weight, encoder.<Encoder names>
// Parts a switch removes have no parameters (no-ffn: no linear*, no norm2; no-norm: no norm*).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "attnlab/mask.hpp"
#include "models/feed_forward.hpp"
#include "models/layers.hpp"
#include "models/multi_head_attention.hpp"
#include "models/norm.hpp"
#include "models/residual.hpp"

namespace attnlab::models {

/// One layer's sizes, attention core and switches.
struct LayerConfig {
  std::size_t d_model = 512;  ///< model width
  std::size_t heads = 8;      ///< attention heads; d_model must be a multiple
  std::size_t ffn = 2048;     ///< FFN hidden size
  /// The attention core's factory string; in a model's config "A;B" alternates the layers'
  /// cores (layer_specs).
  std::string spec = "full";
  bool pre_ln = false;        ///< LayerNorm inside the residual branch (pre-LN) instead of after
  bool skip = true;           ///< residual connections
  bool feed_forward = true;   ///< the FFN sublayer
  bool layer_norm = true;     ///< LayerNorms
  bool final_norm = true;     ///< a pre-LN stack's final LayerNorm (off: no-final-norm)
  bool tied_qk = false;       ///< W_Q = W_K
  bool short_conv = false;    ///< the self-attentions' short convolution on q, k, v
  bool head_norm = false;     ///< every attention's head norm
  bool channel_gate = false;  ///< per-channel gates (GLA's, KDA's) in place of scalar ones
  double eps = 1e-5;          ///< LayerNorm's epsilon (PyTorch's default); RMSNorm's in Llama
  /// Key and value heads (0: as many as `heads`); grouped heads in the Llama block only.
  std::size_t kv_heads = 0;
  /// The base of the rotary embeddings of the Llama block (models/rotary.hpp); the 2017 block
  /// has sinusoidal positions instead and refuses another value (ModelConfig::validate).
  double rope_base = 10000;

  /// Throws Error naming the first bad field (sizes, divisibility, eps, the spec, no-final-norm
  /// without pre-ln, short-conv with tied-qk, channel-gate with a core that takes no per-channel
  /// log-decay).
  void validate() const;
};

/// The layers' specs of a model's spec: "A;B;..." gives layer i the (i mod count)-th (Based's
/// alternation of linear-attention and sliding-window layers, Arora et al. 2024); a spec without
/// ';' is every layer's. Throws Error for an empty part.
std::vector<std::string> layer_specs(const std::string& spec);

/// `count` layers built from `config`, layer i with the i-th of layer_specs(config.spec) (mod
/// their count); layers of one spec are copies of one layer (sharing its core).
template <class Layer>
std::vector<Layer> make_layers(const LayerConfig& config, std::size_t count) {
  std::vector<Layer> prototypes, layers;
  for (const std::string& spec : layer_specs(config.spec)) {
    LayerConfig c = config;
    c.spec = spec;
    prototypes.emplace_back(c);
  }
  layers.reserve(count);
  for (std::size_t i = 0; i < count; ++i) layers.push_back(prototypes[i % prototypes.size()]);
  return layers;
}

/// Sets the switches named in `list` ("pre-ln,no-skip,no-ffn,no-norm,tied-qk,no-final-norm,
/// short-conv,head-norm,channel-gate", any subset, comma separated, "" for none). Throws Error
/// naming an unknown switch and listing the known ones.
void apply_switches(LayerConfig& config, const std::string& list);

/// Every switch's name, in the order above, ", " separated (for help texts and errors).
std::string switch_names();

/// The switches set in `config`, in the order above, comma separated ("" for none).
std::string switches_text(const LayerConfig& config);

/// What an encoder layer's backward needs: its sublayers' traces.
struct EncoderLayerTrace {
  AttentionTrace attention;  ///< the self-attention's
  FeedForwardTrace ffn;      ///< the FFN's (unused under no-ffn)
  SublayerTrace sublayer1;   ///< around the self-attention (norm1)
  SublayerTrace sublayer2;   ///< around the FFN (norm2; unused under no-ffn)
  Activations attended;      ///< the first sublayer's output, the FFN sublayer's input
  Activations output;        ///< the layer's output
};

/// What a decoder layer's backward needs: its three sublayers' traces.
struct DecoderLayerTrace {
  AttentionTrace self_attention;   ///< the causal self-attention's
  AttentionTrace cross_attention;  ///< the cross-attention's
  FeedForwardTrace ffn;            ///< the FFN's (unused under no-ffn)
  SublayerTrace sublayer1;         ///< around the self-attention (norm1)
  SublayerTrace sublayer2;         ///< around the cross-attention (norm2)
  SublayerTrace sublayer3;         ///< around the FFN (norm3; unused under no-ffn)
  Activations attended;            ///< the first sublayer's output
  Activations crossed;             ///< the second sublayer's output
  Activations output;              ///< the layer's output
};

/// The stack's layer traces and what its final LayerNorm saw (pre-LN), with that norm's buffers.
struct EncoderTrace {
  std::vector<EncoderLayerTrace> layers;  ///< one per layer, in order
  Activations norm_input;                 ///< what the final norm saw (pre-LN)
  Activations output;                     ///< the stack's output
  Activations d_norm;                     ///< the backward through the final norm
};

/// The decoder stack's layer traces and what its final LayerNorm saw (pre-LN).
struct DecoderTrace {
  std::vector<DecoderLayerTrace> layers;  ///< one per layer, in order
  Activations norm_input;                 ///< what the final norm saw (pre-LN)
  Activations output;                     ///< the stack's output
  Activations d_norm;                     ///< the backward through the final norm
};

/// The token ids, the embedded input (and the positions added to it) and the encoder's trace.
struct ModelTrace {
  Tokens tokens;         ///< the input ids
  Activations embedded;  ///< EncoderModel::embed(tokens), the encoder's input
  Matrix positions;      ///< sinusoidal_positions(N, d_model), kept while N is the same
  EncoderTrace encoder;  ///< the stack's
};

/// torch.nn.TransformerEncoderLayer (see the header comment).
class EncoderLayer {
 public:
  /// Zero weights (config validated); call initialize or load weights.
  explicit EncoderLayer(const LayerConfig& config);

  MultiHeadAttention self_attn;    ///< self-attention
  std::optional<FeedForward> ffn;  ///< linear1, linear2 (absent under no-ffn)
  std::optional<LayerNorm> norm1;  ///< before or after the self-attention; absent under no-norm
  std::optional<LayerNorm> norm2;  ///< around the FFN; absent under no-norm and no-ffn

  /// x [B, N, d_model] -> [B, N, d_model]; `mask` goes to the self-attention.
  Activations forward(const Activations& x, const Mask& mask = {}) const;
  /// The same into y (shaped by shape_buffer; not x), keeping what the backward needs in `keep`
  /// when given.
  void forward(const Activations& x, const Mask& mask, Activations& y,
               EncoderLayerTrace* keep = nullptr) const;

  /// What self_attn sees of x: norm1(x) under pre-LN, x otherwise.
  Activations attention_input(const Activations& x) const;

  /// The layer on n new tokens x [B, n, d_model] of a causal model after the tokens `state`
  /// holds (self_attn.start_decoding): the same forward with self_attn.decode as its
  /// self-attention (models/decoding.hpp).
  void decode(const Activations& x, AttentionDecoding& state, Activations& y) const;

  /// Seeded initialisation of every part (PyTorch's rules; LayerNorms 1 and 0).
  void initialize(std::uint64_t seed, const std::string& prefix);

  /// Appends the layer's parameters, names prefixed (see the header comment).
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
                    EncoderLayerTrace* keep) const;
  LayerConfig config_;
};

/// torch.nn.TransformerDecoderLayer with a causal self-attention (see the header comment).
class DecoderLayer {
 public:
  /// Zero weights (config validated); call initialize or load weights.
  explicit DecoderLayer(const LayerConfig& config);

  MultiHeadAttention self_attn;       ///< causal self-attention
  MultiHeadAttention multihead_attn;  ///< cross-attention to the encoder's output
  std::optional<FeedForward> ffn;     ///< absent under no-ffn
  std::optional<LayerNorm> norm1;     ///< around the self-attention; absent under no-norm
  std::optional<LayerNorm> norm2;     ///< around the cross-attention; absent under no-norm
  std::optional<LayerNorm> norm3;     ///< around the FFN; absent under no-norm and no-ffn

  /// x [B, Nt, d_model], memory [B, Ns, d_model] -> [B, Nt, d_model]. The self-attention is
  /// causal: `self_mask` with Causal::none becomes top-left (keep bottom-right for decoding
  /// with a cache); its key padding and boolean parts pass through. `memory_mask` goes to the
  /// cross-attention (e.g. the source's key padding).
  Activations forward(const Activations& x, const Activations& memory, const Mask& self_mask = {},
                      const Mask& memory_mask = {}) const;
  /// The same into y (shaped by shape_buffer; not x or memory), keeping what the backward needs
  /// in `keep` when given.
  void forward(const Activations& x, const Activations& memory, const Mask& self_mask,
               const Mask& memory_mask, Activations& y, DecoderLayerTrace* keep = nullptr) const;

  /// Seeded initialisation of every part.
  void initialize(std::uint64_t seed, const std::string& prefix);

  /// Appends the layer's parameters, names prefixed.
  void parameters(const std::string& prefix, Parameters& out);

  /// Throws Error (names prefixed) when a constraint of the loaded weights fails.
  void check(const std::string& prefix) const;

  /// Replaces both attention cores, keeping the weights.
  void set_attention(const std::string& spec);

  /// The configuration it was built with.
  const LayerConfig& config() const { return config_; }

 private:
  LayerConfig config_;
};

/// L layers run in turn, then a final LayerNorm under pre-LN (unless no-final-norm): what Encoder
/// and Decoder share.
template <class Layer>
class Stack {
 public:
  /// L layers with zero weights; call initialize or load weights.
  Stack(const LayerConfig& config, std::size_t layers);

  std::vector<Layer> layers;      ///< in order
  std::optional<LayerNorm> norm;  ///< the final LayerNorm (pre-LN, LayerNorms, final_norm only)

  /// Seeded initialisation of every layer.
  void initialize(std::uint64_t seed, const std::string& prefix);
  /// Appends every parameter: prefix + "layers.<i>." ..., prefix + "norm.".
  void parameters(const std::string& prefix, Parameters& out);
  /// Checks every layer (see EncoderLayer::check).
  void check(const std::string& prefix) const;
  /// Replaces every layer's attention core(s), keeping the weights.
  void set_attention(const std::string& spec);
};

/// torch.nn.TransformerEncoder: L encoder layers, then `norm` under pre-LN (see Stack).
class Encoder : public Stack<EncoderLayer> {
 public:
  /// L encoder layers with zero weights (see Stack).
  using Stack::Stack;

  /// x [B, N, d_model] -> [B, N, d_model]; `observe` sees every layer's input and output
  /// (the final norm comes after the last observation).
  Activations forward(const Activations& x, const Mask& mask = {},
                      const LayerObserver& observe = {}) const;
  /// The same into y (shaped by shape_buffer; not x), keeping what the backward needs in `keep`
  /// when given (the layers' outputs then live in it, else in two buffers used in turn).
  void forward(const Activations& x, const Mask& mask, Activations& y, EncoderTrace* keep,
               const LayerObserver& observe = {}) const;
};

/// torch.nn.TransformerDecoder: L decoder layers, then `norm` under pre-LN (see Stack).
class Decoder : public Stack<DecoderLayer> {
 public:
  /// L decoder layers with zero weights (see Stack).
  using Stack::Stack;

  /// x [B, Nt, d_model], memory [B, Ns, d_model] -> [B, Nt, d_model] (see DecoderLayer).
  Activations forward(const Activations& x, const Activations& memory, const Mask& self_mask = {},
                      const Mask& memory_mask = {}, const LayerObserver& observe = {}) const;
  /// The same into y (shaped by shape_buffer; not x or memory), keeping what the backward needs
  /// in `keep` when given.
  void forward(const Activations& x, const Activations& memory, const Mask& self_mask,
               const Mask& memory_mask, Activations& y, DecoderTrace* keep,
               const LayerObserver& observe = {}) const;
};

/// The block a token model is built of.
enum class Arch {
  transformer,  ///< the 2017 Transformer's (EncoderModel)
  llama,        ///< Llama's (models/llama.hpp: LlamaModel)
};

/// The arch named `name` ("transformer", "llama"). Throws Error naming it and the known ones.
Arch parse_arch(const std::string& name);
/// Its name.
std::string arch_name(Arch arch);

/// A token model's sizes. The defaults are the Long Range Arena text model (Tay et al. 2020):
/// byte tokens, 6 layers, 8 heads, d_model 512, FFN 2048, the 2017 block.
struct ModelConfig {
  LayerConfig layer;              ///< every layer's configuration
  std::size_t layers = 6;         ///< L
  std::size_t vocab = 256;        ///< token ids 0 .. vocab - 1
  std::uint64_t seed = 1;         ///< initialisation
  Arch arch = Arch::transformer;  ///< the block

  /// Throws Error naming the first bad field (for Llama also kv_heads not dividing heads, an odd
  /// head dimension, rope_base <= 0; for the 2017 block a rope_base or kv_heads it does not
  /// have), or the sizes when the weights alone would not fit in memory (require_memory).
  void validate() const;

  /// The parameters of a model of this config without a head; a double, so that no product of
  /// absurd sizes overflows.
  double parameter_count() const;
};

/// The bytes this process may allocate: the machine's physical memory, or the address-space
/// limit (ulimit -v) when that is lower.
double memory_limit_bytes();

/// Throws Error "<what> need(s) at least <bytes>, more than the <limit> this process may use"
/// when `bytes` exceeds memory_limit_bytes(): a size that cannot fit is refused before anything
/// is allocated, instead of failing with bad_alloc (or a wrapped-around length) half-way.
void require_memory(double bytes, const std::string& what);

/// bytes as "12.3 MiB", "4.5 GiB", "1.2e+03 TiB": the unit that keeps the number short.
std::string format_bytes(double bytes);

/// Tokens -> embedding · sqrt(d_model) + sinusoidal positions -> Encoder. Parameters
/// "embedding.weight" and "encoder.*".
class EncoderModel {
 public:
  /// Builds and initialises the model from config.seed (config validated).
  explicit EncoderModel(const ModelConfig& config);

  Embedding embedding;  ///< [vocab, d_model]
  Encoder encoder;      ///< the stack

  /// tokens [B, N] -> embedding(tokens) · sqrt(d_model) + PE[:N] [B, N, d_model].
  Activations embed(const Tokens& tokens) const;
  /// The same into x (shaped by shape_buffer), with the positional encoding kept in `positions`
  /// (recomputed only when N or d_model changes): what a training step's trace reuses.
  void embed(const Tokens& tokens, Activations& x, Matrix& positions) const;
  /// The same for tokens at positions first .. first + N - 1 (an incremental decoder's new
  /// tokens, models/decoding.hpp), into x.
  void embed(const Tokens& tokens, std::size_t first, Activations& x) const;

  /// tokens [B, N] -> the encoder's output [B, N, d_model].
  Activations forward(const Tokens& tokens, const Mask& mask = {},
                      const LayerObserver& observe = {}) const;
  /// The same into y (shaped by shape_buffer), keeping what the backward needs in `keep` when
  /// given.
  void forward(const Tokens& tokens, const Mask& mask, Activations& y, ModelTrace* keep,
               const LayerObserver& observe = {}) const;

  /// Every parameter, in state_dict order.
  Parameters parameters();

  /// Writes the weights folder (models/weights.hpp).
  void save(const std::string& dir) const;

  /// Reads the weights folder; on any error (missing or mis-shaped file, broken tie) the model
  /// is unchanged. Returns the unused .npy files' names.
  std::vector<std::string> load(const std::string& dir);

  /// A copy with every attention core replaced by make_attention(spec), same weights.
  EncoderModel with_attention(const std::string& spec) const;

  /// The configuration it was built with (spec as given).
  const ModelConfig& config() const { return config_; }

 private:
  EncoderModel(const ModelConfig& config, bool initialise);
  ModelConfig config_;
};

/// The same as zero_like(layer) for a whole model (its parameters() takes no prefix).
EncoderModel zero_like(const EncoderModel& model);

/// EncoderLayer::forward(x, mask), keeping the trace; returns trace.output.
const Activations& forward(const EncoderLayer& layer, const Activations& x, const Mask& mask,
                           EncoderLayerTrace& trace);

/// dL/dx given dy (in a buffer of the trace, returned); adds every parameter's gradient into
/// grad (pre- and post-LN, every switch).
Activations& backward(const EncoderLayer& layer, EncoderLayerTrace& trace, const Activations& dy,
                      EncoderLayer& grad);

/// Swaps the buffers that the layers' backward uses only while it runs (stack_backward).
void swap_backward_scratch(EncoderLayerTrace& a, EncoderLayerTrace& b);

/// Encoder::forward(x, mask), keeping the trace; returns trace.output.
const Activations& forward(const Encoder& encoder, const Activations& x, const Mask& mask,
                           EncoderTrace& trace);

/// dL/dx given dy, through the final norm and every layer in reverse; adds into grad. Returns a
/// buffer of the trace.
const Activations& backward(const Encoder& encoder, EncoderTrace& trace, const Activations& dy,
                            Encoder& grad);

/// DecoderLayer::forward(x, memory, self_mask, memory_mask), keeping the trace; returns
/// trace.output.
const Activations& forward(const DecoderLayer& layer, const Activations& x,
                           const Activations& memory, const Mask& self_mask,
                           const Mask& memory_mask, DecoderLayerTrace& trace);

/// The gradients of a decoder's two inputs: its target-side x and the encoder's output.
struct DecoderInputGrads {
  Activations x;       ///< dL/dx
  Activations memory;  ///< dL/dmemory
};

/// dL/dx and dL/dmemory given dy; adds every parameter's gradient into grad.
DecoderInputGrads backward(const DecoderLayer& layer, DecoderLayerTrace& trace,
                           const Activations& dy, DecoderLayer& grad);

/// Decoder::forward(x, memory, self_mask, memory_mask), keeping the trace; returns trace.output.
const Activations& forward(const Decoder& decoder, const Activations& x, const Activations& memory,
                           const Mask& self_mask, const Mask& memory_mask, DecoderTrace& trace);

/// dL/dx and dL/dmemory (summed over the layers, which all read it) given dy; adds into grad.
DecoderInputGrads backward(const Decoder& decoder, DecoderTrace& trace, const Activations& dy,
                           Decoder& grad);

/// EncoderModel::forward(tokens, mask), keeping the trace; returns a buffer of the trace.
const Activations& forward(const EncoderModel& model, const Tokens& tokens, const Mask& mask,
                           ModelTrace& trace);

/// Adds every parameter's gradient into grad given dy: the encoder's, and the embedding rows of
/// the tokens seen (scaled by sqrt(d_model), as the forward scales the embedding).
void backward(const EncoderModel& model, ModelTrace& trace, const Activations& dy,
              EncoderModel& grad);

}  // namespace attnlab::models
