// attnlab model: one forward pass of a Transformer encoder (or with --arch llama a Llama-style
// decoder) with the attention core SPEC, beside the same model (same weights) with `full`
// attention, layer by layer.
//   attnlab model --spec SPEC [--layers 6 --d-model 512 --heads 8 --ffn 2048 --n 4096
//                 --batch 1 --vocab 256 --switches pre-ln,no-ffn,... --seed 1
//                 --arch llama --kv-heads 2 --rope-base 10000
//                 --weights DIR --save-weights DIR]
// The defaults are the Long Range Arena text model (byte tokens, N = 4096). Input: seeded random
// tokens. Prints each layer's time for both models and the distance of SPEC's layer output from
// full's (rel_fro, max_abs, mean_cos over the B·N token vectors), then the totals and the peak
// extra heap memory of each forward (harness/heap.hpp).
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "attnlab/attnlab.hpp"
#include "cli/options.hpp"
#include "harness/heap.hpp"
#include "models/llama.hpp"
#include "models/transformer.hpp"

namespace attnlab::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct ModelOptions {
  std::string spec, switches, weights, save_weights, arch = "transformer";
  models::ModelConfig config;
  std::size_t n = 4096, batch = 1;
};

struct Run {
  double seconds = 0;
  std::int64_t peak_bytes = 0;
  std::vector<double> layer_seconds;
};

// Sees each layer's index, time and output.
using LayerTimer = std::function<void(std::size_t, double, const models::Activations&)>;

// One forward with per-layer times and the extra heap peak.
template <class Model>
Run timed_forward(const Model& model, const models::Tokens& tokens, const LayerTimer& observe) {
  Run run;
  harness::heap::reset_peak();
  const std::int64_t live = harness::heap::live_bytes();
  auto last = Clock::now();
  const auto start = last;
  model.forward(tokens, {}, [&](std::size_t i, const auto&, const models::Activations& out) {
    run.layer_seconds.push_back(std::chrono::duration<double>(Clock::now() - last).count());
    observe(i, run.layer_seconds.back(), out);
    last = Clock::now();  // the observer's own time is not the layer's
  });
  run.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  run.peak_bytes = harness::heap::peak_bytes() - live;
  return run;
}

std::string describe(const ModelOptions& o) {
  const auto& l = o.config.layer;
  const std::string switches = models::switches_text(l);
  const bool llama = o.config.arch == models::Arch::llama;
  return std::to_string(o.config.layers) + " layers, d_model " + std::to_string(l.d_model) + ", " +
         std::to_string(l.heads) + " heads (d_k " + std::to_string(l.d_model / l.heads) +
         (llama && l.kv_heads ? ", " + std::to_string(l.kv_heads) + " key and value heads" : "") +
         "), FFN " + std::to_string(l.ffn) + ", " +
         (llama              ? switches
          : switches.empty() ? "post-LN"
                             : switches) +
         "; batch " + std::to_string(o.batch) + ", N " + std::to_string(o.n) + ", vocab " +
         std::to_string(o.config.vocab);
}

const std::string& spec_of(const models::EncoderModel& m) {
  return m.encoder.layers.at(0).self_attn.spec();
}

const std::string& spec_of(const models::LlamaModel& m) {
  return m.layers.at(0).self_attn.spec();
}

// SPEC's model beside the same weights with full, layer by layer (see the header comment).
template <class Model>
void run_against_full(const ModelOptions& o, Model& model) {
  std::string origin = "seeded weights (seed " + std::to_string(o.config.seed) + ")";
  if (!o.weights.empty()) {
    const auto unused = model.load(o.weights);
    origin = "weights from " + o.weights +
             (unused.empty() ? "" : " (" + std::to_string(unused.size()) + " .npy files not used)");
  }
  if (!o.save_weights.empty()) model.save(o.save_weights);
  const auto full = model.with_attention("full");
  const auto tokens = models::random_tokens(o.batch, o.n, o.config.vocab, o.config.seed + 1);
  const bool llama = o.config.arch == models::Arch::llama;
  std::printf("attnlab model: %s in a %s: %s; %s\n", spec_of(model).c_str(),
              llama ? "Llama-style causal decoder" : "Transformer encoder", describe(o).c_str(),
              origin.c_str());
  std::printf("reference: the same model with full attention, run first\n");
  std::fflush(stdout);
  std::vector<models::Activations> reference;
  const Run base = timed_forward(
      full, tokens, [&](std::size_t, double, const auto& out) { reference.push_back(out); });
  std::printf("%5s %10s %10s %10s %10s %10s\n", "layer", "full s", "spec s", "rel_fro", "max_abs",
              "mean_cos");
  const std::size_t width = o.config.layer.d_model, rows = o.batch * o.n;
  const Run run = timed_forward(model, tokens, [&](std::size_t i, double seconds, const auto& out) {
    const ErrorMetrics e = compare(out.data(), reference[i].data(), rows, width);
    std::printf("%5zu %10.4f %10.4f %10.3e %10.3e %10.6f\n", i + 1, base.layer_seconds[i], seconds,
                e.rel_fro, e.max_abs, e.mean_cos);
    std::fflush(stdout);
  });
  std::printf(
      "total: full %.4f s, spec %.4f s, speed-up over full %.2fx; peak extra heap: full "
      "%.1f MiB, spec %.1f MiB\n",
      base.seconds, run.seconds, base.seconds / run.seconds, base.peak_bytes / 1048576.0,
      run.peak_bytes / 1048576.0);
  if (!o.save_weights.empty()) std::printf("weights written to %s\n", o.save_weights.c_str());
}

