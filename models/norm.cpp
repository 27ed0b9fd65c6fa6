#include "models/norm.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "attnlab/error.hpp"

namespace attnlab::models {

LayerNorm::LayerNorm(std::size_t features, double eps)
    : weight(Vector::from_shape({features})), bias(Vector::from_shape({features})), eps(eps) {
  initialize();
}

Activations LayerNorm::forward(Activations x) const {
  forward(x, x);
  return x;
}

void LayerNorm::forward(const Activations& x, Activations& y) const {
  const std::size_t d = weight.size();
  if (x.shape()[2] != d)
    throw Error("LayerNorm(" + std::to_string(d) + "): input " + shape_text(x) + " has " +
                std::to_string(x.shape()[2]) + " features");
  if (&y != &x) shape_buffer(y, x.shape());
  const std::size_t rows = x.shape()[0] * x.shape()[1];
  const float* gamma = weight.data();
  const float* beta = bias.data();
#pragma omp parallel for schedule(static) if (rows * d > kParallelFloats)
  for (std::size_t r = 0; r < rows; ++r) {
    const float* row = x.data() + r * d;
    float* out = y.data() + r * d;
    double mean = 0, var = 0;  // each sum in SIMD lanes: a fixed order, whatever the threads
#pragma omp simd reduction(+ : mean)
    for (std::size_t c = 0; c < d; ++c) mean += row[c];
    mean /= static_cast<double>(d);
#pragma omp simd reduction(+ : var)
    for (std::size_t c = 0; c < d; ++c) var += (row[c] - mean) * (row[c] - mean);
    const double inv = 1.0 / std::sqrt(var / static_cast<double>(d) + eps);
    for (std::size_t c = 0; c < d; ++c)
      out[c] = static_cast<float>((row[c] - mean) * inv) * gamma[c] + beta[c];
  }
}

void LayerNorm::initialize() {
  weight.fill(1);
  bias.fill(0);
}

void LayerNorm::parameters(const std::string& prefix, Parameters& out) {
  out.push_back(parameter(prefix + "weight", weight));
  out.push_back(parameter(prefix + "bias", bias));
}

Activations backward(const LayerNorm& layer, const Activations& x, const Activations& dy,
                     LayerNorm& grad) {
  Activations dx;
  backward(layer, x, dy, grad, dx);
  return dx;
}

void backward(const LayerNorm& layer, const Activations& x, const Activations& dy, LayerNorm& grad,
              Activations& dx) {
  const std::size_t d = layer.weight.size();
  if (x.shape()[2] != d) layer.forward(x);  // throws the forward's message
  require_gradient_shape(dy, x.shape()[0], x.shape()[1], d, "LayerNorm backward");
  shape_buffer(dx, x.shape());
  const std::size_t rows = x.shape()[0] * x.shape()[1];
  std::vector<double> row_mean(rows), row_inv(rows);
  const float* gamma = layer.weight.data();
  float* d_gamma = grad.weight.data();
  float* d_beta = grad.bias.data();
  constexpr std::size_t kChunk = 16;  // gradient columns per task
  const auto chunks = static_cast<std::ptrdiff_t>((d + kChunk - 1) / kChunk);
#pragma omp parallel if (rows * d > kParallelFloats)
  {
    // dx, rows in parallel. y = xhat·gamma + beta: dxhat = dy·gamma, and through
    // xhat = (x - mean)·inv, dx = inv · (dxhat - mean(dxhat) - xhat · mean(dxhat ∘ xhat)).
    std::vector<double> xhat(d), dxhat(d);
#pragma omp for schedule(static)
    for (std::size_t r = 0; r < rows; ++r) {
      const float* in = x.data() + r * d;
      const float* g = dy.data() + r * d;
      double mean = 0, var = 0;  // each sum in SIMD lanes: a fixed order, whatever the threads
#pragma omp simd reduction(+ : mean)
      for (std::size_t c = 0; c < d; ++c) mean += in[c];
      mean /= static_cast<double>(d);
#pragma omp simd reduction(+ : var)
      for (std::size_t c = 0; c < d; ++c) var += (in[c] - mean) * (in[c] - mean);
      const double inv = 1.0 / std::sqrt(var / static_cast<double>(d) + layer.eps);
      row_mean[r] = mean;
      row_inv[r] = inv;
      double sum = 0, dot = 0;
#pragma omp simd reduction(+ : sum, dot)
      for (std::size_t c = 0; c < d; ++c) {
        xhat[c] = (in[c] - mean) * inv;
        dxhat[c] = double(g[c]) * gamma[c];
        sum += dxhat[c];
        dot += dxhat[c] * xhat[c];
      }
      sum /= static_cast<double>(d);
      dot /= static_cast<double>(d);
      for (std::size_t c = 0; c < d; ++c)
        dx.data()[r * d + c] = static_cast<float>(inv * (dxhat[c] - sum - xhat[c] * dot));
    }
    // Then the gradients of gamma and beta, columns in parallel: each column summed over the
    // rows in order, as one thread sums it.
#pragma omp for schedule(static)
    for (std::ptrdiff_t chunk = 0; chunk < chunks; ++chunk) {
      const std::size_t c0 = std::size_t(chunk) * kChunk, c1 = std::min(d, c0 + kChunk);
      for (std::size_t r = 0; r < rows; ++r) {
        const float* in = x.data() + r * d;
        const float* g = dy.data() + r * d;
        const double mean = row_mean[r], inv = row_inv[r];
        for (std::size_t c = c0; c < c1; ++c) {
          const double xh = (in[c] - mean) * inv;
          d_gamma[c] += static_cast<float>(g[c] * xh);
          d_beta[c] += g[c];
        }
      }
    }
  }
}

void rms_normalize(const float* x, std::size_t rows, std::size_t d, const float* w, double eps,
                   float* y) {
#pragma omp parallel for schedule(static) if (rows * d > kParallelFloats)
  for (std::size_t r = 0; r < rows; ++r) {
    const float* in = x + r * d;
    float* out = y + r * d;
    double squares = 0;  // in SIMD lanes: a fixed order, whatever the threads
#pragma omp simd reduction(+ : squares)
    for (std::size_t c = 0; c < d; ++c) squares += double(in[c]) * in[c];
    const double inv = 1.0 / std::sqrt(squares / double(d) + eps);
    for (std::size_t c = 0; c < d; ++c) out[c] = static_cast<float>(in[c] * inv * w[c]);
  }
}

void rms_normalize_backward(const float* x, const float* dy, std::size_t rows, std::size_t d,
                            const float* w, double eps, float* dx, float* dw) {
  // y_c = w_c x_c inv: dx_j = inv dy_j w_j - x_j inv³ dot / d, dot = sum_c dy_c w_c x_c.
  std::vector<double> row_inv(rows), row_dot(rows);
  constexpr std::size_t kChunk = 16;  // gradient columns per task
  const auto chunks = static_cast<std::ptrdiff_t>((d + kChunk - 1) / kChunk);
#pragma omp parallel if (rows * d > kParallelFloats)
  {
#pragma omp for schedule(static)
    for (std::size_t r = 0; r < rows; ++r) {
      const float* in = x + r * d;
      const float* g = dy + r * d;
      double squares = 0, dot = 0;
#pragma omp simd reduction(+ : squares, dot)
      for (std::size_t c = 0; c < d; ++c) {
        squares += double(in[c]) * in[c];
        dot += double(g[c]) * w[c] * in[c];
      }
      row_inv[r] = 1.0 / std::sqrt(squares / double(d) + eps);
      row_dot[r] = dot;
    }
    // The gain's gradient before dx is written (dx may be dy): columns in parallel, each summed
    // over the rows in order.
#pragma omp for schedule(static)
    for (std::ptrdiff_t chunk = 0; chunk < chunks; ++chunk) {
      const std::size_t c0 = std::size_t(chunk) * kChunk, c1 = std::min(d, c0 + kChunk);
      double sums[kChunk] = {};
      for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t c = c0; c < c1; ++c)
          sums[c - c0] += double(dy[r * d + c]) * x[r * d + c] * row_inv[r];
      for (std::size_t c = c0; c < c1; ++c) dw[c] += static_cast<float>(sums[c - c0]);
    }
#pragma omp for schedule(static)
    for (std::size_t r = 0; r < rows; ++r) {
      const float* in = x + r * d;
      const float* g = dy + r * d;
      float* out = dx + r * d;
      const double inv = row_inv[r], dot = row_dot[r];
      for (std::size_t c = 0; c < d; ++c)
        out[c] = static_cast<float>(inv * g[c] * w[c] - in[c] * inv * inv * inv * dot / double(d));
    }
  }
}

