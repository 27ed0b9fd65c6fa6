// symmetry: self-attention is not symmetric, unless W_Q = W_K (insight 0 of the seed
// 003_*.txt; the seed 001_*.txt adds that with Q = K attention tends to the identity). The same
// model with tied and untied W_Q, W_K: how symmetric its score matrices are and how much
// attention each token pays itself, layer by layer.
#include <cmath>
#include <string>
#include <vector>

#include "models/transformer.hpp"
#include "studies/analysis.hpp"
#include "studies/common.hpp"

namespace attnlab::studies {
namespace {

struct Sizes {
  std::size_t n, d_model, heads, ffn, layers;
};

Sizes sizes(Size s) {
  if (s == Size::tiny) return {32, 32, 2, 64, 2};
  return {512, 512, 8, 2048, 6};  // the LRA text model at N = 512
}

struct Row {
  bool tied;
  std::size_t layer, head;
  double asymmetry;  // ||S - S^T||_F / ||S||_F of the scores S = q k^T
  HeadStats stats;
};

std::vector<Row> measure(const StudyOptions& o, const Sizes& z) {
  std::vector<Row> rows;
  for (const bool tied : {false, true}) {
    models::ModelConfig c;
    c.layer.d_model = z.d_model, c.layer.heads = z.heads, c.layer.ffn = z.ffn;
    c.layer.tied_qk = tied, c.layers = z.layers, c.seed = o.seed;
    const models::EncoderModel model(c);  // same seed: the same W_Q, W_V, W_O, FFN
    const auto tokens = models::random_tokens(1, z.n, c.vocab, o.seed + 1);
    model.forward(tokens, {}, [&](std::size_t l, const models::Activations& x, const auto&) {
      progress(o, "symmetry",
               std::string(tied ? "tied" : "untied") + ", layer " + std::to_string(l + 1));
      const auto& mha = model.encoder.layers[l].self_attn;
      const auto a = model.encoder.layers[l].attention_input(x);
      const QKV in = mha.project(a, a);
      const Tensor p = mha.attention_probabilities(a, a);
      for (std::size_t h = 0; h < z.heads; ++h)
        rows.push_back(
            {tied, l + 1, h + 1, score_asymmetry(in.q, in.k, 0, h), head_stats(p, 0, h)});
    });
  }
  return rows;
}

// Mean over heads of one (tying, layer).
Row mean_row(const std::vector<Row>& rows, bool tied, std::size_t layer) {
  Row m{tied, layer, 0, 0, {}};
  double count = 0;
  for (const Row& r : rows)
    if (r.tied == tied && r.layer == layer) {
      m.asymmetry += r.asymmetry;
      m.stats.self_mass += r.stats.self_mass;
      m.stats.self_argmax += r.stats.self_argmax;
      m.stats.entropy += r.stats.entropy;
      ++count;
    }
  m.asymmetry /= count, m.stats.self_mass /= count, m.stats.self_argmax /= count;
  m.stats.entropy /= count;
  return m;
}

Table table(const std::vector<Row>& rows, const Sizes& z) {
  Table t{{"layer", "W_Q, W_K", "score asymmetry ||S - S^T|| / ||S||", "weight on itself",
           "rows whose largest weight is itself", "row entropy (nats)"},
          {}};
  for (std::size_t l = 1; l <= z.layers; ++l)
    for (const bool tied : {false, true}) {
      const Row m = mean_row(rows, tied, l);
      t.rows.push_back({std::to_string(l), tied ? "tied" : "separate", cell("%.3f", m.asymmetry),
                        cell("%.4f", m.stats.self_mass), cell("%.1f%%", 100 * m.stats.self_argmax),
                        cell("%.3f", m.stats.entropy)});
    }
  t.rows.push_back({"uniform attention", "—", "—", cell("%.4f", 1.0 / double(z.n)),
                    cell("%.1f%%", 100.0 / double(z.n)), cell("%.3f", std::log(double(z.n)))});
  return t;
}

Csv raw_rows(const std::vector<Row>& rows) {
  Csv csv{{"tied_qk", "layer", "head", "asymmetry", "self_mass", "self_argmax", "entropy"}, {}};
  for (const Row& r : rows)
    csv.add({r.tied ? "1" : "0", std::to_string(r.layer), std::to_string(r.head), raw(r.asymmetry),
             raw(r.stats.self_mass), raw(r.stats.self_argmax), raw(r.stats.entropy)});
  return csv;
}

void plot(const StudyOptions& o, const std::vector<Row>& rows, const Sizes& z,
          harness::PlotFiles& files) {
  std::vector<harness::Series> series;
  for (const bool tied : {false, true}) {
    harness::Series s{tied ? "W_Q = W_K (tied)" : "separate W_Q, W_K", {}};
    for (std::size_t l = 1; l <= z.layers; ++l)
      s.xy.emplace_back(double(l), mean_row(rows, tied, l).stats.self_mass);
    series.push_back(std::move(s));
  }
  series.push_back({"uniform attention (1/N)",
                    {{1.0, 1.0 / double(z.n)}, {double(z.layers), 1.0 / double(z.n)}}});
  harness::Plotter(plots_dir(o), o.gnuplot, files)
      .plot("symmetry", series,
            "set grid\nset key below left Left reverse noenhanced\nset logscale y\nset xtics 1\n"
            "set xlabel 'layer'\nset ylabel 'mean attention weight a token pays itself'\nset title "
            "'Self-attention weight, tied and separate W_Q, W_K (mean over heads), N = " +
                std::to_string(z.n) + "' noenhanced\n",
            "using 1:2 with linespoints lw 2");
}

}  // namespace

StudyOutput symmetry_study(const StudyOptions& o, harness::PlotFiles& plots) {
  const Sizes z = sizes(o.size);
  const auto rows = measure(o, z);
  plot(o, rows, z, plots);
  Report r;
  r.title = "what do tied W_Q = W_K do to self-attention?";
  r.question =
      "Insight 0 of the seed `003_*.txt`: self-attention is not symmetric, since q_i . k_j != "
      "q_j . k_i; with one projection for queries and keys (W_Q = W_K) the score matrix X W W^T "
      "X^T is symmetric (an undirected graph), without raising its rank. The seed `001_*.txt` "
      "adds that with Q = K the attention matrix tends to the identity, each token mostly "
      "attending itself, and self-attention degenerates into a position-wise map.";
  r.setup = "The LRA text encoder (" + std::to_string(z.layers) + " layers, d_model " +
            std::to_string(z.d_model) + ", " + std::to_string(z.heads) + " heads, FFN " +
            std::to_string(z.ffn) +
            ", post-LN, exact attention) with seeded, untrained weights, "
            "once with separate W_Q, W_K and once with W_Q = W_K (switch tied-qk; the same seed "
            "gives both models the same W_Q, W_V, W_O and FFN), on the same random byte tokens, "
            "N = " +
            std::to_string(z.n) +
            ". Per layer and head, from the input its self-"
            "attention sees: the scores S = q k^T (before scaling and softmax) and P = "
            "softmax(S / sqrt(d_k)); the table averages over heads (rows.csv has every head).";
  r.reading =
      "Asymmetry 0 means S = S^T exactly (tied: q and k are the same projection of the same "
      "input). Weight on itself: mean P_ii; 1/N is what uniform attention gives.";
  r.paper =
      "No paper figure: insight 0 is an argument (S = X W W^T X^T is symmetric), and the seed "
      "`001_*.txt` states the identity-like attention without numbers. With tied projections "
      "s_ii = |q_i|^2 while s_ij = q_i . q_j <= |q_i| |q_j|, so the diagonal dominates whenever "
      "the norms are similar: the table measures how much.";
  r.figures = {{"attention weight on itself by layer", "plots/symmetry.png"}};
  return {table(rows, z), raw_rows(rows), r};
}

namespace {
const Registrar<StudyMaker> kRegistrar(study_registry(), "symmetry", {symmetry_study, false}, 40);
}  // namespace

}  // namespace attnlab::studies
