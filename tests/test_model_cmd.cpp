// `attnlab model` end to end (binary in $ATTNLAB_CLI, set by meson test): the layer table's
// distances equal an in-process computation, wide sliding is exact, weights folders round-trip,
// and bad configurations exit 2 with one line naming the problem.
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "attnlab/npy.hpp"
#include "cli_helpers.hpp"
#include "helpers.hpp"
#include "models/transformer.hpp"

using namespace attnlab;
using attnlab::test::attnlab_cli;
using attnlab::test::CliResult;
using attnlab::test::TempDir;

namespace {

const std::string kSmall = "--layers 3 --d-model 32 --heads 4 --ffn 48 --n 40 --batch 2 --vocab 50";

struct LayerRow {
  int layer = 0;
  double full_s = 0, spec_s = 0, rel_fro = 0, max_abs = 0, mean_cos = 0;
};

// The table rows: lines that start with a layer number.
std::vector<LayerRow> layer_rows(const std::string& out) {
  std::vector<LayerRow> rows;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    LayerRow r;
    if (fields >> r.layer >> r.full_s >> r.spec_s >> r.rel_fro >> r.max_abs >> r.mean_cos)
      rows.push_back(r);
  }
  return rows;
}

CliResult model_cli(const TempDir& dir, const std::string& args) {
  return attnlab_cli(dir, "model " + args);
}

void require_failure(const TempDir& dir, const std::string& args,
                     std::initializer_list<std::string> fragments) {
  const CliResult r = model_cli(dir, args);
  INFO("attnlab model " << args << "\nstderr: " << r.err);
  CHECK(r.code == 2);
  CHECK(r.err.rfind("attnlab: error: ", 0) == 0);
  CHECK(r.err.find('\n') == r.err.size() - 1);  // one line
  for (const auto& part : fragments) CHECK(r.err.find(part) != std::string::npos);
}

}  // namespace

TEST_CASE("model: the layer table's distances are those of the same models in-process",
          "[cli][models]") {
  TempDir dir("model-cmd");
  const CliResult r = model_cli(dir, "--spec sliding:left=3,right=3 --switches pre-ln " + kSmall);
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("3 layers, d_model 32, 4 heads (d_k 8), FFN 48, pre-ln; batch 2, N 40") !=
        std::string::npos);
  const auto rows = layer_rows(r.out);
  REQUIRE(rows.size() == 3);

  models::ModelConfig c;
  c.layer.d_model = 32, c.layer.heads = 4, c.layer.ffn = 48, c.layer.pre_ln = true;
  c.layer.spec = "sliding:left=3,right=3";
  c.layers = 3, c.vocab = 50;
  const models::EncoderModel model(c);
  const auto tokens = models::random_tokens(2, 40, 50, c.seed + 1);
  std::vector<models::Activations> full;
  model.with_attention("full").forward(
      tokens, {}, [&](std::size_t, const auto&, const auto& out) { full.push_back(out); });
  model.forward(tokens, {}, [&](std::size_t i, const auto&, const auto& out) {
    const ErrorMetrics e = compare(out.data(), full[i].data(), 80, 32);
    CHECK(rows[i].layer == int(i) + 1);
    CHECK(rows[i].rel_fro == Approx(e.rel_fro).epsilon(2e-3));  // printed to 4 digits
    CHECK(rows[i].max_abs == Approx(e.max_abs).epsilon(2e-3));
    CHECK(rows[i].mean_cos == Approx(e.mean_cos).margin(2e-6));
    CHECK(rows[i].rel_fro > 1e-3);  // a 7-key window is not exact
  });
  CHECK(r.out.find("speed-up over full") != std::string::npos);
}

TEST_CASE("model: a window covering N is exact at every layer", "[cli][models]") {
  TempDir dir("model-cmd");
  const CliResult r = model_cli(dir, "--spec sliding:left=40,right=40 " + kSmall);
  REQUIRE(r.code == 0);
  const auto rows = layer_rows(r.out);
  REQUIRE(rows.size() == 3);
  for (const auto& row : rows) {
    CHECK(row.rel_fro < 1e-5);
    CHECK(row.mean_cos == Approx(1.0).margin(1e-6));
  }
}

