// attnlab train: train a Transformer encoder (or with --arch llama a Llama-style decoder) with the
// attention core SPEC on a seeded task (training/tasks.hpp), with a progress line, checkpoints,
// and resume after a kill.
//   attnlab train --task mqar --spec SPEC [--n 256 --layers 2 --d-model 64 --heads 4 --ffn 256
//                 --batch 32 --steps 1000 --seed 1 --lr 3e-3 --warmup 100 --out DIR
//                 --arch llama --kv-heads 2 --rope-base 10000 --tied-embeddings ...]
// The loop is training::run_training (training/run.hpp), which writes into DIR: train.csv (every
// step's batch loss, accuracy and loss in bits; bits per byte for the text task), eval.csv (the
// held-out score every --eval-every steps and at the end) and checkpoint/; this command parses
// the options, prints the messages and adds summary.json (the config, final scores, time per
// step, peak memory, the time split with --profile, and the context: commit, machine, load).
// Rerunning the same command continues from DIR/checkpoint where a previous run stopped (killed or
// finished): the result equals an uninterrupted run's (docs/training.md).
#include <malloc.h>
#include <sys/resource.h>

#include <cstdio>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "attnlab/error.hpp"
#include "cli/options.hpp"
#include "harness/heap.hpp"
#include "harness/meta.hpp"
#include "models/transformer.hpp"
#include "training/run.hpp"
#include "training/tasks.hpp"
#include "training/trainer.hpp"

