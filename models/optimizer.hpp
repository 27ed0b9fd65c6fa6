// Adam with decoupled weight decay (AdamW: Kingma & Ba 2015, "Adam"; Loshchilov & Hutter 2019,
// "Decoupled Weight Decay Regularization") and a linear learning-rate warm-up, over a model's
// parameters and the gradient accumulator of the same shape (models/layers.hpp: zero_like).
//
// Step t = 1, 2, ... with gradient g of parameter p:
//   lr_t = lr · min(1, t / warmup)                    (warmup = 0: lr from the first step)
//   p <- p · (1 - lr_t · weight_decay)                  decoupled decay, every parameter
//   m <- beta1 · m + (1 - beta1) · g,  v <- beta2 · v + (1 - beta2) · g²
//   p <- p - lr_t / (1 - beta1^t) · m / (sqrt(v / (1 - beta2^t)) + eps)
// This is torch.optim.AdamW under LambdaLR(lambda e: min(1, (e + 1) / warmup)), stepped after
// each optimizer step (tests/test_model_backward.cpp checks it against torch).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "models/weights.hpp"

namespace attnlab::models {

/// Adam's hyper-parameters; the defaults are torch.optim.AdamW's, without warm-up.
struct AdamConfig {
  double lr = 1e-3;            ///< peak learning rate, > 0
  double beta1 = 0.9;          ///< first-moment decay, in [0, 1)
  double beta2 = 0.999;        ///< second-moment decay, in [0, 1)
  double eps = 1e-8;           ///< added to sqrt(v), > 0
  double weight_decay = 0.01;  ///< decoupled decay per unit of learning rate, >= 0
  std::size_t warmup = 0;      ///< steps of linear warm-up (0: none)

  /// Throws Error naming the first field out of range.
  void validate() const;
};

/// See the header comment. The moments live here, one pair per parameter, in float32.
class Adam {
 public:
  /// Throws Error when the config is invalid.
  explicit Adam(const AdamConfig& config);

  /// One update of `params` from `grads`: the same names, shapes and order (a model's
  /// parameters() and its accumulator's), the same at every step. Throws Error naming the first
  /// mismatch, or a non-finite gradient, before changing anything.
  void step(const Parameters& params, const Parameters& grads);

  /// The learning rate of step t (1-based), warm-up included.
  double learning_rate(std::size_t t) const;

  /// Steps taken.
  std::size_t steps() const { return t_; }

  /// The moments as named tensors over this optimizer's own storage, "exp_avg.<name>" and
  /// "exp_avg_sq.<name>" (torch's state names) for every parameter in `params` order, zeros
  /// before the first step: what a checkpoint saves and restores with save_weights and
  /// load_weights, beside the step count (set_steps). `params` must be the ones step() takes
  /// (throws Error naming the first mismatch). The references stay valid until the next call.
  Parameters state(const Parameters& params);

  /// Sets the number of steps taken, when restoring a checkpoint (the bias corrections and the
  /// warm-up continue from there).
  void set_steps(std::size_t t) { t_ = t; }

  /// The hyper-parameters.
  const AdamConfig& config() const { return config_; }

 private:
  AdamConfig config_;
  void bind(const Parameters& params);  // checks params, allocates the moments on first use

  std::size_t t_ = 0;
  std::vector<std::string> names_;  // the parameters of the first step
  std::vector<std::vector<std::size_t>> shapes_;
  std::vector<std::vector<float>> m_, v_;
};

/// Sets every gradient to zero (before accumulating the next step's).
void zero_gradients(const Parameters& grads);

}  // namespace attnlab::models
