#include "training/model.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <utility>
#include <vector>

#include "attnlab/error.hpp"
#include "attnlab/kernels.hpp"
#include "attnlab/npy.hpp"
#include "models/transformer.hpp"
#include "models/weights.hpp"

namespace attnlab::training {
namespace {

// Mean of x [B, N, d] over each item's first lengths[b] positions -> pooled [B, 1, d].
void mean_pool(const models::Activations& x, const std::vector<std::int64_t>& lengths,
               models::Activations& pooled) {
  const std::size_t batch = x.shape()[0], n = x.shape()[1], d = x.shape()[2];
  models::shape_buffer(pooled, {batch, 1, d});
  pooled.fill(0.0f);
  for (std::size_t b = 0; b < batch; ++b) {
    const auto len = static_cast<std::size_t>(lengths[b]);
    float* out = &pooled(b, 0, 0);
    for (std::size_t i = 0; i < len; ++i)
      for (std::size_t c = 0; c < d; ++c) out[c] += x.data()[(b * n + i) * d + c];
    for (std::size_t c = 0; c < d; ++c) out[c] /= static_cast<float>(len);
  }
}

// Its backward: each unpadded position gets dpooled / length, padded ones 0.
void mean_pool_backward(const models::Activations& dpooled, std::size_t n,
                        const std::vector<std::int64_t>& lengths, models::Activations& dx) {
  const std::size_t batch = dpooled.shape()[0], d = dpooled.shape()[2];
  models::shape_buffer(dx, {batch, n, d});
  dx.fill(0.0f);
  for (std::size_t b = 0; b < batch; ++b) {
    const auto len = static_cast<std::size_t>(lengths[b]);
    for (std::size_t i = 0; i < len; ++i)
      for (std::size_t c = 0; c < d; ++c) dx(b, i, c) = dpooled(b, 0, c) / static_cast<float>(len);
  }
}

// Whether some positions of a per-token batch are not scored (mqar, copy: the head then sees the
// scored rows alone; with Zoology's 8192 classes it would otherwise be most of the step).
bool scores_some(const Batch& batch) {
  return std::any_of(batch.targets.begin(), batch.targets.end(),
                     [](std::int64_t t) { return t == kNoTarget; });
}

// The scored rows of x [B, N, d], in order, gathered into rows [1, R, d] with their targets.
void gather_scored(const models::Activations& x, const Batch& batch, models::Activations& rows,
                   models::Tokens& row_targets) {
  const std::size_t d = x.shape()[2], positions = batch.targets.size();
  const auto scored = static_cast<std::size_t>(std::count_if(
      batch.targets.begin(), batch.targets.end(), [](std::int64_t t) { return t != kNoTarget; }));
  models::shape_buffer(rows, {1, scored, d});
  models::shape_buffer(row_targets, {1, scored});
  for (std::size_t p = 0, r = 0; p < positions; ++p) {
    if (batch.targets.data()[p] == kNoTarget) continue;
    std::copy_n(x.data() + p * d, d, rows.data() + r * d);
    row_targets.data()[r++] = batch.targets.data()[p];
  }
}

// Its backward: each scored position of dx [B, N, d] gets its row's gradient, the others 0.
void scatter_scored(const models::Activations& drows, const Batch& batch, models::Activations& dx) {
  const std::size_t d = drows.shape()[2];
  models::shape_buffer(dx, {batch.targets.shape()[0], batch.targets.shape()[1], d});
  dx.fill(0.0f);
  for (std::size_t p = 0, r = 0; p < batch.targets.size(); ++p)
    if (batch.targets.data()[p] != kNoTarget)
      std::copy_n(drows.data() + r++ * d, d, dx.data() + p * d);
}

const std::int64_t* targets_of(const Batch& batch, const models::Activations& logits) {
  if (batch.targets.shape()[0] != logits.shape()[0] ||
      batch.targets.shape()[1] != logits.shape()[1])
    throw Error("training: the batch's targets are [" + std::to_string(batch.targets.shape()[0]) +
                ", " + std::to_string(batch.targets.shape()[1]) + "], the logits " +
                models::shape_text(logits));
  return batch.targets.data();
}

}  // namespace

Score& Score::operator+=(const Score& other) {
  const std::size_t total = count + other.count;
  if (total) loss = (loss * double(count) + other.loss * double(other.count)) / double(total);
  correct += other.correct;
  count = total;
  return *this;
}

Score cross_entropy(const float* logits, const std::int64_t* targets, std::size_t rows,
                    std::size_t classes, float* dlogits) {
  Score s;
  for (std::size_t r = 0; r < rows; ++r) {
    if (targets[r] == kNoTarget) continue;
    if (targets[r] < 0 || static_cast<std::size_t>(targets[r]) >= classes)
      throw Error("cross-entropy: target " + std::to_string(targets[r]) + " at row " +
                  std::to_string(r) + " is outside [0, " + std::to_string(classes) + ")");
    ++s.count;
  }
  if (dlogits) std::fill_n(dlogits, rows * classes, 0.0f);
  if (s.count == 0) return s;
  // Rows in parallel, each row's loss kept and summed in row order after.
  std::vector<double> row_loss(rows, 0.0);
  std::size_t correct = 0;
  const auto n_rows = static_cast<std::ptrdiff_t>(rows);
#pragma omp parallel reduction(+ : correct) if (rows * classes > models::kParallelFloats)
  {
    // Each exp once, in float on the kernels' vectorised exp2 (as PyTorch's float softmax):
    // kept in dz when the gradient is wanted (scaled by the row's sum after), else in a row of
    // this thread's; the sum in double.
    std::vector<float> scratch(dlogits ? 0 : classes);
#pragma omp for schedule(static)
    for (std::ptrdiff_t row = 0; row < n_rows; ++row) {
      const auto r = static_cast<std::size_t>(row);
      if (targets[r] == kNoTarget) continue;
      const float* z = logits + r * classes;
      const auto best = static_cast<std::size_t>(std::max_element(z, z + classes) - z);
      float* dz = dlogits ? dlogits + r * classes : nullptr;
      float* e = dz ? dz : scratch.data();
      constexpr float log2e = 1.44269504088896341f;
      for (std::size_t c = 0; c < classes; ++c) e[c] = (z[c] - z[best]) * log2e;
      kernels::exp2_inplace(e, classes);
      double sum = 0;
#pragma omp simd reduction(+ : sum)
      for (std::size_t c = 0; c < classes; ++c) sum += e[c];
      const auto t = static_cast<std::size_t>(targets[r]);
      row_loss[r] = std::log(sum) + double(z[best]) - double(z[t]);
      correct += best == t;
      if (!dz) continue;
      const double scale = 1.0 / (sum * double(s.count));
      for (std::size_t c = 0; c < classes; ++c) dz[c] = static_cast<float>(double(dz[c]) * scale);
      // The target's entry from double, not from its rounded exp: p_t - 1 cancels near p_t = 1.
      dz[t] = static_cast<float>((std::exp(double(z[t]) - double(z[best])) / sum - 1.0) /
                                 double(s.count));
    }
  }
  double total = 0;
  for (std::size_t r = 0; r < rows; ++r)
    if (targets[r] != kNoTarget) total += row_loss[r];
  s.correct = correct;
  s.loss = total / double(s.count);
  return s;
}

Mask batch_mask(const Batch& batch, bool causal) {
  Mask mask;
  if (causal) mask.causal = Causal::top_left;
  const auto n = static_cast<std::int64_t>(batch.tokens.shape()[1]);
  if (std::any_of(batch.lengths.begin(), batch.lengths.end(),
                  [n](std::int64_t l) { return l < n; }))
    mask.key_lengths = batch.lengths;
  return mask;
}

namespace {

std::variant<models::EncoderModel, models::LlamaModel> make_body(const models::ModelConfig& c) {
  if (c.arch == models::Arch::llama) return models::LlamaModel(c);
  return models::EncoderModel(c);
}

const models::Matrix& embedding_of(
    const std::variant<models::EncoderModel, models::LlamaModel>& b) {
  if (const auto* llama = std::get_if<models::LlamaModel>(&b)) return llama->embed_tokens.weight;
  return std::get<models::EncoderModel>(b).embedding.weight;
}

}  // namespace

TaskModel::TaskModel(const models::ModelConfig& config, std::size_t classes, Output output,
                     bool causal, bool tied_embeddings)
    : body(make_body(config)),
      head(config.layer.d_model, tied_embeddings ? 0 : classes,
           config.arch == models::Arch::transformer),
      output_(output),
      causal_(causal || config.arch == models::Arch::llama),
      tied_(tied_embeddings) {
  if (classes == 0) throw Error("training: a task head needs at least 1 class");
  if (tied_embeddings && config.arch != models::Arch::llama)
    throw Error("training: tied_embeddings with arch " + models::arch_name(config.arch) +
                ": the 2017 encoder's head has a bias and reads scaled embeddings (arch llama)");
  if (tied_embeddings && classes != config.vocab)
    throw Error("training: tied_embeddings needs the head's " + std::to_string(classes) +
                " classes to be the embedding's " + std::to_string(config.vocab) +
                " tokens (a language model's)");
  if (config.arch == models::Arch::llama) {
    if (!tied_)  // Hugging Face's initialisation
      models::fill_normal(models::parameter("lm_head.weight", head.weight),
                          models::MultiHeadAttention::kLlamaInitStd, config.seed);
  } else {
    head.initialize(config.seed, "head.");
  }
}

const models::EncoderModel& TaskModel::encoder_body(const std::string& who) const {
  if (const auto* encoder = std::get_if<models::EncoderModel>(&body)) return *encoder;
  throw Unsupported(who, "models of --arch llama (it reads the 2017 encoder's layers)");
}

models::EncoderModel& TaskModel::encoder_body(const std::string& who) {
  return const_cast<models::EncoderModel&>(std::as_const(*this).encoder_body(who));
}

std::string TaskModel::spec() const {
  std::vector<std::string> specs;
  if (const auto* llama = std::get_if<models::LlamaModel>(&body))
    for (const auto& layer : llama->layers) specs.push_back(layer.self_attn.spec());
  else
    for (const auto& layer : std::get<models::EncoderModel>(body).encoder.layers)
      specs.push_back(layer.self_attn.spec());
  // The shortest cycle the layers repeat ("A;B" for A, B, A), as models::layer_specs reads it.
  std::size_t period = 1;
  while (period < specs.size()) {
    bool repeats = true;
    for (std::size_t i = period; i < specs.size(); ++i)
      repeats = repeats && specs[i] == specs[i % period];
    if (repeats) break;
    ++period;
  }
  std::string out;
  for (std::size_t i = 0; i < period && i < specs.size(); ++i) out += (i ? ";" : "") + specs[i];
  return out;
}

std::size_t TaskModel::d_model() const {
  return embedding_of(body).shape()[1];
}

models::Parameters TaskModel::parameters() {
  models::Parameters params = std::visit([](auto& b) { return b.parameters(); }, body);
  if (std::holds_alternative<models::EncoderModel>(body))
    head.parameters("head.", params);
  else if (!tied_)
    head.parameters("lm_head.", params);
  return params;
}

void TaskModel::load(const std::string& dir) {
  TaskModel loaded = *this;
  std::vector<std::string> unused = models::load_weights(dir, loaded.parameters());
  // Hugging Face exports a tied head as lm_head.weight too: read, it must be the embedding.
  const auto lm_head = std::find(unused.begin(), unused.end(), "lm_head.weight.npy");
  if (tied_ && lm_head != unused.end()) {
    const xt::xarray<float> w = load_npy_float(dir + "/lm_head.weight.npy", {2});
    const models::Matrix& e = embedding_of(loaded.body);
    if (!std::equal(w.shape().begin(), w.shape().end(), e.shape().begin(), e.shape().end()) ||
        !std::equal(w.begin(), w.end(), e.begin()))
      throw Error("weights folder " + dir +
                  ": lm_head.weight.npy differs from model.embed_tokens.weight.npy, which tied "
                  "embeddings make the head");
    unused.erase(lm_head);
  }
  if (!unused.empty()) {
    std::string names;
    for (const std::string& name : unused) names += (names.empty() ? "" : ", ") + name;
    throw Error("weights folder " + dir + ": " + names +
                " belong to no parameter of this model "
                "(another model's weights? e.g. a final LayerNorm the switches leave out)");
  }
  if (auto* encoder = std::get_if<models::EncoderModel>(&loaded.body))
    encoder->encoder.check(dir + "/encoder.");
  else
    std::get<models::LlamaModel>(loaded.body).check(dir + "/");
  *this = std::move(loaded);
}

models::Activations TaskModel::features(const models::Tokens& tokens, const Mask& mask) const {
  return std::visit([&](const auto& b) { return b.forward(tokens, mask); }, body);
}

void TaskModel::head_forward(const models::Activations& features,
                             models::Activations& logits) const {
  if (!tied_) return head.forward(features, logits);
  const models::Matrix& e = embedding_of(body);
  const std::size_t rows = features.shape()[0] * features.shape()[1], d = e.shape()[1];
  models::shape_buffer(logits, {features.shape()[0], features.shape()[1], e.shape()[0]});
  models::affine(features.data(), rows, d, d, e.data(), e.shape()[0], d, nullptr, logits.data(),
                 e.shape()[0]);
}

models::Activations TaskModel::logits(const Batch& batch) const {
  const models::Activations hidden = features(batch.tokens, mask(batch));
  models::Activations out;
  if (output_ == Output::per_token) {
    head_forward(hidden, out);
    return out;
  }
  models::Activations pooled;
  mean_pool(hidden, batch.lengths, pooled);
  head_forward(pooled, out);
  return out;
}

TaskModel zero_like(const TaskModel& model) {
  TaskModel grad = model;
  for (const models::ParameterRef& p : grad.parameters()) models::fill_constant(p, 0.0f);
  return grad;
}

namespace {

// The head's backward: dL/d(features) into dfeatures; the head's (or, tied, the embedding's)
// gradient added into grad.
void head_backward(const TaskModel& model, const models::Activations& features,
                   const models::Activations& dlogits, TaskModel& grad,
                   models::Activations& dfeatures) {
  if (!model.tied_embeddings())
    return models::backward(model.head, features, dlogits, grad.head, dfeatures);
  const models::Matrix& e = embedding_of(model.body);
  auto& de = const_cast<models::Matrix&>(embedding_of(grad.body));  // grad's own storage
  const std::size_t rows = features.shape()[0] * features.shape()[1], d = e.shape()[1];
  models::shape_buffer(dfeatures, features.shape());
  models::affine_backward(features.data(), rows, d, d, e.data(), e.shape()[0], d, dlogits.data(),
                          e.shape()[0], dfeatures.data(), d, de.data(), nullptr, true);
}

// The body's traced forward and its backward, whichever the body is.
const models::Activations& body_forward(const TaskModel& model, const Batch& batch,
                                        StepWorkspace& w) {
  if (const auto* llama = std::get_if<models::LlamaModel>(&model.body))
    return models::forward(*llama, batch.tokens, model.mask(batch), w.llama_trace);
  return models::forward(std::get<models::EncoderModel>(model.body), batch.tokens,
                         model.mask(batch), w.trace);
}

void body_backward(const TaskModel& model, const models::Activations& dy, TaskModel& grad,
                   StepWorkspace& w) {
  if (const auto* llama = std::get_if<models::LlamaModel>(&model.body))
    return models::backward(*llama, w.llama_trace, dy, std::get<models::LlamaModel>(grad.body));
  models::backward(std::get<models::EncoderModel>(model.body), w.trace, dy,
                   std::get<models::EncoderModel>(grad.body));
}

}  // namespace

Score loss_and_gradients(const TaskModel& model, const Batch& batch, TaskModel& grad) {
  StepWorkspace workspace;
  return loss_and_gradients(model, batch, grad, workspace);
}

Score loss_and_gradients(const TaskModel& model, const Batch& batch, TaskModel& grad,
                         StepWorkspace& w) {
  const models::Activations& hidden = body_forward(model, batch, w);
  // The head's input: the pooled features, the scored rows, or every position.
  const bool per_token = model.output() == Output::per_token;
  const bool gathered = per_token && scores_some(batch);
  if (!per_token) mean_pool(hidden, batch.lengths, w.head_input);
  if (gathered) gather_scored(hidden, batch, w.head_input, w.head_targets);
  const models::Activations& features = per_token && !gathered ? hidden : w.head_input;
  const std::int64_t* targets = gathered ? w.head_targets.data() : nullptr;
  model.head_forward(features, w.logits);
  models::shape_buffer(w.dlogits, w.logits.shape());
  const std::size_t classes = w.logits.shape()[2];
  const Score score =
      cross_entropy(w.logits.data(), targets ? targets : targets_of(batch, w.logits),
                    w.logits.size() / classes, classes, w.dlogits.data());
  head_backward(model, features, w.dlogits, grad, w.dfeatures);
  if (!per_token) mean_pool_backward(w.dfeatures, hidden.shape()[1], batch.lengths, w.dhidden);
  if (gathered) scatter_scored(w.dfeatures, batch, w.dhidden);
  body_backward(model, per_token && !gathered ? w.dfeatures : w.dhidden, grad, w);
  return score;
}

Score evaluate(const TaskModel& model, const Batch& batch) {
  if (model.output() == Output::per_token && scores_some(batch)) {
    models::Activations rows, logits;
    models::Tokens row_targets;
    gather_scored(model.features(batch.tokens, model.mask(batch)), batch, rows, row_targets);
    model.head_forward(rows, logits);
    return cross_entropy(logits.data(), row_targets.data(), row_targets.size(), logits.shape()[2],
                         nullptr);
  }
  const models::Activations logits = model.logits(batch);
  const std::size_t classes = logits.shape()[2];
  return cross_entropy(logits.data(), targets_of(batch, logits), logits.size() / classes, classes,
                       nullptr);
}

Score evaluate(const TaskModel& model, const std::vector<Batch>& batches) {
  Score total;
  for (const Batch& b : batches) total += evaluate(model, b);
  return total;
}

}  // namespace attnlab::training
