// The studies at their tiny size: each table's numbers against the raw rows and against an
// independent computation of some of them, and the folder's files.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>
#include <xtensor-blas/xlinalg.hpp>
#include <xtensor/xview.hpp>

#include "attnlab/attnlab.hpp"
#include "attnlab/inputs.hpp"
#include "helpers.hpp"
#include "models/transformer.hpp"
#include "npy_helpers.hpp"
#include "studies/analysis.hpp"
#include "studies/study.hpp"
#include "training/trainer.hpp"

using namespace attnlab;
using namespace attnlab::studies;
using attnlab::test::read_text;
using attnlab::test::TempDir;

namespace {

StudyResult tiny(const std::string& name, const TempDir& dir) {
  StudyOptions o;
  o.out_dir = dir.file(name);
  o.size = Size::tiny;
  o.progress = false;
  return run_study(name, o);
}

// The leading number of a table cell ("0.681 (0.678..0.685)" -> 0.681).
double number(const std::string& cell) {
  std::istringstream in(cell);
  double x = NAN;
  in >> x;
  return x;
}

// The value of `column` in the first raw row whose cells match every (column, value) pair.
double raw_value(const Csv& csv, std::initializer_list<std::pair<std::string, std::string>> match,
                 const std::string& column) {
  auto index = [&](const std::string& name) {
    const auto it = std::find(csv.columns.begin(), csv.columns.end(), name);
    if (it == csv.columns.end()) FAIL("rows.csv has no column " << name);
    return std::size_t(it - csv.columns.begin());
  };
  std::vector<std::pair<std::size_t, std::string>> wanted;
  for (const auto& [c, v] : match) wanted.emplace_back(index(c), v);
  for (const auto& row : csv.rows) {
    bool ok = true;
    for (const auto& [i, v] : wanted) ok = ok && row[i] == v;
    if (ok) return std::stod(row[index(column)]);
  }
  FAIL("no raw row matches");
  return NAN;
}

// The folder a study wrote: report.md holds the table, rows.csv the rows, meta.json the context.
void check_files(const StudyResult& r, const TempDir& dir) {
  const std::string folder = dir.file(r.name);
  const std::string report = read_text(folder + "/report.md");
  CHECK(report.find(r.table.markdown()) != std::string::npos);
  CHECK(report.find("## Context") != std::string::npos);
  CHECK(read_text(folder + "/rows.csv") == r.rows.text());
  const auto meta = nlohmann::json::parse(read_text(folder + "/meta.json"));
  CHECK(meta.value("study", "") == r.name);
  CHECK(meta.contains("git_commit"));
  CHECK(meta.contains("load_average"));
  CHECK(meta.contains("load_after"));
  if (std::system("gnuplot -V >/dev/null 2>&1") == 0) {
    CHECK_FALSE(r.plots.pngs.empty());
    for (const auto& png : r.plots.pngs) CHECK(std::filesystem::file_size(png) > 1000);
  } else {
    WARN("gnuplot not found: PNGs not checked");
  }
}

std::string row_with(const Table& t, const std::string& first) {
  for (const auto& row : t.rows)
    if (row[0] == first) return row[1];
  FAIL("no table row " << first);
  return "";
}

}  // namespace

namespace {

// A checkpoint of a few training steps of a tiny causal byte-level LM of the Bible, in
// DIR/lm/checkpoint (the layout of attnlab train --out DIR/lm); returns the trainer.
std::unique_ptr<training::Trainer> tiny_checkpoint(const TempDir& dir) {
  training::TrainConfig c;
  c.task = "text";
  c.causal = true;
  c.n = 16, c.layers = 2, c.d_model = 16, c.heads = 2, c.ffn = 32;
  c.batch = 4, c.eval_size = 8, c.adam.warmup = 2;
  auto trainer = std::make_unique<training::Trainer>(c);
  for (int i = 0; i < 5; ++i) trainer->step();
  trainer->save(dir.file("lm/checkpoint"));
  return trainer;
}

StudyResult tiny_trained(const std::string& name, const TempDir& dir, const std::string& weights) {
  StudyOptions o;
  o.out_dir = dir.file(name);
  o.size = Size::tiny;
  o.progress = false;
  o.weights = weights;
  return run_study(name, o);
}

}  // namespace

