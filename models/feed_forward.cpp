#include "models/feed_forward.hpp"

#include <algorithm>
#include <utility>

#include "attnlab/error.hpp"

namespace attnlab::models {

FeedForward::FeedForward(std::size_t d_model, std::size_t hidden)
    : linear1(d_model, hidden), linear2(hidden, d_model) {}

Activations FeedForward::forward(const Activations& x) const {
  Activations y;
  forward(x, y);
  return y;
}

void FeedForward::forward(const Activations& x, Activations& y, FeedForwardTrace* keep) const {
  const std::size_t d = linear1.weight.shape()[1], hidden = linear1.weight.shape()[0];
  if (x.shape()[2] != d)
    throw Error("feed-forward " + std::to_string(d) + " -> " + std::to_string(hidden) + " -> " +
                std::to_string(d) + ": input " + shape_text(x) + " has " +
                std::to_string(x.shape()[2]) + " features, expected " + std::to_string(d));
  shape_buffer(y, x.shape());
  const std::size_t rows = x.shape()[0] * x.shape()[1];
  // Kept: one block of every row, in the trace. Else blocks of kRowBlock rows in a scratch.
  const std::size_t block = keep ? rows : std::min(rows, kRowBlock);
  Activations scratch;
  float* h = nullptr;
  if (keep) {
    keep->x = x;  // a copy into the same storage each step
    h = shape_buffer(keep->hidden, {x.shape()[0], x.shape()[1], hidden}).data();
  } else {
    h = (scratch = uninitialized<Activations>({1, block, hidden})).data();
  }
  for (std::size_t r0 = 0; r0 < rows; r0 += block) {
    const std::size_t n = std::min(block, rows - r0);
    affine(x.data() + r0 * d, n, d, d, linear1.weight.data(), hidden, d, linear1.bias.data(), h,
           hidden);
    for (std::size_t i = 0; i < n * hidden; ++i) h[i] = h[i] > 0 ? h[i] : 0;  // ReLU
    affine(h, n, hidden, hidden, linear2.weight.data(), d, hidden, linear2.bias.data(),
           y.data() + r0 * d, d);
  }
}

void FeedForward::initialize(std::uint64_t seed, const std::string& prefix) {
  linear1.initialize(seed, prefix + "linear1.");
  linear2.initialize(seed, prefix + "linear2.");
}

void FeedForward::parameters(const std::string& prefix, Parameters& out) {
  linear1.parameters(prefix + "linear1.", out);
  linear2.parameters(prefix + "linear2.", out);
}

const Activations& forward(const FeedForward& ffn, const Activations& x, FeedForwardTrace& trace) {
  ffn.forward(x, trace.output, &trace);
  return trace.output;
}

Activations& backward(const FeedForward& ffn, FeedForwardTrace& trace, const Activations& dy,
                      FeedForward& grad) {
  backward(ffn.linear2, trace.hidden, dy, grad.linear2, trace.d_hidden);
  float* dh = trace.d_hidden.data();
  const float* h = trace.hidden.data();
  for (std::size_t i = 0; i < trace.d_hidden.size(); ++i)
    if (h[i] <= 0) dh[i] = 0;  // ReLU
  backward(ffn.linear1, trace.x, trace.d_hidden, grad.linear1, trace.dx);
  return trace.dx;
}

namespace {

// hidden = silu(gate) ∘ up over n floats.
void swish_gate(const float* gate, const float* up, std::size_t n, float* hidden) {
  sigmoid(gate, n, hidden);
  for (std::size_t i = 0; i < n; ++i) hidden[i] *= gate[i] * up[i];
}

}  // namespace

void swap_backward_scratch(FeedForwardTrace& a, FeedForwardTrace& b) {
  std::swap(a.d_hidden, b.d_hidden);
  std::swap(a.dx, b.dx);
}

SwiGLU::SwiGLU(std::size_t d_model, std::size_t hidden)
    : gate_proj(d_model, hidden, false),
      up_proj(d_model, hidden, false),
      down_proj(hidden, d_model, false) {}

Activations SwiGLU::forward(const Activations& x) const {
  Activations y;
  forward(x, y);
  return y;
}

void SwiGLU::forward(const Activations& x, Activations& y, SwiGLUTrace* keep) const {
  const std::size_t d = gate_proj.weight.shape()[1], hidden = gate_proj.weight.shape()[0];
  if (x.shape()[2] != d)
    throw Error("SwiGLU feed-forward " + std::to_string(d) + " -> " + std::to_string(hidden) +
                " -> " + std::to_string(d) + ": input " + shape_text(x) + " has " +
                std::to_string(x.shape()[2]) + " features, expected " + std::to_string(d));
  shape_buffer(y, x.shape());
  const std::size_t rows = x.shape()[0] * x.shape()[1];
  const std::size_t block = keep ? rows : std::min(rows, kRowBlock);
  Activations scratch[3];
  float *g = nullptr, *u = nullptr, *h = nullptr;
  if (keep) {
    keep->x = x;  // a copy into the same storage each step
    const Activations::shape_type shape{x.shape()[0], x.shape()[1], hidden};
    g = shape_buffer(keep->gate, shape).data();
    u = shape_buffer(keep->up, shape).data();
    h = shape_buffer(keep->hidden, shape).data();
  } else {
    for (Activations& a : scratch) a = uninitialized<Activations>({1, block, hidden});
    g = scratch[0].data(), u = scratch[1].data(), h = scratch[2].data();
  }
  for (std::size_t r0 = 0; r0 < rows; r0 += block) {
    const std::size_t n = std::min(block, rows - r0);
    affine(x.data() + r0 * d, n, d, d, gate_proj.weight.data(), hidden, d, nullptr, g, hidden);
    affine(x.data() + r0 * d, n, d, d, up_proj.weight.data(), hidden, d, nullptr, u, hidden);
    swish_gate(g, u, n * hidden, h);
    affine(h, n, hidden, hidden, down_proj.weight.data(), d, hidden, nullptr, y.data() + r0 * d, d);
  }
}

void SwiGLU::initialize(std::uint64_t seed, const std::string& prefix, double std) {
  Parameters params;
  parameters(prefix, params);
  for (const ParameterRef& p : params) fill_normal(p, std, seed);
}

void SwiGLU::parameters(const std::string& prefix, Parameters& out) {
  gate_proj.parameters(prefix + "gate_proj.", out);
  up_proj.parameters(prefix + "up_proj.", out);
  down_proj.parameters(prefix + "down_proj.", out);
}

const Activations& forward(const SwiGLU& mlp, const Activations& x, SwiGLUTrace& trace) {
  mlp.forward(x, trace.output, &trace);
  return trace.output;
}

Activations& backward(const SwiGLU& mlp, SwiGLUTrace& trace, const Activations& dy, SwiGLU& grad) {
  backward(mlp.down_proj, trace.hidden, dy, grad.down_proj, trace.d_hidden);
  // hidden = silu(gate) up: d_up = d_hidden silu(gate), d_gate = d_hidden up silu'(gate), with
  // silu'(z) = s (1 + z (1 - s)), s = sigmoid(z).
  const std::size_t size = trace.gate.size();
  shape_buffer(trace.d_gate, trace.gate.shape());
  shape_buffer(trace.d_up, trace.up.shape());
  float* dg = trace.d_gate.data();
  float* du = trace.d_up.data();
  const float* g = trace.gate.data();
  const float* u = trace.up.data();
  const float* dh = trace.d_hidden.data();
  sigmoid(g, size, dg);  // s, overwritten below
  for (std::size_t i = 0; i < size; ++i) {
    const float s = dg[i];
    du[i] = dh[i] * g[i] * s;
    dg[i] = dh[i] * u[i] * s * (1 + g[i] * (1 - s));
  }
  backward(mlp.gate_proj, trace.x, trace.d_gate, grad.gate_proj, trace.dx);
  backward(mlp.up_proj, trace.x, trace.d_up, grad.up_proj, trace.dx_up);
  add(trace.dx.data(), trace.dx_up.data(), trace.dx.data(), trace.dx.size());
  return trace.dx;
}

void swap_backward_scratch(SwiGLUTrace& a, SwiGLUTrace& b) {
  std::swap(a.d_hidden, b.d_hidden);
  std::swap(a.d_gate, b.d_gate);
  std::swap(a.d_up, b.d_up);
  std::swap(a.dx, b.dx);
  std::swap(a.dx_up, b.dx_up);
}

}  // namespace attnlab::models
