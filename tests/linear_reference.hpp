// The float64 definitions of the linear family (variants/recurrence_reference.hpp) in the form
// the tests' finite differences take: the scan recurrence on a list of arrays {q, k, v[, g][,
// beta][, S_0]}, linear attention on float32 or float64 tensors. Adapters only: the definitions
// themselves live in variants/, where `attnlab sweep` measures against them too.
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "attnlab/attnlab.hpp"
#include "variants/linear.hpp"
#include "variants/linear_scan.hpp"
#include "variants/recurrence_reference.hpp"

namespace attnlab::test {

using attnlab::feature_projection;
using attnlab::phi64;
using attnlab::row_phi;
using attnlab::State64;

// Linear attention in float64 on float32 or float64 tensors (float32 converts exactly).
template <class T>
inline Tensor64 linear_reference(const LinearConfig& c, const xt::xtensor<T, 4>& q,
                                 const xt::xtensor<T, 4>& k, const xt::xtensor<T, 4>& v,
                                 const Mask& mask, const State64* initial = nullptr,
                                 State64* final = nullptr) {
  return attnlab::linear_reference(c, xt::cast<double>(q), xt::cast<double>(k), xt::cast<double>(v),
                                   mask, initial, final);
}

// The scan recurrence of one variant, mask and head count, called on x = {q, k, v[, g][,
// beta][, S_0]}; has_g / has_beta / has_state say which are present, g [B, H, Nk] or, per key
// channel, [B, H, Nk, Dk]. `final`, when not null, gets the state after the last token
// [B, H, Dk, Dv].
struct Recurrence : ScanRecurrence {
  xt::xarray<double> operator()(const std::vector<xt::xarray<double>>& x, bool has_g, bool has_beta,
                                bool has_state = false, xt::xarray<double>* final = nullptr) const {
    std::size_t next = 3;
    const bool per_channel = has_g && x[next].dimension() == 4;
    const TokenTensor64 g = has_g && !per_channel ? TokenTensor64(x[next]) : TokenTensor64();
    const Tensor64 channel_g = per_channel ? Tensor64(x[next]) : Tensor64();
    if (has_g) ++next;
    const TokenTensor64 beta = has_beta ? TokenTensor64(x[next++]) : TokenTensor64();
    const xt::xarray<double>* s0 = has_state ? &x[next] : nullptr;
    return ScanRecurrence::operator()(
        Tensor64(x[0]), Tensor64(x[1]), Tensor64(x[2]), has_g && !per_channel ? &g : nullptr,
        has_beta ? &beta : nullptr, {}, s0, final, per_channel ? &channel_g : nullptr);
  }
};

// The recurrence `a` runs under `mask` for head size dk and `heads` heads.
inline Recurrence recurrence_of(const ScanAttention& a, const Mask& mask, std::size_t dk,
                                std::size_t heads) {
  return {{scan_recurrence(a, mask, dk, heads)}};
}

// A registered scan engine client by spec (a spec of another variant is a test bug).
inline std::unique_ptr<ScanAttention> make_scan(const std::string& spec) {
  return std::unique_ptr<ScanAttention>(
      static_cast<ScanAttention*>(make_attention(spec).release()));
}

// A view's values in float64, in its shape.
template <class Ref>
xt::xarray<double> values64(const Ref& r) {
  xt::xarray<double> x =
      xt::xarray<double>::from_shape(std::vector<std::size_t>(r.shape().begin(), r.shape().end()));
  std::copy_n(r.data(), x.size(), x.data());
  return x;
}

// A call's inputs as Recurrence takes them: {q, k, v[, g][, beta][, S_0]} in float64, g from
// log_decay or channel_log_decay, S_0 from initial_state.
inline std::vector<xt::xarray<double>> recurrence_inputs(const Tensor& q, const Tensor& k,
                                                         const Tensor& v, const TokenInputs& in) {
  std::vector<xt::xarray<double>> x = {xt::cast<double>(q), xt::cast<double>(k),
                                       xt::cast<double>(v)};
  if (in.log_decay) x.push_back(values64(*in.log_decay));
  if (in.channel_log_decay) x.push_back(values64(*in.channel_log_decay));
  if (in.beta) x.push_back(values64(*in.beta));
  if (in.initial_state) x.push_back(values64(in.initial_state->memory));
  return x;
}

// tests/torch_grads.py's description of a's recurrence ("kind": "scan"): its rule, causal or
// not, the valid keys of the one item, the scale, and whether g and beta are inputs.
inline nlohmann::json scan_torch_case(const ScanAttention& a, const Recurrence& ref, bool causal,
                                      std::size_t valid_keys, double scale, bool with_g,
                                      bool with_beta) {
  return {{"kind", "scan"},
          {"delta", a.rule().delta},
          {"normalise", a.rule().normalise},
          {"causal", causal},
          {"lengths", std::vector<std::size_t>{valid_keys}},
          {"scale", scale},
          {"g", with_g},
          {"beta", with_beta},
          {"head_g", ref.head_g},
          {"beta_value", a.rule().beta}};
}

}  // namespace attnlab::test