TEST_CASE("study names and errors", "[studies]") {
  // Each study registers itself from its own .cpp (the static library is linked whole): these six
  // are there, in their listing order (a study added later may stand anywhere).
  const std::vector<std::string> names = study_names();
  auto at = names.begin();
  for (const char* name : {"spectrum", "rank-collapse", "capacity", "symmetry", "heads", "swap"}) {
    at = std::find(at, names.end(), name);
    CHECK(at != names.end());
  }
  test::require_error([] { run_study("spectra", {}); },
                      {"unknown study 'spectra' (known: spectrum, rank-collapse, capacity"});
  test::require_error([] { parse_size("huge"); }, {"'huge'", "tiny"});
}

TEST_CASE("spectrum: shares of the singular values, checked by an independent SVD", "[studies]") {
  TempDir dir("studies");
  const StudyResult r = tiny("spectrum", dir);
  check_files(r, dir);
  REQUIRE(r.table.rows.size() == 4 + 2 + 1);  // 4 inputs, 2 model layers, the paper's row
  CHECK(r.table.header[1].find("first 16") != std::string::npos);  // N/4 at N = 64
  for (const std::string source : {"gaussian:temp=1", "local:width=32", "layer 2"}) {
    INFO(source);
    // The table shows the rows' mean at k = 16; every curve rises to 1 at k = N.
    CHECK(number(row_with(r.table, source)) ==
          Approx(raw_value(r.rows, {{"source", source}, {"k", "16"}}, "cumulative_mean"))
              .margin(5e-4));
    CHECK(raw_value(r.rows, {{"source", source}, {"k", "64"}}, "cumulative_mean") == Approx(1.0));
  }
  // Independently: P of the local input as the fp64 reference's output for v = identity, one
  // float64 SVD per head, the share of the first 16 singular values averaged over the heads.
  const QKV in = make_inputs("local:width=32", 1, 2, 64, 16, 1);
  Tensor identity = xt::zeros<float>({1ul, 2ul, 64ul, 64ul});
  for (std::size_t h = 0; h < 2; ++h)
    for (std::size_t i = 0; i < 64; ++i) identity(0, h, i, i) = 1;
  const Tensor64 p = reference_attention(in.q, in.k, identity, Mask{});
  double share = 0;
  for (std::size_t h = 0; h < 2; ++h) {
    const xt::xtensor<double, 2> ph = xt::view(p, 0, h, xt::all(), xt::all());
    const auto s = std::get<1>(xt::linalg::svd(ph, false, false));
    share += xt::sum(xt::view(s, xt::range(0, 16)))() / xt::sum(s)() / 2;
  }
  // float32 P (ours) against float64 P: singular values agree to about 1e-6.
  CHECK(number(row_with(r.table, "local:width=32")) == Approx(share).margin(6e-4));
}

