#include "models/optimizer.hpp"

#include <cmath>
#include <cstddef>

#include "models/layers.hpp"

#include "attnlab/error.hpp"

namespace attnlab::models {

void AdamConfig::validate() const {
  const auto fail = [](const std::string& what) { throw Error("adam: " + what); };
  if (!(lr > 0) || !std::isfinite(lr)) fail("lr=" + std::to_string(lr) + ": expected > 0");
  if (!(beta1 >= 0 && beta1 < 1)) fail("beta1=" + std::to_string(beta1) + ": expected in [0, 1)");
  if (!(beta2 >= 0 && beta2 < 1)) fail("beta2=" + std::to_string(beta2) + ": expected in [0, 1)");
  if (!(eps > 0) || !std::isfinite(eps)) fail("eps=" + std::to_string(eps) + ": expected > 0");
  if (!(weight_decay >= 0) || !std::isfinite(weight_decay))
    fail("weight_decay=" + std::to_string(weight_decay) + ": expected >= 0");
}

Adam::Adam(const AdamConfig& config) : config_(config) {
  config_.validate();
}

double Adam::learning_rate(std::size_t t) const {
  if (config_.warmup == 0) return config_.lr;
  return config_.lr * std::min(1.0, static_cast<double>(t) / static_cast<double>(config_.warmup));
}

void Adam::bind(const Parameters& params) {
  if (!names_.empty() && params.size() != names_.size())
    throw Error("adam: " + std::to_string(params.size()) + " parameters, the first step had " +
                std::to_string(names_.size()));
  for (std::size_t i = 0; i < names_.size(); ++i)
    if (names_[i] != params[i].name || shapes_[i] != params[i].shape)
      throw Error("adam: parameter '" + params[i].name + "' is not the one of the first step at " +
                  "position " + std::to_string(i));
  if (!names_.empty()) return;
  for (const ParameterRef& p : params) {
    names_.push_back(p.name);
    shapes_.push_back(p.shape);
    m_.emplace_back(p.size(), 0.0f);
    v_.emplace_back(p.size(), 0.0f);
  }
}

Parameters Adam::state(const Parameters& params) {
  bind(params);
  Parameters state;
  for (std::size_t i = 0; i < names_.size(); ++i)
    state.push_back({"exp_avg." + names_[i], shapes_[i], m_[i].data()});
  for (std::size_t i = 0; i < names_.size(); ++i)
    state.push_back({"exp_avg_sq." + names_[i], shapes_[i], v_[i].data()});
  return state;
}

void Adam::step(const Parameters& params, const Parameters& grads) {
  if (params.size() != grads.size())
    throw Error("adam: " + std::to_string(params.size()) + " parameters but " +
                std::to_string(grads.size()) + " gradients");
  for (std::size_t i = 0; i < params.size(); ++i) {
    const ParameterRef &p = params[i], &g = grads[i];
    if (p.name != g.name || p.shape != g.shape)
      throw Error("adam: parameter " + std::to_string(i) + " is '" + p.name +
                  "' but its gradient is '" + g.name + "' (or of another shape)");
    const float* data = g.data;
    const std::size_t size = g.size();  // out of line: kept out of the loop, which vectorises
    bool finite = true;  // a branch-free test first, so that the common case vectorises
    for (std::size_t j = 0; j < size; ++j) finite &= std::isfinite(data[j]);
    if (finite) continue;
    for (std::size_t j = 0; j < size; ++j)
      if (!std::isfinite(data[j]))
        throw Error("adam: gradient of '" + g.name + "' has a non-finite entry at " +
                    std::to_string(j));
  }
  bind(params);
  ++t_;
  const double lr = learning_rate(t_);
  const double b1 = config_.beta1, b2 = config_.beta2;
  // The scalars in double, the elements in float in torch's order of operations (its CPU
  // kernels compute float tensors in float): as close to torch's step as two implementations
  // get, and float's square roots and divisions take half the time of double's.
  const auto step_size = static_cast<float>(lr / (1.0 - std::pow(b1, static_cast<double>(t_))));
  const auto root_correction =
      static_cast<float>(std::sqrt(1.0 - std::pow(b2, static_cast<double>(t_))));
  const auto decay = static_cast<float>(1.0 - lr * config_.weight_decay);
  const auto b1f = static_cast<float>(b1), b2f = static_cast<float>(b2);
  const auto g1 = static_cast<float>(1.0 - b1), g2 = static_cast<float>(1.0 - b2);
  const auto eps = static_cast<float>(config_.eps);
  for (std::size_t i = 0; i < params.size(); ++i) {
    float* w = params[i].data;
    const float* g = grads[i].data;
    float* m = m_[i].data();
    float* v = v_[i].data();
    const auto size = static_cast<std::ptrdiff_t>(params[i].size());
    // Element-wise, so bitwise the same on any number of threads.
#pragma omp parallel for schedule(static) if (size > std::ptrdiff_t(kParallelFloats))
    for (std::ptrdiff_t j = 0; j < size; ++j) {
      w[j] *= decay;
      m[j] = m[j] * b1f + g1 * g[j];
      v[j] = v[j] * b2f + g2 * g[j] * g[j];
      const float denom = std::sqrt(v[j]) / root_correction + eps;
      w[j] = w[j] + -step_size * m[j] / denom;
    }
  }
}

void zero_gradients(const Parameters& grads) {
  for (const ParameterRef& g : grads) fill_constant(g, 0.0f);
}

}  // namespace attnlab::models
