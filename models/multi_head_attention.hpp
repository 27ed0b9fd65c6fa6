// Multi-head attention (Vaswani et al. 2017) with any attnlab backend as its core: the factory
// string `spec` is how a variant is plugged into a model.
//
//   MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W_O^T + b_O,
//   head_i = Attention(query W_Q,i^T + b_Q,i, memory W_K,i^T + b_K,i, memory W_V,i^T + b_V,i)
// with d_k = d_v = d_model / heads; Attention is make_attention(spec)->forward, called once for
// all heads on [B, H, N, d_k] tensors with the caller's Mask (causal, key padding, boolean mask,
// scale) passed through unchanged, so a backend that cannot honour it throws Unsupported.
// Self-attention: memory = query. Cross-attention: queries from the decoder, keys and values
// from the encoder's output (Nq != Nk).
// Grouped key and value heads (AttentionOptions::kv_heads, GQA; 1: MQA): W_K and W_V project to
// kv_heads heads only, and the core gets k and v [B, kv_heads, Nk, d_k] as they are (query head
// h reads key and value head h / (heads / kv_heads), Hugging Face's repeat_kv); the layer never
// repeats them. A core that does not take grouped heads (Support::grouped_heads) is refused
// when it is set (Unsupported naming it).
//
// Parameters and semantics are those of torch.nn.MultiheadAttention (batch_first, no dropout,
// no bias_k/bias_v, kdim = vdim = d_model):
//   in_proj_weight [3 d_model, d_model]  rows W_Q, then W_K, then W_V; head i uses rows
//                                        i·d_k .. (i+1)·d_k - 1 of each block (with grouped
//                                        heads [d_model + 2 kv_heads·d_k, d_model]: W_K and
//                                        W_V have kv_heads·d_k rows)
//   in_proj_bias   [3 d_model]           b_Q, b_K, b_V (likewise)
//   out_proj.weight [d_model, d_model], out_proj.bias [d_model]
// Tied W_Q = W_K (tied_qk): the K block of in_proj_weight and in_proj_bias always equals the Q
// block (kept so on initialisation, checked when weights are loaded), so with self-attention the
// score matrix q k^T is symmetric. A backward pass must add the K block's gradient to the Q block.
// Gates: a core that takes per-token inputs (support().log_decay / .beta: gla, gated-delta,
// delta) gets them from learned projections of the memory, one value per head and key token, as
// GLA and Gated DeltaNet compute them: g = logsigmoid(memory W_g^T + b_g) / kGateTau (the gate
// projection gate_proj, [H, d_model]) and beta = sigmoid(memory W_beta^T + b_beta) (beta_proj).
// They exist only for such a core (parameters "gate_proj.*", "beta_proj.*"); a core that takes
// neither leaves the layer exactly torch.nn.MultiheadAttention.
// Per-channel gates (AttentionOptions::channel_gate; the model switch channel-gate): for a core
// that takes a log-decay per key channel (Support::channel_decay), g [B, H, Nk, dk] comes from a
// low-rank projection (ChannelGate) in place of gate_proj: pre = memory W_down^T W_up^T + b_up,
// parameters "channel_gate.down.weight" [rank, d_model], "channel_gate.up.weight" [H·dk, rank],
// "channel_gate.up.bias" [H·dk]. With a core without the delta rule (gla) it is GLA's (Yang et
// al. 2024; fla's gk_proj): rank 16, g = logsigmoid(pre) / kGateTau. With a delta-rule core
// (support().beta: kda, gated-delta) it is Kimi Delta Attention's (Kimi Team 2025; fla's f_proj
// and KDA gate): rank dk, g = -exp(a_log[h]) · softplus(pre), with "channel_gate.a_log" [H] and
// b_up as its dt_bias. A core without Support::channel_decay is refused (Unsupported naming the
// core and channel-gate); decoding refuses it too (no decoder takes a per-channel g).
// The core's own learned tensors (linformer's E and F, Attention::parameters) are the layer's
// parameters "attention_<name>" (attnlab.torch's MultiheadAttention's names), learned like every
// weight: attention() hands their current values to the core before it runs, and the backward
// adds the core's gradients of them (AllGradients::parameters).
// Several rows per token (DeltaProduct, Siems et al. 2025; a core whose
// Support::rows_per_token n_h > 1): W_K and W_V project n_h keys and values per token (n_h·kv_dim
// rows each, key j of token t from rows j·kv_dim.. of the block, as fla's GatedDeltaProduct's
// 'b t (n h d) -> b (t n) h d'), beta_proj n_h betas (column j·H + h), and the core gets k, v,
// beta [.., n_h·Nk, ..] with row t·n_h + j the j-th of token t; gate_proj's g sits on each
// token's first row, 0 on the others (the paper's one gate per token); key_lengths are scaled
// by n_h for the core; rotary turns all n_h keys of a token by its position. The short
// convolution runs over the n_h·kv_dim channels of each block. The channel gate is refused
// with it (Unsupported).
// Short convolution (short_conv; DeltaNet's and Gated DeltaNet's ShortConvolution, Based's and
// H3's short filters): each of the projections x W_Q^T + b_Q, x W_K^T + b_K, x W_V^T + b_V goes
// through a causal depthwise convolution of width kConvWidth over the sequence, then SiLU:
//   q[i, c] = silu(sum_t conv_weight[c, t] · (x W_Q^T + b_Q)[i - kConvWidth + 1 + t, c])
// (zero before the first token), the same for k and v with rows d_model.. and 2 d_model.. of
// conv_weight [3 d_model, kConvWidth]: torch.nn.Conv1d(groups=channels, bias=False,
// padding=kConvWidth - 1) cut to the first N outputs. A token's q, k and v then see the few tokens
// before it, which a linear attention cannot look up by position (MQAR's key-value pairs are
// neighbours). Not with tied_qk (k would no longer equal q). With grouped heads conv_weight has
// the rows of in_proj_weight (d_model + 2 kv_heads·d_k).
// Head norm (head_norm; Gated DeltaNet's output normalisation, without its output gate): each
// row of a head's output [dk] is divided by its root mean square (eps kHeadNormEps) and
// multiplied by a learned gain head_norm.weight [dk] shared by the heads, before head_mask and
// W_O. A delta-rule core reads a value back at most 1/sqrt(dk) of its size (unit q and k times the
// softmax scale), a softmax returns a convex combination of values: this gives both one scale.
// Head mask (Michel et al. 2019, "Are Sixteen Heads Really Better than One?"): head_mask[h]
// multiplies head h's output before the heads are merged and projected by W_O, in the forward
// and in the backward; 0 removes the head, so the layer returns b_O from it. Empty (the default)
// keeps every head; all ones is bitwise the same.
// Backward (conventions of models/layers.hpp): the core through Attention::backward (every
// backend that has one); its gates' gradients dg and dbeta come back from AllGradients and pass
// through logsigmoid / 16 and sigmoid (a per-channel dg through its form and both
// projections); the short convolution's filters through SiLU and the convolution; the head
// norm's gain through the normalisation; the core's own learned tensors get
// AllGradients::parameters. Tied W_Q = W_K: the K block's gradient is added to the Q block's and
// both blocks hold the sum, so that an update keeps them equal.
// Llama's attention (AttentionOptions: no biases, rotary, the "llama" names): the same layer
// without b_Q, b_K, b_V, b_O, with q and k rotated (models/rotary.hpp) after the projections and
// the short convolution and before the core, and its parameters named as Hugging Face's
// LlamaAttention's: q_proj.weight, k_proj.weight, v_proj.weight (views of the three blocks of
// in_proj_weight, which stays the storage; with biases also q_proj.bias, ..., as Qwen's),
// o_proj.weight; initialised N(0, 0.02²) as Hugging Face initialises them.
// Cost: 2·B·(Nq·d_model + 2·Nk·kv_heads·d_k)·d_model + 2·B·Nq·d_model² FLOPs of GEMMs plus
// the core's own.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attnlab/attention.hpp"
#include "attnlab/decoder.hpp"
#include "attnlab/inputs.hpp"
#include "attnlab/mask.hpp"
#include "models/layers.hpp"
#include "models/rotary.hpp"

