#include "training/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "attnlab/error.hpp"
#include "attnlab/factory.hpp"
#include "attnlab/npy.hpp"
#include "attnlab/seed.hpp"
#include "attnlab/stats.hpp"
#include "models/step_clock.hpp"

namespace attnlab::training {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The seed of batch `index` of stream `stream` (1: training steps, 2: the held-out set).
std::uint64_t data_seed(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  return stream_seed(seed, {splitmix64(stream << 56 ^ index)});
}

// The rows the task head sees in a step of `batch` examples: the scored positions of a per-token
// task (loss_and_gradients scores those alone; every task scores as many in each example, so one
// example tells), one per sequence otherwise.
std::size_t head_rows(const Task& task, std::size_t batch) {
  if (task.output() == Output::per_sequence) return batch;
  const Batch one = task.batch(1, 0);
  return batch *
         static_cast<std::size_t>(std::count_if(one.targets.begin(), one.targets.end(),
                                                [](std::int64_t t) { return t != kNoTarget; }));
}

models::ModelConfig model_config(const TrainConfig& c, std::size_t vocab) {
  models::ModelConfig m;
  m.layer.d_model = c.d_model;
  m.layer.heads = c.heads;
  m.layer.ffn = c.ffn;
  m.layer.spec = c.spec;
  models::apply_switches(m.layer, c.switches);
  m.layer.kv_heads = c.kv_heads;
  m.layer.rope_base = c.rope_base;
  m.arch = c.arch;
  m.layers = c.layers;
  m.vocab = vocab;
  m.seed = c.seed;
  return m;
}

xt::xarray<float> as_floats(const models::Tokens& t) {
  xt::xarray<float> a = xt::xarray<float>::from_shape({t.shape()[0], t.shape()[1]});
  std::copy(t.begin(), t.end(), a.begin());
  return a;
}

// Writes the batch of `step` into `dir` (see the header comment).
void dump(const Batch& batch, const std::string& dir, std::size_t step) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error("batches folder " + dir + ": cannot create it: " + ec.message());
  const std::string stem = dir + "/step-" + std::to_string(step);
  xt::xarray<float> lengths = xt::xarray<float>::from_shape({batch.lengths.size()});
  std::copy(batch.lengths.begin(), batch.lengths.end(), lengths.begin());
  save_npy(stem + ".tokens.npy", as_floats(batch.tokens));
  save_npy(stem + ".targets.npy", as_floats(batch.targets));
  save_npy(stem + ".lengths.npy", lengths);
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw Error("checkpoint file " + path.string() + ": cannot read it");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

void TrainConfig::validate() const {
  if (n == 0 || batch == 0 || eval_size == 0 || layers == 0)
    throw Error("train: n, batch, eval_size and layers must be at least 1");
  const auto made = make_task(task, n);
  if (made->needs_causal() && !causal_model())
    throw Error("task '" + made->spec() +
                "' is a language model: it needs train --causal (a "
                "bidirectional model would see the byte it is asked to predict)");
  model_config(*this, made->vocab()).validate();
  if (tied_embeddings && arch != models::Arch::llama)
    throw Error("train: tied_embeddings (--tied-embeddings) with arch " + models::arch_name(arch) +
                ": only --arch llama ties its head to the embedding");
  if (tied_embeddings && made->classes() != made->vocab())
    throw Error(
        "train: tied_embeddings (--tied-embeddings) needs as many classes as tokens: task '" +
        made->spec() + "' has " + std::to_string(made->classes()) + " classes and " +
        std::to_string(made->vocab()) + " tokens");
  adam.validate();
  for (const std::string& part : models::layer_specs(spec)) {  // each layer's core
    const auto attention = make_attention(part);
    if (causal_model() && !attention->support().causal)
      throw Unsupported(attention->name(),
                        "causal masks, which train --causal needs in every "
                        "attention call");
    if (kv_heads != 0 && kv_heads != heads && !attention->support().grouped_heads)
      throw Unsupported(attention->name(), "grouped heads, which train --kv-heads " +
                                               std::to_string(kv_heads) + " < --heads " +
                                               std::to_string(heads) + " needs");
  }
  models::require_memory(
      memory_bytes(), "train: n=" + std::to_string(n) + ", batch=" + std::to_string(batch) +
                          ", layers=" + std::to_string(layers) +
                          ", d_model=" + std::to_string(d_model) + ", ffn=" + std::to_string(ffn) +
                          ", eval_size=" + std::to_string(eval_size));
}

double TrainConfig::memory_bytes() const {
  const auto task_ = make_task(task, n);
  const models::ModelConfig model = model_config(*this, task_->vocab());
  const double classes = double(task_->classes()), d = double(d_model);
  const double parameters = model.parameter_count() + (tied_embeddings ? 0 : (d + 1) * classes);
  const double tokens = double(batch) * double(n);
  const double logits = double(head_rows(*task_, batch)) * classes;
  // Per layer its trace (activations and the gradient buffers it keeps), then the one set of
  // backward scratch the layers share (models/residual.hpp): Llama's SwiGLU keeps three hidden
  // activations and has four hidden gradients.
  const double hidden = arch == models::Arch::llama ? 3 * double(ffn) : double(ffn);
  const double scratch = arch == models::Arch::llama ? 4 * double(ffn) : double(ffn);
  // Grouped heads narrow k and v (kept in the trace) and their four gradients (scratch).
  const double narrower = kv_heads ? d - d / double(heads) * double(kv_heads) : 0;
  const double activations = double(layers) * tokens * (20 * d - 2 * narrower + hidden) +
                             tokens * (12 * d - 4 * narrower + scratch) + 2 * logits;
  const double held_out = 2.0 * double(eval_size) * double(n) * sizeof(std::int64_t);
  return 4 * (4 * parameters + activations) + held_out;
}

std::string TrainConfig::describe() const {
  std::ostringstream s;
  s.precision(17);
  std::string canonical;  // each layer's spec as the factory prints it
  for (const std::string& part : models::layer_specs(spec))
    canonical += (canonical.empty() ? "" : ";") + make_attention(part)->spec();
  s << "task " << make_task(task, n)->spec() << "\nspec " << canonical << "\nn " << n << "\nlayers "
    << layers << "\nd_model " << d_model << "\nheads " << heads << "\nffn " << ffn << "\nswitches "
    << switches << "\nbatch " << batch << "\nseed " << seed << "\neval_size " << eval_size
    << "\nlr " << adam.lr << "\nbeta1 " << adam.beta1 << "\nbeta2 " << adam.beta2 << "\neps "
    << adam.eps << "\nweight_decay " << adam.weight_decay << "\nwarmup " << adam.warmup << "\n";
  if (causal) s << "causal 1\n";
  if (!init.empty()) s << "init " << init << "\n";
  if (arch != models::Arch::transformer) s << "arch " << models::arch_name(arch) << "\n";
  if (kv_heads != 0) s << "kv_heads " << kv_heads << "\n";
  if (rope_base != TrainConfig{}.rope_base) s << "rope_base " << rope_base << "\n";
  if (tied_embeddings) s << "tied_embeddings 1\n";
  return s.str();
}

TrainConfig TrainConfig::parse(const std::string& lines, const std::string& where) {
  TrainConfig c;
  c.switches.clear();  // describe() writes "switches " with nothing after it for none
  std::istringstream in(lines);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const auto space = line.find(' ');
    const std::string key = line.substr(0, space);
    const std::string value = space == std::string::npos ? "" : line.substr(space + 1);
    const auto fail = [&]() -> Error {
      return Error(where + ": config line '" + line +
                   "' is not one TrainConfig::describe() writes");
    };
    const auto number = [&](auto& field) {
      std::istringstream v(value);
      if (!(v >> field) || !v.eof()) throw fail();
    };
    if (key == "task")
      c.task = value;
    else if (key == "spec")
      c.spec = value;
    else if (key == "switches")
      c.switches = value;
    else if (key == "init")
      c.init = value;
    else if (key == "n")
      number(c.n);
    else if (key == "layers")
      number(c.layers);
    else if (key == "d_model")
      number(c.d_model);
    else if (key == "heads")
      number(c.heads);
    else if (key == "ffn")
      number(c.ffn);
    else if (key == "batch")
      number(c.batch);
    else if (key == "seed")
      number(c.seed);
    else if (key == "eval_size")
      number(c.eval_size);
    else if (key == "lr")
      number(c.adam.lr);
    else if (key == "beta1")
      number(c.adam.beta1);
    else if (key == "beta2")
      number(c.adam.beta2);
    else if (key == "eps")
      number(c.adam.eps);
    else if (key == "weight_decay")
      number(c.adam.weight_decay);
    else if (key == "warmup")
      number(c.adam.warmup);
    else if (key == "causal")
      c.causal = value == "1" ? true : throw fail();
    else if (key == "arch")
      c.arch = models::parse_arch(value);
    else if (key == "kv_heads")
      number(c.kv_heads);
    else if (key == "rope_base")
      number(c.rope_base);
    else if (key == "tied_embeddings")
      c.tied_embeddings = value == "1" ? true : throw fail();
    else
      throw fail();
  }
  return c;
}

