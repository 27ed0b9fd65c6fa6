// The trained model of the studies that take weights (studies/common.hpp's TrainedPair).
#include <filesystem>
#include <string>

#include "attnlab/error.hpp"
#include "studies/common.hpp"

namespace attnlab::studies {
namespace fs = std::filesystem;

TrainedPair load_trained(const StudyOptions& o) {
  std::string dir = o.weights;
  // A run folder of attnlab train holds its checkpoint in checkpoint/.
  if (!training::Trainer::has_checkpoint(dir) &&
      training::Trainer::has_checkpoint((fs::path(dir) / "checkpoint").string()))
    dir = (fs::path(dir) / "checkpoint").string();
  const training::TrainConfig config = training::checkpoint_config(dir);
  if (config.arch != models::Arch::transformer)  // they read the 2017 encoder's layers
    throw Unsupported("studies trained and prune",
                      "checkpoints of --arch " + models::arch_name(config.arch) + " (" + dir + ")");
  TrainedPair pair{dir, std::make_unique<training::Trainer>(config),
                   std::make_unique<training::Trainer>(config)};
  pair.trained->load(dir);
  return pair;
}

std::string bits_unit(const training::TrainConfig& config) {
  return config.task == "text" ? "bits per byte" : "bits per target";
}

std::string TrainedPair::describe() const {
  const training::TrainConfig& c = trained->config();
  const std::string switches = c.switches.empty() ? "no switches" : "switches " + c.switches;
  return "`attnlab train` checkpoint `" + checkpoint + "`: task " + c.task + ", " +
         (c.causal ? "causal (decoder-only), " : "") + "attention " + c.spec +
         ", N = " + std::to_string(c.n) + ", " + std::to_string(c.layers) + " layers, d_model " +
         std::to_string(c.d_model) + ", " + std::to_string(c.heads) + " heads, FFN " +
         std::to_string(c.ffn) + ", " + switches + ", seed " + std::to_string(c.seed) +
         ", trained " + std::to_string(trained->steps()) + " steps (batch " +
         std::to_string(c.batch) + ", lr " + cell("%g", c.adam.lr) + ", warm-up " +
         std::to_string(c.adam.warmup) +
         "). Untrained: the same config and seed at step 0, "
         "the weights the run started from. Held-out set: the run's own, " +
         std::to_string(c.eval_size) +
         " examples of the task's held_out() (the validation "
         "split for text) in batches of " +
         std::to_string(c.batch) +
         ", as `attnlab train` "
         "scores them.";
}

}  // namespace attnlab::studies
