// attnlab train: train a Transformer encoder with the attention core SPEC on a seeded task
// (training/tasks.hpp), with a progress line, checkpoints, and resume after a kill.
//   attnlab train --task mqar --spec SPEC [--n 256 --layers 2 --d-model 64 --heads 4 --ffn 256
//                 --batch 32 --steps 1000 --seed 1 --lr 3e-3 --warmup 100 --out DIR ...]
// Writes into DIR: train.csv (every step's batch loss, accuracy and loss in bits; bits per
// byte for the text task), eval.csv (the held-out
// score every --eval-every steps and at the end), checkpoint/ (training/trainer.hpp), and
// summary.json (the config, final scores, time per step, peak memory, the time split with
// --profile, and the context: commit, machine, load). Rerunning the same command continues from
// DIR/checkpoint where a previous run stopped (killed or finished): the result equals an
// uninterrupted run's (docs/training.md).
#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "attnlab/error.hpp"
#include "harness/heap.hpp"
#include "harness/meta.hpp"
#include "harness/progress.hpp"
#include "training/tasks.hpp"
#include "training/trainer.hpp"
#include "cli/options.hpp"

namespace attnlab::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct TrainOptions {
  training::TrainConfig config;
  std::size_t steps = 1000, eval_every = 100, checkpoint_every = 100, profile = 0;
  std::string out = "runs/train";
  bool quiet = false;
};

const std::string kLogHeader = "step,loss,accuracy,seconds,bits";

// Keeps the rows of a CSV log whose step (first column) is at most `step`: what a resumed run
// has done. A row cut short by a kill (fewer columns than the header) goes too. A missing log
// stays missing: append() starts it with its first row, so that a run failing before its first
// step leaves no header-only file.
void cut_log(const std::string& path, std::size_t step) {
  if (!fs::exists(path)) return;
  const auto columns = std::count(kLogHeader.begin(), kLogHeader.end(), ',');
  std::string kept = kLogHeader + "\n", line;
  std::ifstream in(path);
  std::getline(in, line);  // the header
  while (std::getline(in, line)) {
    char* end = nullptr;
    const unsigned long long row_step = std::strtoull(line.c_str(), &end, 10);
    if (std::count(line.begin(), line.end(), ',') == columns && end && *end == ',' &&
        row_step <= step)
      kept += line + "\n";
  }
  in.close();
  harness::write_atomically(path, kept);
}

void append(const std::string& path, const std::string& row) {
  const bool start = !fs::exists(path) || fs::is_empty(path);
  std::ofstream out(path, std::ios::app);
  out << (start ? kLogHeader + "\n" : "") << row << "\n";
  if (!out.flush()) throw Error(path + ": cannot append to it");
}

std::string csv_row(std::size_t step, const training::Score& s, double seconds) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "%zu,%.6f,%.6f,%.4f,%.6f", step, s.loss, s.accuracy(), seconds,
                s.bits());
  return buf;
}

// The progress line: redrawn in place on a terminal, plain lines (every ~5% and at each
// evaluation) otherwise.
class ProgressLine {
 public:
  ProgressLine(std::size_t steps, bool quiet)
      : steps_(steps), every_(std::max<std::size_t>(1, steps / 20)), quiet_(quiet),
        tty_(isatty(fileno(stderr))) {}
  ~ProgressLine() {
    if (drawn_) std::fputc('\n', stderr);
  }

  void show(std::size_t step, const training::Score& batch, const training::Score* eval,
            double seconds_per_step) {
    if (quiet_ || (!tty_ && !eval && step % every_ != 0 && step != steps_)) return;
    char text[256];
    std::snprintf(text, sizeof text, "step %zu/%zu  loss %.4f  acc %5.1f%%", step, steps_,
                  batch.loss, 100 * batch.accuracy());
    std::string line = text;
    if (eval) last_eval_ = 100 * eval->accuracy();
    if (last_eval_ >= 0) {
      std::snprintf(text, sizeof text, "  eval %5.1f%%", last_eval_);
      line += text;
    }
    std::snprintf(text, sizeof text, "  %.3f s/step  ETA %s", seconds_per_step,
                  harness::format_duration(seconds_per_step * double(steps_ - step)).c_str());
    line += text;
    if (tty_) {
      std::fprintf(stderr, "\r\033[K%s", line.c_str());
      drawn_ = true;
    } else {
      std::fprintf(stderr, "%s\n", line.c_str());
    }
    std::fflush(stderr);
  }

 private:
  std::size_t steps_, every_;
  bool quiet_, tty_, drawn_ = false;
  double last_eval_ = -1;
};

nlohmann::json score_json(const training::Score& s) {
  return {{"loss", s.loss}, {"bits", s.bits()}, {"accuracy", s.accuracy()}, {"count", s.count}};
}

