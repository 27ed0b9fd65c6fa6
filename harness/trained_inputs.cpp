#include "harness/trained_inputs.hpp"

#include <charconv>
#include <filesystem>

#include "attnlab/error.hpp"
#include "attnlab/seed.hpp"
#include "training/trainer.hpp"

namespace attnlab::harness {
namespace fs = std::filesystem;
namespace {

constexpr const char* kPrefix = "trained:";
constexpr std::uint64_t kHeldOutStream = 6;  // after inputs.cpp's q, k, v, g and beta streams

[[noreturn]] void fail(const std::string& text, const std::string& why) {
  throw Error("input '" + text + "': " + why + " (expected trained:DIR[,layer=L])");
}

// DIR as found: from the current directory, else from the source tree; its checkpoint/ when DIR
// is a run folder.
std::string checkpoint_dir(const TrainedInput& in) {
  fs::path path(in.dir);
#ifdef ATTNLAB_SOURCE_DIR
  if (path.is_relative() && !fs::exists(path) && fs::exists(fs::path(ATTNLAB_SOURCE_DIR) / path))
    path = fs::path(ATTNLAB_SOURCE_DIR) / path;
#endif
  const std::string dir = path.string();
  if (!training::Trainer::has_checkpoint(dir) &&
      training::Trainer::has_checkpoint((path / "checkpoint").string()))
    return (path / "checkpoint").string();
  return dir;
}

training::TrainConfig config_of(const TrainedInput& in, std::string& dir) {
  dir = checkpoint_dir(in);
  try {
    training::TrainConfig c = training::checkpoint_config(dir);
    c.init.clear();  // the weights come from the checkpoint, not from where training started
    c.dump_batches.clear();
    return c;
  } catch (const Error& e) {
    fail(in.text, "dir=" + in.dir + ": " + e.what());
  }
}

}  // namespace

bool is_trained_input(const std::string& text) {
  return text.rfind(kPrefix, 0) == 0;
}

TrainedInput parse_trained_input(const std::string& text) {
  if (!is_trained_input(text)) fail(text, "not a trained input");
  TrainedInput in;
  in.text = text;
  std::string rest = text.substr(std::string(kPrefix).size());
  const auto comma = rest.find(',');
  in.dir = rest.substr(0, comma);
  if (in.dir.empty()) fail(text, "dir: empty (the checkpoint folder of attnlab train)");
  rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
  while (!rest.empty()) {
    const auto next = rest.find(',');
    const std::string token = rest.substr(0, next);
    rest = next == std::string::npos ? "" : rest.substr(next + 1);
    const auto eq = token.find('=');
    if (eq == std::string::npos) fail(text, "token '" + token + "' is not key=value");
    const std::string key = token.substr(0, eq), value = token.substr(eq + 1);
    if (key != "layer") fail(text, "unknown key '" + key + "' (known: layer)");
    std::size_t layer = 0;
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), layer);
    if (value.empty() || ec != std::errc() || end != value.data() + value.size() || layer < 1)
      fail(text, "layer=" + value + ": expected a layer number, 1 or more");
    in.layer = layer;
  }
  return in;
}

std::string trained_input_label(const std::string& text) {
  try {
    const TrainedInput in = parse_trained_input(text);
    fs::path dir(in.dir);
    if (dir.filename().empty()) dir = dir.parent_path();
    if (dir.filename() == "checkpoint") dir = dir.parent_path();
    return dir.filename().string() + ", layer " + std::to_string(in.layer);
  } catch (const Error&) {
    return text;
  }
}

TrainedShape trained_shape(const TrainedInput& in) {
  std::string dir;
  const training::TrainConfig c = config_of(in, dir);
  if (c.arch != models::Arch::transformer)  // rotary q and k inside its blocks: not read here
    fail(in.text, "dir=" + in.dir +
                      ": a model of --arch llama (the trained input reads the 2017 encoder's "
                      "layers)");
  if (in.layer > c.layers)
    fail(in.text, "layer=" + std::to_string(in.layer) + ": the model has " +
                      std::to_string(c.layers) + " layers (expected 1 to " +
                      std::to_string(c.layers) + ")");
  return {static_cast<std::int64_t>(c.n), static_cast<std::int64_t>(c.heads),
          static_cast<std::int64_t>(c.d_model / c.heads), c.causal_model()};
}

QKV trained_inputs(const TrainedInput& in, std::size_t n, std::size_t batch, std::uint64_t seed) {
  const TrainedShape shape = trained_shape(in);
  if (n > std::size_t(shape.max_n))
    fail(in.text, "n=" + std::to_string(n) + ": the model was trained at N = " +
                      std::to_string(shape.max_n) + " and serves no longer sequences");
  std::string dir;
  const training::TrainConfig config = config_of(in, dir);
  training::TaskModel model = training::Trainer(config).model();
  try {
    model.load(dir);
  } catch (const Error& e) {
    fail(in.text, "dir=" + in.dir + ": " + e.what());
  }
  const auto task = training::make_task(config.task, n);
  const training::Batch held = task->held_out(batch, stream_seed(seed, {kHeldOutStream}));
  for (std::int64_t length : held.lengths)
    if (length < std::int64_t(n))
      fail(in.text, "its task (" + config.task +
                        ") pads its sequences, and the sweep's masks have no key padding");
  QKV out;
  const std::size_t target = in.layer - 1;
  const models::EncoderModel& body = model.encoder_body("input '" + in.text + "'");
  body.forward(held.tokens, model.mask(held),
               [&](std::size_t l, const models::Activations& x, const models::Activations&) {
                 if (l != target) return;
                 const auto& layer = body.encoder.layers[l];
                 const models::Activations a = layer.attention_input(x);
                 out = layer.self_attn.project(a, a);
               });
  return out;
}

}  // namespace attnlab::harness
