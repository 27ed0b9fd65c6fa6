// Backward passes of the model layers (issue 10): for each layer a forward that keeps a trace
// (what its backward needs) and a backward that returns the gradient of the layer's input and
// adds the gradients of its parameters into `grad`, an object of the layer's own type and shape
// whose tensors hold gradients: grad.parameters() lists them under the model's names and in its
// order, which is how an optimizer (models/optimizer.hpp) pairs them. Gradients accumulate, so
// several backward calls (micro-batches) add up; zero_like() gives a fresh accumulator.
//
// The loss L is the caller's: backward takes dy = dL/d(output). Conventions as the forwards':
// activations [batch, seq, features], W [out, in], y = x W^T + b. Matrix products go through
// OpenBLAS (cblas_sgemm), the attention core through Attention::backward (every backend).
// What is not learned gets no gradient: the sinusoidal positional encoding is a constant added
// to the scaled embedding. A core's own learned tensors (linformer's E and F) are the layer's
// attention_parameters, their gradients Attention::backward's AllGradients::parameters. The gate
// projections of a core that takes g or beta are learned: dg and dbeta come back from
// AllGradients and pass through logsigmoid / 16 and sigmoid; the short convolution's filters
// through SiLU and the convolution; the head norm's gain through the normalisation.
// Tied W_Q = W_K: the K block's gradient is added to the Q block's and both blocks hold the sum,
// so that an update keeps them equal.
// The traces are also the step's workspace: a forward writes its activations and its output into
// its trace and a backward its gradients, each buffer reshaped only when its shape changes
// (shape_buffer), so a trace kept from one step to the next makes every step after the first
// allocate nothing large (a fresh buffer costs page faults about as long as the GEMM that fills
// it). The references the forwards and backwards return point into the trace and stay valid
// until its next forward or backward.
#pragma once

#include <vector>

#include "attnlab/attention.hpp"
#include "models/transformer.hpp"

