// The exact result: dense attention accumulated in float64, written from the equations (mask.hpp
// and attention.hpp state them), one query row at a time. Simple enough to be obviously right;
// every test and the harness compare against it. Grouped heads: query head h reads KV head
// h / (H / Hkv), and dk, dv are summed over the query heads that share one.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include <xtensor/xarray.hpp>

#include "attnlab/attention.hpp"
#include "attnlab/mask.hpp"
#include "attnlab/tensor.hpp"

namespace attnlab {

/// allowed(b, h, i, j): may query i attend key j? Describes any variant's sparsity pattern.
using Pattern = std::function<bool(std::size_t b, std::size_t h, std::size_t i, std::size_t j)>;

/// The score modifiers with gradients in float64 (what finite differences perturb), each empty
/// (an xarray without axes, a vector without entries) when not given; their definitions are
/// TokenInputs'.
struct Modifiers64 {
  xt::xarray<double> bias;           ///< additive bias, broadcastable to [B, H, Nq, Nk]
  std::vector<double> sinks;         ///< sink logits [H]
  std::vector<double> alibi_slopes;  ///< ALiBi slopes [H]
  xt::xarray<double> log_decay;      ///< the forgetting gate's g [B, H, Nk]
  /// The float inputs of `in` (log_decay, bias, sinks, alibi_slopes; beta is not a softmax's).
  static Modifiers64 of(const TokenInputs& in);
};

/// softmax(q k^T * scale restricted to the pattern) v in float64. Rows with no allowed key are
/// zero. `rows` picks query indices (all when empty): the output is then [B, H, rows, Dv].
Tensor64 reference_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                             const Pattern& allowed, const std::vector<std::size_t>& rows = {});

/// Exact attention under a Mask (validated here; every part and the softcap).
Tensor64 reference_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Mask& mask,
                             const std::vector<std::size_t>& rows = {});

/// The same with the inputs `in` (bias, sinks, ALiBi, the forgetting gate; validated by the
/// caller, as Attention::forward does).
Tensor64 reference_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Mask& mask,
                             const TokenInputs& in, const std::vector<std::size_t>& rows = {});

/// The same on float64 inputs (all rows): what finite differences in fp64 perturb.
Tensor64 reference_attention(const Tensor64& q, const Tensor64& k, const Tensor64& v, double scale,
                             const Pattern& allowed);

/// Every modifier on float64 inputs: the Mask (validated here) and, when `also` is given, a
/// variant's pattern intersected with it.
Tensor64 reference_attention(const Tensor64& q, const Tensor64& k, const Tensor64& v,
                             const Mask& mask, const Modifiers64& mods,
                             const Pattern& also = nullptr);

/// dL/dq, dL/dk, dL/dv in float64, shaped like q, k, v, and the modifiers' gradients (empty for
/// those not given; d_bias in bias's shape, summed over its broadcast axes).
struct Gradients64 {
  Tensor64 dq;                         ///< dL/dq [B, H, Nq, Dk]
  Tensor64 dk;                         ///< dL/dk [B, Hkv, Nk, Dk]
  Tensor64 dv;                         ///< dL/dv [B, Hkv, Nk, Dv]
  xt::xarray<double> d_bias;           ///< dL/d(bias)
  std::vector<double> d_sinks;         ///< dL/d(sinks) [H]
  std::vector<double> d_alibi_slopes;  ///< dL/d(slopes) [H]
  xt::xarray<double> d_log_decay;      ///< dL/dg [B, H, Nk]
};

/// The gradients of reference_attention(q, k, v, scale, allowed) given d_out = dL/d(out)
/// [B, H, Nq, Dv], dense and in float64: dS = P ∘ (dO V^T - rowsum(dO ∘ O)), dQ = scale · dS K,
/// dK = scale · dS^T Q, dV = P^T dO. A row with no allowed key has no gradient.
Gradients64 reference_attention_backward(const Tensor64& q, const Tensor64& k, const Tensor64& v,
                                         double scale, const Pattern& allowed,
                                         const Tensor64& d_out);

/// The same under a Mask (validated here), from the float32 inputs a backend sees.
Gradients64 reference_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                         const Mask& mask, const Tensor& d_out);

/// Every modifier's gradient too, derived by hand from the forward above: with z the modified
/// score and dz = P ∘ (dP - rowsum(dO ∘ O)), d(bias) = dz, d(slope_h) = -sum dz · |p(i) - j|,
/// dF_p(i) += dz, dF_j -= dz and dg_s = sum over t >= s of dF_t, d(sink_h) = -sum_i p_sink ·
/// rowsum(dO ∘ O), and the score's dS = dz · (1 - tanh²(s / cap)) under a softcap.
Gradients64 reference_attention_backward(const Tensor64& q, const Tensor64& k, const Tensor64& v,
                                         const Mask& mask, const Modifiers64& mods,
                                         const Tensor64& d_out, const Pattern& also = nullptr);

}  // namespace attnlab
