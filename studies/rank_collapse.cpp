// rank-collapse: pure attention loses rank doubly exponentially with depth (Dong, Cordonnier,
// Loukas 2021; insight 7 of the seed 003_*.txt). The relative residual of each layer's output to
// rank one, against depth, for pure attention and with skip connections, FFN or LayerNorm added.
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "attnlab/stats.hpp"
#include "models/transformer.hpp"
#include "studies/analysis.hpp"
#include "studies/common.hpp"

namespace attnlab::studies {
namespace {

struct Sizes {
  std::size_t n, d_model, heads, layers, seeds;
};

Sizes sizes(Size s) {
  if (s == Size::tiny) return {16, 32, 2, 6, 2};
  return {256, 512, 8, 12, 3};
}

// The architectures compared: pure self-attention, then one part added back, then all of them,
// on inputs of standard deviation 4 (sharp enough softmax that the decay spans several layers);
// last, pure attention on inputs of standard deviation 1.
struct Arch {
  const char* name;
  const char* switches;
  float input_std;
};
constexpr Arch kArchs[] = {
    {"pure attention", "no-skip,no-ffn,no-norm", 4},
    {"+ skip", "no-ffn,no-norm", 4},
    {"+ FFN", "no-skip,no-norm", 4},
    {"+ LayerNorm", "no-skip,no-ffn", 4},
    {"Transformer (all three, post-LN)", "", 4},
    {"pure attention, X_0 std 1", "no-skip,no-ffn,no-norm", 1},
};

struct Row {
  std::string arch;
  std::uint64_t seed;
  std::size_t layer;  // 0: the input
  RankResiduals res;
};

std::vector<Row> measure(const StudyOptions& o, const Sizes& z) {
  std::vector<Row> rows;
  for (const Arch& a : kArchs)
    for (std::uint64_t s = 0; s < z.seeds; ++s) {
      progress(o, "rank-collapse", std::string(a.name) + ", seed " + std::to_string(s + 1));
      models::LayerConfig c;
      c.d_model = z.d_model, c.heads = z.heads, c.ffn = 4 * z.d_model;
      models::apply_switches(c, a.switches);
      models::Encoder encoder(c, z.layers);
      encoder.initialize(o.seed + s, "");
      std::mt19937_64 rng(o.seed + 1000 + s);
      std::normal_distribution<float> normal(0.0f, a.input_std);
      models::Activations x = models::Activations::from_shape({1, z.n, z.d_model});
      for (float& v : x) v = normal(rng);
      rows.push_back({a.name, s, 0, rank_residuals(x.data(), z.n, z.d_model)});
      encoder.forward(x, {}, [&](std::size_t i, const auto&, const models::Activations& out) {
        rows.push_back({a.name, s, i + 1, rank_residuals(out.data(), z.n, z.d_model)});
      });
    }
  return rows;
}

// Median over seeds of `arch` at `layer`.
RankResiduals median_at(const std::vector<Row>& rows, const std::string& arch, std::size_t layer) {
  std::vector<double> mean, rank1;
  for (const Row& r : rows)
    if (r.arch == arch && r.layer == layer) {
      mean.push_back(r.res.token_mean);
      rank1.push_back(r.res.rank1);
    }
  return {median(mean), median(rank1)};
}

Table table(const std::vector<Row>& rows, std::size_t layers) {
  Table t{{"depth"}, {}};
  for (const Arch& a : kArchs) t.header.push_back(a.name);
  for (std::size_t l = 0; l <= layers; ++l) {
    std::vector<std::string> cells = {l == 0 ? "input" : std::to_string(l)};
    for (const Arch& a : kArchs) {
      const RankResiduals r = median_at(rows, a.name, l);
      cells.push_back(cell("%.2e", r.rank1) + " / " + cell("%.2e", r.token_mean));
    }
    t.rows.push_back(cells);
  }
  t.rows.push_back({"Dong et al.", "-> 0 doubly exponentially", "prevents collapse",
                    "slows collapse", "does not help", "—", "-> 0 doubly exponentially"});
  return t;
}

Csv raw_rows(const std::vector<Row>& rows) {
  Csv csv{{"architecture", "seed", "layer", "res_rank1", "res_token_mean"}, {}};
  for (const Row& r : rows)
    csv.add({r.arch, std::to_string(r.seed + 1), std::to_string(r.layer), raw(r.res.rank1),
             raw(r.res.token_mean)});
  return csv;
}

// Residuals of exactly 0 (float32 underflow of the differences) are drawn at this floor.
constexpr double kFloor = 1e-12;

void plot(const StudyOptions& o, const std::vector<Row>& rows, std::size_t layers,
          harness::PlotFiles& files) {
  std::vector<harness::Series> series;
  for (const Arch& a : kArchs) {
    harness::Series s{a.name, {}};
    for (std::size_t l = 0; l <= layers; ++l)
      s.xy.emplace_back(double(l), std::max(median_at(rows, a.name, l).rank1, kFloor));
    series.push_back(std::move(s));
  }
  harness::Plotter(plots_dir(o), o.gnuplot, files)
      .plot("rank_collapse", series,
            "set grid\nset key below left Left reverse maxcols 3 noenhanced\nset logscale y\n"
            "set format y '10^{%L}'\nset xlabel 'depth (layers)'\nset ylabel "
            "'||X - X_1||_F / ||X||_F (X_1: best rank-1 approximation)'\nset title "
            "'Rank collapse with depth (median over seeds)' noenhanced\n",
            "using 1:2 with linespoints lw 2");
}

}  // namespace

StudyOutput rank_collapse_study(const StudyOptions& o, harness::PlotFiles& plots) {
  const Sizes z = sizes(o.size);
  const std::vector<Row> rows = measure(o, z);
  plot(o, rows, z.layers, plots);
  Report r;
  r.title = "does pure attention collapse to rank one with depth?";
  r.question =
      "Dong, Cordonnier and Loukas (2021, \"Attention is not all you need: pure attention loses "
      "rank doubly exponentially with depth\"; insight 7 of the seed `003_*.txt`) prove that a "
      "stack of self-attention layers without skip connections or MLPs drives its output to a "
      "rank-1 matrix 1 x^T (every token the same) doubly exponentially fast in depth; skip "
      "connections prevent it, MLPs slow it, LayerNorm does not help.";
  r.setup = "A stack of " + std::to_string(z.layers) + " encoder layers (d_model " +
            std::to_string(z.d_model) + ", " + std::to_string(z.heads) + " heads, FFN " +
            std::to_string(4 * z.d_model) +
            ", exact attention) with seeded, untrained weights "
            "(PyTorch's initialisation), on X_0 with i.i.d. N(0, 4^2) entries (N(0, 1) in the last "
            "column), N = " +
            std::to_string(z.n) + " tokens; " + std::to_string(z.seeds) +
            " seeds (weights and "
            "input), median shown. Architectures by switches (`models/transformer.hpp`): pure "
            "attention = no-skip,no-ffn,no-norm; + skip = no-ffn,no-norm; + FFN = "
            "no-skip,no-norm; + LayerNorm = no-skip,no-ffn. Each cell: the residual to the best "
            "rank-1 approximation ||X - X_1||_F / ||X||_F (singular values after the first) / "
            "Dong et al.'s residual to the nearest token-uniform matrix ||X - 1 x^T||_F / "
            "||X||_F (x the mean token).";
  r.reading =
      "Doubly exponential decay shows as a curve that bends down on the log plot (log res falls "
      "faster with each layer) until float32 rounding (about 1e-7 relative) stops it.";
  r.paper =
      "Dong et al. state the decay as a bound and show it for trained and random networks in "
      "their figures (no table; `../shared/anchors/papers.md`): pure self-attention -> 0 doubly "
      "exponentially; skip connections prevent collapse; MLPs slow it; LayerNorm does not help. "
      "The last table row puts their statement under each of our columns.";
  r.figures = {{"rank-1 residual against depth", "plots/rank_collapse.png"}};
  return {table(rows, z.layers), raw_rows(rows), r};
}

namespace {
const Registrar<StudyMaker> kRegistrar(study_registry(), "rank-collapse",
                                       {rank_collapse_study, false}, 20);
}  // namespace

}  // namespace attnlab::studies