namespace attnlab::models {

/// How the layer's parameters are named and initialised.
enum class AttentionNames {
  torch,  ///< torch.nn.MultiheadAttention's: in_proj_weight, in_proj_bias, out_proj.*
  llama,  ///< Hugging Face LlamaAttention's: q_proj, k_proj, v_proj, o_proj (.weight)
};

/// A MultiHeadAttention's switches beyond its sizes and core (see the header comment).
struct AttentionOptions {
  bool tied_qk = false;     ///< W_Q = W_K (and b_Q = b_K)
  bool short_conv = false;  ///< q, k, v through the short convolution
  bool head_norm = false;   ///< the heads normalised before W_O
  bool bias = true;         ///< b_Q, b_K, b_V, b_O (false: Llama's projections)
  double rope_base = 0;     ///< rotary embeddings on q and k with this base (0: none)
  AttentionNames names = AttentionNames::torch;  ///< parameter names and initialisation
  /// Key and value heads (0: as many as query heads). Must divide the query heads; fewer than
  /// them (grouped heads) needs a core that takes them, and no tied_qk.
  std::size_t kv_heads = 0;
  /// A per-channel log-decay [B, H, N, Dk] from the low-rank gate (ChannelGate) in place of the
  /// scalar gate_proj: needs a core that takes one (Support::channel_decay: gla, kda,
  /// gated-delta).
  bool channel_gate = false;
};

/// The per-channel gate of GLA and Kimi Delta Attention (see the header comment): a low-rank
/// projection of the memory to one pre-activation per head and key channel,
/// pre = memory W_down^T W_up^T + b_up, then GLA's g = logsigmoid(pre) / kGateTau or KDA's
/// g = -exp(a_log[h]) · softplus(pre) (b_up is KDA's dt_bias).
struct ChannelGate {
  /// GLA's rank of W_down (gate_low_rank_dim); KDA's is the head dimension.
  static constexpr std::size_t kGlaRank = 16;
  /// Zero weights (a_log present for KDA's form); call initialize or load weights.
  ChannelGate(std::size_t d_model, std::size_t rank, std::size_t heads, std::size_t head_dim,
              bool kda);
  Linear down;                  ///< W_down [rank, d_model], no bias
  Linear up;                    ///< W_up [heads·dk, rank] and b_up [heads·dk]
  std::optional<Vector> a_log;  ///< KDA's log decay rate per head [heads]; empty: GLA's form
  /// Whether the form is KDA's.
  bool kda() const { return a_log.has_value(); }
  /// W_down and W_up as torch.nn.Linear's default; GLA: b_up likewise; KDA (fla's
  /// KimiDeltaAttention): a_log = log A, A uniform in [1, 16], and b_up the inverse softplus of
  /// dt, log dt uniform in [log 0.001, log 0.1]. Streams from (seed, prefix + name).
  void initialize(std::uint64_t seed, const std::string& prefix);
  /// Appends prefix + "down.weight", "up.weight", "up.bias", then "a_log" (KDA).
  void parameters(const std::string& prefix, Parameters& out);
};

/// A core's per-token inputs as the gate projections computed them, with their pre-activations
/// (for the backward). Empty tensors: not used by the core.
struct Gates {
  TokenTensor g;               ///< log-decay [B, H, Nk]
  TokenTensor beta;            ///< delta rule strength [B, H, Nk]
  Tensor channel_g;            ///< per-channel log-decay [B, H, Nk, Dk] (the channel gate)
  Activations g_pre;           ///< memory W_g^T + b_g [B, Nk, H]
  Activations beta_pre;        ///< memory W_beta^T + b_beta [B, Nk, H]
  Activations channel_hidden;  ///< memory W_down^T [B, Nk, rank]
  Activations channel_pre;     ///< channel_hidden W_up^T + b_up [B, Nk, H·dk]
  /// Pointers to the ones present, for Attention::forward.
  TokenInputs inputs() const;
};

/// The gradients of multi-head attention's two inputs (for self-attention, their sum is the
/// input's).
struct AttentionInputGrads {
  Activations query;   ///< dL/dquery
  Activations memory;  ///< dL/dmemory
};

/// What multi-head attention's backward needs: inputs, the heads' q, k, v, the gates, the core's
/// output [B, H, Nq, dk] and what its forward saved, the merged heads, the mask; then the
/// buffers of the forward's output and of the backward.
struct AttentionTrace {
  Activations query;    ///< the queries' input [B, Nq, d_model]
  Activations memory;   ///< the keys' and values' input [B, Nk, d_model]
  QKV in;               ///< the heads' q, k, v
  Tensor heads;         ///< the core's output [B, H, Nq, dk]
  Tensor normed_heads;  ///< with the head norm: heads normalised
  Tensor masked_heads;  ///< with a head mask: the heads times it
  Gates gates;          ///< the core's per-token inputs (empty without)
  Saved saved;          ///< what the core's forward saved (a softmax's row log-sum-exp, ...)
  Activations merged;   ///< the heads (normalised, times head_mask) concatenated: out_proj's input
  Mask mask;            ///< the mask the core saw
  Matrix projected;     ///< the forward's projection rows (MultiHeadAttention::project)
  Activations output;   ///< the forward's result (the free forward() writes it here)
  // The backward's buffers, kept from step to step:
  Activations d_merged;       ///< out_proj's input gradient [B, N, d_model]
  Tensor d_heads;             ///< d_merged split into heads [B, H, N, head_dim]
  AllGradients core_grads;    ///< the attention core's gradients
  Activations dq;             ///< dL/dq merged from heads [B, N, d_model]
  Activations dk;             ///< dL/dk merged from heads
  Activations dv;             ///< dL/dv merged from heads
  Activations d_projection;   ///< with the short convolution: dL/d(one block's projection)
  Matrix d_in_proj_weight;    ///< in_proj_weight's gradient of this call
  Vector d_in_proj_bias;      ///< in_proj_bias's gradient of this call
  Activations d_memory_v;     ///< the V block's dL/dmemory
  AttentionInputGrads grads;  ///< the backward's result
};

/// What self-attention keeps between the calls of an incremental decoder
/// (MultiHeadAttention::start_decoding): its core's TokenDecoder (a KV cache, a ring, a recurrent
/// state: lib/attnlab/decoder.hpp), the tokens it holds (the next token's position, for the
/// rotary angles) and, with the short convolution, the last kConvWidth - 1 projection rows of
/// each block per item (zeros before the first token, the forward's padding).
struct AttentionDecoding {
  std::unique_ptr<TokenDecoder> core;           ///< the core's decoder
  std::size_t position = 0;                     ///< tokens held per item
  std::array<std::vector<float>, 3> conv_rows;  ///< q, k, v blocks: [B, kConvWidth - 1, width]
  /// Bytes held: the core's decoder's and the convolution's rows.
  std::size_t bytes() const;
};

/// See the header comment. Copies share the attention core, unless it has learned tensors: a
/// copy then makes its own from the spec, so two layers never hand theirs to one core.
class MultiHeadAttention {
 public:
  /// Throws Error when d_model is not divisible by heads or is 0, the spec is invalid, or
  /// short_conv is asked for with tied_qk.
  MultiHeadAttention(std::size_t d_model, std::size_t heads, const std::string& spec = "full",
                     bool tied_qk = false, bool short_conv = false, bool head_norm = false);
  /// The same with every option; also throws Error for an odd head dimension or a rotary base
  /// <= 0 with rotary embeddings, kv_heads not dividing heads or fewer than heads with tied_qk
  /// (naming the field), and Unsupported when kv_heads < heads and the core does not take
  /// grouped heads (naming the core).
  MultiHeadAttention(std::size_t d_model, std::size_t heads, const std::string& spec,
                     const AttentionOptions& options);

