// The position-wise feed-forward layers, each with its one forward (keeping what its backward
// needs when given a trace) and its backward side by side (conventions of models/layers.hpp):
// FeedForward, the 2017 Transformer's ReLU FFN.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "models/layers.hpp"

namespace attnlab::models {

/// What FeedForward's backward needs: its input and the hidden activations after the ReLU; then
/// the backward's buffers.
struct FeedForwardTrace {
  Activations x;         ///< the input
  Activations hidden;    ///< relu(linear1(x))
  Activations output;    ///< the forward's result (the free forward() writes it here)
  Activations d_hidden;  ///< the backward's dL/dhidden
  Activations dx;        ///< the backward's result
};

/// The position-wise FFN of Vaswani et al.: linear2(relu(linear1(x))), named "linear1.*" and
/// "linear2.*" inside a layer as in torch.nn.TransformerEncoderLayer.
class FeedForward {
 public:
  /// linear1: d_model -> hidden, linear2: hidden -> d_model.
  FeedForward(std::size_t d_model, std::size_t hidden);

  Linear linear1;  ///< d_model -> hidden
  Linear linear2;  ///< hidden -> d_model

  /// x [B, N, d_model] -> [B, N, d_model].
  Activations forward(const Activations& x) const;
  /// The same into y (shaped by shape_buffer; y must not be x). Without `keep`, kRowBlock token
  /// rows at a time: the hidden activations are never held for all B·N rows (128 MiB at the LRA
  /// size, B = 4, and a fresh buffer of that size costs as much in page faults as the GEMMs that
  /// fill it on our VM). With `keep`, all rows at once into keep->hidden, and x copied into
  /// keep->x: what backward() reads.
  void forward(const Activations& x, Activations& y, FeedForwardTrace* keep = nullptr) const;

  /// Token rows per block of forward() without a trace.
  static constexpr std::size_t kRowBlock = 512;

  /// Both linears, PyTorch's default initialisation.
  void initialize(std::uint64_t seed, const std::string& prefix);

  /// Appends prefix + "linear1.weight", ..., prefix + "linear2.bias".
  void parameters(const std::string& prefix, Parameters& out);
};

/// FeedForward::forward keeping the trace; returns trace.output.
const Activations& forward(const FeedForward& ffn, const Activations& x, FeedForwardTrace& trace);

/// dL/dx given dy (in trace.dx, returned); adds both linears' gradients into grad (ReLU's
/// derivative at 0 taken as 0).
Activations& backward(const FeedForward& ffn, FeedForwardTrace& trace, const Activations& dy,
                      FeedForward& grad);

}  // namespace attnlab::models