namespace attnlab::cli {
namespace {

struct TrainOptions {
  training::TrainConfig config;
  training::RunOptions run;
  std::size_t profile = 0;
  bool quiet = false;
  std::string arch = "transformer";
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

void run_train(TrainOptions& o) {
  if (o.run.eval_every == 0 || o.run.checkpoint_every == 0)
    throw Error("train: --eval-every and --checkpoint-every must be at least 1");
  o.config.arch = models::parse_arch(o.arch);
  keep_freed_memory();
  training::Trainer trainer(o.config);
  o.run.progress = o.quiet ? nullptr : stderr;
  const std::string spec = trainer.model().spec();
  double load_before = 0;
  std::int64_t live = 0;
  training::RunEvents events;
  if (!o.quiet)
    events.resumed = [](const std::string& checkpoint, std::size_t step) {
      std::fprintf(stderr, "resuming from %s at step %zu\n", checkpoint.c_str(), step);
    };
  events.loop_starting = [&] {
    load_before = harness::load_average_1min();
    harness::heap::reset_peak();
    live = harness::heap::live_bytes();
  };
  // The run's description, once its first step has run: a run that cannot take one (a spec that
  // refuses the task's shapes) fails with the error's one line alone.
  if (!o.quiet)
    events.first_step = [&] {
      std::fprintf(stderr,
                   "attnlab train: %s on %s (%s), N %zu, %zu layers, d_model %zu, %zu heads, "
                   "batch %zu, %zu steps -> %s\n",
                   spec.c_str(), trainer.task().spec().c_str(),
                   models::arch_name(o.config.arch).c_str(), o.config.n, o.config.layers,
                   o.config.d_model, o.config.heads, o.config.batch, o.run.steps,
                   o.run.out.c_str());
    };
  const training::RunResult run = training::run_training(trainer, o.run, events);
  const training::Score& eval = run.eval;
  const training::StepTimes& times = run.times;
  const std::int64_t peak_heap = harness::heap::peak_bytes() - live;

  nlohmann::json summary = harness::run_context();
  summary["config"] = trainer.config().describe();
  summary["task"] = trainer.task().spec();
  summary["spec"] = spec;
  summary["steps"] = trainer.steps();
  summary["eval"] = score_json(eval);
  summary["train_seconds"] = trainer.seconds;
  summary["seconds_per_step"] = run.trained ? run.session_seconds / double(run.trained) : 0.0;
  summary["step_parts_seconds"] = {
      {"data", times.data}, {"gradients", times.gradients}, {"update", times.update}};
  summary["peak_heap_bytes"] = peak_heap;
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  summary["max_rss_bytes"] = static_cast<std::int64_t>(usage.ru_maxrss) * 1024;
  summary["loadavg_before"] = load_before;
  summary["loadavg_after"] = harness::load_average_1min();
  summary["resumed_at_step"] = run.resumed_at;
  if (o.profile > 0) {
    const training::StepSplit s = training::measure_split(trainer, o.profile);
    summary["split"] = {{"step_seconds", s.step},
                        {"attention_seconds", s.attention},
                        {"gemm_seconds", s.gemm},
                        {"rest_seconds", s.step - s.attention - s.gemm},
                        {"rounds", s.rounds}};
  }
  harness::write_atomically(o.run.out + "/summary.json", summary.dump(2) + "\n");

  std::printf(
      "%s on %s: %zu steps, eval loss %.4f (%.4f bits per target), accuracy %.2f%% (%zu "
      "targets); %.3f s/step, "
      "peak extra heap %.1f MiB\n",
      summary["spec"].get<std::string>().c_str(), trainer.task().spec().c_str(), trainer.steps(),
      eval.loss, eval.bits(), 100 * eval.accuracy(), eval.count,
      summary["seconds_per_step"].get<double>(), double(peak_heap) / 1048576.0);
  if (summary.contains("split")) {
    const auto& s = summary["split"];
    const double step = s["step_seconds"];
    std::printf(
        "time split of a step (%zu rounds, medians): step %.4f s = attention %.4f s "
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
  CLI::App* cmd = app.add_subcommand("train",
                                     "Train a Transformer encoder (or --arch llama decoder) with "
                                     "SPEC as its attention on a seeded task (" +
                                         join_names(training::task_names()) + "); resumable");
  cmd->footer("Tasks: " + training::task_usage() +
              " (docs/training.md).\nRerunning the same command with the same --out resumes from "
              "its checkpoint.\nExample: attnlab train --task mqar --spec linear --n 256 --steps "
              "2000 --out runs/mqar-linear");
  cmd->add_option("--task", c.task, "Task factory string")->capture_default_str();
  cmd->add_option("--spec", c.spec, "Attention factory string, e.g. full or linear")->required();
  cmd->add_option("--n", c.n, "Sequence length")->check(kNotNegative)->capture_default_str();
  cmd->add_option("--layers", c.layers, "Encoder layers")
      ->check(kNotNegative)
      ->capture_default_str();
  cmd->add_option("--d-model", c.d_model, "Model width")
      ->check(kNotNegative)
      ->capture_default_str();
  cmd->add_option("--heads", c.heads, "Attention heads (must divide d_model)")
      ->check(kNotNegative)
      ->capture_default_str();
  cmd->add_option("--ffn", c.ffn, "FFN hidden size")->check(kNotNegative)->capture_default_str();
  cmd->add_option("--switches", c.switches,
                  "Any of " + models::switch_names() + ", comma separated")
      ->capture_default_str();
  cmd->add_option("--arch", o->arch,
                  "The block: transformer (the 2017 encoder) or llama (RMSNorm, rotary q and k, "
                  "SwiGLU, no biases; always causal)")
      ->capture_default_str();
  cmd->add_option(
         "--kv-heads", c.kv_heads,
         "Key and value heads (arch llama; must divide --heads; 0: as many as --heads; fewer: "
         "grouped heads, for a core that takes them)")
      ->check(kNotNegative)
      ->capture_default_str();
  cmd->add_option("--rope-base", c.rope_base, "Rotary embeddings' base (arch llama)")
      ->capture_default_str();
  cmd->add_flag("--tied-embeddings", c.tied_embeddings,
                "The token embedding is the head (arch llama; a task with as many classes as "
                "tokens)");
  cmd->add_flag("--causal", c.causal,
                "Decoder-only (GPT-style): every attention call causal, each token predicted "
                "from its prefix");
  cmd->add_option("--init", c.init,
                  "Initial weights from this weights folder (torch state_dict names) instead of "
                  "the seeded ones");
  cmd->add_option("--dump-batches", c.dump_batches,
                  "Write each step's batch to this folder as step-T.{tokens,targets,lengths}.npy");
  cmd->add_option("--batch", c.batch, "Examples per step")
      ->check(kNotNegative)
      ->capture_default_str();
  cmd->add_option("--steps", o->run.steps, "Train until this step")
      ->check(kNotNegative)
      ->capture_default_str();
  cmd->add_option("--seed", c.seed, "Weights and data seed")
      ->check(kNotNegative)
      ->capture_default_str();
  cmd->add_option("--lr", c.adam.lr, "Adam's peak learning rate")->capture_default_str();
  cmd->add_option("--warmup", c.adam.warmup, "Learning-rate warm-up steps")
      ->check(kNotNegative)
      ->capture_default_str();
  cmd->add_option("--weight-decay", c.adam.weight_decay, "Decoupled weight decay")
      ->capture_default_str();
  cmd->add_option("--eval-size", c.eval_size, "Held-out examples")
      ->check(kNotNegative)
      ->capture_default_str();
  cmd->add_option("--eval-every", o->run.eval_every, "Score the held-out set every this many steps")
      ->check(kNotNegative)
      ->capture_default_str();
  cmd->add_option("--checkpoint-every", o->run.checkpoint_every, "Checkpoint every this many steps")
      ->check(kNotNegative)
      ->capture_default_str();
  cmd->add_option("--profile", o->profile,
                  "After training, measure ROUNDS steps split into attention, GEMMs and the rest")
      ->check(kNotNegative)
      ->capture_default_str();
  cmd->add_option("--out", o->run.out, "Output folder (logs, checkpoint, summary.json)")
      ->capture_default_str();
  cmd->add_flag("--quiet", o->quiet, "No progress on stderr");
  cmd->callback([o] { run_train(*o); });
}

}  // namespace attnlab::cli