TEST_CASE("model: weights written with --save-weights load with --weights", "[cli][models]") {
  TempDir dir("model-cmd");
  const CliResult saved = model_cli(dir, "--spec linear --save-weights w " + kSmall);
  REQUIRE(saved.code == 0);
  CHECK(std::filesystem::exists(dir.file("w/encoder.layers.2.self_attn.in_proj_weight.npy")));
  CHECK(std::filesystem::exists(dir.file("w/embedding.weight.npy")));
  const CliResult loaded = model_cli(dir, "--spec linear --weights w " + kSmall);
  REQUIRE(loaded.code == 0);
  CHECK(loaded.out.find("weights from w") != std::string::npos);
  const auto a = layer_rows(saved.out), b = layer_rows(loaded.out);
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i].rel_fro == b[i].rel_fro);

  // Other weights, other numbers: the folder really is read.
  save_npy(dir.file("w/encoder.layers.0.linear1.bias.npy"), xt::ones<float>({48ul}));
  const CliResult changed = model_cli(dir, "--spec linear --weights w " + kSmall);
  REQUIRE(changed.code == 0);
  CHECK(layer_rows(changed.out)[0].rel_fro != a[0].rel_fro);
}

TEST_CASE("model: bad configurations exit 2 with one line naming the problem", "[cli][models]") {
  TempDir dir("model-cmd");
  require_failure(dir, "--spec full --d-model 30 --heads 4 --n 8", {"d_model=30", "heads=4"});
  require_failure(dir, "--spec full --switches pre-ln,no-skipp --n 8", {"'no-skipp'", "tied-qk"});
  require_failure(dir, "--spec fulll --n 8", {"'fulll'", "unknown variant"});
  require_failure(dir, "--spec full --n 0", {"--n"});
  require_failure(dir, "--spec full --n 8 --weights nowhere", {"nowhere", "not a directory"});
  REQUIRE(model_cli(dir, "--spec full --save-weights w " + kSmall).code == 0);
  std::filesystem::remove(dir.file("w/encoder.layers.1.norm2.weight.npy"));
  require_failure(dir, "--spec full --weights w " + kSmall,
                  {"encoder.layers.1.norm2.weight.npy", "missing", "(32,)"});
  save_npy(dir.file("w/encoder.layers.1.norm2.weight.npy"), xt::ones<float>({31ul}));
  require_failure(dir, "--spec full --weights w " + kSmall, {"norm2.weight.npy", "(31,)", "(32,)"});
  require_failure(dir, "--spec full --weights w --d-model 64 --heads 4 --n 8",
                  {"embedding.weight.npy", "(50, 32)", "(256, 64)"});
}

TEST_CASE("model --arch llama: a causal decoder beside full; bad configurations name the field",
          "[cli][models]") {
  TempDir dir("model-llama");
  const std::string small =
      "--arch llama --layers 2 --d-model 16 --heads 2 --ffn 24 --n 12 "
      "--batch 2 --vocab 20 ";
  const CliResult r = model_cli(dir, small + "--spec sliding:left=12,right=0 --save-weights w");
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("Llama-style causal decoder") != std::string::npos);
  // A causal window covering every earlier token is exact attention.
  const auto rows = layer_rows(r.out);
  REQUIRE(rows.size() == 2);
  for (const LayerRow& row : rows) CHECK(row.rel_fro < 1e-6);
  CHECK(std::filesystem::exists(dir.file("w/model.layers.1.mlp.down_proj.weight.npy")));
  REQUIRE(model_cli(dir, small + "--spec full --weights w").code == 0);
  require_failure(dir, small + "--spec full --kv-heads 3", {"kv_heads=3", "heads=2"});
  require_failure(dir, small + "--spec linformer --kv-heads 1", {"linformer", "grouped heads"});
  // Grouped heads (MQA): a causal window covering every earlier token is exact attention here
  // too, each core given one key and value head.
  const CliResult mqa =
      model_cli(dir, small + "--spec sliding:left=12,right=0 --kv-heads 1 --save-weights g");
  INFO(mqa.err);
  REQUIRE(mqa.code == 0);
  CHECK(mqa.out.find("1 key and value heads") != std::string::npos);
  const auto mqa_rows = layer_rows(mqa.out);
  REQUIRE(mqa_rows.size() == 2);
  for (const LayerRow& row : mqa_rows) CHECK(row.rel_fro < 1e-6);
  require_failure(dir, small + "--spec full --weights g",
                  {"model.layers.0.self_attn.k_proj.weight.npy", "(8, 16)", "(16, 16)"});
  require_failure(dir, small + "--spec full --rope-base -1", {"rope_base"});
  require_failure(dir, "--arch mamba --spec full --n 8", {"arch 'mamba'"});
  require_failure(dir,
                  "--arch llama --layers 2 --d-model 32 --heads 2 --ffn 24 --n 12 --vocab 20 "
                  "--spec full --weights w",
                  {"model.embed_tokens.weight.npy", "(20, 16)", "(20, 32)"});
}