  /// [d_model + 2 kv_dim(), d_model]: W_Q, W_K, W_V stacked (block_offset, block_size)
  Matrix in_proj_weight;
  Vector in_proj_bias;              ///< b_Q, b_K, b_V stacked likewise (empty without biases)
  Linear out_proj;                  ///< W_O [d_model, d_model], b_O (none without biases)
  std::optional<Linear> gate_proj;  ///< W_g [H, d_model], b_g: when the core takes g
  /// W_beta [key_rows()·H, d_model], b_beta: when the core takes beta
  std::optional<Linear> beta_proj;
  /// The per-channel gate (in place of gate_proj): with AttentionOptions::channel_gate.
  std::optional<ChannelGate> channel_gate;
  /// The short convolution's filters [d_model + 2 kv_dim(), kConvWidth] (see the header
  /// comment): when built with short_conv.
  std::optional<Matrix> conv_weight;
  /// The short convolution's width (DeltaNet's default).
  static constexpr std::size_t kConvWidth = 4;
  /// The head norm's gain [dk] (see the header comment): when built with head_norm.
  std::optional<Vector> head_norm_weight;
  /// The head norm's epsilon (fla's RMSNorm default).
  static constexpr double kHeadNormEps = 1e-5;
  /// The standard deviation of W_Q, W_K, W_V, W_O with the llama names (Hugging Face Llama's
  /// initializer_range).
  static constexpr double kLlamaInitStd = 0.02;
  /// g's temperature: logsigmoid(x) / 16 keeps a fresh gate near 0.96 per token (GLA's choice).
  static constexpr double kGateTau = 16.0;
  /// Per-head factor on the heads' outputs before W_O (see the header comment): empty keeps
  /// every head, else one entry per head (0 removes it). Not a parameter: not saved or learned.
  std::vector<float> head_mask;
  /// The core's learned tensors (see the header comment), as the core's parameters(heads) names
  /// and shapes them; empty for a core without.
  std::vector<ParameterTensor> attention_parameters;