void run_model(ModelOptions& o) {
  if (o.n == 0 || o.batch == 0) throw Error("model: --n and --batch must be at least 1");
  models::apply_switches(o.config.layer, o.switches);
  o.config.layer.spec = o.spec;
  o.config.arch = models::parse_arch(o.arch);
  o.config.validate();
  // Refused before anything is allocated or written: two models' weights (SPEC's and full's),
  // the reference's output of every layer, one layer's working activations and the tokens.
  const double token_count = double(o.batch) * double(o.n), d = double(o.config.layer.d_model);
  const double hidden = double(o.config.layer.ffn) * (o.config.arch == models::Arch::llama ? 3 : 1);
  models::require_memory(4 * (2 * o.config.parameter_count() +
                              token_count * (double(o.config.layers) * d + 6 * d + hidden)) +
                             8 * token_count,
                         "model: --n " + std::to_string(o.n) + " with --batch " +
                             std::to_string(o.batch) + ", --layers " +
                             std::to_string(o.config.layers) + ", --d-model " +
                             std::to_string(o.config.layer.d_model) + " and --ffn " +
                             std::to_string(o.config.layer.ffn));
  if (o.config.arch == models::Arch::llama) {
    models::LlamaModel model(o.config);
    run_against_full(o, model);
  } else {
    models::EncoderModel model(o.config);
    run_against_full(o, model);
  }
}

}  // namespace

void add_model_command(CLI::App& app) {
  auto o = std::make_shared<ModelOptions>();
  CLI::App* cmd = app.add_subcommand(
      "model",
      "One forward pass of a Transformer encoder (or --arch llama decoder) with SPEC as its "
      "attention, against the same model with full attention, layer by layer");
  cmd->footer(
      "Defaults: the Long Range Arena text model (6 layers, 8 heads, d_model 512, FFN 2048, byte "
      "tokens, N 4096), post-LN, seeded weights.\nSwitches: " +
      models::switch_names() +
      " (comma separated).\nWeights: a folder of <PyTorch state_dict key>.npy files "
      "(embedding.weight, encoder.layers.0.self_attn.in_proj_weight, ...; see --save-weights).\n"
      "Example: attnlab model --spec sliding:left=64,right=64 --n 1024 --layers 2");
  cmd->add_option("--spec", o->spec, "Attention factory string, e.g. linear or bigbird")
      ->required();
  cmd->add_option("--layers", o->config.layers, "Encoder layers")
      ->check(kNotNegative)
      ->capture_default_str();
  cmd->add_option("--d-model", o->config.layer.d_model, "Model width")
      ->check(kNotNegative)
      ->capture_default_str();
  cmd->add_option("--heads", o->config.layer.heads, "Attention heads (must divide d_model)")
      ->check(kNotNegative)
      ->capture_default_str();
  cmd->add_option("--ffn", o->config.layer.ffn, "FFN hidden size")
      ->check(kNotNegative)
      ->capture_default_str();
  cmd->add_option("--arch", o->arch,
                  "The block: transformer (the 2017 encoder) or llama (a causal decoder: "
                  "RMSNorm, rotary q and k, SwiGLU, no biases)")
      ->capture_default_str();
  cmd->add_option(
         "--kv-heads", o->config.layer.kv_heads,
         "Key and value heads (arch llama; must divide --heads; 0: as many as --heads; fewer: "
         "grouped heads, for a core that takes them)")
      ->check(kNotNegative)
      ->capture_default_str();
  cmd->add_option("--rope-base", o->config.layer.rope_base, "Rotary embeddings' base (arch llama)")
      ->capture_default_str();
  cmd->add_option("--n", o->n, "Sequence length")->check(kNotNegative)->capture_default_str();
  cmd->add_option("--batch", o->batch, "Batch size")->check(kNotNegative)->capture_default_str();
  cmd->add_option("--vocab", o->config.vocab, "Vocabulary (token ids 0..vocab-1)")
      ->check(kNotNegative)
      ->capture_default_str();
  cmd->add_option("--switches", o->switches,
                  "Any of " + models::switch_names() + ", comma separated");
  cmd->add_option("--seed", o->config.seed, "Weights seed (tokens use seed + 1)")
      ->check(kNotNegative)
      ->capture_default_str();
  cmd->add_option("--weights", o->weights, "Load the weights from this folder of .npy files");
  cmd->add_option("--save-weights", o->save_weights, "Write the model's weights to this folder");
  cmd->callback([o] { run_model(*o); });
}

}  // namespace attnlab::cli
