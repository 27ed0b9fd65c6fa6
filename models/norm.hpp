// The normalisations over the last axis, each with its forward and its backward (conventions of
// models/layers.hpp): LayerNorm (the 2017 Transformer's) and RMSNorm (Zhang & Sennrich 2019,
// "Root Mean Square Layer Normalization": Llama's, and the attention heads' head norm).
#pragma once

#include <cstddef>
#include <string>

#include "models/layers.hpp"

namespace attnlab::models {

/// torch.nn.LayerNorm over the last axis: (x - mean) / sqrt(var + eps) * weight + bias, with the
/// biased variance.
class LayerNorm {
 public:
  /// weight 1, bias 0 (PyTorch's initialisation; initialize() restores it).
  LayerNorm(std::size_t features, double eps = 1e-5);

  Vector weight;  ///< gamma [features]
  Vector bias;    ///< beta [features]
  double eps;     ///< added to the variance

  /// x [B, N, features] -> the same shape, normalised in x's own storage (pass an rvalue to
  /// spare a fresh buffer). Throws Error on a feature-size mismatch.
  Activations forward(Activations x) const;
  /// The same into y (shaped by shape_buffer; y may be x): rows in parallel, each row computed
  /// as forward(x) computes it, so the result is bitwise the same.
  void forward(const Activations& x, Activations& y) const;

  /// weight 1, bias 0.
  void initialize();

  /// Appends prefix + "weight", prefix + "bias".
  void parameters(const std::string& prefix, Parameters& out);
};

/// torch.nn.RMSNorm / Hugging Face's LlamaRMSNorm over the last axis:
/// y = x / sqrt(mean(x²) + eps) * weight, the mean square in double.
class RMSNorm {
 public:
  /// weight 1 (initialize() restores it). Throws Error when eps is not finite and > 0.
  explicit RMSNorm(std::size_t features, double eps = 1e-5);

  Vector weight;  ///< the gain [features]
  double eps;     ///< added to the mean square

  /// x [B, N, features] -> the same shape, normalised. Throws Error on a feature-size mismatch.
  Activations forward(const Activations& x) const;
  /// The same into y (shaped by shape_buffer; y may be x).
  void forward(const Activations& x, Activations& y) const;

  /// weight 1.
  void initialize();

  /// Appends prefix + "weight".
  void parameters(const std::string& prefix, Parameters& out);
};

/// RMSNorm's computation on `rows` rows of d floats x -> y (y may be x), rows in parallel:
/// y[c] = x[c] · inv · w[c], inv = 1 / sqrt(sum_c x[c]² / d + eps) in double.
void rms_normalize(const float* x, std::size_t rows, std::size_t d, const float* w, double eps,
                   float* y);

/// Its backward given dy (rows of d): dx (may be dy) = inv · dy ∘ w - x · inv³ · (dy·(w∘x)) / d;
/// adds dL/dw, each column summed over the rows in order (so bitwise as one thread), into dw.
void rms_normalize_backward(const float* x, const float* dy, std::size_t rows, std::size_t d,
                            const float* w, double eps, float* dx, float* dw);

/// dL/dx of LayerNorm::forward at input x (mean and variance recomputed), given dy; adds the
/// gradients of weight and bias into grad.
Activations backward(const LayerNorm& layer, const Activations& x, const Activations& dy,
                     LayerNorm& grad);
/// The same into dx (shaped by shape_buffer; not x or dy): rows in parallel for dx, columns in
/// parallel for the gradients (each summed over the rows in order, so bitwise as one thread).
void backward(const LayerNorm& layer, const Activations& x, const Activations& dy, LayerNorm& grad,
              Activations& dx);

/// dL/dx of RMSNorm::forward at input x, given dy, into dx (shaped by shape_buffer; not x or
/// dy); adds the gain's gradient into grad.
void backward(const RMSNorm& layer, const Activations& x, const Activations& dy, RMSNorm& grad,
              Activations& dx);

}  // namespace attnlab::models
