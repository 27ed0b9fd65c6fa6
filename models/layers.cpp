#include "models/layers.hpp"

#include <cblas.h>

#include <cstdint>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "attnlab/blas.hpp"
#include "attnlab/error.hpp"
#include "attnlab/kernels.hpp"
#include "models/step_clock.hpp"

namespace attnlab::models {
void add(const float* a, const float* b, float* out, std::size_t size) {
  for (std::size_t i = 0; i < size; ++i) out[i] = a[i] + b[i];
}

void sigmoid(const float* x, std::size_t size, float* s) {
  constexpr float log2e = 1.44269504088896341f;
  for (std::size_t c = 0; c < size; ++c) s[c] = -x[c] * log2e;
  kernels::exp2_inplace(s, size);
  for (std::size_t c = 0; c < size; ++c) s[c] = 1.0f / (1.0f + s[c]);
}

std::string shape_text(const Activations& x) {
  std::string s = "[";  // built in place: GCC 12 warns falsely on "literal" + std::string&&
  for (std::size_t a = 0; a < 3; ++a) s += (a ? ", " : "") + std::to_string(x.shape()[a]);
  return s + "]";
}

void affine(const float* x, std::size_t rows, std::size_t in, std::size_t ldx, const float* w,
            std::size_t out, std::size_t ldw, const float* b, float* y, std::size_t ldy) {
  for (std::size_t r = 0; r < rows; ++r) {
    if (b)
      std::copy_n(b, out, y + r * ldy);
    else
      std::fill_n(y + r * ldy, out, 0.0f);
  }
  if (rows == 0 || out == 0) return;
  blas::warn_if_slow();  // once: every model's forward passes here
  const TimedPart timed(StepPart::gemm);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows),
              static_cast<int>(out), static_cast<int>(in), 1.0f, x, static_cast<int>(ldx), w,
              static_cast<int>(ldw), 1.0f, y, static_cast<int>(ldy));
}

void affine_backward(const float* x, std::size_t rows, std::size_t in, std::size_t ldx,
                     const float* w, std::size_t out, std::size_t ldw, const float* dy,
                     std::size_t lddy, float* dx, std::size_t lddx, float* dw, float* db,
                     bool accumulate) {
  if (rows == 0) return;
  {
    const TimedPart timed(StepPart::gemm);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(out), int(in), int(rows), 1.0f, dy,
                int(lddy), x, int(ldx), accumulate ? 1.0f : 0.0f, dw, int(ldw));
  }
  if (db) {
    if (!accumulate) std::fill_n(db, out, 0.0f);
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < out; ++c) db[c] += dy[r * lddy + c];
  }
  if (dx) {
    const TimedPart timed(StepPart::gemm);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(rows), int(in), int(out), 1.0f, dy,
                int(lddy), w, int(ldw), 0.0f, dx, int(lddx));
  }
}

void require_gradient_shape(const Activations& dy, std::size_t batch, std::size_t n,
                            std::size_t features, const char* what) {
  if (dy.shape()[0] != batch || dy.shape()[1] != n || dy.shape()[2] != features)
    throw Error(std::string(what) + ": gradient " + shape_text(dy) + ", expected [" +
                std::to_string(batch) + ", " + std::to_string(n) + ", " + std::to_string(features) +
                "] (the output's shape)");
}

Linear::Linear(std::size_t in_features, std::size_t out_features, bool with_bias)
    : weight(Matrix::from_shape({out_features, in_features})),
      bias(Vector::from_shape({with_bias ? out_features : 0})) {
  weight.fill(0);
  bias.fill(0);
}

Activations Linear::forward(const Activations& x) const {
  Activations y;
  forward(x, y);
  return y;
}

void Linear::forward(const Activations& x, Activations& y) const {
  const std::size_t in = weight.shape()[1], out = weight.shape()[0];
  if (x.shape()[2] != in)
    throw Error("linear layer " + std::to_string(in) + " -> " + std::to_string(out) + ": input " +
                shape_text(x) + " has " + std::to_string(x.shape()[2]) + " features, expected " +
                std::to_string(in));
  shape_buffer(y, {x.shape()[0], x.shape()[1], out});
  affine(x.data(), x.shape()[0] * x.shape()[1], in, in, weight.data(), out, in, bias_data(),
         y.data(), out);
}