// A step allocates and frees the same few MiB-sized activations every time. glibc would hand
// the big ones back to the kernel at each free (mmap, heap trimming), so that every step pays
// their 4 KiB page faults again: measured on our VM at N = 256, that was 65% of a step. Keep
// freed memory in the heap instead (M_MMAP_THRESHOLD at its 64-bit maximum, no trimming).
void keep_freed_memory() {
#ifdef M_MMAP_THRESHOLD
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
}

void train_into(const TrainOptions& o, training::Trainer& trainer);

void run_train(TrainOptions& o) {
  if (o.eval_every == 0 || o.checkpoint_every == 0)
    throw Error("train: --eval-every and --checkpoint-every must be at least 1");
  keep_freed_memory();
  training::Trainer trainer(o.config);
  const std::string checkpoint = o.out + "/checkpoint";
  const bool fresh_out = !fs::exists(o.out);
  fs::create_directories(o.out);
  try {
    train_into(o, trainer);
  } catch (...) {
    std::error_code ec;
    if (fresh_out && fs::is_empty(o.out, ec)) fs::remove(o.out, ec);  // a failed start: no trace
    throw;
  }
}

// The loop, the logs and the summary of run_train, in the folder o.out that exists.
void train_into(const TrainOptions& o, training::Trainer& trainer) {
  const std::string checkpoint = o.out + "/checkpoint";
  std::size_t first = 0;
  if (training::Trainer::has_checkpoint(checkpoint)) {
    trainer.load(checkpoint);
    first = trainer.steps();
    if (!o.quiet) std::fprintf(stderr, "resuming from %s at step %zu\n", checkpoint.c_str(), first);
  }
  const std::string train_csv = o.out + "/train.csv", eval_csv = o.out + "/eval.csv";
  cut_log(train_csv, first);
  cut_log(eval_csv, first);

  const double load_before = harness::load_average_1min();
  harness::heap::reset_peak();
  const std::int64_t live = harness::heap::live_bytes();
  // The run's description, once its first step has run: a run that cannot take one (a spec that
  // refuses the task's shapes) fails with the error's one line alone.
  bool announced = o.quiet;
  const auto announce = [&] {
    if (announced) return;
    announced = true;
    std::fprintf(stderr, "attnlab train: %s on %s, N %zu, %zu layers, d_model %zu, %zu heads, "
                         "batch %zu, %zu steps -> %s\n",
                 trainer.model().body.encoder.layers[0].self_attn.attention().spec().c_str(),
                 trainer.task().spec().c_str(), o.config.n, o.config.layers, o.config.d_model,
                 o.config.heads, o.config.batch, o.steps, o.out.c_str());
  };
  ProgressLine progress(o.steps, o.quiet);
  training::StepTimes times;
  double session_seconds = 0;
  training::Score eval;
  bool evaluated = false;
  for (std::size_t step = first + 1; step <= o.steps; ++step) {
    const auto start = Clock::now();
    const training::Score batch = trainer.step(&times);
    announce();
    const double took = std::chrono::duration<double>(Clock::now() - start).count();
    trainer.seconds += took;
    session_seconds += took;
    append(train_csv, csv_row(step, batch, trainer.seconds));
    evaluated = step % o.eval_every == 0 || step == o.steps;
    if (evaluated) {
      eval = trainer.evaluate();
      append(eval_csv, csv_row(step, eval, trainer.seconds));
    }
    progress.show(step, batch, evaluated ? &eval : nullptr,
                  session_seconds / double(step - first));
    if (step % o.checkpoint_every == 0 || step == o.steps) trainer.save(checkpoint);
  }
  announce();
  if (!evaluated) eval = trainer.evaluate();  // nothing left to train: score what is there
  const std::int64_t peak_heap = harness::heap::peak_bytes() - live;
  const std::size_t trained = trainer.steps() - first;

  nlohmann::json summary = harness::run_context();
  summary["config"] = trainer.config().describe();
  summary["task"] = trainer.task().spec();
  summary["spec"] = trainer.model().body.encoder.layers[0].self_attn.attention().spec();
  summary["steps"] = trainer.steps();
  summary["eval"] = score_json(eval);
  summary["train_seconds"] = trainer.seconds;
  summary["seconds_per_step"] = trained ? session_seconds / double(trained) : 0.0;
  summary["step_parts_seconds"] = {{"data", times.data}, {"gradients", times.gradients},
                                   {"update", times.update}};
  summary["peak_heap_bytes"] = peak_heap;
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  summary["max_rss_bytes"] = static_cast<std::int64_t>(usage.ru_maxrss) * 1024;
  summary["loadavg_before"] = load_before;
  summary["loadavg_after"] = harness::load_average_1min();
  summary["resumed_at_step"] = first;
  if (o.profile > 0) {
    const training::StepSplit s = training::measure_split(trainer, o.profile);
    summary["split"] = {{"step_seconds", s.step}, {"attention_seconds", s.attention},
                        {"gemm_seconds", s.gemm}, {"rest_seconds", s.step - s.attention - s.gemm},
                        {"rounds", s.rounds}};
  }
  harness::write_atomically(o.out + "/summary.json", summary.dump(2) + "\n");

  std::printf("%s on %s: %zu steps, eval loss %.4f (%.4f bits per target), accuracy %.2f%% (%zu "
              "targets); %.3f s/step, "
              "peak extra heap %.1f MiB\n",
              summary["spec"].get<std::string>().c_str(), trainer.task().spec().c_str(),
              trainer.steps(), eval.loss, eval.bits(), 100 * eval.accuracy(), eval.count,
              summary["seconds_per_step"].get<double>(), double(peak_heap) / 1048576.0);
  if (summary.contains("split")) {
    const auto& s = summary["split"];
    const double step = s["step_seconds"];
    std::printf("time split of a step (%zu rounds, medians): step %.4f s = attention %.4f s "
                "(%.0f%%) + GEMMs %.4f s (%.0f%%) + everything else %.4f s (%.0f%%)\n",
                o.profile, step, s["attention_seconds"].get<double>(),
                100 * s["attention_seconds"].get<double>() / step, s["gemm_seconds"].get<double>(),
                100 * s["gemm_seconds"].get<double>() / step, s["rest_seconds"].get<double>(),
                100 * s["rest_seconds"].get<double>() / step);
  }
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto o = std::make_shared<TrainOptions>();
  training::TrainConfig& c = o->config;
  CLI::App* cmd = app.add_subcommand(
      "train", "Train a Transformer encoder with SPEC as its attention on a seeded task (" +
                   join_names(training::task_names()) + "); resumable");
  cmd->footer("Tasks: " + training::task_usage() +
              " (docs/training.md).\nRerunning the same command with the same --out resumes from "
              "its checkpoint.\nExample: attnlab train --task mqar --spec linear --n 256 --steps "
              "2000 --out runs/mqar-linear");
  cmd->add_option("--task", c.task, "Task factory string")->capture_default_str();
  cmd->add_option("--spec", c.spec, "Attention factory string, e.g. full or linear")->required();
  cmd->add_option("--n", c.n, "Sequence length")->check(kNotNegative)->capture_default_str();
  cmd->add_option("--layers", c.layers, "Encoder layers")->check(kNotNegative)->capture_default_str();
  cmd->add_option("--d-model", c.d_model, "Model width")->check(kNotNegative)->capture_default_str();
  cmd->add_option("--heads", c.heads, "Attention heads (must divide d_model)")->check(kNotNegative)->capture_default_str();
  cmd->add_option("--ffn", c.ffn, "FFN hidden size")->check(kNotNegative)->capture_default_str();
  cmd->add_option("--switches", c.switches,
                  "pre-ln,no-skip,no-ffn,no-norm,tied-qk,no-final-norm (any subset)")
      ->capture_default_str();
  cmd->add_flag("--causal", c.causal,
                "Decoder-only (GPT-style): every attention call causal, each token predicted "
                "from its prefix");
  cmd->add_option("--init", c.init,
                  "Initial weights from this weights folder (torch state_dict names) instead of "
                  "the seeded ones");
  cmd->add_option("--dump-batches", c.dump_batches,
                  "Write each step's batch to this folder as step-T.{tokens,targets,lengths}.npy");
  cmd->add_option("--batch", c.batch, "Examples per step")->check(kNotNegative)->capture_default_str();
  cmd->add_option("--steps", o->steps, "Train until this step")->check(kNotNegative)->capture_default_str();
  cmd->add_option("--seed", c.seed, "Weights and data seed")->check(kNotNegative)->capture_default_str();
  cmd->add_option("--lr", c.adam.lr, "Adam's peak learning rate")->capture_default_str();
  cmd->add_option("--warmup", c.adam.warmup, "Learning-rate warm-up steps")->check(kNotNegative)->capture_default_str();
  cmd->add_option("--weight-decay", c.adam.weight_decay, "Decoupled weight decay")
      ->capture_default_str();
  cmd->add_option("--eval-size", c.eval_size, "Held-out examples")->check(kNotNegative)->capture_default_str();
  cmd->add_option("--eval-every", o->eval_every, "Score the held-out set every this many steps")
      ->check(kNotNegative)->capture_default_str();
  cmd->add_option("--checkpoint-every", o->checkpoint_every, "Checkpoint every this many steps")
      ->check(kNotNegative)->capture_default_str();
  cmd->add_option("--profile", o->profile,
                  "After training, measure ROUNDS steps split into attention, GEMMs and the rest")
      ->check(kNotNegative)->capture_default_str();
  cmd->add_option("--out", o->out, "Output folder (logs, checkpoint, summary.json)")
      ->capture_default_str();
  cmd->add_flag("--quiet", o->quiet, "No progress on stderr");
  cmd->callback([o] { run_train(*o); });
}

}  // namespace attnlab::cli