TrainConfig checkpoint_config(const std::string& path) {
  const bool here = fs::exists(fs::path(path) / "state.txt");
  if (!here && !fs::exists(fs::path(path + ".old") / "state.txt"))
    throw Error("'" + path +
                "' is not a checkpoint folder of attnlab train: it has no "
                "state.txt (give the run's checkpoint/ folder, e.g. runs/lm/checkpoint)");
  const std::string dir = here ? path : path + ".old";
  std::istringstream state(read_text(fs::path(dir) / "state.txt"));
  std::string line, lines;
  for (int skip = 0; skip < 2 && std::getline(state, line); ++skip) {
  }  // step, seconds
  while (std::getline(state, line) && line != "end") lines += line + "\n";
  return TrainConfig::parse(lines, "checkpoint file " + dir + "/state.txt");
}

Trainer::Trainer(const TrainConfig& config)
    : config_((config.validate(), config)),
      task_(make_task(config.task, config.n)),
      model_(model_config(config, task_->vocab()), task_->classes(), task_->output(),
             config.causal_model(), config.tied_embeddings),
      grad_(zero_like(model_)),
      adam_(config.adam) {
  if (!config_.init.empty()) model_.load(config_.init);
}

Score Trainer::step(StepTimes* times) {
  auto start = Clock::now();
  const Batch batch = task_->batch(config_.batch, data_seed(config_.seed, 1, steps() + 1));
  if (times) times->data += since(start);
  if (!config_.dump_batches.empty()) dump(batch, config_.dump_batches, steps() + 1);  // untimed
  start = Clock::now();
  auto params = model_.parameters(), grads = grad_.parameters();
  models::zero_gradients(grads);
  const Score score = loss_and_gradients(model_, batch, grad_, workspace_);
  if (times) times->gradients += since(start);
  start = Clock::now();
  adam_.step(params, grads);
  if (times) times->update += since(start);
  return score;
}