namespace attnlab::models {

/// A copy of `layer` with every parameter zero: a gradient accumulator for its backward.
template <class Layer>
Layer zero_like(const Layer& layer) {
  Layer grad = layer;
  Parameters params;
  grad.parameters("", params);
  for (const ParameterRef& p : params) fill_constant(p, 0.0f);
  return grad;
}

/// The same for a whole model (its parameters() takes no prefix).
EncoderModel zero_like(const EncoderModel& model);

/// dL/dx of Linear::forward at input x, given dy [B, N, out]; adds dL/dW, dL/db into grad.
/// Throws Error when the shapes do not fit the layer.
Activations backward(const Linear& layer, const Activations& x, const Activations& dy,
                     Linear& grad);
/// The same into dx (shaped by shape_buffer; not x or dy).
void backward(const Linear& layer, const Activations& x, const Activations& dy, Linear& grad,
              Activations& dx);

/// dL/dx of LayerNorm::forward at input x (mean and variance recomputed), given dy; adds the
/// gradients of weight and bias into grad.
Activations backward(const LayerNorm& layer, const Activations& x, const Activations& dy,
                     LayerNorm& grad);
/// The same into dx (shaped by shape_buffer; not x or dy): rows in parallel for dx, columns in
/// parallel for the gradients (each summed over the rows in order, so bitwise as one thread).
void backward(const LayerNorm& layer, const Activations& x, const Activations& dy, LayerNorm& grad,
              Activations& dx);

/// What FeedForward's backward needs: its input and the hidden activations after the ReLU.
struct FeedForwardTrace {
  Activations x;         ///< the input
  Activations hidden;    ///< relu(linear1(x))
  Activations output;    ///< the forward's result
  Activations d_hidden;  ///< the backward's dL/dhidden
  Activations dx;        ///< the backward's result
};

/// FeedForward::forward, keeping the trace; returns trace.output.
const Activations& forward(const FeedForward& ffn, const Activations& x, FeedForwardTrace& trace);

/// dL/dx given dy (in trace.dx, returned); adds both linears' gradients into grad (ReLU's
/// derivative at 0 taken as 0).
Activations& backward(const FeedForward& ffn, FeedForwardTrace& trace, const Activations& dy,
                      FeedForward& grad);

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
  Gates gates;          ///< the core's per-token inputs (empty without)
  Saved saved;          ///< what the core's forward saved (a softmax's row log-sum-exp, ...)
  Activations merged;   ///< the heads (normalised, times head_mask) concatenated: out_proj's input
  Mask mask;            ///< the mask the core saw
  Matrix projected;     ///< the forward's projection rows (MultiHeadAttention::project)
  Activations output;   ///< the forward's result
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

/// MultiHeadAttention::forward(query, memory, mask), keeping the trace; returns trace.output.
const Activations& forward(const MultiHeadAttention& mha, const Activations& query,
                           const Activations& memory, const Mask& mask, AttentionTrace& trace);

/// dL/dquery and dL/dmemory given dy (in trace.grads, returned); adds in_proj and out_proj
/// gradients into grad. The core's backward may throw Unsupported (a backend without one).
AttentionInputGrads& backward(const MultiHeadAttention& mha, AttentionTrace& trace,
                              const Activations& dy, MultiHeadAttention& grad);

/// One residual sublayer's LayerNorm and sum (x + f(LN(x)) or LN(x + f(x))): what its
/// LayerNorm saw, and the buffers of its forward and backward.
struct SublayerTrace {
  Activations norm_input;  ///< what the LayerNorm saw (unused without it)
  Activations normed;      ///< pre-LN: the LayerNorm's output, f's input
  Activations output;      ///< the sublayer's result
  Activations d_norm;      ///< the backward through a post-LN LayerNorm
  Activations d_input;     ///< the backward through a pre-LN LayerNorm
};

/// What an encoder layer's backward needs: its sublayers' traces.
struct EncoderLayerTrace {
  AttentionTrace attention;  ///< the self-attention's
  FeedForwardTrace ffn;      ///< the FFN's (unused under no-ffn)
  SublayerTrace sublayer1;   ///< around the self-attention (norm1)
  SublayerTrace sublayer2;   ///< around the FFN (norm2; unused under no-ffn)
};

/// EncoderLayer::forward(x, mask), keeping the trace; returns a buffer of the trace.
const Activations& forward(const EncoderLayer& layer, const Activations& x, const Mask& mask,
                           EncoderLayerTrace& trace);

/// dL/dx given dy (in a buffer of the trace, returned); adds every parameter's gradient into
/// grad (pre- and post-LN, every switch).
Activations& backward(const EncoderLayer& layer, EncoderLayerTrace& trace, const Activations& dy,
                      EncoderLayer& grad);

/// The stack's layer traces and what its final LayerNorm saw (pre-LN), with that norm's buffers.
struct EncoderTrace {
  std::vector<EncoderLayerTrace> layers;  ///< one per layer, in order
  Activations norm_input;                 ///< what the final norm saw (pre-LN)
  Activations output;                     ///< the final norm's output
  Activations d_norm;                     ///< the backward through the final norm
};

/// Encoder::forward(x, mask), keeping the trace; returns a buffer of the trace.
const Activations& forward(const Encoder& encoder, const Activations& x, const Mask& mask,
                           EncoderTrace& trace);

/// dL/dx given dy, through the final norm and every layer in reverse; adds into grad. Returns a
/// buffer of the trace.
const Activations& backward(const Encoder& encoder, EncoderTrace& trace, const Activations& dy,
                            Encoder& grad);

/// What a decoder layer's backward needs: its three sublayers' traces.
struct DecoderLayerTrace {
  AttentionTrace self_attention;   ///< the causal self-attention's
  AttentionTrace cross_attention;  ///< the cross-attention's
  FeedForwardTrace ffn;            ///< the FFN's (unused under no-ffn)
  SublayerTrace sublayer1;         ///< around the self-attention (norm1)
  SublayerTrace sublayer2;         ///< around the cross-attention (norm2)
  SublayerTrace sublayer3;         ///< around the FFN (norm3; unused under no-ffn)
};

/// DecoderLayer::forward(x, memory, self_mask, memory_mask), keeping the trace; returns a
/// buffer of the trace.
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

/// The decoder stack's layer traces and what its final LayerNorm saw (pre-LN).
struct DecoderTrace {
  std::vector<DecoderLayerTrace> layers;  ///< one per layer, in order
  Activations norm_input;                 ///< what the final norm saw (pre-LN)
  Activations d_norm;                     ///< the backward through the final norm
};

/// Decoder::forward(x, memory, self_mask, memory_mask), keeping the trace.
Activations forward(const Decoder& decoder, const Activations& x, const Activations& memory,
                    const Mask& self_mask, const Mask& memory_mask, DecoderTrace& trace);

/// dL/dx and dL/dmemory (summed over the layers, which all read it) given dy; adds into grad.
DecoderInputGrads backward(const Decoder& decoder, DecoderTrace& trace, const Activations& dy,
                           Decoder& grad);

/// The token ids, the embedded input (and the positions added to it) and the encoder's trace.
struct ModelTrace {
  Tokens tokens;         ///< the input ids
  Activations embedded;  ///< EncoderModel::embed(tokens), the encoder's input
  Matrix positions;      ///< sinusoidal_positions(N, d_model), kept while N is the same
  EncoderTrace encoder;  ///< the stack's
};

/// EncoderModel::forward(tokens, mask), keeping the trace; returns a buffer of the trace.
const Activations& forward(const EncoderModel& model, const Tokens& tokens, const Mask& mask,
                           ModelTrace& trace);

/// Adds every parameter's gradient into grad given dy: the encoder's, and the embedding rows of
/// the tokens seen (scaled by sqrt(d_model), as the forward scales the embedding).
void backward(const EncoderModel& model, ModelTrace& trace, const Activations& dy,
              EncoderModel& grad);

}  // namespace attnlab::models
