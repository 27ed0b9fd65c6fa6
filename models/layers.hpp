// The small layers a Transformer is built from, each a class holding its learned tensors as named
// public members (PyTorch's names and layouts, models/weights.hpp) with forward(),
// initialize(seed, prefix) and parameters(prefix, out). No dropout; each layer's backward pass is
// in models/backward.hpp.
// Matrix products go through OpenBLAS (cblas_sgemm); everything else is one pass over the data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "attnlab/kernels.hpp"
#include "models/weights.hpp"

namespace attnlab::models {

/// Token ids [batch, seq].
using Tokens = xt::xtensor<std::int64_t, 2>;

/// The library's buffer helpers (attnlab/kernels.hpp) under the names the models have used:
/// the one huge-page hint, uninitialised buffers marked by it, and shape_buffer, which keeps a
/// buffer's storage from one step to the next.
using kernels::prefer_huge_pages;
using kernels::shape_buffer;
using kernels::uninitialized;

/// Below this many floats a compute-bound loop of the models (LayerNorm, the loss, Adam: double
/// arithmetic, exp, sqrt) runs on one thread: waking OpenMP's team costs more. Memory-bound
/// loops (copies, adds, ReLU, column sums) stay on one thread at every size: on our two shared
/// cores a second thread gained them little and a parallel region's barrier waits for a thread
/// the other builds have descheduled (results/training-speed/README.md).
inline constexpr std::size_t kParallelFloats = 1 << 15;

/// out[i] = a[i] + b[i] for i < size (out may be a or b): the residual adds.
void add(const float* a, const float* b, float* out, std::size_t size);

/// y[rows, out] = x[rows, in] · w[out, in]^T + b[out] (b may be null), all row-major with leading
/// dimensions ldx, ldw, ldy: one cblas_sgemm. The product behind every projection here.
void affine(const float* x, std::size_t rows, std::size_t in, std::size_t ldx, const float* w,
            std::size_t out, std::size_t ldw, const float* b, float* y, std::size_t ldy);

/// torch.nn.Linear: y = x W^T + b over the last axis.
class Linear {
 public:
  /// Zero weights; call initialize or load weights.
  Linear(std::size_t in_features, std::size_t out_features);

  Matrix weight;  ///< W [out, in]
  Vector bias;    ///< b [out]

  /// x [B, N, in] -> [B, N, out]. Throws Error when x's last axis is not `in`.
  Activations forward(const Activations& x) const;
  /// The same into y (shaped by shape_buffer; y must not be x).
  void forward(const Activations& x, Activations& y) const;

  /// PyTorch's default: W and b uniform in +-1/sqrt(in), from (seed, prefix + "weight"/"bias").
  void initialize(std::uint64_t seed, const std::string& prefix);

  /// Appends prefix + "weight", prefix + "bias".
  void parameters(const std::string& prefix, Parameters& out);
};

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

/// The position-wise FFN of Vaswani et al.: linear2(relu(linear1(x))), named "linear1.*" and
/// "linear2.*" inside a layer as in torch.nn.TransformerEncoderLayer.
class FeedForward {
 public:
  /// linear1: d_model -> hidden, linear2: hidden -> d_model.
  FeedForward(std::size_t d_model, std::size_t hidden);

  Linear linear1;  ///< d_model -> hidden
  Linear linear2;  ///< hidden -> d_model

  /// x [B, N, d_model] -> [B, N, d_model], kRowBlock token rows at a time: the hidden
  /// activations are never held for all B·N rows (128 MiB at the LRA size, B = 4, and a fresh
  /// buffer of that size costs as much in page faults as the GEMMs that fill it on our VM).
  Activations forward(const Activations& x) const;
  /// The same into y (shaped by shape_buffer; y must not be x).
  void forward(const Activations& x, Activations& y) const;

  /// Token rows per block of forward().
  static constexpr std::size_t kRowBlock = 512;

  /// Both linears, PyTorch's default initialisation.
  void initialize(std::uint64_t seed, const std::string& prefix);

  /// Appends prefix + "linear1.weight", ..., prefix + "linear2.bias".
  void parameters(const std::string& prefix, Parameters& out);
};

/// torch.nn.Embedding: row t of weight for token t.
class Embedding {
 public:
  /// Zero weights; call initialize or load weights.
  Embedding(std::size_t vocab, std::size_t dim);

  Matrix weight;  ///< [vocab, dim]

  /// tokens [B, N] -> [B, N, dim]. Throws Error naming the first token outside [0, vocab).
  Activations forward(const Tokens& tokens) const;
  /// The same into y (shaped by shape_buffer).
  void forward(const Tokens& tokens, Activations& y) const;

  /// N(0, 1/dim) entries, so that the embedding scaled by sqrt(dim) has unit variance.
  void initialize(std::uint64_t seed, const std::string& prefix);

  /// Appends prefix + "weight".
  void parameters(const std::string& prefix, Parameters& out);
};

/// The sinusoidal positional encoding of Vaswani et al. [n, dim]: PE(p, 2i) = sin(p / 10000^(2i /
/// dim)), PE(p, 2i + 1) = cos(p / 10000^(2i / dim)).
Matrix sinusoidal_positions(std::size_t n, std::size_t dim);

/// Token ids [batch, n], uniform in [0, vocab), reproducible from `seed` (e.g. random bytes for
/// the Long Range Arena text model).
Tokens random_tokens(std::size_t batch, std::size_t n, std::size_t vocab, std::uint64_t seed);

/// The shape as text, "[2, 16, 64]", for error messages.
std::string shape_text(const Activations& x);

}  // namespace attnlab::models
