// swap: every variant plugged into the same model (the Long Range Arena text encoder, the same
// seeded weights): the distance of each layer's output from the model with `full`, by layer and
// by N, and the time of the whole model. Then the timing split at the LRA size (N = 4096, B = 1):
// the model's forward with `full` against its attention calls and its GEMMs measured alone.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "attnlab/factory.hpp"
#include "attnlab/metrics.hpp"
#include "attnlab/stats.hpp"
#include "models/transformer.hpp"
#include "studies/analysis.hpp"
#include "studies/common.hpp"

namespace attnlab::studies {
namespace {

using Clock = std::chrono::steady_clock;

struct Sizes {
  std::vector<std::size_t> lengths;
  std::size_t layers, d_model, heads, ffn, split_n, rounds;
};

Sizes sizes(Size s) {
  if (s == Size::tiny) return {{32, 64}, 2, 32, 4, 64, 64, 2};
  return {{512, 1024, 2048, 4096}, 6, 512, 8, 2048, 4096, 3};  // LRA text: 6 x 512, 8 heads
}

// The LRA efficiency table's models, in its settings (../shared/anchors/papers.md).
const std::vector<std::string> kSpecs = {"full",    "sliding", "linformer:k=256,share=kv",
                                         "bigbird", "linear",  "linear:feature=favor"};

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

models::ModelConfig model_config(const Sizes& z, std::uint64_t seed) {
  models::ModelConfig c;
  c.layer.d_model = z.d_model, c.layer.heads = z.heads, c.layer.ffn = z.ffn;
  c.layers = z.layers, c.seed = seed;
  return c;
}

// A long-format raw row: what was measured, for which spec, N and layer (0: the whole model),
// in which round of the timing split (0 elsewhere), and its value.
struct Row {
  std::string kind, spec;
  std::size_t n, layer, round;
  double value;
};

// Rounds over N: each round runs every spec once, `full` first (the first round stores its layer
// outputs as the reference and records every spec's distances from them); each forward is timed,
// and a spec's time is its median over the rounds, so the shared machine's drift hits every spec
// alike.
void measure_errors(const StudyOptions& o, const Sizes& z, std::vector<Row>& rows) {
  const models::EncoderModel full(model_config(z, o.seed));
  for (std::size_t n : z.lengths) {
    const auto tokens = models::random_tokens(1, n, full.config().vocab, o.seed + 1);
    std::vector<models::Activations> reference;
    for (std::size_t round = 1; round <= z.rounds; ++round)
      for (const std::string& spec : kSpecs) {
        progress(o, "swap",
                 spec + ", N = " + std::to_string(n) + ", round " + std::to_string(round));
        const models::EncoderModel model = full.with_attention(spec);
        const std::string canonical = model.encoder.layers[0].self_attn.spec();
        const auto start = Clock::now();
        model.forward(tokens, {}, [&](std::size_t i, const auto&, const models::Activations& out) {
          if (round > 1) return;
          if (spec == "full") reference.push_back(out);
          const ErrorMetrics e = compare(out.data(), reference[i].data(), n, z.d_model);
          rows.push_back({"rel_fro", canonical, n, i + 1, 0, e.rel_fro});
          rows.push_back({"mean_cos", canonical, n, i + 1, 0, e.mean_cos});
        });
        // Round 1's comparisons (a few ms per layer) are in its times, alike for every spec.
        rows.push_back({"model_seconds", canonical, n, 0, round, seconds_since(start)});
      }
  }
}

// The GEMMs of one layer, as the model calls them (models::affine), on buffers of its sizes.
struct LayerGemms {
  std::vector<float> x, h, w_in, w_out, w1, w2, q, o, f1, f2, bias;
  std::size_t n, d, ffn;

  LayerGemms(std::size_t n_, std::size_t d_, std::size_t ffn_)
      : x(n_ * d_, 0.5f),
        h(n_ * ffn_, 0.5f),
        w_in(d_ * d_, 0.01f),
        w_out(d_ * d_, 0.01f),
        w1(ffn_ * d_, 0.01f),
        w2(d_ * ffn_, 0.01f),
        q(n_ * d_),
        o(n_ * d_),
        f1(n_ * ffn_),
        f2(n_ * d_),
        bias(ffn_, 0.0f),
        n(n_),
        d(d_),
        ffn(ffn_) {}