Activations backward(const Linear& layer, const Activations& x, const Activations& dy,
                     Linear& grad) {
  Activations dx;
  backward(layer, x, dy, grad, dx);
  return dx;
}

void backward(const Linear& layer, const Activations& x, const Activations& dy, Linear& grad,
              Activations& dx) {
  const std::size_t in = layer.weight.shape()[1], out = layer.weight.shape()[0];
  if (x.shape()[2] != in) layer.forward(x);  // throws the forward's message
  require_gradient_shape(dy, x.shape()[0], x.shape()[1], out, "linear layer backward");
  shape_buffer(dx, x.shape());
  affine_backward(x.data(), x.shape()[0] * x.shape()[1], in, in, layer.weight.data(), out, in,
                  dy.data(), out, dx.data(), in, grad.weight.data(),
                  grad.has_bias() ? grad.bias.data() : nullptr, true);
}

void Linear::initialize(std::uint64_t seed, const std::string& prefix) {
  Parameters p;
  parameters(prefix, p);
  const double bound = 1.0 / std::sqrt(static_cast<double>(weight.shape()[1]));
  for (const ParameterRef& r : p) fill_uniform(r, bound, seed);
}

void Linear::parameters(const std::string& prefix, Parameters& out) {
  out.push_back(parameter(prefix + "weight", weight));
  if (has_bias()) out.push_back(parameter(prefix + "bias", bias));
}

Embedding::Embedding(std::size_t vocab, std::size_t dim)
    : weight(Matrix::from_shape({vocab, dim})) {
  weight.fill(0);
}

Activations Embedding::forward(const Tokens& tokens) const {
  Activations y;
  forward(tokens, y);
  return y;
}

void Embedding::forward(const Tokens& tokens, Activations& y) const {
  const std::size_t vocab = weight.shape()[0], dim = weight.shape()[1];
  shape_buffer(y, {tokens.shape()[0], tokens.shape()[1], dim});
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const std::int64_t t = tokens.data()[i];
    if (t < 0 || static_cast<std::size_t>(t) >= vocab)
      throw Error("token " + std::to_string(t) + " at position " +
                  std::to_string(i % tokens.shape()[1]) + " of item " +
                  std::to_string(i / tokens.shape()[1]) + ": outside the vocabulary [0, " +
                  std::to_string(vocab) + ")");
    std::copy_n(weight.data() + static_cast<std::size_t>(t) * dim, dim, y.data() + i * dim);
  }
}

void Embedding::initialize(std::uint64_t seed, const std::string& prefix) {
  fill_normal(parameter(prefix + "weight", weight),
              1.0 / std::sqrt(static_cast<double>(weight.shape()[1])), seed);
}

void Embedding::parameters(const std::string& prefix, Parameters& out) {
  out.push_back(parameter(prefix + "weight", weight));
}

Matrix sinusoidal_positions(std::size_t n, std::size_t dim, std::size_t first) {
  std::vector<double> frequency(dim);
  for (std::size_t c = 0; c < dim; ++c)
    frequency[c] = std::pow(10000.0, -static_cast<double>(c - c % 2) / static_cast<double>(dim));
  auto pe = uninitialized<Matrix>({n, dim});
  for (std::size_t p = 0; p < n; ++p)
    for (std::size_t c = 0; c < dim; ++c) {
      const double angle = static_cast<double>(first + p) * frequency[c];
      pe(p, c) = static_cast<float>(c % 2 == 0 ? std::sin(angle) : std::cos(angle));
    }
  return pe;
}

Tokens random_tokens(std::size_t batch, std::size_t n, std::size_t vocab, std::uint64_t seed) {
  if (vocab == 0) throw Error("random_tokens: vocab=0, expected at least 1");
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::int64_t> token(0, static_cast<std::int64_t>(vocab) - 1);
  Tokens t = Tokens::from_shape({batch, n});
  for (auto& v : t) v = token(rng);
  return t;
}

}  // namespace attnlab::models