RMSNorm::RMSNorm(std::size_t features, double eps)
    : weight(Vector::from_shape({features})), eps(eps) {
  if (!(eps > 0) || !std::isfinite(eps))
    throw Error("RMSNorm: eps=" + std::to_string(eps) + ", expected a finite value > 0");
  initialize();
}

Activations RMSNorm::forward(const Activations& x) const {
  Activations y;
  forward(x, y);
  return y;
}

void RMSNorm::forward(const Activations& x, Activations& y) const {
  const std::size_t d = weight.size();
  if (x.shape()[2] != d)
    throw Error("RMSNorm(" + std::to_string(d) + "): input " + shape_text(x) + " has " +
                std::to_string(x.shape()[2]) + " features");
  if (&y != &x) shape_buffer(y, x.shape());
  rms_normalize(x.data(), x.shape()[0] * x.shape()[1], d, weight.data(), eps, y.data());
}

void RMSNorm::initialize() {
  weight.fill(1);
}

void RMSNorm::parameters(const std::string& prefix, Parameters& out) {
  out.push_back(parameter(prefix + "weight", weight));
}

void backward(const RMSNorm& layer, const Activations& x, const Activations& dy, RMSNorm& grad,
              Activations& dx) {
  const std::size_t d = layer.weight.size();
  if (x.shape()[2] != d) layer.forward(x);  // throws the forward's message
  require_gradient_shape(dy, x.shape()[0], x.shape()[1], d, "RMSNorm backward");
  shape_buffer(dx, x.shape());
  rms_normalize_backward(x.data(), dy.data(), x.shape()[0] * x.shape()[1], d, layer.weight.data(),
                         layer.eps, dx.data(), grad.weight.data());
}

}  // namespace attnlab::models
