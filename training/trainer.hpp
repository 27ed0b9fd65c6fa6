// Training a TaskModel on a Task with Adam, checkpoints that resume exactly, and the time split
// of a step. What `attnlab train` runs (cli/cmd_train.cpp; docs/training.md).
//
// Weights: seeded from `seed`, or read from the weights folder `init` (a PyTorch twin's exported
// state_dict, or another run's checkpoint folder; TaskModel::load checks every name and shape).
// Data: step t (1-based) trains on task.batch(batch, seed of (seed, t)); the held-out set is
// eval_size examples from another stream of the same seed, generated once. So a run is a
// function of its config alone, and one resumed from the checkpoint of step t continues with
// exactly the batches, weights and optimizer moments an uninterrupted run has at step t: the
// final weights are bitwise equal (tests/test_training.cpp).
//
// Checkpoint folder (Trainer::save):
//   <name>.npy            every parameter, the weights-folder format of models/weights.hpp
//                         (embedding.weight, encoder.layers.0...., head.weight, head.bias): the
//                         body loads into `attnlab model --weights` as it is
//   optimizer/exp_avg.<name>.npy, optimizer/exp_avg_sq.<name>.npy   Adam's moments
//   state.txt             "step T", "seconds S" (training time so far), then the config lines
//                         of TrainConfig::describe(), which a resume must match, then "end"
//                         (a file without it is cut short, or older and read as before)
// Saving is a sequence in which a kill at any moment leaves a complete checkpoint that is loaded
// and never a partial one that is: (1) write DIR.tmp, state.txt last (a failed write removes
// DIR.tmp); (2) rename DIR to DIR.old; (3) rename DIR.tmp to DIR; (4) rename DIR.old to
// DIR.trash and remove that. Only DIR and DIR.old are loaded (DIR first; DIR.old exists alone
// only between (2) and (3)), and each is only ever a renamed complete folder; the removal that a
// kill can cut short happens under DIR.trash, which the next save clears like a DIR.tmp.
//
// Batches (dump_batches = DIR): step t also writes its batch as DIR/step-<t>.tokens.npy [B, N],
// DIR/step-<t>.targets.npy ([B, N] or [B, 1], kNoTarget = -1) and DIR/step-<t>.lengths.npy
// [B], float32 (every id is below 2^24, so exact): what a PyTorch twin trains on to follow a run
// step for step (tests/torch_train.py).
//
// Not learned here: an attention core's own tensors (linformer's E and F stay at their seeded
// initialisation); the model's parameters are the layers' (their backward passes,
// models/layers.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "models/optimizer.hpp"
#include "training/model.hpp"
#include "training/tasks.hpp"

namespace attnlab::training {

/// Everything a run is a function of (the number of steps aside: a run can be extended).
struct TrainConfig {
  std::string task = "mqar";        ///< task factory string (training/tasks.hpp)
  std::string spec = "full";        ///< attention factory string
  std::size_t n = 256;              ///< sequence length
  std::size_t layers = 2;           ///< encoder layers
  std::size_t d_model = 64;         ///< model width
  std::size_t heads = 4;            ///< attention heads (divide d_model)
  std::size_t ffn = 256;            ///< FFN hidden size
  std::string switches = "pre-ln";  ///< models::apply_switches list; pre-LN trains without tuning
  std::size_t batch = 32;           ///< examples per step
  std::uint64_t seed = 1;           ///< weights and data
  std::size_t eval_size = 512;      ///< held-out examples
  models::AdamConfig adam{3e-3, 0.9, 0.98, 1e-8, 0.01, 100};  ///< lr 3e-3, warm-up 100 steps
  bool causal = false;  ///< a decoder-only stack: every attention call causal
  models::Arch arch = models::Arch::transformer;  ///< the block (llama: always causal)
  std::size_t kv_heads = 0;                       ///< key and value heads (0: `heads`); llama only
  double rope_base = 10000;                       ///< the rotary embeddings' base; llama only
  bool tied_embeddings = false;                   ///< the embedding is the head; llama only
  std::string init;          ///< initial weights folder ("": seeded from `seed`)
  std::string dump_batches;  ///< folder to write each step's batch to ("": none); not
                             ///< part of the run's identity (describe() leaves it out)

  /// Throws Error naming the first bad field (sizes, the task, the spec, the switches, Adam), or
  /// the sizes when memory_bytes() exceeds what this process may use (models::require_memory);
  /// Unsupported when `causal` and the spec has no causal mode, or kv_heads < heads and its core
  /// does not take grouped heads.
  void validate() const;