TEST_CASE("rank-collapse: pure attention collapses doubly exponentially, skips prevent it",
          "[studies]") {
  TempDir dir("studies");
  const StudyResult r = tiny("rank-collapse", dir);
  check_files(r, dir);
  REQUIRE(r.table.rows.size() == 1 + 6 + 1);  // the input, 6 layers, Dong et al.'s row
  auto residual = [&](std::size_t depth, std::size_t column) {  // rank-1 residual in the table
    return number(r.table.rows[depth][column]);
  };
  // The table's cells are medians over the 2 seeds of the raw rows (to the 3 printed digits).
  const double a = raw_value(
      r.rows, {{"architecture", "pure attention"}, {"seed", "1"}, {"layer", "2"}}, "res_rank1");
  const double b = raw_value(
      r.rows, {{"architecture", "pure attention"}, {"seed", "2"}, {"layer", "2"}}, "res_rank1");
  CHECK(residual(2, 1) == Approx((a + b) / 2).epsilon(5e-3));

  // Independently: the rank-1 residual of seed 1's pure-attention stack after 2 layers from a
  // float64 SVD of the same stack's output.
  models::LayerConfig c;
  c.d_model = 32, c.heads = 2, c.ffn = 128;
  models::apply_switches(c, "no-skip,no-ffn,no-norm");
  models::Encoder encoder(c, 2);
  encoder.initialize(1, "");
  std::mt19937_64 rng(1001);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  models::Activations x = models::Activations::from_shape({1, 16, 32});
  for (float& v : x) v = normal(rng);
  const xt::xtensor<double, 2> out =
      xt::view(xt::cast<double>(encoder.forward(x)), 0, xt::all(), xt::all());
  const auto s = std::get<1>(xt::linalg::svd(out, false, false));
  const double tail =
      std::sqrt(xt::sum(xt::square(s))() - s(0) * s(0)) / std::sqrt(xt::sum(xt::square(s))());
  CHECK(a == Approx(tail).epsilon(1e-3));

  // The findings, as measured at this size (median residuals in the comments).
  for (std::size_t depth = 1; depth <= 6; ++depth)
    CHECK(residual(depth, 2) > 0.5);  // + skip: 0.87..0.91
  CHECK(residual(4, 1) < 1e-6);       // pure attention: 8.9e-8 at depth 4
  // Doubly exponential: the log-decrement grows layer after layer (0.13, 0.25, 4.2 here).
  const double d1 = std::log(residual(0, 1) / residual(1, 1)),
               d2 = std::log(residual(1, 1) / residual(2, 1)),
               d3 = std::log(residual(2, 1) / residual(3, 1));
  CHECK(d2 > 1.5 * d1);
  CHECK(d3 > 4 * d2);
  CHECK(residual(4, 4) < 1e-2);  // LayerNorm does not prevent it (6.9e-4 at depth 4)
}

TEST_CASE("capacity: retrieval errors, failure points and the feature-space bound", "[studies]") {
  TempDir dir("studies");
  const StudyResult r = tiny("capacity", dir);
  check_files(r, dir);
  auto row = [&](const std::string& memory) -> const std::vector<std::string>& {
    for (const auto& cells : r.table.rows)
      if (cells[0] == memory) return cells;
    FAIL("no row " << memory);
    return r.table.rows.front();
  };
  REQUIRE(r.table.header[3] == "error at S=64");
  // The bound is exact up to the feature dimension and fails at the first S past it:
  // elu+1 has 64 features, DPFP nu=1 128, the others more than the largest S (160).
  CHECK(row("elu+1: bound")[1] == "96");
  CHECK(row("DPFP nu=1: bound")[1] == "160");
  CHECK(row("DPFP nu=3: bound")[1] == "> 160");
  CHECK(number(row("DPFP nu=1: bound")[5]) == 0.0);  // S = 128: 128 independent features
  // Past the rank, random values keep the share 64 / S of their energy: error sqrt(1 - 64/96).
  CHECK(number(row("elu+1: bound")[4]) == Approx(std::sqrt(1 - 64.0 / 96)).margin(0.03));
  // Softmax does best (0.072 at S = 64 against 0.35 and more for every linear memory).
  for (const auto& cells : r.table.rows)
    if (cells[0] != "softmax" && cells[0].find("bound") == std::string::npos)
      CHECK(number(cells[3]) > 3 * number(row("softmax")[3]));

  // Independently: softmax's one-pass cell at S = 64 from the fp64 reference and the
  // scale-free error sqrt(1 - <R, V>^2 / (|R|^2 |V|^2)).
  auto gaussian = [](std::size_t n, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal;
    Tensor t = Tensor::from_shape({1, 1, n, 64});
    for (float& x : t) x = normal(rng);
    return t;
  };
  const Tensor keys = gaussian(64, 1), values = gaussian(64, 2);
  const Tensor64 read = reference_attention(keys, keys, values, Mask{});
  const Tensor64 v = xt::cast<double>(values);
  const double rv = xt::sum(read * v)(), rr = xt::sum(read * read)(), vv = xt::sum(v * v)();
  CHECK(number(row("softmax")[3]) == Approx(std::sqrt(1 - rv * rv / (rr * vv))).margin(6e-4));
  CHECK(raw_value(r.rows, {{"memory", "softmax"}, {"stored", "64"}}, "error") ==
        Approx(std::sqrt(1 - rv * rv / (rr * vv))).epsilon(1e-4));
}

