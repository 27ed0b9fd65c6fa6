// Feature maps phi for linear attention: a query or key row x of length Dk becomes a non-negative
// row phi(x) of length dim(), so that phi(q)·phi(k) stands in for a similarity kernel.
//
//   elu1   elu(x) + 1                                  dim Dk   (Katharopoulos et al. 2020)
//   relu   max(x, 0)                                   dim Dk
//   favor  exp(w_r·x' - |x'|^2 / 2) / sqrt(m), r < m   dim m    (Choromanski et al. 2020)
//          with x' = x · scale^(1/2): phi(q)·phi(k) is an unbiased estimate of exp(q·k · scale).
//          The w_r are positive orthogonal random features: blocks of Dk orthonormal directions
//          (Gram-Schmidt of a Gaussian Dk x Dk matrix, in float64) whose rows are rescaled by
//          independent chi(Dk) norms, drawn from `seed` (favor_projection).
//   dpfp   x' = [relu(x), relu(-x)]; phi = concatenation over j = 1..nu of x' * roll(x', j),
//          roll(x', j)[a] = x'[(a - j) mod 2Dk]       dim 2·Dk·nu (Schlag et al. 2021), nu < 2Dk
//   taylor phi = [1, x', vec(x' x'^T) / sqrt(2)]       dim 1 + d' + d'^2 (Arora et al. 2024, Based)
//          with x' = P x / d'^(1/4): the second-order Taylor expansion of exp, so that
//          phi(q)·phi(k) = 1 + t + t^2 / 2 with t = q'·k' = (Pq)·(Pk) / sqrt(d'), which is > 0
//          for every t. P [d' x Dk] is the identity when d' = Dk, else d' orthonormal rows drawn
//          from `seed` (taylor_projection): a fixed projection to Based's small feature dim (16
//          in the paper). A learned projection is the model layer's own q and k projection to a
//          head size of d' (as Based's layer does), with d' = Dk here. Entries may be negative;
//          the kernel, and the sum of the features (1 + s + s^2/sqrt(2) with s = sum x'), never
//          are.
//
// favor is returned in log form (logarithmic() == true): map() writes log phi(x), and the caller
// subtracts a stabilising constant before exponentiating (see variants/linear.hpp for which).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <xtensor/xtensor.hpp>

namespace attnlab {

/// Linear attention's feature maps: elu(x)+1, relu(x), FAVOR+ positive random features, DPFP,
/// Based's Taylor map.
enum class Feature { elu1, relu, favor, dpfp, taylor };

/// "elu1", "relu", "favor", "dpfp" or "taylor", as in the factory string.
const char* feature_name(Feature f);

/// The m x Dk FAVOR+ projection for `seed`: orthogonal blocks with chi(Dk)-distributed row norms.
/// Same (m, dk, seed), bitwise-same matrix.
xt::xtensor<float, 2> favor_projection(std::size_t m, std::size_t dk, std::uint64_t seed);

/// The taylor map's fixed d' x Dk projection for `seed` (d' < Dk): d' orthonormal rows, those of
/// favor_projection's orthogonal blocks scaled to unit length. Same (d', dk, seed), bitwise-same.
xt::xtensor<float, 2> taylor_projection(std::size_t rows, std::size_t dk, std::uint64_t seed);

/// A feature map phi of linear attention (elu+1, relu, FAVOR+, DPFP or Taylor) for head dim dk.
class FeatureMap {
 public:
  /// m: favor's feature count, or taylor's projected dim d' (1 <= d' <= dk; d' = dk: no
  /// projection); nu: dpfp's roll count (1 <= nu < 2·dk); scale: favor's q·k scale; seed: favor's
  /// and taylor's projection.
  FeatureMap(Feature f, std::size_t dk, std::size_t m, std::size_t nu, std::uint64_t seed,
             double scale);

  /// Which map.
  Feature feature() const { return feature_; }
  /// The feature dimension Dphi.
  std::size_t dim() const { return dim_; }
  /// The input head dim.
  std::size_t dk() const { return dk_; }
  /// True for favor: map() then writes log phi(x) (unstabilised).
  bool logarithmic() const { return feature_ == Feature::favor; }

  /// x [rows x Dk] (row-major, contiguous) -> out [rows x dim()].
  void map(const float* x, std::size_t rows, float* out) const;

  /// The backward of map(): given the features phi [rows x dim()] of x as the caller used them
  /// and their gradient d_phi, writes dx [rows x Dk]. For favor, phi are the exponentiated
  /// features exp(log phi - c) and the caller's stabiliser c is held constant (its gradient is
  /// zero wherever it cancels, as Performer implementations treat it). At the kinks of relu and
  /// dpfp (x = 0) the derivative is taken as 0.
  void backward(const float* x, std::size_t rows, const float* phi, const float* d_phi,
                float* dx) const;

 private:
  Feature feature_;
  std::size_t dk_, dim_, nu_;
  float scale_ = 1.0f, log_norm_ = 0.0f;  // favor: q·k scale and log(1 / sqrt(m));
                                          // taylor without a projection: d'^(-1/4)
  std::vector<float> wt_;                 // favor: projection^T · sqrt(scale), [Dk x m]
  std::vector<float> w_;                  // favor: projection · sqrt(scale), [m x Dk]
                                          // taylor: P / d'^(1/4) [d' x Dk], empty when d' = Dk
  std::size_t taylor_dim_ = 0;            // taylor: d'
  /// taylor: x' = P x / d'^(1/4) of one row into xp [d'].
  void taylor_input(const float* x, float* xp) const;
};

}  // namespace attnlab
