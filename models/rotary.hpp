// Rotary position embeddings (Su et al. 2021, "RoFormer"), in Hugging Face Llama's convention
// (`rotate_half`): a head's vector x [dk] at position p becomes
//   x ∘ cos(p θ) + rotate_half(x) ∘ sin(p θ),   rotate_half(x) = [-x[dk/2:], x[:dk/2]],
// with θ_j = θ_{j + dk/2} = base^(-2j / dk) for j < dk/2: channel j turns with channel j + dk/2.
// So q_i · k_j depends on the positions through i - j alone. The angles p θ, their cosines and
// sines are computed in double and rounded to float (Hugging Face computes the angles in float32,
// which at position p is off by up to about p · 6e-8 radians).
// Applied to q and k after their projections and before the attention core
// (models/multi_head_attention.hpp); for the linear family that is before the feature map, as
// RoFormer and the papers that combine the two do. The rotation is orthogonal: its backward is
// the inverse rotation (the angles negated).
#pragma once

#include <cstddef>

#include "attnlab/tensor.hpp"

namespace attnlab::models {

/// See the header comment.
class Rotary {
 public:
  /// Throws Error naming the head dimension when it is odd or 0, or the base when it is not a
  /// finite number > 0.
  Rotary(std::size_t head_dim, double base = 10000.0);

  /// Rotates x [B, H, N, dk] in place, token i at position first + i (first > 0: the new
  /// tokens of an incremental decoder, after the `first` it holds); `inverse` rotates back (the
  /// backward of the rotation). `rows_per_position` rows share a position (row i is at
  /// first + i / rows_per_position: DeltaProduct's keys of one token). Throws Error when x's
  /// last axis is not head_dim.
  void apply(Tensor& x, bool inverse = false, std::size_t first = 0,
             std::size_t rows_per_position = 1) const;

  /// The base of the angles.
  double base() const { return base_; }
  /// dk.
  std::size_t head_dim() const { return head_dim_; }

 private:
  std::size_t head_dim_;
  double base_;
};

}  // namespace attnlab::models
