// The position-wise feed-forward layers, each with its one forward (keeping what its backward
// needs when given a trace) and its backward side by side (conventions of models/layers.hpp):
// FeedForward, the 2017 Transformer's ReLU FFN, and SwiGLU (Shazeer 2020, "GLU Variants Improve
// Transformer"), Llama's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "models/layers.hpp"

namespace attnlab::models {

/// What FeedForward's backward needs: its input and the hidden activations after the ReLU; then
/// the backward's buffers.
struct FeedForwardTrace {
  Activations x;         ///< the input
  Activations hidden;    ///< relu(linear1(x))
  Activations output;    ///< the forward's result (the free forward() writes it here)
  Activations d_hidden;  ///< the backward's dL/dhidden
  Activations dx;        ///< the backward's result
};

/// The position-wise FFN of Vaswani et al.: linear2(relu(linear1(x))), named "linear1.*" and
/// "linear2.*" inside a layer as in torch.nn.TransformerEncoderLayer.
class FeedForward {
 public:
  /// linear1: d_model -> hidden, linear2: hidden -> d_model.
  FeedForward(std::size_t d_model, std::size_t hidden);

  Linear linear1;  ///< d_model -> hidden
  Linear linear2;  ///< hidden -> d_model

  /// x [B, N, d_model] -> [B, N, d_model].
  Activations forward(const Activations& x) const;
  /// The same into y (shaped by shape_buffer; y must not be x). Without `keep`, kRowBlock token
  /// rows at a time: the hidden activations are never held for all B·N rows (128 MiB at the LRA
  /// size, B = 4, and a fresh buffer of that size costs as much in page faults as the GEMMs that
  /// fill it on our VM). With `keep`, all rows at once into keep->hidden, and x copied into
  /// keep->x: what backward() reads.
  void forward(const Activations& x, Activations& y, FeedForwardTrace* keep = nullptr) const;

  /// Token rows per block of forward() without a trace.
  static constexpr std::size_t kRowBlock = 512;

  /// Both linears, PyTorch's default initialisation.
  void initialize(std::uint64_t seed, const std::string& prefix);

  /// Appends prefix + "linear1.weight", ..., prefix + "linear2.bias".
  void parameters(const std::string& prefix, Parameters& out);
};

/// FeedForward::forward keeping the trace; returns trace.output.
const Activations& forward(const FeedForward& ffn, const Activations& x, FeedForwardTrace& trace);

/// dL/dx given dy (in trace.dx, returned); adds both linears' gradients into grad (ReLU's
/// derivative at 0 taken as 0).
Activations& backward(const FeedForward& ffn, FeedForwardTrace& trace, const Activations& dy,
                      FeedForward& grad);

/// Swaps the buffers that the backward uses only while it runs (all but its result), so that
/// one set serves every layer of a stack in turn (models/residual.hpp: stack_backward).
void swap_backward_scratch(FeedForwardTrace& a, FeedForwardTrace& b);

/// What SwiGLU's backward needs: its input, the two hidden projections and their product; then
/// the backward's buffers.
struct SwiGLUTrace {
  Activations x;         ///< the input
  Activations gate;      ///< x W_gate^T
  Activations up;        ///< x W_up^T
  Activations hidden;    ///< silu(gate) ∘ up, down_proj's input
  Activations output;    ///< the forward's result (the free forward() writes it here)
  Activations d_hidden;  ///< the backward's dL/dhidden
  Activations d_gate;    ///< dL/dgate
  Activations d_up;      ///< dL/dup
  Activations dx;        ///< the backward's result
  Activations dx_up;     ///< up_proj's share of dx
};

/// Llama's feed-forward (Hugging Face's LlamaMLP): down_proj(silu(gate_proj(x)) ∘ up_proj(x)),
/// silu(z) = z · sigmoid(z), no biases; w1 = gate_proj, w3 = up_proj, w2 = down_proj in the
/// paper's names. Parameters "gate_proj.weight" [hidden, d_model], "up_proj.weight" [hidden,
/// d_model], "down_proj.weight" [d_model, hidden]. Cost: 6·B·N·d_model·hidden FLOPs of GEMMs.
class SwiGLU {
 public:
  /// Zero weights; call initialize or load weights.
  SwiGLU(std::size_t d_model, std::size_t hidden);

  Linear gate_proj;  ///< d_model -> hidden, through SiLU
  Linear up_proj;    ///< d_model -> hidden
  Linear down_proj;  ///< hidden -> d_model

  /// x [B, N, d_model] -> [B, N, d_model].
  Activations forward(const Activations& x) const;
  /// The same into y (shaped by shape_buffer; y must not be x), as FeedForward's: kRowBlock rows
  /// at a time without `keep`, every row at once into it with.
  void forward(const Activations& x, Activations& y, SwiGLUTrace* keep = nullptr) const;

  /// Token rows per block of forward() without a trace.
  static constexpr std::size_t kRowBlock = FeedForward::kRowBlock;

  /// Hugging Face's Llama initialisation: every weight N(0, std²), streams from
  /// (seed, prefix + name).
  void initialize(std::uint64_t seed, const std::string& prefix, double std);

  /// Appends prefix + "gate_proj.weight", "up_proj.weight", "down_proj.weight".
  void parameters(const std::string& prefix, Parameters& out);
};

/// SwiGLU::forward keeping the trace; returns trace.output.
const Activations& forward(const SwiGLU& mlp, const Activations& x, SwiGLUTrace& trace);

/// dL/dx given dy (in trace.dx, returned); adds the three weights' gradients into grad.
Activations& backward(const SwiGLU& mlp, SwiGLUTrace& trace, const Activations& dy, SwiGLU& grad);

/// Swaps the buffers that the backward uses only while it runs (stack_backward).
void swap_backward_scratch(SwiGLUTrace& a, SwiGLUTrace& b);

}  // namespace attnlab::models