const std::vector<Batch>& Trainer::held_out() {
  if (eval_.empty())
    for (std::size_t i = 0, left = config_.eval_size; left > 0; ++i) {
      const std::size_t size = std::min(left, config_.batch);
      eval_.push_back(task_->held_out(size, data_seed(config_.seed, 2, i)));
      left -= size;
    }
  return eval_;
}

Score Trainer::evaluate() {
  return training::evaluate(model_, held_out());
}

namespace {

// Removes a checkpoint folder that is no longer wanted: renamed to DIR.trash first (one atomic
// step), so that a kill during the removal leaves a partial folder only under a name that is
// never loaded.
void discard(const std::string& folder, const std::string& trash) {
  std::error_code ec;
  fs::remove_all(trash, ec);
  fs::rename(folder, trash, ec);
  if (ec)
    throw Error("checkpoint " + folder + ": cannot move it to " + trash + ": " + ec.message());
  fs::remove_all(trash, ec);
}

bool complete(const std::string& folder) {
  return fs::exists(fs::path(folder) / "state.txt");
}

}  // namespace

void Trainer::save(const std::string& dir) {
  const std::string tmp = dir + ".tmp", old = dir + ".old", trash = dir + ".trash";
  std::error_code ec;
  fs::remove_all(tmp, ec);  // what a kill or a failed save left: never loaded
  fs::remove_all(trash, ec);
  if (complete(dir) && fs::exists(old)) discard(old, trash);  // a kill after the last rename
  try {
    const models::Parameters params = model_.parameters();
    models::save_weights(tmp, params);
    models::save_weights(tmp + "/optimizer", adam_.state(params));
    std::ofstream state(tmp + "/state.txt");  // last: a folder with state.txt is complete
    state.precision(17);
    state << "step " << steps() << "\nseconds " << seconds << "\n"
          << config_.describe() << "end\n";  // the end line: a complete file
    if (!state.flush()) throw Error("checkpoint file " + tmp + "/state.txt: cannot write it");
  } catch (...) {
    fs::remove_all(tmp, ec);  // a full disk leaves nothing half-written behind
    throw;
  }
  if (complete(dir)) {
    fs::rename(dir, old, ec);
    if (ec) throw Error("checkpoint " + dir + ": cannot move it to " + old + ": " + ec.message());
  }
  fs::rename(tmp, dir, ec);
  if (ec) throw Error("checkpoint " + tmp + ": cannot rename it to " + dir + ": " + ec.message());
  if (fs::exists(old)) discard(old, trash);
}

