// A Transformer with a task head: what `attnlab train` trains. The body is the 2017 encoder,
// models::EncoderModel (token embedding, sinusoidal positions, L layers with any attention spec),
// with a head Linear from d_model to the task's classes ("head.weight", "head.bias"); or Llama's
// decoder, models::LlamaModel (`attnlab train --arch llama`: always causal), with Hugging Face's
// bias-free head "lm_head.weight", or the embedding itself as the head (tied embeddings, which
// need as many classes as tokens: a language model's). The head is applied at every position
// (Output::per_token) or to the mean of the encoder's outputs over the unpadded positions
// (Output::per_sequence: mean pooling, as LRA's classifiers may). Training and evaluate() apply a
// per-token head to the scored positions alone (MQAR scores its queries, a sixteenth of the tokens:
// Zoology's 8192-way head at every token would be most of the step); logits() gives every
// position's. Padded keys are masked in every attention call (Mask::key_lengths). A causal model
// (`attnlab train
// --causal`) is a decoder-only, GPT-style stack: every attention call is also causal (top-left),
// so position i sees positions 0..i only and a per-token target is predicted from the prefix up
// to its position; per-sequence tasks pool the causal outputs as above. The loss is the mean
// cross-entropy over the scored targets.
#pragma once

#include <cstddef>
#include <cstdint>
#include <numbers>
#include <string>
#include <variant>
#include <vector>

#include "attnlab/mask.hpp"
#include "models/llama.hpp"
#include "models/transformer.hpp"
#include "training/tasks.hpp"

namespace attnlab::training {

/// Mean cross-entropy of a batch, with how many scored targets the arg-max got right.
struct Score {
  double loss = 0;          ///< mean over the scored targets (0 when there are none)
  std::size_t correct = 0;  ///< scored targets whose logit is the largest (first on ties)
  std::size_t count = 0;    ///< scored targets

  /// correct / count (0 when count is 0).
  double accuracy() const { return count ? double(correct) / double(count) : 0.0; }
  /// The loss in bits per scored target (loss / ln 2): bits per byte for the text task.
  double bits() const { return loss / std::numbers::ln2; }
  /// Adds another batch's score, weighting the losses by their counts.
  Score& operator+=(const Score& other);
};

/// Cross-entropy of logits [rows, classes] (row-major) against targets[rows] in [0, classes) or
/// kNoTarget (not scored), log-sum-exp in double. When dlogits is not null it receives
/// d(loss)/d(logits) of the mean loss: (softmax - onehot) / count on scored rows, 0 elsewhere.
/// Rows in parallel; the loss is summed over the rows in order, so bitwise as one thread. Throws
/// Error naming the first target outside [0, classes).
Score cross_entropy(const float* logits, const std::int64_t* targets, std::size_t rows,
                    std::size_t classes, float* dlogits);

/// The mask of a batch: key padding where an item is shorter than N, nothing otherwise; and
/// top-left causal when `causal`.
Mask batch_mask(const Batch& batch, bool causal = false);

/// An EncoderModel with a classification head (see the header comment).
class TaskModel {
 public:
  /// Builds and initialises the encoder from config (config.seed) and the head (PyTorch's
  /// Linear initialisation from the same seed); throws Error for a bad config or classes == 0.
  /// `causal`: every attention call is causal (see the header comment).
  /// config.arch picks the body; a Llama body is causal whatever `causal` says. Throws Error
  /// for tied_embeddings with the 2017 encoder, or with classes != config.vocab (naming it).
  TaskModel(const models::ModelConfig& config, std::size_t classes, Output output,
            bool causal = false, bool tied_embeddings = false);

  /// The 2017 encoder ("embedding.weight", "encoder.*") or Llama's ("model.*").
  std::variant<models::EncoderModel, models::LlamaModel> body;
  /// "head.weight" [classes, d_model] and "head.bias" on the 2017 encoder; "lm_head.weight",
  /// without a bias, on Llama's; unused (the embedding is the head) with tied embeddings.
  models::Linear head;

  /// Per token or per sequence.
  Output output() const { return output_; }

  /// Whether every attention call is causal.
  bool causal() const { return causal_; }

  /// Whether the head is the body's token embedding.
  bool tied_embeddings() const { return tied_; }

  /// The 2017 encoder body. Throws Unsupported naming `who` when the body is another.
  const models::EncoderModel& encoder_body(const std::string& who) const;
  /// The same, to change.
  models::EncoderModel& encoder_body(const std::string& who);

  /// The attention cores' canonical specs: one, or the layers' cycle "A;B" (models::layer_specs).
  std::string spec() const;

  /// d_model.
  std::size_t d_model() const;

  /// The mask of every attention call on `batch`: batch_mask(batch, causal()).
  Mask mask(const Batch& batch) const { return batch_mask(batch, causal_); }

  /// Every parameter: the body's in state_dict order, then the head's.
  models::Parameters parameters();

  /// Reads the weights folder `dir` (models/weights.hpp: "embedding.weight", "encoder.*",
  /// "head.*", or "model.*" and "lm_head.weight") into every parameter, e.g. a PyTorch twin's
  /// exported initial weights. Throws Error naming the file that is missing, mis-shaped or not
  /// finite, a broken tie, or a file no parameter reads (the folder is of another model); with
  /// tied embeddings an lm_head.weight, as Hugging Face exports it, must equal the embedding. On
  /// error nothing changes.
  void load(const std::string& dir);

  /// The body's output [B, N, d_model] on `tokens` under `mask`.
  models::Activations features(const models::Tokens& tokens, const Mask& mask) const;

  /// The head on `features` [B, R, d_model] -> logits [B, R, classes] (shaped by shape_buffer).
  void head_forward(const models::Activations& features, models::Activations& logits) const;

  /// The logits [B, N, classes] (per token) or [B, 1, classes] (per sequence) of a batch.
  models::Activations logits(const Batch& batch) const;

 private:
  Output output_;
  bool causal_;
  bool tied_;
};

/// A copy of `model` with every parameter zero: the gradient accumulator of loss_and_gradients.
TaskModel zero_like(const TaskModel& model);

/// The buffers of a training step: the model's trace (models/transformer.hpp) and the head's
/// input, logits and their gradients. Kept from one step to the next (the Trainer owns one), a
/// step after the first allocates nothing large.
struct StepWorkspace {
  models::ModelTrace trace;        ///< the 2017 body's activations and gradient buffers
  models::LlamaTrace llama_trace;  ///< Llama's
  models::Activations head_input;  ///< the mean-pooled features, or the scored rows [1, R, d]
  models::Tokens head_targets;     ///< the scored rows' targets [1, R]
  models::Activations logits;      ///< the head's output
  models::Activations dlogits;     ///< d(loss)/d(logits)
  models::Activations dfeatures;   ///< d(loss)/d(the head's input)
  models::Activations dhidden;     ///< pooled or gathered: d(loss)/d(the body's output)
};

/// The batch's score, and the gradient of its mean loss added into `grad` (zero_like's shape).
/// The attention cores' backward may throw Unsupported.
Score loss_and_gradients(const TaskModel& model, const Batch& batch, TaskModel& grad);
/// The same in `workspace`'s buffers.
Score loss_and_gradients(const TaskModel& model, const Batch& batch, TaskModel& grad,
                         StepWorkspace& workspace);

/// The batch's score without gradients.
Score evaluate(const TaskModel& model, const Batch& batch);

/// The score over `batches` (each evaluated alone, the scores added up): a held-out set's.
Score evaluate(const TaskModel& model, const std::vector<Batch>& batches);

}  // namespace attnlab::training
