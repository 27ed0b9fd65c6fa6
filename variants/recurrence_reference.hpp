// The linear family in float64, written from the papers' equations token by token, independent
// of the kernels (no chunks, no WY form, no stabilised running sums): what the tests compare the
// variants against and take finite differences of, and what `attnlab sweep` and `attnlab demo`
// measure the error of a variant that is not softmax attention against
// (Support::approximates_softmax false: its distance from softmax says nothing of its quality).
//
//   linear  (variants/linear.hpp) the sum rule in the O(N^2) kernel-matrix form, K_ij =
//           phi(q_i)·phi(k_j) row by row; the delta rule as its definition, W updated key by key
//           with the sum-normalised features (Katharopoulos et al. 2020; Schlag et al. 2021).
//   scan    (variants/linear_scan.hpp: delta, retnet, gla, gated-delta) the recurrence of
//           DeltaNet (Schlag et al. 2021), RetNet (Sun et al. 2023), GLA / Mamba-2 scalar gates
//           and Gated DeltaNet (Yang et al. 2024): S_t = a_t S_{t-1} + k_t u_t^T with u_t = v_t
//           (sum rule) or beta_t (v_t - a_t S_{t-1}^T k_t) (delta rule), a_t = exp(g_t); with
//           a decay per key channel, a_t S_{t-1} is Diag(exp g_t) S_{t-1} (GLA as published,
//           Kimi Delta Attention).
//   delta-product (variants/delta_product.hpp) the scan recurrence of its delta rule over the
//           steps' rows, each query reading the state after its token's last row.
// All from a zero state or a given initial one, and all can return the state after the last
// token (the engine's initial_state / final_state). Inputs are float64 (float32 tensors convert
// exactly), outputs [B, H, rows, Dv] in float64. Grouped KV heads: k and v have Hkv heads, H a
// multiple, and query head h reads head h / (H / Hkv); the state is per query head.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <xtensor/xarray.hpp>

#include "attnlab/attention.hpp"
#include "attnlab/mask.hpp"
#include "attnlab/tensor.hpp"
#include "variants/linear.hpp"
#include "variants/linear_scan.hpp"

namespace attnlab {

/// One value per (batch item, head, key token) in float64: g or beta [B, H, Nk].
using TokenTensor64 = xt::xtensor<double, 3>;

/// A recurrent state in float64: memory S [B, H, P, Dv] and, for linear's sum rule, the key sum
/// z [B, H, P] (P: the feature size, Dk for the scan engine).
struct State64 {
  xt::xarray<double> memory;   ///< S
  xt::xarray<double> key_sum;  ///< z, or empty
};

/// The projection phi64 takes: favor's random features, taylor's P when taylor_dim < Dk, else
/// none (empty).
xt::xtensor<float, 2> feature_projection(const LinearConfig& c, std::size_t dk);

/// phi(x) of one row x[0..dk) in float64 from the definitions (favor: log phi, unstabilised);
/// `w` is feature_projection's (favor's features [m, dk], taylor's P [d', dk], or empty),
/// `scale` the q·k scale.
std::vector<double> phi64(const LinearConfig& c, const xt::xtensor<float, 2>& w, const double* x,
                          std::size_t dk, double scale);

/// favor: exp(f - max f); then, when `normalise` (the delta rule), f / sum(f) (a zero row stays
/// zero). Other maps unchanged.
std::vector<double> row_phi(const LinearConfig& c, std::vector<double> f, bool normalise);

/// Linear attention (variants/linear.hpp) in float64 on the query rows `rows` (all when empty).
/// From `initial` (S_0, z_0; not favor's sum rule, whose state is relative to its stabiliser)
/// when given: num_i = phi(q_i)^T S_0 + ..., den_i = phi(q_i)^T z_0 + ..., W_0 = S_0^T; `final`
/// gets the state after the last valid key.
Tensor64 linear_reference(const LinearConfig& c, const Tensor64& q, const Tensor64& k,
                          const Tensor64& v, const Mask& mask, const State64* initial = nullptr,
                          State64* final = nullptr, const std::vector<std::size_t>& rows = {});

/// The scan engine's recurrence for one client, mask and head count (scan_recurrence()).
struct ScanRecurrence {
  bool delta = false;                 ///< the delta rule (else the sum rule)
  bool normalise = false;             ///< q, k -> x / sqrt(|x|^2 + 1e-6) before use
  bool causal = true;                 ///< out_t = S_t^T q_t; else every query reads S_Nk
  double beta_value = 1.0;            ///< the delta rule's strength when no beta is given
  std::vector<double> head_g;         ///< per-head log-decay when no g is given (retnet)
  std::vector<std::int64_t> lengths;  ///< valid keys per batch item (empty: all)
  double scale = 0.0;                 ///< q times this before use

  /// out [B, H, rows, Dv] of q [B, H, Nq, Dk], k [B, Hkv, Nk, Dk], v [B, Hkv, Nk, Dv] and, when
  /// not null, g and beta [B, H, Nk] or the per-channel g `channel_g` [B, H, Nk, Dk], on the
  /// query rows `rows` (all when empty); from S_0 = `initial` [B, H, Dk, Dv] when given, else 0;
  /// `final` gets the state after the last token.
  Tensor64 operator()(const Tensor64& q, const Tensor64& k, const Tensor64& v,
                      const TokenTensor64* g, const TokenTensor64* beta,
                      const std::vector<std::size_t>& rows = {},
                      const xt::xarray<double>* initial = nullptr,
                      xt::xarray<double>* final = nullptr,
                      const Tensor64* channel_g = nullptr) const;
};

/// The recurrence `a` runs under `mask` with `heads` heads of size dk.
ScanRecurrence scan_recurrence(const ScanAttention& a, const Mask& mask, std::size_t dk,
                               std::size_t heads);

/// The float64 output of `attention`'s own definition on q, k, v, `in` (its g, beta and initial
/// state) and `mask` (validated by a forward of the caller's), on the query rows `rows` (all
/// when empty): linear attention, a client of the scan engine or delta-product, (item, head) slices
/// in parallel; packed documents (Mask::documents) each as a sequence of its own. Throws
/// Unsupported naming the variant when it has no float64 definition here, or for what the
/// definitions do not model: the softmax engine's modifiers (window, prefix, custom, softcap;
/// bias, sinks, ALiBi), and key padding or an initial state beside packed documents.
Tensor64 own_reference(const Attention& attention, const Tensor& q, const Tensor& k,
                       const Tensor& v, const Mask& mask, const TokenInputs& in,
                       const std::vector<std::size_t>& rows = {});

}  // namespace attnlab