TEST_CASE("symmetry: tied W_Q = W_K gives symmetric scores and tokens attending themselves",
          "[studies]") {
  TempDir dir("studies");
  const StudyResult r = tiny("symmetry", dir);
  check_files(r, dir);
  REQUIRE(r.table.rows.size() == 2 * 2 + 1);  // 2 layers x {separate, tied}, uniform attention
  for (const auto& row : r.table.rows) {
    if (row[1] == "tied") {
      CHECK(number(row[2]) == 0.0);  // exactly symmetric
      CHECK(number(row[4]) > 50);    // 73% and 92% of the rows peak on the token itself
    } else if (row[1] == "separate") {
      CHECK(number(row[2]) > 1.0);  // 1.23 and 1.50
      CHECK(number(row[4]) < 20);   // 6% and 2%
    }
  }
  CHECK(number(r.table.rows[1][3]) > 4 * number(r.table.rows[0][3]));  // layer 1: 0.22 vs 0.04

  // Independently: layer 1 of the separate model, P from the fp64 reference (v = identity),
  // the mean weight on the diagonal over heads and tokens.
  models::ModelConfig c;
  c.layer.d_model = 32, c.layer.heads = 2, c.layer.ffn = 64, c.layers = 2;
  const models::EncoderModel model(c);
  const auto x = model.embed(models::random_tokens(1, 32, 256, 2));
  const QKV in = model.encoder.layers[0].self_attn.project(x, x);
  Tensor identity = xt::zeros<float>({1ul, 2ul, 32ul, 32ul});
  for (std::size_t h = 0; h < 2; ++h)
    for (std::size_t i = 0; i < 32; ++i) identity(0, h, i, i) = 1;
  const Tensor64 p = reference_attention(in.q, in.k, identity, Mask{});
  double diagonal = 0;
  for (std::size_t h = 0; h < 2; ++h)
    for (std::size_t i = 0; i < 32; ++i) diagonal += p(0, h, i, i) / 64;
  CHECK(number(r.table.rows[0][3]) == Approx(diagonal).margin(6e-5));
}

TEST_CASE("heads: with W_Q = W_K fewer, larger heads focus on the token itself", "[studies]") {
  TempDir dir("studies");
  const StudyResult r = tiny("heads", dir);
  check_files(r, dir);
  REQUIRE(r.table.rows.size() == 2 * 4 + 1);  // {separate, tied} x h = 1, 2, 4, 8; uniform
  const double uniform = 1.0 / 32, max_entropy = std::log(32.0);
  for (std::size_t i = 0; i < 8; ++i) {
    const auto& row = r.table.rows[i];
    CHECK(number(row[5]) <= max_entropy);
    if (row[0] == "separate") CHECK(number(row[3]) < 1.5 * uniform);  // 0.035..0.042
    // The tied weight on itself falls as h grows (0.36, 0.22, 0.14, 0.095 here).
    if (row[0] == "tied" && row[1] != "1")
      CHECK(number(row[3]) < 0.8 * number(r.table.rows[i - 1][3]));
  }
  CHECK(r.table.rows[4][3].find("(0.3618..0.3618)") != std::string::npos);  // h = 1: one head

  // Independently: tied, h = 1, the mean diagonal of P from the fp64 reference (v = identity).
  models::ModelConfig c;
  c.layer.d_model = 32, c.layer.heads = 1, c.layer.ffn = 128, c.layer.tied_qk = true, c.layers = 1;
  const models::EncoderModel model(c);
  const auto x = model.embed(models::random_tokens(1, 32, 256, 2));
  const QKV in = model.encoder.layers[0].self_attn.project(x, x);
  const Tensor identity = xt::reshape_view(xt::eye<float>(32), {1, 1, 32, 32});
  const Tensor64 p = reference_attention(in.q, in.k, identity, Mask{});
  double diagonal = 0;
  for (std::size_t i = 0; i < 32; ++i) diagonal += p(0, 0, i, i) / 32;
  CHECK(number(r.table.rows[4][3]) == Approx(diagonal).margin(6e-5));
}

