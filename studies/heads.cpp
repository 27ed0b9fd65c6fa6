// heads: at fixed d_model, does splitting attention into more heads stop it from focusing on the
// token itself? (The multi-head discussion of the seed 000_*.txt: with one head "the attention
// focuses on each word itself"; more heads give more ways to distribute it.) h = 1 .. 16 on the
// same weights: the attention weight each token pays itself and the row entropy, per head.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "models/transformer.hpp"
#include "studies/analysis.hpp"
#include "studies/common.hpp"

namespace attnlab::studies {
namespace {

struct Sizes {
  std::size_t n, d_model;
  std::vector<std::size_t> heads;
};

Sizes sizes(Size s) {
  if (s == Size::tiny) return {32, 32, {1, 2, 4, 8}};
  return {512, 512, {1, 2, 4, 8, 16}};
}

struct Row {
  bool tied;
  std::size_t heads, head;
  HeadStats stats;
};

std::vector<Row> measure(const StudyOptions& o, const Sizes& z) {
  std::vector<Row> rows;
  for (const bool tied : {false, true})
    for (std::size_t h : z.heads) {
      progress(o, "heads",
               std::string(tied ? "tied" : "separate") + " W_Q, W_K, h = " + std::to_string(h));
      models::ModelConfig c;
      c.layer.d_model = z.d_model, c.layer.heads = h, c.layer.ffn = 4 * z.d_model;
      c.layer.tied_qk = tied, c.layers = 1, c.seed = o.seed;
      // The weights' shapes do not depend on h: every h splits the same W_Q, W_K, W_V.
      const models::EncoderModel model(c);
      const auto x = model.embed(models::random_tokens(1, z.n, c.vocab, o.seed + 1));
      const Tensor p = model.encoder.layers[0].self_attn.attention_probabilities(x, x);
      for (std::size_t head = 0; head < h; ++head)
        rows.push_back({tied, h, head + 1, head_stats(p, 0, head)});
    }
  return rows;
}

struct Summary {
  double mean = 0, min = 1e300, max = -1e300;
};

// One statistic over the heads of (tying, h).
template <class Get>
Summary summary(const std::vector<Row>& rows, bool tied, std::size_t h, Get get) {
  Summary s;
  double count = 0;
  for (const Row& r : rows)
    if (r.tied == tied && r.heads == h) {
      const double v = get(r.stats);
      s.mean += v, s.min = std::min(s.min, v), s.max = std::max(s.max, v), ++count;
    }
  s.mean /= count;
  return s;
}

double self_mass(const HeadStats& s) {
  return s.self_mass;
}
double entropy(const HeadStats& s) {
  return s.entropy;
}
double self_argmax(const HeadStats& s) {
  return s.self_argmax;
}

std::string with_range(const Summary& s, const char* format) {
  return cell(format, s.mean) + " (" + cell(format, s.min) + ".." + cell(format, s.max) + ")";
}

Table table(const std::vector<Row>& rows, const Sizes& z) {
  Table t{{"W_Q, W_K", "h", "d_k", "weight on itself: mean (heads min..max)",
           "rows peaking on itself", "row entropy, nats (heads min..max)"},
          {}};
  for (const bool tied : {false, true})
    for (std::size_t h : z.heads)
      t.rows.push_back({tied ? "tied" : "separate", std::to_string(h),
                        std::to_string(z.d_model / h),
                        with_range(summary(rows, tied, h, self_mass), "%.4f"),
                        cell("%.1f%%", 100 * summary(rows, tied, h, self_argmax).mean),
                        with_range(summary(rows, tied, h, entropy), "%.3f")});
  t.rows.push_back({"uniform attention", "—", "—", cell("%.4f", 1.0 / double(z.n)),
                    cell("%.1f%%", 100.0 / double(z.n)), cell("%.3f", std::log(double(z.n)))});
  return t;
}

Csv raw_rows(const std::vector<Row>& rows) {
  Csv csv{{"tied_qk", "heads", "head", "self_mass", "self_argmax", "entropy"}, {}};
  for (const Row& r : rows)
    csv.add({r.tied ? "1" : "0", std::to_string(r.heads), std::to_string(r.head),
             raw(r.stats.self_mass), raw(r.stats.self_argmax), raw(r.stats.entropy)});
  return csv;
}

// Mean with the heads' range as error bars, one line per tying, and the uniform level.
template <class Get>
void plot_stat(harness::Plotter& plotter, const std::string& name, const std::vector<Row>& rows,
               const Sizes& z, Get get, const std::string& ylabel, double uniform,
               const std::string& yscale) {
  std::string data, body;
  for (const bool tied : {false, true}) {
    data += std::string("# ") + (tied ? "tied" : "separate") + ": h mean min max\n";
    for (std::size_t h : z.heads) {
      const Summary s = summary(rows, tied, h, get);
      data += raw(double(h)) + " " + raw(s.mean) + " " + raw(s.min) + " " + raw(s.max) + "\n";
    }
    data += "\n\n";
    body += std::string(tied ? ", \\\n     " : "plot ") + "'" + name + ".dat' index " +
            (tied ? "1" : "0") + " using 1:2:3:4 with yerrorlines lw 2 " +
            harness::series_style(tied ? 1 : 0).gnuplot() + " title " +
            harness::gp_quote(tied ? "W_Q = W_K (tied)" : "separate W_Q, W_K");
  }
  body += ", \\\n     " + raw(uniform) + " with lines dt 2 lw 2 " +
          harness::series_style(2).gnuplot() + " title 'uniform attention'\n";
  plotter.raw(
      name, data,
      "set grid\nset key below left Left reverse noenhanced\nset logscale x 2\nset xtics (" +
          [&] {
            std::string t;
            for (std::size_t h : z.heads) t += (t.empty() ? "" : ", ") + std::to_string(h);
            return t;
          }() +
          ")\nset xrange [0.8:" + raw(1.25 * double(z.heads.back())) + "]\n" + yscale +
          "set xlabel 'heads h (d_model = " + std::to_string(z.d_model) +
          ", d_k = d_model / h)' noenhanced\nset ylabel '" + ylabel + "'\nset title '" + ylabel +
          " per head (bars: range over heads), N = " + std::to_string(z.n) + "' noenhanced\n" +
          body);
}

}  // namespace

StudyOutput heads_study(const StudyOptions& o, harness::PlotFiles& plots) {
  const Sizes z = sizes(o.size);
  const auto rows = measure(o, z);
  harness::Plotter plotter(plots_dir(o), o.gnuplot, plots);
  plot_stat(plotter, "heads_self", rows, z, self_mass, "attention weight on itself",
            1.0 / double(z.n), "set logscale y\n");
  plot_stat(plotter, "heads_entropy", rows, z, entropy, "row entropy (nats)", std::log(double(z.n)),
            "");
  Report r;
  r.title = "do more heads stop attention from focusing on the token itself?";
  r.question =
      "The seed `000_*.txt` argues for multi-head attention this way: one head over-focuses on "
      "the position being encoded (\"h = 1: the attention focuses on each word itself\"), while "
      "h heads of size d_model / h give h different ways to distribute attention, so that at "
      "fixed d_model more heads express more.";
  r.setup =
      "The first layer's self-attention of the LRA text model (d_model " +
      std::to_string(z.d_model) +
      ", seeded, untrained) on the embedded random byte tokens (embedding x sqrt(d_model) + "
      "sinusoidal positions), N = " +
      std::to_string(z.n) + ", with h = 1 .. " + std::to_string(z.heads.back()) +
      " heads: the weight matrices do not depend on h, so every "
      "h splits the very same W_Q, W_K into heads of d_k = d_model / h. Separate W_Q, W_K and "
      "tied W_Q = W_K (where a token's score with itself, |q_i|^2 / sqrt(d_k), is the largest "
      "whenever the norms are similar). Per head: the mean weight P_ii a token pays itself, the "
      "share of rows whose largest weight is on the token itself, and the mean row entropy.";
  r.reading =
      "Uniform attention pays 1/N to each token and has entropy ln N. With separate projections "
      "an untrained head has no reason to prefer the token itself; with tied ones the diagonal "
      "score grows like sqrt(d_k), so fewer, larger heads focus more on the token itself.";
  r.paper =
      "No figure with numbers: the seed illustrates the claim with hand-drawn attention maps of "
      "a trained model. Ours are untrained weights, so the table separates what the head split "
      "does by itself (this study) from what training learns (not measured here).";
  r.figures = {{"weight on itself against h", "plots/heads_self.png"},
               {"row entropy against h", "plots/heads_entropy.png"}};
  return {table(rows, z), raw_rows(rows), r};
}

namespace {
const Registrar<StudyMaker> kRegistrar(study_registry(), "heads", {heads_study, false}, 50);
}  // namespace

}  // namespace attnlab::studies