  /// A lower bound of the bytes a run needs: four copies of the parameters (weights, gradients,
  /// Adam's two moments), the step's workspace (per layer about 20 · d_model + ffn floats a
  /// token, kept from step to step, one backward scratch of 12 · d_model + ffn floats a token,
  /// the head's logits and their gradient at the scored rows) and the held-out set's tokens. An
  /// attention core's own scratch comes on top.
  double memory_bytes() const;

  /// Whether every attention call is causal: `causal`, or a Llama model.
  bool causal_model() const { return causal || arch == models::Arch::llama; }

  /// One "key value" line per field, in a fixed order: the identity of a run. `causal`, `init`,
  /// `arch`, `kv_heads`, `rope_base` and `tied_embeddings` add their lines ("causal 1",
  /// "init DIR", "arch llama", ...) only when they differ from the defaults, so that the
  /// checkpoints of earlier runs still resume.
  std::string describe() const;

  /// The config whose describe() the lines are (the inverse of describe(); lines it does not
  /// write are refused). Throws Error naming `where` and the line that is unknown or malformed.
  static TrainConfig parse(const std::string& lines, const std::string& where);
};

/// The config of the checkpoint folder `dir` (Trainer::save; DIR.old when only that is left),
/// read from its state.txt: what `Trainer(config).load(dir)` needs. Throws Error saying that
/// `dir` is not a checkpoint folder when it has no state.txt, or naming the bad line.
TrainConfig checkpoint_config(const std::string& dir);

/// Wall-clock seconds of one step's parts.
struct StepTimes {
  double data = 0;       ///< generating the batch
  double gradients = 0;  ///< forward, loss and backward
  double update = 0;     ///< Adam
};

/// A training run in memory: the task, the model, its gradient accumulator and the optimizer.
class Trainer {
 public:
  /// Builds the task and the model, seeded or read from config.init (config validated; throws
  /// Error naming what in the init folder does not fit the model).
  explicit Trainer(const TrainConfig& config);

  /// One step on the batch of step steps() + 1; returns its score (before the update). Adds
  /// the parts' times into `times` when given.
  Score step(StepTimes* times = nullptr);

  /// The score on the held-out set (evaluated in batches of config.batch).
  Score evaluate();

  /// The held-out set: config.eval_size examples of task().held_out() in batches of
  /// config.batch, generated on first use from the seed alone (what evaluate() scores).
  const std::vector<Batch>& held_out();

  /// Steps taken.
  std::size_t steps() const { return adam_.steps(); }

  /// Training time so far in seconds, kept by the caller and saved in checkpoints.
  double seconds = 0;

  /// Writes the checkpoint folder `dir` (see the header comment), replacing the previous one.
  /// Throws Error naming the file that could not be written.
  void save(const std::string& dir);

  /// Restores a checkpoint written by save() for the same config; throws Error naming the first
  /// config line that differs, or the missing or broken file. Nothing changes on error.
  void load(const std::string& dir);

  /// Whether `dir` (or what a kill left of it, DIR.old) holds a checkpoint.
  static bool has_checkpoint(const std::string& dir);

  /// The task.
  const Task& task() const { return *task_; }
  /// The model.
  const TaskModel& model() const { return model_; }
  /// The configuration.
  const TrainConfig& config() const { return config_; }

 private:
  TrainConfig config_;
  std::unique_ptr<Task> task_;
  TaskModel model_, grad_;
  StepWorkspace workspace_;  // the step's buffers, reused from one step to the next
  models::Adam adam_;
  std::vector<Batch> eval_;
};

/// The time of a training step split into its attention calls, its GEMMs and the rest.
struct StepSplit {
  double step = 0;         ///< a whole step (forward, loss, backward, Adam), median of rounds
  double attention = 0;    ///< the time inside its L attention cores (forward and backward)
  double gemm = 0;         ///< the time inside its GEMMs (projections, FFN, head; both ways)
  std::size_t rounds = 0;  ///< rounds measured
};

/// Measures a StepSplit at the trainer's config on copies of its model (the trainer does not
/// change): `rounds` training steps on one batch in one StepWorkspace, as Trainer::step runs
/// them, each timed whole while the layers time their own attention cores and GEMMs
/// (models/step_clock.hpp); the medians of each over the rounds.
StepSplit measure_split(const Trainer& trainer, std::size_t rounds);

}  // namespace attnlab::training