  void run() {
    for (int block = 0; block < 3; ++block)  // W_Q, W_K, W_V
      models::affine(x.data(), n, d, d, w_in.data(), d, d, bias.data(), q.data(), d);
    models::affine(q.data(), n, d, d, w_out.data(), d, d, bias.data(), o.data(), d);
    models::affine(x.data(), n, d, d, w1.data(), ffn, d, bias.data(), f1.data(), ffn);
    models::affine(h.data(), n, ffn, ffn, w2.data(), d, ffn, bias.data(), f2.data(), d);
  }
};

// The time to allocate and first write a plain 64 MiB buffer: the 4 KiB page faults the model's
// buffers would pay without their huge-page hint (glibc returns large freed blocks to the
// system, so they are fresh again next time).
double fresh_buffer_seconds() {
  const auto start = Clock::now();
  std::vector<float> fresh(std::size_t{16} << 20, 1.0f);
  const double s = seconds_since(start);
  return fresh[fresh.size() / 2] == 1.0f ? s : NAN;  // keeps the buffer from being optimised out
}

// Rounds of (whole model, its attention calls alone, its GEMMs alone), alternated so that the
// shared machine's drift hits all three alike.
void measure_split(const StudyOptions& o, const Sizes& z, std::vector<Row>& rows) {
  const models::EncoderModel model(model_config(z, o.seed));
  const auto tokens = models::random_tokens(1, z.split_n, model.config().vocab, o.seed + 1);
  const auto& mha = model.encoder.layers[0].self_attn;
  const auto x = model.embed(tokens);
  const QKV in = mha.project(x, x);
  Tensor out = Tensor::from_shape(in.q.shape());
  LayerGemms gemms(z.split_n, z.d_model, z.ffn);
  for (std::size_t round = 1; round <= z.rounds; ++round) {
    progress(o, "swap",
             "timing split at N = " + std::to_string(z.split_n) + ", round " +
                 std::to_string(round) + " of " + std::to_string(z.rounds));
    auto start = Clock::now();
    model.forward(tokens);
    rows.push_back({"split_model_seconds", "full", z.split_n, 0, round, seconds_since(start)});
    start = Clock::now();
    for (std::size_t l = 0; l < z.layers; ++l)
      mha.attention().forward(in.q, in.k, in.v, {}, {}, out);
    rows.push_back({"split_attention_seconds", "full", z.split_n, 0, round, seconds_since(start)});
    start = Clock::now();
    for (std::size_t l = 0; l < z.layers; ++l) gemms.run();
    rows.push_back({"split_gemm_seconds", "full", z.split_n, 0, round, seconds_since(start)});
    rows.push_back({"fresh_64mib_seconds", "", 0, 0, round, fresh_buffer_seconds()});
  }
}

// The row's value; the median over rounds where there are several (model_seconds).
double value(const std::vector<Row>& rows, const std::string& kind, const std::string& spec,
             std::size_t n, std::size_t layer) {
  std::vector<double> v;
  for (const Row& r : rows)
    if (r.kind == kind && r.spec == spec && r.n == n && r.layer == layer) v.push_back(r.value);
  return v.empty() ? NAN : median(v);
}

double median_of(const std::vector<Row>& rows, const std::string& kind) {
  std::vector<double> v;
  for (const Row& r : rows)
    if (r.kind == kind) v.push_back(r.value);
  return median(v);
}

std::vector<std::string> specs_in(const std::vector<Row>& rows) {
  std::vector<std::string> specs;
  for (const Row& r : rows)
    if (r.kind == "rel_fro" && std::find(specs.begin(), specs.end(), r.spec) == specs.end())
      specs.push_back(r.spec);
  return specs;
}

Table error_table(const std::vector<Row>& rows, const Sizes& z) {
  Table t{{"spec"}, {}};
  for (std::size_t n : z.lengths) t.header.push_back("N=" + std::to_string(n));
  for (const auto& spec : specs_in(rows)) {
    std::vector<std::string> cells = {"`" + spec + "`"};
    for (std::size_t n : z.lengths) {
      const double full_s = value(rows, "model_seconds", "full", n, 0),
                   s = value(rows, "model_seconds", spec, n, 0);
      cells.push_back(cell("%.2e", value(rows, "rel_fro", spec, n, z.layers)) + ", " +
                      cell("%.3g s", s) + " (" + cell("%.2fx", full_s / s) + ")");
    }
    t.rows.push_back(cells);
  }
  return t;
}

Table layer_table(const std::vector<Row>& rows, const Sizes& z) {
  const std::size_t n = z.lengths.back();
  Table t{{"spec (N = " + std::to_string(n) + ")"}, {}};
  for (std::size_t l = 1; l <= z.layers; ++l) t.header.push_back("layer " + std::to_string(l));
  for (const auto& spec : specs_in(rows)) {
    std::vector<std::string> cells = {"`" + spec + "`"};
    for (std::size_t l = 1; l <= z.layers; ++l)
      cells.push_back(cell("%.2e", value(rows, "rel_fro", spec, n, l)) + " (cos " +
                      cell("%.4f", value(rows, "mean_cos", spec, n, l)) + ")");
    t.rows.push_back(cells);
  }
  return t;
}

std::string split_section(const std::vector<Row>& rows, const Sizes& z) {
  const double model = median_of(rows, "split_model_seconds"),
               attention = median_of(rows, "split_attention_seconds"),
               gemm = median_of(rows, "split_gemm_seconds");
  Table t{{"whole model forward", "its " + std::to_string(z.layers) + " attention calls alone",
           "its GEMMs alone", "model / (attention + GEMMs)", "everything else",
           "a fresh 64 MiB buffer"},
          {{cell("%.3f s", model), cell("%.3f s", attention), cell("%.3f s", gemm),
            cell("%.2f", model / (attention + gemm)), cell("%.3f s", model - attention - gemm),
            cell("%.3f s", median_of(rows, "fresh_64mib_seconds"))}}};
  return "## Timing split at the LRA size\n\nThe model with `full` at N = " +
         std::to_string(z.split_n) + ", B = 1, against what it cannot avoid: its " +
         std::to_string(z.layers) +
         " exact attention calls (the core's forward on the model's "
         "own q, k, v [1, " +
         std::to_string(z.heads) + ", N, " + std::to_string(z.d_model / z.heads) +
         "], into a reused output) and its GEMMs (per "
         "layer W_Q, W_K, W_V, W_O and the FFN's two, through the same `models::affine` the model "
         "calls), each measured alone. Medians of " +
         std::to_string(z.rounds) +
         " rounds, each round timing the three in turn, so the shared machine's load hits them "
         "alike (rows.csv has every round). Everything else: embedding, head split and merge, "
         "residual sums, LayerNorms, ReLU, and the page faults of the buffers each layer "
         "allocates: eight of B·N·d_model floats, 8 MiB each at this size (q, k, v, their "
         "projection, the attention output, the merged heads, the output projection, the FFN's "
         "output; residual sums and LayerNorms work in place), marked for transparent huge pages "
         "(`models::uninitialized`). The last column is what a plain fresh 64 MiB buffer (4 KiB "
         "pages) costs in the same rounds: what the layers' buffers would cost without that "
         "hint. The target is a ratio of at most 2.\n\n" +
         t.markdown();
}

Csv raw_rows(const std::vector<Row>& rows) {
  Csv csv{{"kind", "spec", "n", "layer", "round", "value"}, {}};
  for (const Row& r : rows)
    csv.add({r.kind, r.spec, std::to_string(r.n), std::to_string(r.layer), std::to_string(r.round),
             raw(r.value)});
  return csv;
}

// Values of exactly 0 (full against itself) cannot sit on a log axis.
constexpr double kFloor = 1e-9;

void plot(const StudyOptions& o, const std::vector<Row>& rows, const Sizes& z,
          harness::PlotFiles& files) {
  harness::Plotter plotter(plots_dir(o), o.gnuplot, files);
  std::vector<harness::Series> by_n, by_layer, times;
  const std::size_t n_max = z.lengths.back();
  for (const auto& spec : specs_in(rows)) {
    harness::Series e{spec, {}}, l{spec, {}}, t{spec, {}};
    for (std::size_t n : z.lengths) {
      e.xy.emplace_back(double(n), std::max(value(rows, "rel_fro", spec, n, z.layers), kFloor));
      t.xy.emplace_back(double(n), value(rows, "model_seconds", spec, n, 0));
    }
    for (std::size_t layer = 1; layer <= z.layers; ++layer)
      l.xy.emplace_back(double(layer),
                        std::max(value(rows, "rel_fro", spec, n_max, layer), kFloor));
    if (spec != "full") by_n.push_back(std::move(e)), by_layer.push_back(std::move(l));
    times.push_back(std::move(t));
  }
  const std::string common = "set grid\nset key below left Left reverse maxcols 2 noenhanced\n";
  const std::string model =
      std::to_string(z.layers) + " layers, d_model " + std::to_string(z.d_model);
  plotter.plot("swap_error_vs_n", by_n,
               common +
                   "set logscale xy\nset format y '10^{%L}'\nset xlabel 'sequence length N'\n"
                   "set ylabel 'rel. Frobenius distance from full, last layer'\nset title "
                   "'Each variant in the same model (" +
                   model + "): output error by N' noenhanced\n",
               "using 1:2 with linespoints lw 2");
  plotter.plot("swap_error_by_layer", by_layer,
               common +
                   "set logscale y\nset format y '10^{%L}'\nset xtics 1\nset xlabel 'layer'\n"
                   "set ylabel 'rel. Frobenius distance from full'\nset title 'Error by "
                   "layer, N = " +
                   std::to_string(n_max) + "' noenhanced\n",
               "using 1:2 with linespoints lw 2");
  plotter.plot("swap_time_vs_n", times,
               common +
                   "set logscale xy\nset xlabel 'sequence length N'\nset ylabel 'seconds "
                   "per model forward (B = 1)'\nset title 'Whole-model time (" +
                   model + ")' noenhanced\n",
               "using 1:2 with linespoints lw 2");
}

}  // namespace

StudyOutput swap_study(const StudyOptions& o, harness::PlotFiles& plots) {
  const Sizes z = sizes(o.size);
  std::vector<Row> rows;
  measure_errors(o, z, rows);
  measure_split(o, z, rows);
  plot(o, rows, z, plots);
  Report r;
  r.title = "every variant in the same model";
  r.question =
      "What changes when a variant replaces exact attention inside a model, rather than in one "
      "attention call: how far each layer's output moves from the same model with `full`, how "
      "that grows with depth and N, and what it saves in the time of the whole model.";
  r.setup = "The Long Range Arena text encoder (" + std::to_string(z.layers) + " layers, d_model " +
            std::to_string(z.d_model) + ", " + std::to_string(z.heads) + " heads, FFN " +
            std::to_string(z.ffn) +
            ", post-LN, byte tokens) with one set of seeded, untrained "
            "weights; each spec is the same model with its attention core swapped "
            "(`EncoderModel::with_attention`), run on the same random tokens, B = 1. The specs are "
            "the LRA table's models in its settings (local attention, Linformer k = 256 with "
            "shared key-value projection, BigBird ITC, linear elu+1, Performer FAVOR+). Distance: "
            "rel_fro = ||out - out_full||_F / ||out_full||_F over the N token vectors of a layer's "
            "output, and the mean cosine of the token vectors. Time: one forward of the whole "
            "model: the median of " +
            std::to_string(z.rounds) +
            " rounds, each round running "
            "every spec once in turn, so the shared machine's load hits them alike (speed-up = "
            "full's median / the spec's).";
  r.reading =
      "Each cell: the last layer's rel_fro, the model's time and (in brackets) its speed-up over "
      "the model with `full` at the same N. The second table follows the error through the "
      "layers at the largest N.";
  r.paper =
      "The LRA paper (Tay et al. 2020, `../shared/anchors/papers.md`) reports speed-ups of the "
      "same six models in training steps per second on TPU v3 at batch 32 (local 5.3x, "
      "Linformer 5.5x, BigBird 1.1x, linear 5.6x, Performer 5.7x at 4K) and their accuracy after "
      "training; `./dev run`'s sweep sets our attention calls beside those speed-ups (none is "
      "current in `results/`: the last, `results/archive/default/report.md`, timed older "
      "kernels). "
      "Here the whole model's forward is timed on a CPU at B = 1, and the distances are those "
      "of untrained weights: how much each approximation changes the model before any training "
      "adapts to it.";
  r.figures = {{"error against N", "plots/swap_error_vs_n.png"},
               {"error by layer", "plots/swap_error_by_layer.png"},
               {"time against N", "plots/swap_time_vs_n.png"}};
  r.extra =
      "## Error by layer\n\n" + layer_table(rows, z).markdown() + "\n" + split_section(rows, z);
  return {error_table(rows, z), raw_rows(rows), r};
}

namespace {
const Registrar<StudyMaker> kRegistrar(study_registry(), "swap", {swap_study, false}, 60);
}  // namespace

}  // namespace attnlab::studies