bool Trainer::has_checkpoint(const std::string& dir) {
  return fs::exists(fs::path(dir) / "state.txt") ||
         fs::exists(fs::path(dir + ".old") / "state.txt");
}

void Trainer::load(const std::string& path) {
  // A kill between save()'s two renames leaves only DIR.old, which is complete.
  const std::string dir = fs::exists(fs::path(path) / "state.txt") ? path : path + ".old";
  std::istringstream state(read_text(fs::path(dir) / "state.txt"));
  std::size_t step = 0;
  double seconds_so_far = 0;
  std::string key, line;
  if (!(state >> key >> step) || key != "step" || !(state >> key >> seconds_so_far) ||
      key != "seconds")
    throw Error("checkpoint file " + dir +
                "/state.txt is truncated or corrupt: expected "
                "'step T' and 'seconds S' first (remove " +
                dir + " to start over)");
  std::getline(state, line);
  // The config lines up to "end"; a state.txt without that line was cut short or written before
  // it had one (which stays readable).
  std::vector<std::string> has, wants;
  bool ended = false;
  while (!ended && std::getline(state, line))
    if (!(ended = line == "end")) has.push_back(line);
  std::istringstream expected(config_.describe());
  for (std::string want; std::getline(expected, want);) wants.push_back(want);
  for (std::size_t i = 0; i < std::max(has.size(), wants.size()); ++i) {
    if (i < has.size() && i < wants.size() && has[i] == wants[i]) continue;
    if (i >= has.size() && !ended)
      throw Error("checkpoint file " + dir +
                  "/state.txt is truncated or corrupt: it ends "
                  "before the config line '" +
                  wants[i] + "' (remove " + dir + " to start over)");
    throw Error("checkpoint " + dir + " was written by another run: it has '" +
                (i < has.size() ? has[i] : "(nothing)") + "', this run '" +
                (i < wants.size() ? wants[i] : "(nothing)") +
                "' (use the same options, or another --out)");
  }
  TaskModel model = model_;
  models::Adam adam(config_.adam);
  const models::Parameters params = model.parameters();
  models::load_weights(dir, params);
  models::load_weights(dir + "/optimizer", adam.state(params));
  adam.set_steps(step);
  model_ = std::move(model);
  adam_ = std::move(adam);
  seconds = seconds_so_far;
}

StepSplit measure_split(const Trainer& trainer, std::size_t rounds) {
  if (rounds == 0) return {};
  const TrainConfig& c = trainer.config();
  TaskModel model = trainer.model();
  TaskModel grad = zero_like(model);
  StepWorkspace workspace;
  models::Adam adam(c.adam);
  const Batch batch = trainer.task().batch(c.batch, data_seed(c.seed, 3, 0));

  // One untimed step first: the workspace's buffers are allocated then, as in a run's first step.
  loss_and_gradients(model, batch, grad, workspace);
  std::vector<double> step_s, attention_s, gemm_s;
  for (std::size_t r = 0; r < rounds; ++r) {
    models::StepClock clock;
    const models::RunningClock running(clock);
    const auto start = Clock::now();
    auto params = model.parameters(), grads = grad.parameters();
    models::zero_gradients(grads);
    loss_and_gradients(model, batch, grad, workspace);
    adam.step(params, grads);
    step_s.push_back(since(start));
    attention_s.push_back(clock.attention);
    gemm_s.push_back(clock.gemm);
  }
  return {median(step_s), median(attention_s), median(gemm_s), rounds};
}

}  // namespace attnlab::training
