// spectrum: is attention low-rank after softmax? Linformer's Figure 1 (insight 5 of the seed
// 003_*.txt): normalised cumulative singular values of P = softmax(q k^T / sqrt(d)), for each
// input distribution of the harness and for each layer of a model.
#include <algorithm>
#include <string>
#include <vector>

#include "attnlab/inputs.hpp"
#include "models/transformer.hpp"
#include "studies/analysis.hpp"
#include "studies/common.hpp"

namespace attnlab::studies {
namespace {

struct Sizes {
  std::size_t n, heads, dim;                 // the harness inputs
  std::size_t layers, d_model, ffn, mheads;  // the model
};

Sizes sizes(Size s) {
  if (s == Size::tiny) return {64, 2, 16, 2, 32, 64, 2};
  return {512, 8, 64, 6, 512, 2048, 8};  // Linformer's n = 512; the LRA text model
}

const std::vector<std::string> kInputs = {"gaussian:temp=1", "gaussian:temp=0.5", "lowrank:r=8",
                                          "local:width=32"};

// One source's curve: c_k over heads, mean and range.
struct Spectrum {
  std::string source, kind;
  std::vector<double> mean, min, max;
};

Spectrum spectrum_of(const Tensor& p, const std::string& source, const std::string& kind) {
  const std::size_t heads = p.shape()[1], n = p.shape()[2];
  Spectrum s{source, kind, std::vector<double>(n, 0.0), std::vector<double>(n, 1.0),
             std::vector<double>(n, 0.0)};
  for (std::size_t h = 0; h < heads; ++h) {
    const auto c = normalized_cumulative(singular_values(&p(0, h, 0, 0), n, p.shape()[3]));
    for (std::size_t k = 0; k < n; ++k) {
      s.mean[k] += c[k] / double(heads);
      s.min[k] = std::min(s.min[k], c[k]);
      s.max[k] = std::max(s.max[k], c[k]);
    }
  }
  return s;
}

std::vector<Spectrum> measure(const StudyOptions& o, const Sizes& z) {
  std::vector<Spectrum> out;
  for (const auto& dist : kInputs) {
    progress(o, "spectrum", "input " + dist);
    const QKV in = make_inputs(dist, 1, z.heads, z.n, z.dim, o.seed);
    out.push_back(spectrum_of(models::attention_probabilities(in.q, in.k), dist, "input"));
  }
  models::ModelConfig c;
  c.layer.d_model = z.d_model, c.layer.heads = z.mheads, c.layer.ffn = z.ffn;
  c.layers = z.layers, c.seed = o.seed;
  const models::EncoderModel model(c);
  const auto tokens = models::random_tokens(1, z.n, c.vocab, o.seed + 1);
  model.forward(tokens, {}, [&](std::size_t i, const models::Activations& x, const auto&) {
    progress(o, "spectrum", "model layer " + std::to_string(i + 1));
    const auto& layer = model.encoder.layers[i];
    const auto a = layer.attention_input(x);
    out.push_back(spectrum_of(layer.self_attn.attention_probabilities(a, a),
                              "layer " + std::to_string(i + 1), "model"));
  });
  return out;
}

Csv raw_rows(const std::vector<Spectrum>& spectra) {
  Csv csv{{"source", "kind", "k", "cumulative_mean", "cumulative_min", "cumulative_max"}, {}};
  for (const auto& s : spectra)
    for (std::size_t k = 0; k < s.mean.size(); ++k)
      csv.add(
          {s.source, s.kind, std::to_string(k + 1), raw(s.mean[k]), raw(s.min[k]), raw(s.max[k])});
  return csv;
}

Table table(const std::vector<Spectrum>& spectra, std::size_t quarter) {
  const std::size_t few = quarter / 8;  // 16 of 512
  Table t{{"source", "share in the first " + std::to_string(quarter) + " (heads: min..max)",
           "first " + std::to_string(few), "k for 90%", "k for 99%"},
          {}};
  for (const auto& s : spectra)
    t.rows.push_back({s.source,
                      cell("%.3f", s.mean[quarter - 1]) + " (" + cell("%.3f", s.min[quarter - 1]) +
                          ".." + cell("%.3f", s.max[quarter - 1]) + ")",
                      cell("%.3f", s.mean[few - 1]), std::to_string(rank_for_share(s.mean, 0.9)),
                      std::to_string(rank_for_share(s.mean, 0.99))});
  t.rows.push_back({"Linformer Fig. 1: pretrained RoBERTa-base, n = 512, mean of 10k sentences",
                    "\"most of P\" (a figure, no number)", "—", "—", "—"});
  return t;
}

void plot(const StudyOptions& o, const std::vector<Spectrum>& spectra, std::size_t quarter,
          harness::PlotFiles& files) {
  std::vector<harness::Series> series;
  for (const auto& s : spectra) {
    harness::Series line{s.source + (s.kind == "model" ? " (model)" : " (input)"), {}};
    for (std::size_t k = 0; k < s.mean.size(); ++k) line.xy.emplace_back(double(k + 1), s.mean[k]);
    series.push_back(std::move(line));
  }
  const std::string q = std::to_string(quarter);
  harness::Plotter(plots_dir(o), o.gnuplot, files)
      .plot(
          "spectrum", series,
          "set grid\nset key below left Left reverse maxcols 3 noenhanced\nset logscale x 2\nset "
          "yrange [0:1.02]\n"
          "set xlabel 'singular value index k'\nset ylabel 'normalised cumulative singular value'\n"
          "set title 'Spectrum of P = softmax(QK^T/sqrt(d)), N = " +
              std::to_string(spectra[0].mean.size()) + "' noenhanced\nset arrow from " + q +
              ", graph 0 to " + q + ", graph 1 nohead dt 2 lw 2\nset label 'Linformer: k = " + q +
              "' at " + q + ", graph 0.97 offset 1,0\n",
          "using 1:2 with linespoints lw 2 pi " +
              std::to_string(std::max<std::size_t>(1, spectra[0].mean.size() / 8)));
}

}  // namespace

StudyOutput spectrum_study(const StudyOptions& o, harness::PlotFiles& plots) {
  const Sizes z = sizes(o.size);
  const std::vector<Spectrum> spectra = measure(o, z);
  const std::size_t quarter = z.n / 4;  // Linformer's 128 of 512
  plot(o, spectra, quarter, plots);
  Report r;
  r.title = "is attention low-rank after softmax?";
  r.question =
      "Linformer (Wang et al. 2020, Figure 1) found that for pretrained RoBERTa at n = 512 most of "
      "the attention matrix P is captured by its first 128 singular values, and that higher "
      "layers are lower rank; insight 5 of the seed `003_*.txt` repeats it. We measure the same "
      "curve for the harness's input distributions and for every layer of our model.";
  r.setup = "N = " + std::to_string(z.n) +
            ". Inputs: `make_inputs(dist, B = 1, H = " + std::to_string(z.heads) +
            ", N, D = " + std::to_string(z.dim) +
            ", seed)` for each "
            "distribution (`attnlab/inputs.hpp`). Model: the LRA text encoder (" +
            std::to_string(z.layers) + " layers, d_model " + std::to_string(z.d_model) + ", " +
            std::to_string(z.mheads) + " heads, FFN " + std::to_string(z.ffn) +
            ", post-LN) with seeded, untrained weights on random byte tokens; P of each layer "
            "from the input its self-attention sees. For each head, the singular values s of P "
            "(float64 SVD) give c_k = (s_1 + ... + s_k) / sum(s); the table shows c_k averaged "
            "over heads (and its range over heads) at k = N/4 (Linformer's 128 of 512) and N/32, "
            "and the smallest k reaching 90% and 99%.";
  r.reading =
      "A share near 1 at N/4 means P is well approximated at rank N/4. rows.csv has every curve.";
  r.paper =
      "Linformer's Figure 1 (left) plots this curve for pretrained RoBERTa-base averaged over 10k "
      "sentences, and (right) the share at index 128 by layer, higher for higher layers; the "
      "paper gives no number (`../shared/anchors/papers.md`). Our model is untrained, so its "
      "layers show what random weights do, not what pretraining learns; the input rows show how "
      "much of the low rank comes from the input distribution alone.";
  r.figures = {{"normalised cumulative singular values", "plots/spectrum.png"}};
  return {table(spectra, quarter), raw_rows(spectra), r};
}

namespace {
const Registrar<StudyMaker> kRegistrar(study_registry(), "spectrum", {spectrum_study, false}, 10);
}  // namespace

}  // namespace attnlab::studies