TEST_CASE("swap: each variant in the same model, its distance from full and its time",
          "[studies]") {
  TempDir dir("studies");
  const StudyResult r = tiny("swap", dir);
  check_files(r, dir);
  REQUIRE(r.table.rows.size() == 6);
  REQUIRE(r.table.header == std::vector<std::string>{"spec", "N=32", "N=64"});
  auto cell_of = [&](const std::string& prefix, std::size_t column) {
    for (const auto& row : r.table.rows)
      if (row[0].rfind("`" + prefix, 0) == 0) return row[column];
    FAIL("no row " << prefix);
    return std::string();
  };
  const std::string linear = "linear:feature=elu1,m=256,nu=1,rule=sum,beta=1,eps=1e-06,seed=1";
  for (std::size_t column : {1, 2}) {
    CHECK(number(cell_of("full", column)) == 0.0);  // the reference itself, bitwise
    // Windows and blocks that cover N = 32 and 64 are exact (to float rounding).
    CHECK(number(cell_of("sliding", column)) < 1e-5);
    CHECK(number(cell_of("bigbird", column)) < 1e-5);
    CHECK(number(cell_of("linformer", column)) > 0.05);  // 0.25, 0.22
    CHECK(number(cell_of(linear, column)) > 0.01);       // 0.075, 0.065
  }
  // The cell's speed-up is full's median time over the spec's, over the 2 rounds of the rows.
  auto median_time = [&](const std::string& spec) {
    double sum = 0;
    for (const std::string round : {"1", "2"})
      sum += raw_value(r.rows,
                       {{"kind", "model_seconds"}, {"spec", spec}, {"n", "64"}, {"round", round}},
                       "value");
    return sum / 2;
  };
  CHECK(cell_of(linear, 2).find(cell("(%.2fx)", median_time("full") / median_time(linear))) !=
        std::string::npos);

  // Independently: the last layer's distance of linear from full at N = 64, by hand in float64.
  models::ModelConfig c;
  c.layer.d_model = 32, c.layer.heads = 4, c.layer.ffn = 64, c.layers = 2;
  const models::EncoderModel full(c);
  const auto tokens = models::random_tokens(1, 64, 256, 2);
  const auto a = full.forward(tokens), b = full.with_attention("linear").forward(tokens);
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff += (double(b.data()[i]) - a.data()[i]) * (double(b.data()[i]) - a.data()[i]);
    norm += double(a.data()[i]) * a.data()[i];
  }
  CHECK(number(cell_of(linear, 2)) == Approx(std::sqrt(diff / norm)).epsilon(6e-3));

  // The timing split: every round's three times, and the ratio of their medians in report.md.
  std::vector<double> model, attention, gemm;
  for (const auto& row : r.rows.rows) {
    if (row[0] == "split_model_seconds") model.push_back(std::stod(row[5]));
    if (row[0] == "split_attention_seconds") attention.push_back(std::stod(row[5]));
    if (row[0] == "split_gemm_seconds") gemm.push_back(std::stod(row[5]));
  }
  REQUIRE(model.size() == 2);
  REQUIRE(attention.size() == 2);
  REQUIRE(gemm.size() == 2);
  const double ratio = (model[0] + model[1]) / (attention[0] + attention[1] + gemm[0] + gemm[1]);
  CHECK(read_text(dir.file("swap/report.md")).find("| " + cell("%.2f", ratio) + " |") !=
        std::string::npos);
}

