// The primitives the model layers are built from (Linear, Embedding, the affine product and its
// backward), each a class holding its learned tensors as named public members (PyTorch's names
// and layouts, models/weights.hpp) with forward(), its backward beside it, initialize(seed,
// prefix) and parameters(prefix, out). No dropout. The norms are in models/norm.hpp, the
// feed-forward in models/feed_forward.hpp, attention in models/multi_head_attention.hpp.
//
// Backward passes, here and in every layer of models/: a backward returns (or writes) the
// gradient of the layer's input and adds the gradients of its parameters into `grad`, an object
// of the layer's own type and shape whose tensors hold gradients (zero_like): grad.parameters()
// lists them under the model's names and in its order, which is how an optimizer
// (models/optimizer.hpp) pairs them. Gradients accumulate, so several backward calls
// (micro-batches) add up. The loss L is the caller's: backward takes dy = dL/d(output).
// A layer whose backward needs more than its input has one forward that keeps it in a trace
// when given one (`keep`) and keeps nothing otherwise: training and evaluation run the same
// code. The traces are also a training step's workspace: a forward writes its activations into
// its trace and a backward its gradients, each buffer reshaped only when its shape changes
// (shape_buffer), so a trace kept from one step to the next makes every step after the first
// allocate nothing large (a fresh buffer costs page faults about as long as the GEMM that fills
// it).
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

/// s[i] = sigmoid(x[i]) = 1 / (1 + 2^(-x[i] log2 e)) for i < size, on the kernels' vectorised
/// exp2 (s may be x): behind SiLU and the gates.
void sigmoid(const float* x, std::size_t size, float* s);

/// y[rows, out] = x[rows, in] · w[out, in]^T + b[out] (b may be null), all row-major with leading
/// dimensions ldx, ldw, ldy: one cblas_sgemm. The product behind every projection here.
void affine(const float* x, std::size_t rows, std::size_t in, std::size_t ldx, const float* w,
            std::size_t out, std::size_t ldw, const float* b, float* y, std::size_t ldy);

/// The backward of affine over `rows` rows given dy (leading dimension lddy): dw (+)= dy^T x,
/// db (+)= the column sums of dy (db may be null: no bias), and, when dx is not null,
/// dx = dy w. `accumulate`: add into dw and db instead of overwriting them.
void affine_backward(const float* x, std::size_t rows, std::size_t in, std::size_t ldx,
                     const float* w, std::size_t out, std::size_t ldw, const float* dy,
                     std::size_t lddy, float* dx, std::size_t lddx, float* dw, float* db,
                     bool accumulate);

/// Throws Error "<what>: gradient [..], expected [batch, n, features] (the output's shape)" when
/// a backward's dy does not have the shape of the forward's output.
void require_gradient_shape(const Activations& dy, std::size_t batch, std::size_t n,
                            std::size_t features, const char* what);

/// A copy of `layer` with every parameter zero: a gradient accumulator for its backward.
template <class Layer>
Layer zero_like(const Layer& layer) {
  Layer grad = layer;
  Parameters params;
  grad.parameters("", params);
  for (const ParameterRef& p : params) fill_constant(p, 0.0f);
  return grad;
}

/// torch.nn.Linear: y = x W^T + b over the last axis, or y = x W^T (bias=False).
class Linear {
 public:
  /// Zero weights; call initialize or load weights. Without `bias`, `bias` is empty.
  Linear(std::size_t in_features, std::size_t out_features, bool bias = true);

  Matrix weight;  ///< W [out, in]
  Vector bias;    ///< b [out], or empty without a bias

  /// x [B, N, in] -> [B, N, out]. Throws Error when x's last axis is not `in`.
  Activations forward(const Activations& x) const;
  /// The same into y (shaped by shape_buffer; y must not be x).
  void forward(const Activations& x, Activations& y) const;

  /// PyTorch's default: W and b uniform in +-1/sqrt(in), from (seed, prefix + "weight"/"bias").
  void initialize(std::uint64_t seed, const std::string& prefix);

  /// Appends prefix + "weight", and prefix + "bias" when it has one.
  void parameters(const std::string& prefix, Parameters& out);

  /// Whether it has a bias.
  bool has_bias() const { return bias.size() != 0; }
  /// bias.data(), or null without a bias (affine's b).
  const float* bias_data() const { return has_bias() ? bias.data() : nullptr; }
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
/// dim)), PE(p, 2i + 1) = cos(p / 10000^(2i / dim)), for positions p = first .. first + n - 1 (an
/// incremental decoder's new tokens start after those it holds).
Matrix sinusoidal_positions(std::size_t n, std::size_t dim, std::size_t first = 0);

/// Token ids [batch, n], uniform in [0, vocab), reproducible from `seed` (e.g. random bytes for
/// the Long Range Arena text model).
Tokens random_tokens(std::size_t batch, std::size_t n, std::size_t vocab, std::uint64_t seed);

/// The shape as text, "[2, 16, 64]", for error messages.
std::string shape_text(const Activations& x);

/// dL/dx of Linear::forward at input x, given dy [B, N, out]; adds dL/dW, dL/db into grad.
/// Throws Error when the shapes do not fit the layer.
Activations backward(const Linear& layer, const Activations& x, const Activations& dy,
                     Linear& grad);
/// The same into dx (shaped by shape_buffer; not x or dy).
void backward(const Linear& layer, const Activations& x, const Activations& dy, Linear& grad,
              Activations& dx);

}  // namespace attnlab::models
