// prune: how many heads of a trained model can go? (Michel, Levy, Neubig 2019, "Are Sixteen
// Heads Really Better than One?"; Voita et al. 2019.) On a model trained by `attnlab train`
// (--weights DIR): each head removed alone (its output zeroed before W_O, the model's head
// mask), its held-out score change being its importance; then heads removed cumulatively in
// increasing order of importance, the held-out score against the number removed.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "studies/common.hpp"
#include "training/model.hpp"

namespace attnlab::studies {
namespace {

// One head, 0-based.
struct Head {
  std::size_t layer, head;
};

std::string head_name(const Head& h) {
  return "L" + std::to_string(h.layer + 1) + "H" + std::to_string(h.head + 1);
}

// The held-out score of `model` with the heads in `removed` masked out (head_mask 0; every other
// head 1, so that removing none is bitwise the plain forward).
training::Score score_without(training::TaskModel model, const std::vector<Head>& removed,
                              const std::vector<training::Batch>& held) {
  auto& layers = model.encoder_body("study prune").encoder.layers;
  for (auto& layer : layers) layer.self_attn.head_mask.assign(layer.self_attn.heads(), 1.0f);
  for (const Head& h : removed) layers[h.layer].self_attn.head_mask[h.head] = 0.0f;
  return training::evaluate(model, held);
}

struct Row {
  std::string kind;  // unpruned, untrained, single, layer, cumulative
  std::string weights;
  std::size_t removed;
  std::string heads;  // the head(s) removed: "L1H2", "L1", the last one added for cumulative
  training::Score score;
};

struct Measured {
  std::vector<Row> rows;
  std::vector<Head> order;         // increasing importance
  std::vector<double> importance;  // per head of `order`: bits without it - bits with all
  double unpruned = 0, untrained = 0;
  std::size_t total = 0;
};

Measured measure(const StudyOptions& o, TrainedPair& pair) {
  Measured m;
  const training::TrainConfig& c = pair.trained->config();
  const std::vector<training::Batch>& held = pair.trained->held_out();
  const training::TaskModel& model = pair.trained->model();
  progress(o, "prune", "unpruned and untrained");
  const training::Score full = training::evaluate(model, held);
  const training::Score untrained = pair.untrained->evaluate();
  m.unpruned = full.bits(), m.untrained = untrained.bits();
  m.rows.push_back({"unpruned", "trained", 0, "", full});
  m.rows.push_back({"untrained", "untrained", 0, "", untrained});

  std::vector<Head> heads;
  for (std::size_t l = 0; l < c.layers; ++l)
    for (std::size_t h = 0; h < c.heads; ++h) heads.push_back({l, h});
  m.total = heads.size();
  std::vector<double> delta;
  for (const Head& h : heads) {
    progress(o, "prune", "without " + head_name(h));
    const training::Score s = score_without(model, {h}, held);
    m.rows.push_back({"single", "trained", 1, head_name(h), s});
    delta.push_back(s.bits() - full.bits());
  }
  for (std::size_t l = 0; l < c.layers; ++l) {
    progress(o, "prune", "without layer " + std::to_string(l + 1) + "'s attention");
    std::vector<Head> all;
    for (std::size_t h = 0; h < c.heads; ++h) all.push_back({l, h});
    m.rows.push_back({"layer", "trained", c.heads, "L" + std::to_string(l + 1),
                      score_without(model, all, held)});
  }
  std::vector<std::size_t> rank(heads.size());
  std::iota(rank.begin(), rank.end(), 0);
  std::stable_sort(rank.begin(), rank.end(),
                   [&](std::size_t a, std::size_t b) { return delta[a] < delta[b]; });
  for (std::size_t i : rank) m.order.push_back(heads[i]), m.importance.push_back(delta[i]);
  std::vector<Head> removed;
  m.rows.push_back({"cumulative", "trained", 0, "", full});
  for (const Head& h : m.order) {
    removed.push_back(h);
    progress(o, "prune", std::to_string(removed.size()) + " heads removed");
    m.rows.push_back({"cumulative", "trained", removed.size(), head_name(h),
                      score_without(model, removed, held)});
  }
  return m;
}

Csv raw_rows(const Measured& m) {
  Csv csv{{"kind", "weights", "removed", "heads", "loss", "bits", "accuracy", "delta_bits"}, {}};
  for (const Row& r : m.rows)
    csv.add({r.kind, r.weights, std::to_string(r.removed), r.heads, raw(r.score.loss),
             raw(r.score.bits()), raw(r.score.accuracy()), raw(r.score.bits() - m.unpruned)});
  return csv;
}

Table table(const Measured& m, const std::string& unit) {
  Table t{{"heads removed", "last removed (its importance alone)", unit, "change", "accuracy"}, {}};
  for (const Row& r : m.rows) {
    if (r.kind != "cumulative") continue;
    const std::string last =
        r.removed == 0 ? "none (unpruned)"
                       : r.heads + " (" + cell("%+.4f", m.importance[r.removed - 1]) + ")";
    t.rows.push_back({std::to_string(r.removed) + " of " + std::to_string(m.total), last,
                      cell("%.4f", r.score.bits()), cell("%+.4f", r.score.bits() - m.unpruned),
                      cell("%.1f%%", 100 * r.score.accuracy())});
  }
  for (const Row& r : m.rows)
    if (r.kind == "untrained")
      t.rows.push_back({"untrained model", "—", cell("%.4f", r.score.bits()),
                        cell("%+.4f", r.score.bits() - m.unpruned),
                        cell("%.1f%%", 100 * r.score.accuracy())});
  return t;
}

std::string single_table(const Measured& m, const std::string& unit) {
  Table t{{"head removed alone", unit, "change (importance)", "accuracy"}, {}};
  for (const Row& r : m.rows)
    if (r.kind == "single" || r.kind == "layer")
      t.rows.push_back({r.kind == "layer" ? "all of layer " + r.heads.substr(1) : r.heads,
                        cell("%.4f", r.score.bits()), cell("%+.4f", r.score.bits() - m.unpruned),
                        cell("%.1f%%", 100 * r.score.accuracy())});
  return "## Each head removed alone, and each layer's attention removed\n\n" + t.markdown();
}

// The most heads removable in the cumulative order before the score rises by more than `cost`.
std::size_t removable(const Measured& m, double cost) {
  std::size_t most = 0;
  for (const Row& r : m.rows)
    if (r.kind == "cumulative" && r.score.bits() - m.unpruned <= cost)
      most = std::max(most, r.removed);
    else if (r.kind == "cumulative")
      break;
  return most;
}

std::string findings(const Measured& m, const std::string& unit) {
  std::string md = "## Findings (computed from the rows)\n\n";
  for (double cost : {0.01, 0.05, 0.1})
    md += "- heads removable in the cumulative order at a cost of at most " + cell("%.2f", cost) +
          " " + unit + ": " + std::to_string(removable(m, cost)) + " of " +
          std::to_string(m.total) + ".\n";
  std::size_t harmless = 0;
  for (double d : m.importance) harmless += d <= 0.01 ? 1 : 0;
  md += "- removed alone, " + std::to_string(harmless) + " of " + std::to_string(m.total) +
        " heads cost at most 0.01 " + unit + "; the most important, " + head_name(m.order.back()) +
        ", costs " + cell("%+.4f", m.importance.back()) + ".\n";
  md += "- every head removed: " + cell("%.4f", m.rows.back().score.bits()) + " " + unit +
        ", against " + cell("%.4f", m.unpruned) + " unpruned and " + cell("%.4f", m.untrained) +
        " untrained.\n";
  return md;
}

void plot(const StudyOptions& o, const Measured& m, const std::string& unit,
          harness::PlotFiles& files) {
  harness::Series curve{"heads removed in increasing order of importance", {}};
  for (const Row& r : m.rows)
    if (r.kind == "cumulative") curve.xy.emplace_back(double(r.removed), r.score.bits());
  const harness::Series unpruned{"unpruned", {{0.0, m.unpruned}, {double(m.total), m.unpruned}}};
  harness::Plotter(plots_dir(o), o.gnuplot, files)
      .plot("prune", {curve, unpruned},
            "set grid\nset key top left Left reverse noenhanced\nset xlabel 'heads removed (of " +
                std::to_string(m.total) + ")'\nset ylabel 'held-out " + unit +
                "'\nset title 'Heads removed from the trained model' noenhanced\n",
            "using 1:2 with linespoints lw 2");
}

}  // namespace

StudyOutput prune_study(const StudyOptions& o, harness::PlotFiles& plots) {
  TrainedPair pair = load_trained(o);
  const training::TrainConfig& c = pair.trained->config();
  const std::string unit = bits_unit(c);
  const Measured m = measure(o, pair);
  plot(o, m, unit, plots);
  Report r;
  r.title = "how many heads of a trained model can go?";
  r.question =
      "Michel, Levy and Neubig (2019, \"Are Sixteen Heads Really Better than One?\") removed "
      "attention heads from trained models at test time: most heads can go one at a time with "
      "little loss, and many together, in increasing order of importance, before the score "
      "falls; Voita et al. (2019) pruned most encoder heads of a translation model for a small "
      "BLEU loss. The same on a model trained by `attnlab train`.";
  r.setup =
      pair.describe() +
      " A head is removed by its head mask (models/multi_head_attention.hpp): "
      "its output is zeroed before the heads are merged and projected by W_O (Michel et al.'s "
      "mask), so the layer keeps b_O and the other heads. Score: the held-out set's mean "
      "cross-entropy in " +
      unit +
      " (loss / ln 2), as `attnlab train` reports it. Importance "
      "of a head: the change when it alone is removed. The cumulative curve removes the heads "
      "in increasing order of that importance (fixed once, not recomputed after each removal). "
      "The size (" +
      std::string(size_name(o.size)) +
      ") changes nothing here: the held-out "
      "set is the run's.";
  r.reading =
      "Change: against the unpruned model (negative: better without). The untrained row is "
      "the same config at step 0; a uniform guess scores log2(" +
      std::to_string(pair.trained->task().classes()) +
      ") = " + cell("%.3f", std::log2(double(pair.trained->task().classes()))) + " " + unit + ".";
  r.paper =
      "`../shared/anchors/papers.md`: pruning 38 of 48 encoder heads of a Transformer-base "
      "(WMT EN-RU) costs 0.15 BLEU (Voita et al.); 20% (WMT) to 40% (BERT) of the heads can be "
      "pruned without noticeable loss (Michel et al., who also find most single heads "
      "removable alone at little cost). Their models are trained at scale; ours is a small "
      "model (" +
      std::to_string(c.layers * c.heads) +
      " heads) trained for minutes; with few "
      "heads there is less redundancy to prune.";
  r.figures = {{"held-out score against heads removed", "plots/prune.png"}};
  r.extra = findings(m, unit) + "\n" + single_table(m, unit);
  return {table(m, unit), raw_rows(m), r};
}

namespace {
const Registrar<StudyMaker> kRegistrar(study_registry(), "prune", {prune_study, true}, 80);
}  // namespace

}  // namespace attnlab::studies
