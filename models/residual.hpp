// What the Transformer families share around their layers (models/transformer.hpp, the 2017
// blocks; models/llama.hpp, Llama's): the residual sublayer, x + f(N(x)) (pre-norm) or
// N(x + f(x)) (post-norm) with any norm N, and the stack of layers with a final norm, each with
// its one forward (keeping its trace when asked) and its backward (conventions of
// models/layers.hpp).
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <vector>

#include "models/layers.hpp"
#include "models/norm.hpp"

namespace attnlab::models {

/// Called after each layer of a stack: its index, its input and its output.
using LayerObserver =
    std::function<void(std::size_t layer, const Activations& input, const Activations& output)>;

/// A self-attention sublayer's function f(input, output): a block's forward calls its
/// MultiHeadAttention's forward, an incremental decoder its decode (models/decoding.hpp).
using SelfAttentionCall = std::function<void(const Activations& input, Activations& output)>;

/// One residual sublayer's norm and sum: what its norm saw, and the buffers of its forward and
/// backward.
struct SublayerTrace {
  Activations norm_input;  ///< what the norm saw (unused without it)
  Activations normed;      ///< pre-norm: the norm's output, f's input
  Activations branch;      ///< f's output, when a sum or a norm follows it
  Activations d_norm;      ///< the backward through a post-norm
  Activations d_input;     ///< the backward through a pre-norm
};

/// One residual sublayer into y (not x): x + f(N(x)) with `pre_norm`, N(x + f(x)) without, with
/// no sum without `skip` and no N without `norm`; with `keep`, what the norm saw stays there for
/// the backward. f(input, output) writes the branch's output.
template <class Norm, class F>
void residual_forward(bool pre_norm, bool skip, const Activations& x,
                      const std::optional<Norm>& norm, Activations& y, SublayerTrace* keep, F&& f) {
  const bool pre = pre_norm && norm, post = !pre_norm && norm;
  SublayerTrace scratch;  // without `keep`: freed on return
  SublayerTrace& t = keep ? *keep : scratch;
  const Activations* input = &x;
  if (pre) {
    if (keep) t.norm_input = x;  // a copy into the same storage each step
    norm->forward(x, t.normed);
    input = &t.normed;
  }
  if (!skip && !post) return f(*input, y);
  f(*input, t.branch);
  Activations& sum = post ? t.norm_input : y;  // post-norm: the sum is what the norm sees
  if (skip) {
    shape_buffer(sum, t.branch.shape());
    add(t.branch.data(), x.data(), sum.data(), sum.size());
  } else {
    sum = t.branch;
  }
  if (post) norm->forward(sum, y);
}

/// Its backward: back(d) returns the gradient of f's input given d = the gradient of f's output
/// (a buffer of f's trace, which this may change); adds the norm's gradients into norm_grad.
/// Returns dL/dx, a buffer of the trace or of f's.
template <class Norm, class B>
Activations& residual_backward(bool pre_norm, bool skip, const Activations& dy,
                               const std::optional<Norm>& norm, std::optional<Norm>& norm_grad,
                               SublayerTrace& t, B&& back) {
  const bool pre = pre_norm && norm, post = !pre_norm && norm;
  if (post) backward(*norm, t.norm_input, dy, *norm_grad, t.d_norm);
  const Activations& dz = post ? t.d_norm : dy;
  Activations& branch = back(dz);
  if (pre) backward(*norm, t.norm_input, branch, *norm_grad, t.d_input);
  Activations& dx = pre ? t.d_input : branch;
  if (skip) add(dx.data(), dz.data(), dx.data(), dx.size());
  return dx;
}

/// A stack's forward into y (not x): step(layer, input, output, layer_trace) runs each layer in
/// turn, its output in its trace when keeping (StackTrace: `layers`, `norm_input`), else in two
/// buffers used in turn (the last straight into y when no norm follows); `observe` sees each;
/// then the final norm.
template <class LayerTrace, class Layer, class Norm, class StackTrace, class Step>
void stack_forward(const std::vector<Layer>& layers, const std::optional<Norm>& norm,
                   const Activations& x, Activations& y, StackTrace* keep,
                   const LayerObserver& observe, Step step) {
  if (keep) keep->layers.resize(layers.size());
  Activations buffers[2];
  const Activations* h = &x;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    LayerTrace* layer_keep = keep ? &keep->layers[i] : nullptr;
    Activations& out = i + 1 == layers.size() && !norm ? y
                       : layer_keep                    ? layer_keep->output
                                                       : buffers[i % 2];
    step(layers[i], *h, out, layer_keep);
    if (observe) observe(i, *h, out);
    h = &out;
  }
  if (!norm) {
    if (h != &y) y = *h;  // no layers
    return;
  }
  if (!keep) return norm->forward(*h, y);
  keep->norm_input = *h;  // a copy into the same storage each step
  norm->forward(keep->norm_input, y);
}

/// Its backward given dy: through the final norm (into trace.d_norm) and every layer in reverse
/// (backward(layer, layer_trace, d, layer_grad)), adding into grad_layers and grad_norm. One set
/// of backward scratch moves down the layers (swap_backward_scratch(a, b) of the layer traces)
/// instead of one set per layer. Returns dL/dx, a buffer of the traces.
template <class Layer, class Norm, class StackTrace>
const Activations& stack_backward(const std::vector<Layer>& layers, const std::optional<Norm>& norm,
                                  StackTrace& trace, const Activations& dy,
                                  std::vector<Layer>& grad_layers, std::optional<Norm>& grad_norm) {
  if (norm) backward(*norm, trace.norm_input, dy, *grad_norm, trace.d_norm);
  const Activations* d = norm ? &trace.d_norm : &dy;
  // Layer 0 holds the scratch set after a backward, so the top layer takes it from there.
  for (std::size_t i = layers.size(); i-- > 0;) {
    swap_backward_scratch(trace.layers[i], trace.layers[i + 1 < layers.size() ? i + 1 : 0]);
    d = &backward(layers[i], trace.layers[i], *d, grad_layers[i]);
  }
  return *d;
}

}  // namespace attnlab::models
