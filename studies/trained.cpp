// trained: the measures of spectrum, heads, symmetry and rank-collapse, per layer and head, on a
// model trained by `attnlab train` (--weights DIR) beside the same model untrained (the run's
// initialisation), on the task's own held-out inputs; plus the head-specialisation measures of
// Voita et al. 2019 (positional heads, rare-token heads). Is P low rank in a trained model
// (Linformer, Figure 1)? Do trained heads specialise?
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "attnlab/error.hpp"
#include "models/transformer.hpp"
#include "studies/analysis.hpp"
#include "studies/common.hpp"
#include "training/model.hpp"

namespace attnlab::studies {
namespace {

// Sequences of the held-out set analysed (the first of its first batch).
std::size_t sequences(Size s) {
  return s == Size::tiny ? 1 : 8;
}

// The share of held-out positions whose tokens count as rare (the least frequent token ids).
constexpr double kRareShare = 0.1;

// One head's measures (or the uniform reference's), averaged over the sequences.
struct HeadRow {
  std::string weights;              // trained, untrained, uniform
  std::size_t layer = 0, head = 0;  // 1-based; 0 for the uniform reference
  std::vector<double> curve;        // mean normalised cumulative singular values c_k
  HeadStats stats;
  PositionStats position;
  double rare = 0, asymmetry = 0;

