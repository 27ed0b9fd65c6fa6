// The normalisations over the last axis, each with its forward and its backward (conventions of
// models/layers.hpp): LayerNorm (the 2017 Transformer's).
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

/// dL/dx of LayerNorm::forward at input x (mean and variance recomputed), given dy; adds the
/// gradients of weight and bias into grad.
Activations backward(const LayerNorm& layer, const Activations& x, const Activations& dy,
                     LayerNorm& grad);
/// The same into dx (shaped by shape_buffer; not x or dy): rows in parallel for dx, columns in
/// parallel for the gradients (each summed over the rows in order, so bitwise as one thread).
void backward(const LayerNorm& layer, const Activations& x, const Activations& dy, LayerNorm& grad,
              Activations& dx);

}  // namespace attnlab::models