  /// Multiplies head h of the core's output heads [B, H, Nq, dk] by head_mask[h] (nothing when
  /// head_mask is empty). Throws Error when head_mask has other than H entries.
  void apply_head_mask(Tensor& heads) const;

  /// The head norm of the core's output `heads` into `out` (shaped by shape_buffer; `out` may
  /// be `heads`: each row is read whole before it is written).
  void normalise_heads(const Tensor& heads, Tensor& out) const;
  /// Its backward: d_out, dL/d(normalise_heads' output), becomes dL/d(heads) in place; adds the
  /// gain's gradient into grad_weight.
  void normalise_heads_backward(const Tensor& heads, Tensor& d_out, Vector& grad_weight) const;

  /// The core's per-token inputs from `memory` [B, Nk, d_model] (empty for a core without).
  Gates gates(const Activations& memory) const;

  /// Self-attention: x [B, N, d_model] -> [B, N, d_model].
  Activations forward(const Activations& x, const Mask& mask = {}) const;

  /// Cross-attention: query [B, Nq, d_model], memory [B, Nk, d_model] -> [B, Nq, d_model].
  /// Throws Error naming the mismatch when the shapes do not fit.
  Activations forward(const Activations& query, const Activations& memory, const Mask& mask) const;

  /// The one forward behind both, into y (shaped by shape_buffer; not query or memory). With
  /// `keep`, everything the backward reads stays in it (the inputs, q, k, v, the gates, the
  /// core's output and what the core saved for its backward) and its buffers are reused; without,
  /// the core saves nothing and the intermediates are freed on return.
  void forward(const Activations& query, const Activations& memory, const Mask& mask,
               Activations& y, AttentionTrace* keep = nullptr) const;

