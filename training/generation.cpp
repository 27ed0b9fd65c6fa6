#include "training/generation.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <variant>

#include "attnlab/error.hpp"
#include "models/decoding.hpp"

namespace attnlab::training {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A uniform double in [0, 1) from the top 53 bits: the same on every standard library (the
// std:: distributions are not specified bit for bit).
double uniform01(std::mt19937_64& rng) {
  return double(rng() >> 11) * 0x1.0p-53;
}

}  // namespace

void SamplingConfig::validate(std::size_t vocab) const {
  if (tokens == 0) throw Error("generate: tokens=0, expected at least 1 new token");
  if (!std::isfinite(temperature) || temperature < 0)
    throw Error("generate: temperature=" + std::to_string(temperature) +
                ", expected a finite number >= 0 (0: greedy)");
  if (top_k > vocab)
    throw Error("generate: top_k=" + std::to_string(top_k) + ", expected at most the model's " +
                std::to_string(vocab) + " tokens (0: all)");
  if (top_k != 0 && temperature == 0)
    throw Error("generate: top_k=" + std::to_string(top_k) +
                " with temperature=0: greedy decoding takes the largest logit, top_k limits "
                "sampling (give a temperature > 0, or no top_k)");
}

std::int64_t next_token(const float* logits, std::size_t vocab, const SamplingConfig& config,
                        std::mt19937_64& rng) {
  if (config.temperature == 0)  // the first largest, as std::max_element finds it
    return std::max_element(logits, logits + vocab) - logits;
  std::vector<std::size_t> order(vocab);
  std::iota(order.begin(), order.end(), std::size_t(0));
  std::size_t k = vocab;
  if (config.top_k != 0 && config.top_k < vocab) {
    k = config.top_k;  // the k largest, ties to the lower id
    std::partial_sort(order.begin(), order.begin() + std::ptrdiff_t(k), order.end(),
                      [&](std::size_t a, std::size_t b) {
                        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
                      });
    std::sort(order.begin(), order.begin() + std::ptrdiff_t(k));  // id order: a fixed draw
  }
  double max = -INFINITY;
  for (std::size_t i = 0; i < k; ++i) max = std::max(max, double(logits[order[i]]));
  std::vector<double> weight(k);
  double sum = 0;
  for (std::size_t i = 0; i < k; ++i)
    sum += weight[i] = std::exp((double(logits[order[i]]) - max) / config.temperature);
  double u = uniform01(rng) * sum;
  for (std::size_t i = 0; i < k; ++i) {
    if (u < weight[i]) return std::int64_t(order[i]);
    u -= weight[i];
  }
  return std::int64_t(order[k - 1]);  // u rounded past the last weight
}

double Generation::tokens_per_second() const {
  const double seconds = prefill_seconds + decode_seconds;
  return seconds > 0 ? double(tokens.size()) / seconds : 0.0;
}

namespace {

// The checkpoint folder of `weights`: RUN/checkpoint or the run folder RUN (as the studies read
// it).
std::string checkpoint_folder(const std::string& weights) {
  const std::string inside = (std::filesystem::path(weights) / "checkpoint").string();
  return !Trainer::has_checkpoint(weights) && Trainer::has_checkpoint(inside) ? inside : weights;
}

// The vocabulary of the language model `config` describes; Error when it is not one.
std::size_t language_model_vocab(const TrainConfig& config, const std::string& checkpoint) {
  const auto task = make_task(config.task, config.n);
  if (!task->needs_causal() || task->output() != Output::per_token ||
      task->classes() != task->vocab())
    throw Error("generate: checkpoint " + checkpoint + " is of task " + config.task +
                ", not a language model (train one with --task text --causal)");
  return task->vocab();
}

// The model `config` describes with the checkpoint's weights (the optimizer's state is not read).
// A language model is causal: TrainConfig::validate (in Trainer) refuses one without --causal.
TaskModel trained_model(const TrainConfig& config, const std::string& checkpoint) {
  TaskModel model = Trainer(config).model();
  model.load(checkpoint);
  return model;
}

}  // namespace

Generator::Generator(const std::string& weights)
    : checkpoint_(checkpoint_folder(weights)),
      config_(checkpoint_config(checkpoint_)),
      vocab_(language_model_vocab(config_, checkpoint_)),
      model_(trained_model(config_, checkpoint_)) {}

Generation Generator::generate(const std::vector<std::int64_t>& prompt,
                               const SamplingConfig& config,
                               const std::function<void(std::int64_t)>& on_token) const {
  const TaskModel& model = model_;
  const std::size_t vocab = vocab_, n = max_length();
  config.validate(vocab);
  if (prompt.empty()) throw Error("generate: the prompt is empty: give at least one token");
  for (std::int64_t id : prompt)
    if (id < 0 || std::size_t(id) >= vocab)
      throw Error("generate: prompt token " + std::to_string(id) +
                  " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
  if (prompt.size() > n)
    throw Error("generate: the prompt's " + std::to_string(prompt.size()) +
                " tokens are more than the model's maximum length " + std::to_string(n) +
                " (the N it was trained at)");
  // The last new token is drawn, not read: the model reads prompt + tokens - 1.
  if (prompt.size() + config.tokens - 1 > n)
    throw Error("generate: tokens=" + std::to_string(config.tokens) + " after a prompt of " +
                std::to_string(prompt.size()) + " would have the model read " +
                std::to_string(prompt.size() + config.tokens - 1) +
                " tokens, more than its maximum length " + std::to_string(n) +
                " (the N it was trained at): at most " + std::to_string(n + 1 - prompt.size()));

  const auto start = Clock::now();
  models::ModelDecoder decoder =
      std::visit([&](const auto& body) { return models::ModelDecoder(body, 1, n); }, model.body);
  std::mt19937_64 rng(config.seed);
  Generation out;
  models::Tokens input = models::Tokens::from_shape({1, prompt.size()});
  std::copy(prompt.begin(), prompt.end(), input.begin());
  models::Activations features = decoder.feed(input), last, logits;
  for (std::size_t i = 0;; ++i) {
    const std::size_t rows = features.shape()[1], d = features.shape()[2];
    models::shape_buffer(last, {1, 1, d});
    std::copy_n(features.data() + (rows - 1) * d, d, last.data());
    model.head_forward(last, logits);
    const std::int64_t token = next_token(logits.data(), vocab, config, rng);
    out.tokens.push_back(token);
    if (on_token) on_token(token);
    if (i == 0) out.prefill_seconds = since(start);
    if (i + 1 == config.tokens) break;
    input = models::Tokens::from_shape({1, 1});
    input(0, 0) = token;
    features = decoder.feed(input);
  }
  out.decode_seconds = since(start) - out.prefill_seconds;
  out.decoder_bytes = decoder.bytes();
  return out;
}

}  // namespace attnlab::training
