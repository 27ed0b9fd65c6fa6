#include "models/feed_forward.hpp"

#include <algorithm>

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

}  // namespace attnlab::models