  /// Incremental causal self-attention, as a model generates: a state for `batch` sequences
  /// holding at most `max_tokens` tokens each (0: no limit, but a core that needs one, bigbird).
  /// Throws Unsupported (naming the core and decoding) for a core without a decoder.
  AttentionDecoding start_decoding(std::size_t batch, std::size_t max_tokens = 0) const;
  /// The self-attention outputs y [B, n, d_model] of n new tokens x [B, n, d_model] after those
  /// `state` holds: the rows the causal forward of all of them gives (to float tolerance; the
  /// core's prefill for n > 1, its step for n = 1), by the same projections, short convolution,
  /// rotation (at the tokens' positions), gates, head norm, head mask and W_O as forward().
  /// Throws Error for a batch other than the state's or tokens past its max_tokens (the state
  /// then unchanged), and what the core's decoder throws (the state then no longer usable).
  void decode(const Activations& x, AttentionDecoding& state, Activations& y) const;

  /// The heads' inputs: q [B, H, Nq, d_k] from `query`, k and v [B, kv_heads, Nk, d_k] from
  /// `memory`.
  QKV project(const Activations& query, const Activations& memory) const;
  /// The same into `out` and the projection rows `scratch`, both shaped by shape_buffer: a
  /// training step reuses them. `scratch` is [B·max(Nq, Nk), w], or with the short
  /// convolution [3·B·max(Nq, Nk), w] holding the three projections before it (block `which`
  /// from row which·B·max(Nq, Nk), packed in rows of block_size(which) floats), which its
  /// backward needs; w = max(d_model, block_size(1)).
  void project(const Activations& query, const Activations& memory, QKV& out,
               Matrix& scratch) const;