  std::size_t rank(double share) const { return rank_for_share(curve, share); }
};

// Rank collapse of one layer's output (layer 0: the embedded input), averaged over sequences.
struct LayerRow {
  std::string weights;
  std::size_t layer = 0;
  RankResiduals res;
};

struct Measured {
  std::vector<HeadRow> heads;
  std::vector<LayerRow> layers;
  std::size_t n = 0, sequences = 0, rare_ids = 0;
  std::vector<std::size_t> rare_list;  // the rare ids, rarest first
  double rare_positions = 0;           // share of the held-out positions with a rare token
};

// The rare token ids: the least frequent ids of the whole held-out set, added while their
// positions stay within kRareShare of all positions.
std::vector<bool> rare_tokens(const std::vector<training::Batch>& held, std::size_t vocab,
                              Measured& m) {
  std::vector<double> count(vocab, 0.0);
  double total = 0;
  for (const auto& b : held)
    for (std::size_t i = 0; i < b.tokens.shape()[0]; ++i)
      for (std::size_t j = 0; j < std::size_t(b.lengths[i]); ++j)
        count[b.tokens(i, j)] += 1, ++total;
  std::vector<std::size_t> ids(vocab);
  for (std::size_t i = 0; i < vocab; ++i) ids[i] = i;
  std::stable_sort(ids.begin(), ids.end(), [&](auto a, auto b) { return count[a] < count[b]; });
  std::vector<bool> rare(vocab, false);
  double taken = 0;
  for (std::size_t id : ids) {
    if (count[id] == 0) continue;
    if (taken + count[id] > kRareShare * total) break;
    taken += count[id];
    rare[id] = true;
    ++m.rare_ids;
    m.rare_list.push_back(id);
  }
  m.rare_positions = total > 0 ? taken / total : 0;
  return rare;
}

// The rare ids as text: printable bytes as characters for the text task, other bytes in hex,
// ids of other tasks as numbers; rarest first.
std::string rare_text(const Measured& m, bool bytes) {
  std::string out;
  for (std::size_t id : m.rare_list) {
    char text[16];
    if (bytes && id > 32 && id < 127 && id != '`')
      std::snprintf(text, sizeof text, "`%c`", char(id));
    else if (bytes)
      std::snprintf(text, sizeof text, "0x%02zx", id);
    else
      std::snprintf(text, sizeof text, "%zu", id);
    out += (out.empty() ? "" : " ") + std::string(text);
  }
  return out.empty() ? "none" : out;
}

// Adds one head's measures of sequence b into `row` (divided by the sequences at the end).
void add_head(HeadRow& row, const Tensor& p, const QKV* in, std::size_t b, std::size_t h,
              const std::vector<bool>& flagged) {
  const std::size_t n = p.shape()[2];
  const auto c = normalized_cumulative(singular_values(&p(b, h, 0, 0), n, n));
  if (row.curve.empty()) row.curve.assign(n, 0.0);
  for (std::size_t k = 0; k < n; ++k) row.curve[k] += c[k];
  const HeadStats s = head_stats(p, b, h);
  row.stats.self_mass += s.self_mass, row.stats.entropy += s.entropy;
  row.stats.self_argmax += s.self_argmax;
  const PositionStats ps = position_stats(p, b, h);
  row.position.distance += ps.distance, row.position.previous_mass += ps.previous_mass;
  row.position.previous_argmax += ps.previous_argmax;
  row.rare += flagged_mass(p, b, h, flagged);
  if (in) row.asymmetry += score_asymmetry(in->q, in->k, b, h);
}

void divide(HeadRow& row, double count) {
  for (double& c : row.curve) c /= count;
  row.stats.self_mass /= count, row.stats.entropy /= count, row.stats.self_argmax /= count;
  row.position.distance /= count, row.position.previous_mass /= count;
  row.position.previous_argmax /= count;
  row.rare /= count, row.asymmetry /= count;
}

// Every layer's and head's measures of `model` on the first `count` sequences of `batch`.
void measure_model(const training::TaskModel& model, const std::string& weights,
                   const training::Batch& batch, std::size_t count,
                   const std::vector<std::vector<bool>>& flags, Measured& m) {
  const Mask mask = model.mask(batch);
  const models::EncoderModel& body = model.encoder_body("study trained");
  const std::size_t heads = body.config().layer.heads, d = body.config().layer.d_model;
  const std::size_t n = batch.tokens.shape()[1];
  const auto add_layer = [&](std::size_t layer, const models::Activations& x) {
    LayerRow row{weights, layer, {}};
    for (std::size_t b = 0; b < count; ++b) {
      const RankResiduals r = rank_residuals(&x(b, 0, 0), n, d);
      row.res.rank1 += r.rank1 / double(count), row.res.token_mean += r.token_mean / double(count);
    }
    m.layers.push_back(row);
  };
  body.forward(batch.tokens, mask,
               [&](std::size_t l, const models::Activations& x, const models::Activations& out) {
                 if (l == 0) add_layer(0, x);
                 const auto& layer = body.encoder.layers[l];
                 const auto a = layer.attention_input(x);
                 const QKV in = layer.self_attn.project(a, a);
                 const Tensor p = models::attention_probabilities(in.q, in.k, mask);
                 for (std::size_t h = 0; h < heads; ++h) {
                   HeadRow row{weights, l + 1, h + 1, {}, {}, {}, 0, 0};
                   for (std::size_t b = 0; b < count; ++b) add_head(row, p, &in, b, h, flags[b]);
                   divide(row, double(count));
                   m.heads.push_back(std::move(row));
                 }
                 add_layer(l + 1, out);
               });
}

Measured measure(const StudyOptions& o, const TrainedPair& pair) {
  Measured m;
  const std::vector<training::Batch>& held = pair.trained->held_out();
  const training::Batch& batch = held.front();
  m.n = batch.tokens.shape()[1];
  m.sequences = std::min(sequences(o.size), batch.tokens.shape()[0]);
  const std::vector<bool> rare = rare_tokens(held, pair.trained->task().vocab(), m);
  std::vector<std::vector<bool>> flags(m.sequences, std::vector<bool>(m.n, false));
  for (std::size_t b = 0; b < m.sequences; ++b)
    for (std::size_t j = 0; j < m.n; ++j) flags[b][j] = rare[batch.tokens(b, j)];
  progress(o, "trained", "trained weights");
  measure_model(pair.trained->model(), "trained", batch, m.sequences, flags, m);
  progress(o, "trained", "untrained weights");
  measure_model(pair.untrained->model(), "untrained", batch, m.sequences, flags, m);
  // Uniform attention under the same mask: zero queries and keys give every visible key the
  // same weight, through the same softmax.
  const Mask mask = pair.trained->model().mask(batch);
  Tensor zero = Tensor::from_shape({batch.tokens.shape()[0], 1, m.n, 1});
  zero.fill(0.0f);
  const Tensor p = models::attention_probabilities(zero, zero, mask);
  HeadRow uniform{"uniform", 0, 0, {}, {}, {}, 0, 0};
  for (std::size_t b = 0; b < m.sequences; ++b) add_head(uniform, p, nullptr, b, 0, flags[b]);
  divide(uniform, double(m.sequences));
  m.heads.push_back(std::move(uniform));
  return m;
}

Csv raw_rows(const Measured& m) {
  Csv csv{{"weights", "layer", "head", "measure", "value"}, {}};
  for (const HeadRow& r : m.heads) {
    const std::string layer = r.layer ? std::to_string(r.layer) : "all";
    const std::string head = r.head ? std::to_string(r.head) : "all";
    const auto add = [&](const char* measure, double v) {
      csv.add({r.weights, layer, head, measure, raw(v)});
    };
    add("rank90", double(r.rank(0.9)));
    add("rank99", double(r.rank(0.99)));
    add("share_quarter", r.curve[m.n / 4 - 1]);
    add("self_mass", r.stats.self_mass);
    add("self_argmax", r.stats.self_argmax);
    add("entropy", r.stats.entropy);
    add("distance", r.position.distance);
    add("previous_mass", r.position.previous_mass);
    add("previous_argmax", r.position.previous_argmax);
    add("rare_mass", r.rare);
    if (r.weights != "uniform") add("asymmetry", r.asymmetry);
  }
  for (const LayerRow& r : m.layers) {
    csv.add({r.weights, std::to_string(r.layer), "all", "res_rank1", raw(r.res.rank1)});
    csv.add({r.weights, std::to_string(r.layer), "all", "res_token_mean", raw(r.res.token_mean)});
  }
  return csv;
}

std::vector<std::string> head_cells(const HeadRow& r, std::size_t n) {
  return {std::to_string(r.rank(0.9)) + " / " + std::to_string(r.rank(0.99)),
          cell("%.3f", r.curve[n / 4 - 1]),
          cell("%.3f", r.stats.self_mass),
          cell("%.3f", r.stats.entropy),
          cell("%.1f", r.position.distance),
          cell("%.3f", r.position.previous_mass) + " (" +
              cell("%.0f%%", 100 * r.position.previous_argmax) + ")",
          cell("%.3f", r.rare),
          r.weights == "uniform" ? "—" : cell("%.3f", r.asymmetry)};
}

Table table(const Measured& m) {
  Table t{{"layer", "head", "weights",
           "k for 90% / 99% of P's singular values (of N = " + std::to_string(m.n) + ")",
           "share in the first N/4", "weight on itself", "row entropy (nats)",
           "mean distance attended (tokens)", "weight on the previous token (rows peaking there)",
           "weight on rare tokens", "score asymmetry (Frobenius norm of S - S^T over that of S)"},
          {}};
  for (const HeadRow& r : m.heads) {
    std::vector<std::string> row = {r.layer ? std::to_string(r.layer) : "—",
                                    r.head ? std::to_string(r.head) : "—",
                                    r.weights == "uniform" ? "uniform attention" : r.weights};
    for (auto& c : head_cells(r, m.n)) row.push_back(std::move(c));
    t.rows.push_back(std::move(row));
  }
  // Side by side: trained, then untrained, per layer and head; the uniform reference last.
  std::stable_sort(t.rows.begin(), t.rows.end() - 1, [](const auto& a, const auto& b) {
    return std::make_pair(std::stoul(a[0]), std::stoul(a[1])) <
           std::make_pair(std::stoul(b[0]), std::stoul(b[1]));
  });
  return t;
}

std::string collapse_table(const Measured& m) {
  Table t{{"layer output", "trained: rank-1 residual / token-mean residual",
           "untrained: rank-1 residual / token-mean residual"},
          {}};
  std::map<std::size_t, std::map<std::string, RankResiduals>> by_layer;
  for (const LayerRow& r : m.layers) by_layer[r.layer][r.weights] = r.res;
  for (const auto& [layer, w] : by_layer) {
    std::vector<std::string> row = {layer == 0 ? "input (embedded tokens)" : std::to_string(layer)};
    for (const char* weights : {"trained", "untrained"}) {
      const RankResiduals& r = w.at(weights);
      row.push_back(cell("%.3f", r.rank1) + " / " + cell("%.3f", r.token_mean));
    }
    t.rows.push_back(std::move(row));
  }
  return "## Rank collapse of the layer outputs\n\nAs the study rank-collapse measures it: for "
         "each layer's output X [N, d_model] (before a pre-LN stack's final LayerNorm), "
         "||X - X_1||_F / ||X||_F (X_1 the best rank-1 approximation) / ||X - 1 x^T||_F / "
         "||X||_F (x the mean token), averaged over the sequences. Near 0: every token the "
         "same (collapsed).\n\n" +
         t.markdown();
}

// The heads of `weights` for which `pick` holds, as "L1H2 (0.83)", or "none".
template <class Pick, class Value>
std::string heads_where(const Measured& m, const std::string& weights, Pick pick, Value value) {
  std::string list;
  for (const HeadRow& r : m.heads)
    if (r.weights == weights && pick(r))
      list += (list.empty() ? "" : ", ") + std::string("L") + std::to_string(r.layer) + "H" +
              std::to_string(r.head) + " (" + cell("%.2f", value(r)) + ")";
  return list.empty() ? "none" : list;
}

template <class Get>
double mean_over_heads(const Measured& m, const std::string& weights, Get get) {
  double sum = 0, count = 0;
  for (const HeadRow& r : m.heads)
    if (r.weights == weights) sum += get(r), ++count;
  return count ? sum / count : NAN;
}

const HeadRow& uniform_row(const Measured& m) {
  return m.heads.back();
}

// The answers to the study's questions, in numbers computed from the rows.
std::string findings(const Measured& m) {
  const HeadRow& u = uniform_row(m);
  std::string md = "## Findings (computed from the rows)\n\n";
  for (const char* w : {"trained", "untrained"}) {
    md +=
        "- " + std::string(w) + ": k for 90% of P's singular values, mean over heads " +
        cell("%.1f", mean_over_heads(m, w, [](const HeadRow& r) { return double(r.rank(0.9)); })) +
        ", for 99% " +
        cell("%.1f", mean_over_heads(m, w, [](const HeadRow& r) { return double(r.rank(0.99)); })) +
        " of N = " + std::to_string(m.n) + "; share in the first N/4 " +
        cell("%.3f",
             mean_over_heads(m, w, [&](const HeadRow& r) { return r.curve[m.n / 4 - 1]; })) +
        ".\n";
  }
  md +=
      "- uniform attention under the same mask: k for 90% / 99% = " + std::to_string(u.rank(0.9)) +
      " / " + std::to_string(u.rank(0.99)) + ", share in N/4 " +
      cell("%.3f", u.curve[m.n / 4 - 1]) + ".\n";
  for (const char* w : {"trained", "untrained"}) {
    const auto previous_argmax = [](const HeadRow& r) { return r.position.previous_argmax; };
    md +=
        "- " + std::string(w) +
        ", positional heads by Voita et al.'s criterion (the previous "
        "token has the largest weight in >= 90% of the rows): " +
        heads_where(
            m, w, [](const HeadRow& r) { return r.position.previous_argmax >= 0.9; },
            previous_argmax) +
        "; in >= 50% of the rows: " +
        heads_where(
            m, w, [](const HeadRow& r) { return r.position.previous_argmax >= 0.5; },
            previous_argmax) +
        "; weight on the previous token >= 0.5: " +
        heads_where(
            m, w, [](const HeadRow& r) { return r.position.previous_mass >= 0.5; },
            [](const HeadRow& r) { return r.position.previous_mass; }) +
        "; local heads (mean distance attended <= 1/8 of uniform attention's " +
        cell("%.1f", u.position.distance) + "): " +
        heads_where(
            m, w, [&](const HeadRow& r) { return r.position.distance <= u.position.distance / 8; },
            [](const HeadRow& r) { return r.position.distance; }) +
        "; heads on the token itself (weight >= 0.5): " +
        heads_where(
            m, w, [](const HeadRow& r) { return r.stats.self_mass >= 0.5; },
            [](const HeadRow& r) { return r.stats.self_mass; }) +
        "; rare-token heads (weight on rare tokens >= 2x uniform's " + cell("%.3f", u.rare) +
        "): " +
        heads_where(
            m, w, [&](const HeadRow& r) { return r.rare >= 2 * u.rare; },
            [](const HeadRow& r) { return r.rare; }) +
        ".\n";
  }
  return md;
}

void plot(const StudyOptions& o, const Measured& m, std::size_t layers, harness::PlotFiles& files) {
  std::vector<harness::Series> series;
  for (const char* w : {"trained", "untrained"})
    for (std::size_t l = 1; l <= layers; ++l) {
      harness::Series s{std::string(w) + ", layer " + std::to_string(l) + " (mean of heads)", {}};
      std::vector<double> mean(m.n, 0.0);
      double count = 0;
      for (const HeadRow& r : m.heads)
        if (r.weights == w && r.layer == l) {
          for (std::size_t k = 0; k < m.n; ++k) mean[k] += r.curve[k];
          ++count;
        }
      for (std::size_t k = 0; k < m.n; ++k) s.xy.emplace_back(double(k + 1), mean[k] / count);
      series.push_back(std::move(s));
    }
  harness::Series u{"uniform attention, same mask", {}};
  for (std::size_t k = 0; k < m.n; ++k) u.xy.emplace_back(double(k + 1), uniform_row(m).curve[k]);
  series.push_back(std::move(u));
  harness::Plotter(plots_dir(o), o.gnuplot, files)
      .plot("trained_spectrum", series,
            "set grid\nset key below left Left reverse maxcols 2 noenhanced\nset logscale x 2\n"
            "set yrange [0:1.02]\nset xlabel 'singular value index k'\nset ylabel "
            "'normalised cumulative singular value'\nset title 'Spectrum of P, trained and "
            "untrained, N = " +
                std::to_string(m.n) + "' noenhanced\n",
            "using 1:2 with linespoints lw 2 pi " +
                std::to_string(std::max<std::size_t>(1, m.n / 8)));
}

}  // namespace

StudyOutput trained_study(const StudyOptions& o, harness::PlotFiles& plots) {
  const TrainedPair pair = load_trained(o);
  const training::TrainConfig& c = pair.trained->config();
  if (c.n < 4)
    throw Error("study trained: the checkpoint's N = " + std::to_string(c.n) +
                ", the spectrum's N/4 needs N >= 4");
  const Measured m = measure(o, pair);
  plot(o, m, c.layers, plots);
  Report r;
  r.title = "do trained heads differ from untrained ones?";
  r.question =
      "The studies spectrum, heads, symmetry and rank-collapse run on seeded, untrained weights. "
      "Here the same measures run on a model trained by `attnlab train`, beside the same model "
      "untrained, on the task's own held-out inputs. Is P = softmax(q k^T / sqrt(d_k)) low rank "
      "in a trained model, as Linformer's Figure 1 found for pretrained RoBERTa? Do trained "
      "heads specialise, as Voita et al. (2019) found in trained translation encoders: "
      "positional heads attending to a neighbour, heads attending to rare tokens? Do tokens "
      "attend themselves, are the scores symmetric, do the layer outputs collapse towards rank "
      "one?";
  r.setup =
      pair.describe() + " Inputs: the first " + std::to_string(m.sequences) +
      " sequence(s) of "
      "the held-out set's first batch; every measure is per sequence, then averaged. Per layer "
      "and head, from the input its self-attention sees (norm1(x) under pre-LN), P under the "
      "model's own mask (" +
      std::string(c.causal ? "causal" : "key padding only") +
      "):\n\n"
      "- spectrum (as the study spectrum): the singular values s of P (float64 SVD) give c_k = "
      "(s_1 + ... + s_k) / sum(s); c_k is averaged over the sequences, and the table gives the "
      "smallest k with c_k >= 90% and 99%, and c_k at k = N/4 (Linformer's 128 of 512). " +
      (c.causal
           ? "The model is causal, so P is lower-triangular (row i spreads over keys 0..i): the "
             "SVD is of the whole N x N P as it is, zeros above the diagonal included, no "
             "symmetrisation. A lower-triangular P with a positive diagonal is invertible, so "
             "its exact rank is always N; low rank here means the share of sum(s) the first k "
             "hold. The uniform row (row i = 1/(i+1) on keys 0..i) shows what the triangle "
             "alone gives.\n"
           : "\n") +
      "- heads (as the study heads): the mean weight P_ii a token pays itself and the mean row "
      "entropy in nats.\n"
      "- symmetry (as the study symmetry): ||S - S^T||_F / ||S||_F of the scores S = q k^T "
      "before scaling, mask and softmax.\n"
      "- specialisation (Voita et al.): the mean distance attended sum_j P_ij |i - j|; the "
      "weight on the previous token P_i,i-1 (rows i >= 1) and the share of rows whose largest "
      "weight is there (a positional head); the weight on rare tokens: the least frequent token "
      "ids of the whole held-out set, taken while their positions stay within " +
      cell("%.0f%%", 100 * kRareShare) + " of it (here " + std::to_string(m.rare_ids) + " ids, " +
      cell("%.1f%%", 100 * m.rare_positions) +
      " of the positions: " + rare_text(m, c.task == "text") +
      ").\n"
      "- rank collapse (as the study rank-collapse): the residuals of each layer's output to "
      "rank one (table below).\n\n"
      "Uniform attention under the same mask (zero scores through the same softmax) is the "
      "reference row.";
  r.reading =
      "Each head has a trained row and an untrained row; the last row is uniform attention. "
      "rows.csv has every measure in long form (weights, layer, head, measure, value; head "
      "'all' for the per-layer residuals and the uniform reference).";
  r.paper =
      "Linformer (Wang et al. 2020, Figure 1): in pretrained RoBERTa-base at n = 512 most of P "
      "lies in its first 128 singular values, more so in higher layers (a figure, no number). "
      "Voita et al. (2019, \"Analyzing Multi-Head Self-Attention\"): in trained translation "
      "encoders a few heads are positional (attend to the previous or next token in at least "
      "90% of the rows), one attends to rare tokens, and these are the heads pruning keeps "
      "longest. Dong et al. (2021): with skip connections and MLPs the outputs do not collapse "
      "to rank one. Our models are small (d_model " +
      std::to_string(c.d_model) +
      ") and trained for minutes, not RoBERTa: the table says what this run learned, not what "
      "pretraining at scale learns.";
  r.figures = {{"spectrum of P, trained against untrained", "plots/trained_spectrum.png"}};
  r.extra = findings(m) + "\n" + collapse_table(m);
  return {table(m), raw_rows(m), r};
}

namespace {
const Registrar<StudyMaker> kRegistrar(study_registry(), "trained", {trained_study, true}, 70);
}  // namespace

}  // namespace attnlab::studies