TEST_CASE("trained: a checkpoint's heads beside its initialisation's, on held-out text",
          "[studies]") {
  const TempDir dir("studies");
  const auto trainer = tiny_checkpoint(dir);
  // The run folder is enough: its checkpoint/ is found, its config read from state.txt.
  const StudyResult r = tiny_trained("trained", dir, dir.file("lm"));
  check_files(r, dir);
  CHECK(r.table.rows.size() ==
        2 * 2 * 2 + 1);  // (trained, untrained) x 2 layers x 2 heads, uniform

  // An independent computation of layer 1's P on the first held-out sequence, for each model.
  const training::Batch& batch = trainer->held_out().front();
  const training::Trainer untrained(trainer->config());
  const training::Trainer* models[] = {trainer.get(), &untrained};
  for (const training::Trainer* t : models) {
    const std::string weights = t == trainer.get() ? "trained" : "untrained";
    const auto& model = t->model();
    const auto& body = model.encoder_body("test");
    const auto& layer = body.encoder.layers[0];
    const auto a = layer.attention_input(body.embed(batch.tokens));
    const Tensor p = layer.self_attn.attention_probabilities(a, a, model.mask(batch));
    for (std::size_t h = 0; h < 2; ++h) {
      INFO(weights << " head " << h + 1);
      const std::string head = std::to_string(h + 1);
      const HeadStats s = head_stats(p, 0, h);
      CHECK(raw_value(
                r.rows,
                {{"weights", weights}, {"layer", "1"}, {"head", head}, {"measure", "self_mass"}},
                "value") == Approx(s.self_mass).epsilon(1e-6));
      CHECK(
          raw_value(r.rows,
                    {{"weights", weights}, {"layer", "1"}, {"head", head}, {"measure", "entropy"}},
                    "value") == Approx(s.entropy).epsilon(1e-6));
      double previous = 0;
      for (std::size_t i = 1; i < 16; ++i) previous += p(0, h, i, i - 1) / 15.0;
      CHECK(
          raw_value(
              r.rows,
              {{"weights", weights}, {"layer", "1"}, {"head", head}, {"measure", "previous_mass"}},
              "value") == Approx(previous).epsilon(1e-5));
      // Causal: P is lower-triangular, so the 99% rank is at most N and at least 1.
      const double k99 = raw_value(
          r.rows, {{"weights", weights}, {"layer", "1"}, {"head", head}, {"measure", "rank99"}},
          "value");
      CHECK(k99 >= 1);
      CHECK(k99 <= 16);
    }
  }
  // The trained weights are not the untrained ones.
  CHECK(
      raw_value(r.rows,
                {{"weights", "trained"}, {"layer", "1"}, {"head", "1"}, {"measure", "self_mass"}},
                "value") !=
      raw_value(r.rows,
                {{"weights", "untrained"}, {"layer", "1"}, {"head", "1"}, {"measure", "self_mass"}},
                "value"));
  // Uniform causal attention: row i puts 1/(i+1) on itself and on its previous token.
  double self = 0, previous = 0;
  for (std::size_t i = 0; i < 16; ++i) self += 1.0 / double(i + 1) / 16.0;
  for (std::size_t i = 1; i < 16; ++i) previous += 1.0 / double(i + 1) / 15.0;
  CHECK(raw_value(r.rows, {{"weights", "uniform"}, {"measure", "self_mass"}}, "value") ==
        Approx(self).epsilon(1e-6));
  CHECK(raw_value(r.rows, {{"weights", "uniform"}, {"measure", "previous_mass"}}, "value") ==
        Approx(previous).epsilon(1e-6));
  // Rank collapse rows for the input and both layers of both models.
  for (const char* weights : {"trained", "untrained"})
    for (const char* layer : {"0", "1", "2"}) {
      const double res = raw_value(
          r.rows, {{"weights", weights}, {"layer", layer}, {"measure", "res_rank1"}}, "value");
      CHECK(res > 0);
      CHECK(res < 1);
    }
  const std::string report = read_text(dir.file("trained/report.md"));
  CHECK(report.find("lower-triangular") != std::string::npos);
  CHECK(report.find("trained 5 steps") != std::string::npos);
}

