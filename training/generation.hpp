// Text generation from a causal language model trained by `attnlab train --task text --causal`
// (or `--arch llama`, always causal), with any attention core that decodes: what `attnlab
// generate` runs (cli/cmd_generate.cpp, docs/cli.md). The prompt is fed once (every layer's
// decoder prefilled: models/decoding.hpp), then each new token is drawn from the head's logits at
// the last position and fed back, one step per token. Drawing: temperature 0 is greedy (the
// arg-max, the first on ties, as training's accuracy counts it), which gives the tokens that
// re-running the whole causal forward at every step gives (tests/test_generation.cpp); a
// temperature T > 0 samples softmax(logits / T), over the top_k largest logits when top_k > 0,
// from a generator seeded by `seed` alone (the same seed, the same text).
// Length: the model reads the prompt and every new token but the last; it may read at most the
// N it was trained at (TrainConfig::n: positions past it were never trained), so a prompt longer
// than N, or a prompt and `tokens` that would have it read more, are refused before anything is
// generated (an Error naming the parameter and the most that fits).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "training/trainer.hpp"

namespace attnlab::training {

/// How many tokens to generate and how each is drawn (see the header comment).
struct SamplingConfig {
  std::size_t tokens = 100;  ///< new tokens (>= 1)
  double temperature = 1.0;  ///< 0: greedy; else softmax(logits / temperature), finite
  std::size_t top_k = 0;     ///< sample among the k largest logits (0: all); not with greedy
  std::uint64_t seed = 1;    ///< the sampler's seed

  /// Throws Error naming the parameter (tokens, temperature, top_k) that is out of range for a
  /// model of `vocab` tokens.
  void validate(std::size_t vocab) const;
};

/// The next token from `logits` [vocab] under `config` (temperature, top_k), drawing from `rng`
/// when sampling (greedy draws nothing).
std::int64_t next_token(const float* logits, std::size_t vocab, const SamplingConfig& config,
                        std::mt19937_64& rng);

/// What generate() did.
struct Generation {
  std::vector<std::int64_t> tokens;  ///< the new tokens, in order
  double prefill_seconds = 0;        ///< feeding the prompt and drawing the first token
  double decode_seconds = 0;         ///< the tokens after the first (one step each)
  std::size_t decoder_bytes = 0;     ///< bytes the layers' decoders held at the end
  /// New tokens per second over the whole generation (prompt included).
  double tokens_per_second() const;
};

/// A trained causal language model, ready to generate (see the header comment).
class Generator {
 public:
  /// Loads the weights of the checkpoint folder `weights` of `attnlab train` (RUN/checkpoint, or
  /// the run folder RUN; the optimizer's state is not needed, as in a checkpoint exported for
  /// reading only). Throws Error when it is not a checkpoint, or (naming the folder) not a language
  /// model's (a task whose next token is its input: text; trained causal, as that task must be).
  explicit Generator(const std::string& weights);

  /// Generates config.tokens tokens after `prompt` (token ids, at least one), calling
  /// `on_token` with each as it comes. Throws Error (before generating) for a bad config, an
  /// empty prompt or one with an id outside the vocabulary, or a length past max_length() (see
  /// the header comment); Unsupported when the attention core does not decode.
  Generation generate(const std::vector<std::int64_t>& prompt, const SamplingConfig& config,
                      const std::function<void(std::int64_t)>& on_token = {}) const;

  /// The tokens the model may read: the N it was trained at.
  std::size_t max_length() const { return config_.n; }
  /// The run's config.
  const TrainConfig& config() const { return config_; }
  /// The model.
  const TaskModel& model() const { return model_; }
  /// The checkpoint folder read.
  const std::string& checkpoint() const { return checkpoint_; }

 private:
  std::string checkpoint_;  // the members in the order the constructor fills them
  TrainConfig config_;
  std::size_t vocab_;
  TaskModel model_;
};

}  // namespace attnlab::training