  /// softmax(q k^T · scale) under `mask`, dense [B, H, Nq, Nk]: what exact attention weighs the
  /// values with (whatever the core is), for analysis. O(B·H·Nq·Nk) memory. A row that sees no
  /// key is zero.
  Tensor attention_probabilities(const Activations& query, const Activations& memory,
                                 const Mask& mask = {}) const;

  /// PyTorch's initialisation: in_proj_weight Xavier-uniform (the K block copied from the Q block
  /// when tied), in_proj_bias and out_proj.bias 0, out_proj.weight uniform in +-1/sqrt(d_model),
  /// conv_weight uniform in +-1/sqrt(kConvWidth) (Conv1d's), head_norm.weight 1; streams from
  /// (seed, prefix + name). With the llama names, W_Q, W_K, W_V and W_O are N(0, 0.02²)
  /// (Hugging Face's initializer_range) instead.
  void initialize(std::uint64_t seed, const std::string& prefix);

  /// Appends prefix + "in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias" (the
  /// llama names: "q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"; no biases
  /// without them), then "conv_weight", "head_norm.weight", the gate projections' and
  /// "attention_<name>" for each of attention_parameters.
  void parameters(const std::string& prefix, Parameters& out);

  /// Throws Error (naming `where`) when tied and the K block differs from the Q block.
  void check_tied(const std::string& where) const;

  /// Replaces the core by make_attention(spec), keeping every weight; gate projections the new
  /// core needs and the old did not have start at zero (g = logsigmoid(0) / 16, beta = 1/2);
  /// attention_parameters start as the new core's own (linformer's drawn E and F). Throws
  /// Unsupported (naming the core) when kv_heads < heads and the core does not take grouped heads.
  void set_attention(const std::string& spec);

  /// The core backend, holding attention_parameters: handed to it here when they differ from
  /// what it holds (a comparison per call, a copy when they changed; throws Error naming one
  /// that does not fit). Not to be called concurrently on one layer.
  const Attention& attention() const;
  /// The core's spec as the factory made it (canonical): the layer's variant, also once the
  /// core holds learned tensors (whose own spec() then says init=supplied).
  const std::string& spec() const { return core_.canonical; }
  /// d_model.
  std::size_t d_model() const { return out_proj.weight.shape()[0]; }
  /// The number of heads h.
  std::size_t heads() const { return heads_; }
  /// d_k = d_v = d_model / heads.
  std::size_t head_dim() const { return d_model() / heads_; }
  /// The key and value heads (kv_heads, or heads when it is 0).
  std::size_t kv_heads() const { return kv_heads_; }
  /// The width of the key and value projections, kv_heads · d_k.
  std::size_t kv_dim() const { return kv_heads_ * head_dim(); }
  /// Keys, values and betas projected per token: the core's Support::rows_per_token
  /// (DeltaProduct's n_h; 1 for every other core).
  std::size_t key_rows() const { return key_rows_; }
  /// The first row of block `which` (0: W_Q, 1: W_K, 2: W_V; 3: their end) in in_proj_weight.
  std::size_t block_offset(std::size_t which) const {
    return which == 0 ? 0 : d_model() + (which - 1) * key_rows_ * kv_dim();
  }
  /// The rows of block `which`: d_model for W_Q, key_rows() · kv_dim() for W_K and W_V.
  std::size_t block_size(std::size_t which) const {
    return which == 0 ? d_model() : key_rows_ * kv_dim();
  }
  /// Whether W_Q = W_K (and b_Q = b_K).
  bool tied_qk() const { return options_.tied_qk; }
  /// Whether the projections have biases.
  bool bias() const { return options_.bias; }
  /// The rotary embeddings of q and k, when built with them.
  const std::optional<Rotary>& rotary() const { return rotary_; }
  /// The options it was built with.
  const AttentionOptions& options() const { return options_; }
  /// The short convolution's backward for block `which` (0: q, 1: k, 2: v) of `batch`
  /// sequences of n rows: u the projection rows it saw [batch·n, block_size(which)], d_out dL/d(its
  /// output) in the same layout (overwritten with dL/d(before SiLU)); writes dL/du into du and adds
  /// the filters' gradient into the block's rows of grad_weight (conv_weight's shape).
  void short_conv_backward(std::size_t which, std::size_t batch, std::size_t n, const float* u,
                           float* d_out, float* du, Matrix& grad_weight) const;
  /// Whether q, k and v pass through the short convolution.
  bool short_conv() const { return conv_weight.has_value(); }