TEST_CASE("prune: no head removed is evaluate()'s score, every head of a layer is no attention",
          "[studies]") {
  const TempDir dir("studies");
  const auto trainer = tiny_checkpoint(dir);
  const StudyResult r = tiny_trained("prune", dir, dir.file("lm/checkpoint"));
  check_files(r, dir);
  const training::Score full = trainer->evaluate();
  // Nothing removed: the head masks are all ones, bitwise the plain forward.
  CHECK(raw_value(r.rows, {{"kind", "cumulative"}, {"removed", "0"}}, "loss") ==
        std::stod(raw(full.loss)));
  CHECK(raw_value(r.rows, {{"kind", "unpruned"}}, "loss") == std::stod(raw(full.loss)));
  CHECK(raw_value(r.rows, {{"kind", "untrained"}}, "loss") ==
        std::stod(raw(training::Trainer(trainer->config()).evaluate().loss)));

  // Every head of layer 1 removed = layer 1's attention output is b_O alone = W_O zeroed.
  training::TaskModel no_attention = trainer->model();
  no_attention.encoder_body("test").encoder.layers[0].self_attn.out_proj.weight.fill(0.0f);
  const training::Score without = training::evaluate(no_attention, trainer->held_out());
  CHECK(raw_value(r.rows, {{"kind", "layer"}, {"heads", "L1"}}, "loss") ==
        std::stod(raw(without.loss)));
  CHECK(without.loss != full.loss);

  // Single removals of the 4 heads, then 0..4 removed cumulatively in increasing importance.
  std::size_t single = 0, cumulative = 0;
  std::vector<double> importance;
  for (const auto& row : r.rows.rows) {
    single += row[0] == "single";
    cumulative += row[0] == "cumulative";
    if (row[0] == "single") importance.push_back(std::stod(row[7]));
  }
  CHECK(single == 4);
  CHECK(cumulative == 5);
  // The first head removed cumulatively is the least important alone: the same score.
  CHECK(raw_value(r.rows, {{"kind", "cumulative"}, {"removed", "1"}}, "delta_bits") ==
        *std::min_element(importance.begin(), importance.end()));
  // All heads removed: equal to both layers' W_O zeroed.
  no_attention.encoder_body("test").encoder.layers[1].self_attn.out_proj.weight.fill(0.0f);
  CHECK(raw_value(r.rows, {{"kind", "cumulative"}, {"removed", "4"}}, "loss") ==
        std::stod(raw(training::evaluate(no_attention, trainer->held_out()).loss)));
}

TEST_CASE("studies of trained weights: bad folders and misplaced --weights are refused",
          "[studies]") {
  const TempDir dir("studies");
  std::filesystem::create_directories(dir.file("empty"));
  test::require_error([&] { tiny_trained("trained", dir, dir.file("empty")); },
                      {"empty' is not a checkpoint folder of attnlab train", "state.txt"});
  test::require_error([&] { tiny_trained("prune", dir, dir.file("missing")); },
                      {"missing' is not a checkpoint folder"});
  test::require_error([&] { tiny_trained("prune", dir, ""); },
                      {"study prune analyses a trained model", "--weights DIR"});
  test::require_error(
      [&] { tiny_trained("spectrum", dir, dir.file("empty")); },
      {"study spectrum runs on seeded weights and takes no --weights", "trained, prune"});
  // A state.txt whose config lines are not TrainConfig::describe()'s.
  std::filesystem::create_directories(dir.file("bad"));
  std::ofstream(dir.file("bad/state.txt")) << "step 3\nseconds 1\ntask text\ncolour blue\nend\n";
  test::require_error([&] { tiny_trained("trained", dir, dir.file("bad")); },
                      {"bad/state.txt", "'colour blue'"});
  CHECK(study_takes_weights("prune"));
  CHECK_FALSE(study_takes_weights("heads"));
}
