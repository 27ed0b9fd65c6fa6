// Synthetic training tasks, generated in C++ from a seed (no downloads), named by a factory
// string like the attention variants: "mqar:pairs=16,vocab=256", "listops", "copy:vocab=10".
// Every task makes batches of token sequences of one length N with their targets; batch(size,
// seed) depends only on its arguments, so a training run's data is a function of (seed, step).
// Each task is one file, training/tasks/<name>.cpp, that registers itself in task_registry() as
// the variants do (attnlab/factory.hpp); its keys are parsed by the variants' Params, whose
// messages then speak of a task ("task 'mqar:pairz=3': unknown key 'pairz' (known: pairs, vocab)").
//
//   mqar     Multi-query associative recall (Arora et al. 2023, "Zoology", its multiquery_ar
//            generator): `pairs` key-value pairs k1 v1 ... kD vD (keys drawn without
//            replacement from [1, vocab/2), values from [vocab/2, vocab)), then every key asked
//            once, in random order, at positions 2D + 2g with the gaps g drawn without
//            replacement from [0, (N - 2D) / 2) with weights (g + 1)^(-0.99) (Zoology's power
//            law, a = 0.01); every other position holds a random token from [0, vocab) that is
//            not one of the example's keys (Zoology draws from the whole vocabulary, 8192 tokens,
//            where that is rare; in a small one a key would recur in the noise with another
//            successor and make the answer ambiguous). Target: the key's value at each query
//            position. Keys: pairs (default N / 16, >= 1,
//            4 · pairs <= N), vocab (default 256, pairs <= vocab / 2 - 1).
//   listops  Long Range Arena ListOps (Tay et al. 2021, Nangia & Bowman 2018; LRA's
//            listops.py): nested [MAX, [MIN, [MED, [SM (sum mod 10) lists over digits 0-9, each
//            closed by ']'; a node is a digit with probability 0.25 (always at max depth), else
//            an operator over 2..args children. Trees are drawn until min_len < length < max_len
//            tokens (LRA: 500 < length < 2000, depth 10, args 10), tokens without LRA's
//            parentheses, padded to N. Target: the value, 10 classes. Keys: max_len (default N,
//            3..N), min_len (default max_len / 4), depth (default 10, >= 2), args (default 10).
//   copy     x1 .. xm, a delimiter, then m blanks (and blanks to N): the target at position
//            m + 1 + i is x(i+1). m = (N - 1) / 2 symbols from [2, vocab). Keys: vocab (default
//            10, >= 3).
//   text     Byte-level language modelling of the King James Bible, the 4,298,239 bytes that
//            `bible Ge1:1-Re22:21` (Debian's bible-kjv package) prints, read once per process
//            without a shell. Split: the first 95% of the bytes train (Genesis to Colossians 1:18),
//            the last 5% (Colossians 1:18 to Revelation) are the validation set, which held_out()
//            draws from. An example is a window of N + 1 bytes starting uniformly at random
//            inside its split: tokens its first N bytes, targets the next byte of each (every
//            position scored, so loss / ln 2 is bits per byte). Needs the causal model (train
//            --causal). No keys; vocab 256.
// Token ids: mqar as above; listops 0 pad, 1-10 digits 0-9, 11 [MIN, 12 [MAX, 13 [MED, 14 [SM,
// 15 ']'; copy 0 blank, 1 delimiter, 2.. symbols.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "attnlab/factory.hpp"
#include "models/layers.hpp"

/// Training over any attention spec: seeded tasks, a task head and its loss, the Trainer with
/// checkpoints (docs/training.md).
namespace attnlab::training {}

namespace attnlab::training {

/// What a task asks of the model: a class per token, or one per sequence.
enum class Output {
  per_token,     ///< targets [B, N], kNoTarget where nothing is asked (mqar, copy)
  per_sequence,  ///< targets [B, 1] (listops)
};

/// A target that is not scored (the input positions of mqar and copy).
inline constexpr std::int64_t kNoTarget = -1;

/// One batch of a task.
struct Batch {
  models::Tokens tokens;              ///< [B, N] input ids in [0, vocab)
  models::Tokens targets;             ///< [B, N] or [B, 1] (see Output), classes or kNoTarget
  std::vector<std::int64_t> lengths;  ///< tokens before the padding, per item (N: none)
};

/// A seeded generator of one task at one sequence length.
class Task {
 public:
  virtual ~Task() = default;

  /// The canonical factory string, every key in a fixed order.
  virtual std::string spec() const = 0;
  /// Input ids are in [0, vocab()).
  virtual std::size_t vocab() const = 0;
  /// Targets are in [0, classes()).
  virtual std::size_t classes() const = 0;
  /// Per token or per sequence.
  virtual Output output() const = 0;
  /// N, the length of every sequence.
  virtual std::size_t length() const = 0;

  /// `size` examples drawn from `seed` alone: the same arguments give the same batch.
  virtual Batch batch(std::size_t size, std::uint64_t seed) const = 0;

  /// `size` held-out examples from `seed`: batch() for the generated tasks (a fresh seed is
  /// new data), the validation split for a corpus.
  virtual Batch held_out(std::size_t size, std::uint64_t seed) const { return batch(size, seed); }

  /// Whether only a causal model can learn it (a language model: the next byte is an input).
  virtual bool needs_causal() const { return false; }
};

/// Task factory strings, for Params' messages: "task 'mqar:pairz=3': unknown key ...".
inline constexpr SpecKind kTaskSpec{"task", "task"};

/// A task's entry in task_registry().
struct TaskMaker {
  /// Reads the task's keys from the Params (which checks them) and builds it at length n.
  std::unique_ptr<Task> (*make)(Params& params, std::size_t n);
  /// Its keys with their defaults, for help texts: "pairs=N/16,vocab=256".
  const char* keys;
};

/// The tasks' registry, filled by the registrars of training/tasks/*.cpp.
Registry<TaskMaker>& task_registry();

/// Builds the task a factory string names at sequence length n; throws Error naming the task
/// or the key and value that is wrong (unknown name or key, malformed value, broken constraint).
std::unique_ptr<Task> make_task(std::string_view spec, std::size_t n);

/// The registered task names, in order (mqar, listops, copy, text today).
std::vector<std::string> task_names();

/// The tasks with their keys and defaults, for help texts: "mqar[:pairs=N/16,vocab=256], ...".
std::string task_usage();

/// The text task's corpus, the whole King James Bible; read on first use (throws Error naming
/// the missing program).
const std::string& text_corpus();

/// Where the text task's validation split of a corpus of `bytes` bytes begins: the last 5%.
std::size_t text_split(std::size_t bytes);

/// ListOps' token names, by id ("<pad>", "0".."9", "[MIN", "[MAX", "[MED", "[SM", "]").
const std::vector<std::string>& listops_tokens();

}  // namespace attnlab::training