 private:
  void check_input(const Activations& x, const char* what) const;
  // project() after the tokens `state` holds (nullptr: none): the rotation at their positions,
  // the short convolution over its held rows (which it updates).
  void project(const Activations& query, const Activations& memory, QKV& out, Matrix& scratch,
               AttentionDecoding* state) const;
  // What follows the core: t.heads through the head norm and the head mask (into t's buffers
  // when `keep`, else in place), merged, then W_O into y.
  void output(AttentionTrace& t, bool keep, Activations& y) const;
  // Block `which` (0: q, 1: k, 2: v) of in_proj_weight (or in_proj_bias) under the llama name.
  ParameterRef block_parameter(const std::string& prefix, std::size_t which, bool bias_block);

  // The core: copies share it unless `own` (it has learned tensors: a copy makes its own, and
  // `held` is what it holds of them).
  struct Core {
    std::string spec, canonical;
    bool own = false;
    std::shared_ptr<Attention> backend;
    std::vector<ParameterTensor> held;
    Core() = default;
    Core(const Core& other);
    Core& operator=(const Core& other);
    Core(Core&&) = default;
    Core& operator=(Core&&) = default;
  };

  std::size_t heads_;
  std::size_t kv_heads_;
  std::size_t key_rows_ = 1;
  AttentionOptions options_;
  std::optional<Rotary> rotary_;
  mutable Core core_;  // attention() hands the core its tensors: logically const
};

/// Projected rows y [B·N, H·dk] (row stride H·dk) as heads [B, H, N, dk]: head h owns dk
/// consecutive columns.
Tensor split_heads(const float* y, std::size_t batch, std::size_t n, std::size_t heads,
                   std::size_t dk);
/// The same into `out` (shaped by shape_buffer).
void split_heads(const float* y, std::size_t batch, std::size_t n, std::size_t heads,
                 std::size_t dk, Tensor& out);

/// Heads [B, H, N, dk] concatenated back into [B, N, H·dk].
Activations merge_heads(const Tensor& t);
/// The same into `out` (shaped by shape_buffer).
void merge_heads(const Tensor& t, Activations& out);

/// MultiHeadAttention::forward(query, memory, mask), keeping the trace; returns trace.output.
const Activations& forward(const MultiHeadAttention& mha, const Activations& query,
                           const Activations& memory, const Mask& mask, AttentionTrace& trace);

/// dL/dquery and dL/dmemory given dy (in trace.grads, returned); adds every parameter's gradient
/// into grad. The core's backward may throw Unsupported (a backend without one).
AttentionInputGrads& backward(const MultiHeadAttention& mha, AttentionTrace& trace,
                              const Activations& dy, MultiHeadAttention& grad);

/// Swaps the buffers that the backward uses only while it runs (all but its result's query
/// gradient), so that one set serves every layer of a stack in turn (models/residual.hpp).
void swap_backward_scratch(AttentionTrace& a, AttentionTrace& b);

/// softmax(q k^T · scale) under `mask` for q [B, H, Nq, Dk], k [B, Hkv, Nk, Dk]: the dense
/// [B, H, Nq, Nk] probabilities exact attention weighs the values with (rows that see no key are
/// zero), accumulated in float32 by one sgemm per head. Validates shapes and mask (throws Error).
Tensor attention_probabilities(const Tensor& q, const Tensor& k, const Mask& mask = {});

}  // namespace attnlab::models
