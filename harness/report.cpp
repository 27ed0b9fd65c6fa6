#include "harness/report.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "attnlab/error.hpp"
#include "attnlab/factory.hpp"
#include "harness/anchors.hpp"
#include "harness/meta.hpp"
#include "harness/plot.hpp"
#include "harness/rows.hpp"

namespace attnlab::harness {
namespace fs = std::filesystem;
namespace {

const std::string kDash = "—";

std::string fmt(const char* format, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, x);
  return buf;
}

std::string opt_fmt(const char* format, const std::optional<double>& x) {
  return x ? fmt(format, *x) : kDash;
}

std::string md_escape(std::string s) {
  std::string out;
  for (char c : s) {
    if (c == '|')
      out += "\\|";
    else if (c == '\n')
      out += ' ';
    else
      out += c;
  }
  return out;
}

std::string code(const std::string& s) {
  return "`" + md_escape(s) + "`";
}

// ---------------------------------------------------------------- grouping

// The problem a row solves apart from its length: batch, heads, dim, causal, input.
using Context = std::tuple<std::int64_t, std::int64_t, std::int64_t, std::string, std::string>;
Context context_of(const ReportRow& r) {
  return {r.batch, r.heads, r.dim, r.causal, r.input};
}

std::string describe(const Context& c) {
  return "B=" + std::to_string(std::get<0>(c)) + ", H=" + std::to_string(std::get<1>(c)) +
         ", D=" + std::to_string(std::get<2>(c)) + ", causal " + std::get<3>(c) + ", input " +
         code(std::get<4>(c));
}

// The context with most ok rows passing `keep`, float32 and then non-causal preferred; nullopt
// when none.
template <class Keep>
std::optional<Context> main_context(const std::vector<ReportRow>& rows, Keep keep) {
  struct Score {
    bool float32 = false;  // a context's rows share their dtype (it is part of `causal`)
    int rows = 0;          // ok rows, a non-causal one counting 1000000
    std::size_t first = 0;
  };
  std::map<Context, Score> count;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (!rows[i].ok() || !keep(rows[i])) continue;
    auto [it, fresh] = count.emplace(context_of(rows[i]), Score{rows[i].dtype == "float32", 0, i});
    it->second.rows += rows[i].causal == "none" ? 1000000 : 1;
  }
  std::optional<Context> best;
  Score best_score{false, -1, 0};
  for (const auto& [c, s] : count)
    if (std::pair(s.float32, s.rows) > std::pair(best_score.float32, best_score.rows) ||
        (s.float32 == best_score.float32 && s.rows == best_score.rows &&
         s.first < best_score.first)) {
      best = c;
      best_score = s;
    }
  return best;
}

std::string describe_plain(const Context& c) {
  return "B=" + std::to_string(std::get<0>(c)) + ", H=" + std::to_string(std::get<1>(c)) +
         ", D=" + std::to_string(std::get<2>(c)) + ", causal " + std::get<3>(c);
}

bool has_token(const std::string& spec, const std::string& token) {
  const auto colon = spec.find(':');
  if (colon == std::string::npos) return false;
  std::stringstream ss(spec.substr(colon + 1));
  for (std::string t; std::getline(ss, t, ',');)
    if (t == token) return true;
  return false;
}

// The spec of `variant` shown for it: most preferred tokens, then most ok rows, then first.
std::optional<std::string> representative_spec(const std::vector<ReportRow>& rows,
                                               const std::string& variant,
                                               const std::vector<std::string>& prefer,
                                               const std::optional<Context>& ctx) {
  std::map<std::string, std::pair<int, int>> score;  // spec -> (preferred tokens, ok rows)
  std::vector<std::string> order;
  for (const auto& r : rows) {
    if (r.variant != variant || !r.ok() || (ctx && context_of(r) != *ctx)) continue;
    auto [it, fresh] = score.emplace(r.spec, std::make_pair(0, 0));
    if (fresh) {
      order.push_back(r.spec);
      for (const auto& t : prefer) it->second.first += has_token(r.spec, t);
    }
    ++it->second.second;
  }
  std::optional<std::string> best;
  for (const auto& s : order)
    if (!best || score[s] > score[*best]) best = s;
  return best;
}

const ReportRow* find_row(const std::vector<ReportRow>& rows, const std::string& spec,
                          std::int64_t n, const Context& ctx) {
  const ReportRow* found = nullptr;
  for (const auto& r : rows)
    if (r.spec == spec && r.n == n && context_of(r) == ctx) {
      if (r.ok()) return &r;
      if (!found) found = &r;
    }
  return found;
}

std::vector<std::string> variants_in_order(const std::vector<ReportRow>& rows) {
  std::vector<std::string> out;
  for (const auto& r : rows)
    if (std::find(out.begin(), out.end(), r.variant) == out.end()) out.push_back(r.variant);
  // full first, peers last: the reading order of every table and plot.
  std::stable_sort(out.begin(), out.end(), [](const std::string& a, const std::string& b) {
    auto rank = [](const std::string& v) {
      return v == "full" ? 0 : (v == "numpy" || v == "torch") ? 2 : 1;
    };
    return rank(a) < rank(b);
  });
  return out;
}

std::vector<std::string> preferred_tokens(const std::string& variant) {
  for (const auto& a : anchors::lra_rows())
    if (a.variant == variant) return a.setting;
  return {};
}

// The typed view of a row; `where` ("rows.csv: line 7") names it in errors.
ReportRow report_row(const Row& row, const std::string& where) {
  auto number = [&](Col c) -> std::optional<double> {
    const std::string& t = row[c];
    if (t.empty()) return std::nullopt;
    char* end = nullptr;
    const double x = std::strtod(t.c_str(), &end);
    if (end != t.c_str() + t.size())
      throw Error(where + ": column '" + column_names()[static_cast<std::size_t>(c)] + "': '" + t +
                  "' is not a number");
    return x;
  };
  auto integer = [&](Col c) { return static_cast<std::int64_t>(number(c).value_or(0)); };
  ReportRow r;
  r.key = row[Col::key];
  r.spec = row[Col::spec];
  r.variant = row[Col::variant];
  if (r.variant.empty()) r.variant = r.spec.substr(0, r.spec.find(':'));
  r.n = integer(Col::n);
  r.batch = integer(Col::batch);
  r.heads = integer(Col::heads);
  r.dim = integer(Col::dim);
  // The causal setting, the mask spec and a dtype other than float32 read as one setting
  // ("top-left", "top-left, documents:count=16", "top-left, bf16"): every table and plot that
  // separates causal settings separates masks and dtypes too, and the rows without a mask in
  // float32 (or an older run's) read as before.
  const std::string& mask = row[Col::mask];
  r.dtype = row[Col::dtype].empty() ? "float32" : row[Col::dtype];
  r.causal = row[Col::causal] + (mask.empty() || mask == "none" ? "" : ", " + mask) +
             (r.dtype == "float32" ? "" : ", " + r.dtype);
  r.input = row[Col::input];
  r.seed = row[Col::seed];
  r.status = row[Col::status];
  r.message = row[Col::message];
  r.reps = integer(Col::reps);
  r.time_median_s = number(Col::time_median_s);
  r.time_min_s = number(Col::time_min_s);
  r.time_max_s = number(Col::time_max_s);
  r.time_iqr_s = number(Col::time_iqr_s);
  r.peak_mem_bytes = number(Col::peak_mem_bytes);
  r.flops = number(Col::flops);
  r.gflops = number(Col::gflops);
  r.sgemm_gflops = number(Col::sgemm_gflops);
  r.sgemm_fraction = number(Col::sgemm_fraction);
  r.err_rows = number(Col::err_rows);
  r.rel_fro = number(Col::rel_fro);
  r.max_abs = number(Col::max_abs);
  r.mean_cos = number(Col::mean_cos);
  r.p99_row = number(Col::p99_row);
  r.shard = row[Col::shard];
  r.token_inputs = row[Col::token_inputs];
  r.error_vs = row[Col::error_vs];
  return r;
}

// Fills error_vs where the row has none from the spec's declaration (a spec the factory does
// not know, a peer's, is softmax attention); an older row of a variant that is not softmax
// attention loses its error columns, which were measured against softmax. `declared` caches
// the declarations by spec (building some backends allocates their projections).
void complete_error_vs(ReportRow& r, std::map<std::string, bool>& declared) {
  if (!r.error_vs.empty()) return;
  auto it = declared.find(r.spec);
  if (it == declared.end()) {
    bool softmax = true;
    try {
      softmax = make_attention(r.spec)->support().approximates_softmax;
    } catch (const Error&) {
    }
    it = declared.emplace(r.spec, softmax).first;
  }
  r.error_vs = it->second ? "softmax" : "own";
  if (!it->second) r.rel_fro = r.max_abs = r.mean_cos = r.p99_row = r.err_rows = std::nullopt;
}

}  // namespace

// ---------------------------------------------------------------- labels

std::string time_text(double seconds) {
  return seconds < 1 ? fmt("%.3g ms", seconds * 1e3) : fmt("%.3g s", seconds);
}

std::string short_spec(const std::string& spec) {
  const auto colon = spec.find(':');
  if (colon == std::string::npos) return spec;
  std::string defaults;
  try {
    defaults = make_attention(spec.substr(0, colon))->spec();
  } catch (const Error&) {  // a peer or an unregistered name: keep it whole
    return spec;
  }
  std::string out = spec.substr(0, colon);
  std::stringstream tokens(spec.substr(colon + 1));
  bool first = true;
  for (std::string t; std::getline(tokens, t, ',');)
    if (!has_token(defaults, t)) {
      out += (first ? ":" : ",") + t;
      first = false;
    }
  return out;
}

// ---------------------------------------------------------------- rows

std::vector<ReportRow> parse_report_rows(std::istream& in, const std::string& what) {
  std::ostringstream buffer;
  buffer << in.rdbuf();
  std::string text = buffer.str();
  // A hand-written file may lack the last '\n': its last line is a record like the others (and
  // one a kill tore is refused below for its field count).
  if (!text.empty() && text.back() != '\n') text += '\n';
  std::vector<std::size_t> lines;
  const std::vector<CsvRecord> records = parse_csv(text, nullptr, &lines);
  if (records.empty()) throw Error(what + ": empty file (expected a header line)");
  // The schema's columns by name (harness/rows.hpp), any subset and order; others are ignored.
  const CsvRecord& header = records.front();
  std::vector<std::pair<std::size_t, Col>> columns;  // (field, column)
  bool present[kColumnCount] = {};
  for (std::size_t i = 0; i < header.size(); ++i) {
    Col c;
    if (find_column(header[i], c) && !present[static_cast<std::size_t>(c)]) {
      columns.emplace_back(i, c);
      present[static_cast<std::size_t>(c)] = true;
    }
  }
  for (Col required : {Col::spec, Col::variant, Col::n, Col::status})
    if (!present[static_cast<std::size_t>(required)])
      throw Error(what + ": header has no '" + column_names()[static_cast<std::size_t>(required)] +
                  "' column");

  std::vector<ReportRow> rows;
  std::map<std::string, bool> declared;
  for (std::size_t r = 1; r < records.size(); ++r) {
    const CsvRecord& fields = records[r];
    if (fields.size() == 1 && fields[0].empty()) continue;  // blank line
    if (fields.size() != header.size())
      throw Error(what + ": line " + std::to_string(lines[r]) + " has " +
                  std::to_string(fields.size()) + " fields, the header " +
                  std::to_string(header.size()) +
                  " (a torn last line is repaired by resuming the sweep)");
    Row cells;
    for (const auto& [field, column] : columns) cells[column] = fields[field];
    rows.push_back(report_row(cells, what + ": line " + std::to_string(lines[r])));
    complete_error_vs(rows.back(), declared);
  }
  return rows;
}

std::vector<ReportRow> read_report_rows(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("report: cannot open '" + path + "': " + std::strerror(errno));
  return parse_report_rows(in, path);
}

std::vector<Relative> relative_to_full(const std::vector<ReportRow>& rows) {
  // (n, context) -> indices of ok full rows
  std::map<std::pair<std::int64_t, Context>, std::vector<std::size_t>> full;
  for (std::size_t i = 0; i < rows.size(); ++i)
    if (rows[i].variant == "full" && rows[i].ok() && rows[i].time_median_s)
      full[{rows[i].n, context_of(rows[i])}].push_back(i);
  std::vector<Relative> out(rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const ReportRow& r = rows[i];
    const auto it = full.find({r.n, context_of(r)});
    if (!r.ok() || it == full.end()) continue;
    const ReportRow* partner = &rows[it->second.front()];
    for (std::size_t j : it->second)
      if (rows[j].seed == r.seed) {
        partner = &rows[j];
        break;
      }
    if (r.time_median_s && *r.time_median_s > 0)
      out[i].speedup = *partner->time_median_s / *r.time_median_s;
    if (r.peak_mem_bytes && partner->peak_mem_bytes && *partner->peak_mem_bytes > 0)
      out[i].memory_ratio = *r.peak_mem_bytes / *partner->peak_mem_bytes;
  }
  return out;
}

std::vector<std::size_t> pareto_frontier(const std::vector<ParetoPoint>& points) {
  std::vector<std::size_t> order(points.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  // Fastest first; among equal speed-ups the smaller error first, then the earlier point.
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (points[a].speedup != points[b].speedup) return points[a].speedup > points[b].speedup;
    return points[a].error < points[b].error;
  });
  std::vector<std::size_t> frontier;
  double best_error = INFINITY;
  for (std::size_t i : order)
    if (points[i].error < best_error) {  // strictly better than every faster point
      frontier.push_back(i);
      best_error = points[i].error;
    }
  std::reverse(frontier.begin(), frontier.end());
  return frontier;
}

// ---------------------------------------------------------------- tables

std::string lra_table(const std::vector<ReportRow>& rows) {
  const auto rel = relative_to_full(rows);
  auto in_lra = [](const ReportRow& r) {
    return std::find(std::begin(anchors::kLraLengths), std::end(anchors::kLraLengths), r.n) !=
           std::end(anchors::kLraLengths);
  };
  std::ostringstream out;
  out << "## Long Range Arena efficiency table\n\n";
  const auto ctx =
      main_context(rows, [&](const ReportRow& r) { return r.variant == "full" && in_lra(r); });
  if (!ctx) {
    out << "No ok `full` rows at N = 1K, 2K, 3K or 4K: speed-ups need them. " << kDash << "\n\n";
    return out.str();
  }
  out << "Ours: forward time and peak extra memory of one call, " << describe(*ctx)
      << ", as speed-up over our `full` (fused, exact) and memory as a fraction of its memory. "
      << "Paper: " << anchors::kLraCitation << "; the paper's speed-ups are steps/s over the "
      << "Transformer's, its memory ratios are computed here from its GB figures. "
      << "Absolute numbers do not transfer between a TPU training step and a CPU forward call; "
      << "ratios transfer better, and even they depend on the hardware.\n\n";
  out << "| Model | source | 1K | 2K | 3K | 4K | mem 1K | mem 2K | mem 3K | mem 4K |\n";
  out << "|---|---|---|---|---|---|---|---|---|---|\n";
  const auto& anchor_rows = anchors::lra_rows();
  const auto& base = anchor_rows.front();
  for (const auto& a : anchor_rows) {
    std::optional<std::string> spec = a.variant == "full"
                                          ? std::optional<std::string>("full")
                                          : representative_spec(rows, a.variant, a.setting, ctx);
    // Performer is only "ours" when a favor spec exists; never shown as another linear spec.
    if (spec && !a.setting.empty() && a.setting.front().rfind("feature=", 0) == 0 &&
        !has_token(*spec, a.setting.front()))
      spec.reset();
    out << "| " << a.model << " | ours " << (spec ? code(*spec) : kDash);
    std::string mem;
    for (int n : anchors::kLraLengths) {
      const ReportRow* r = spec ? find_row(rows, *spec, n, *ctx) : nullptr;
      const std::size_t i = r ? std::size_t(r - rows.data()) : 0;
      if (a.variant == "full") {
        out << " | " << (r && r->ok() && r->time_median_s ? time_text(*r->time_median_s) : kDash);
        mem += " | " + (r && r->ok() && r->peak_mem_bytes
                            ? fmt("%.1f MiB", *r->peak_mem_bytes / 1048576.0)
                            : kDash);
      } else {
        out << " | " << (r && rel[i].speedup ? fmt("%.2fx", *rel[i].speedup) : kDash);
        mem += " | " + (r && rel[i].memory_ratio
                            ? fmt("%.2fx", *rel[i].memory_ratio) + " (" +
                                  fmt("%.1f MiB", *r->peak_mem_bytes / 1048576.0) + ")"
                            : kDash);
      }
    }
    out << mem << " |\n| | paper (TPU v3)";
    for (int j = 0; j < 4; ++j)
      out << " | " << fmt("%.1f steps/s", a.steps_per_s[j])
          << (a.variant == "full" ? "" : fmt(" (%.2fx)", a.steps_per_s[j] / base.steps_per_s[j]));
    for (int j = 0; j < 4; ++j)
      out << " | "
          << (a.variant == "full" ? fmt("%.2f GB", a.memory_gb[j])
                                  : fmt("%.2fx", a.memory_gb[j] / base.memory_gb[j]) +
                                        fmt(" (%.2f GB)", a.memory_gb[j]));
    out << " |\n";
  }
  out << "\nOur spec per model: the one matching most of the paper's setting ("
      << "local: sliding defaults; Linformer: k=256, share=kv; BigBird: ITC defaults; linear: "
      << "elu+1, sum rule; Performer: FAVOR+), then the one with most points. LRA's local "
      << "attention used non-overlapping blocks, ours is a sliding window.\n\n";
  return out.str();
}

std::string linformer_table(const std::vector<ReportRow>& rows) {
  const auto rel = relative_to_full(rows);
  std::ostringstream out;
  out << "## Linformer: speed-up over full, n x k\n\n";
  const auto ctx = main_context(rows, [](const ReportRow& r) { return r.variant == "linformer"; });
  if (!ctx) {
    out << "No ok `linformer` rows. " << kDash << "\n\n";
    return out.str();
  }
  // One spec per k: the paper's setting where there is a choice.
  std::map<int, std::string> spec_for_k;
  for (int k : anchors::kLinformerK) {
    std::vector<ReportRow> with_k;
    for (const auto& r : rows)
      if (r.variant == "linformer" && has_token(r.spec, "k=" + std::to_string(k)))
        with_k.push_back(r);
    if (auto s = representative_spec(with_k, "linformer", {"share=kv", "init=gaussian"}, ctx))
      spec_for_k[k] = *s;
  }
  out << "Each cell: ours / paper. Ours: " << describe(*ctx) << ", time of our `full` over "
      << "linformer's, same run. Paper: " << anchors::kLinformerCitation << ". \"" << kDash
      << "\": no point (ours not measured or not ok; the paper has none where k >= n).\n\n";
  out << "| n \\ k |";
  for (int k : anchors::kLinformerK) out << " " << k << " |";
  out << "\n|---|";
  for (std::size_t j = 0; j < std::size(anchors::kLinformerK); ++j) out << "---|";
  out << "\n";
  for (int n : anchors::kLinformerN) {
    out << "| " << n << " |";
    for (int k : anchors::kLinformerK) {
      std::string ours = kDash;
      if (spec_for_k.count(k))
        if (const ReportRow* r = find_row(rows, spec_for_k[k], n, *ctx)) {
          const auto i = std::size_t(r - rows.data());
          if (rel[i].speedup) ours = fmt("%.2fx", *rel[i].speedup);
        }
      const auto paper = anchors::linformer_speedup(n, k);
      out << " " << ours << " / " << (paper ? fmt("%.3gx", *paper) : kDash) << " |";
    }
    out << "\n";
  }
  out << "\nSpecs shown:";
  for (const auto& [k, s] : spec_for_k) out << " " << code(s);
  if (spec_for_k.empty()) out << " " << kDash;
  out << ".\n\n";
  return out.str();
}

namespace {

// One table per length of the rows `keep` picks: spec, input, shape, status, the error columns,
// speed-up, time and GFLOP/s; with `tokens`, the token inputs each row was given.
std::string per_length_tables(const std::vector<ReportRow>& rows, bool tokens,
                              const std::function<bool(const ReportRow&)>& keep) {
  const auto rel = relative_to_full(rows);
  std::set<std::int64_t> lengths;
  for (const auto& r : rows)
    if (keep(r)) lengths.insert(r.n);
  const auto variants = variants_in_order(rows);
  std::ostringstream out;
  for (std::int64_t n : lengths) {
    out << "### N = " << n << "\n\n"
        << "| spec | input | causal | B,H,D | " << (tokens ? "token inputs | " : "")
        << "status | rel_fro | max_abs | mean_cos | p99 | err rows | speed-up | time | GFLOP/s "
           "(of sgemm) |\n"
        << "|---|---|---|---|" << (tokens ? "---|" : "")
        << "---|---|---|---|---|---|---|---|---|\n";
    for (const auto& v : variants)
      for (std::size_t i = 0; i < rows.size(); ++i) {
        const ReportRow& r = rows[i];
        if (r.n != n || r.variant != v || !keep(r)) continue;
        out << "| " << code(r.spec) << " | " << code(r.input) << " | " << r.causal << " | "
            << r.batch << "," << r.heads << "," << r.dim << " | ";
        if (tokens) out << (r.token_inputs.empty() ? "none" : md_escape(r.token_inputs)) << " | ";
        out << (r.ok() ? "ok" : md_escape(r.status + (r.message.empty() ? "" : ": " + r.message)))
            << " | " << opt_fmt("%.2e", r.rel_fro) << " | " << opt_fmt("%.2e", r.max_abs) << " | "
            << opt_fmt("%.6f", r.mean_cos) << " | " << opt_fmt("%.2e", r.p99_row) << " | "
            << opt_fmt("%.0f", r.err_rows) << " | " << opt_fmt("%.2fx", rel[i].speedup) << " | "
            << (r.ok() && r.time_median_s ? time_text(*r.time_median_s) : kDash) << " | "
            << (r.ok() && r.gflops ? fmt("%.3g", *r.gflops) +
                                         (r.sgemm_fraction ? fmt(" (%.2f)", *r.sgemm_fraction) : "")
                                   : kDash)
            << " |\n";
      }
    out << "\n";
  }
  return out.str();
}

const char* const kColumnsText =
    "rel_fro = ||out - ref||_F / ||ref||_F; mean_cos = mean row cosine; p99 = 99th "
    "percentile of the row relative error. Speed-up: our `full` time over the row's time "
    "on the same problem; time: median seconds per call; GFLOP/s of the useful work the "
    "variant declares, in brackets as a fraction of the OpenBLAS sgemm rate of the same run.";

}  // namespace

std::string error_tables(const std::vector<ReportRow>& rows) {
  std::ostringstream out;
  out << "## Error against exact softmax attention, per length\n\n"
      << "The approximations of softmax attention (and `full` itself, and the peers), against "
      << "softmax attention in float64 under the same mask on `err rows` query rows (all, or a "
      << "seeded sample at long N). " << kColumnsText
      << " The variants that compute something else are in the next section.\n\n";
  return out.str() + per_length_tables(rows, false,
                                       [](const ReportRow& r) { return r.approximates_softmax(); });
}

std::string own_error_tables(const std::vector<ReportRow>& rows) {
  std::ostringstream out;
  out << "## Variants that are not softmax attention: numerical error against their own "
         "definition\n\n";
  bool any = false;
  for (const auto& r : rows) any |= !r.approximates_softmax();
  if (!any) {
    out << "No such rows (variants whose `support().approximates_softmax` is false: a decaying "
           "or delta-rule memory).\n\n";
    return out.str();
  }
  out << "A decaying or delta-rule memory (`support().approximates_softmax` false) computes a "
      << "function of its own: its distance from softmax attention says nothing of its quality, "
      << "so it is measured against its own float64 definition "
      << "(`variants/recurrence_reference.hpp`) on the same rows, with the token inputs it takes "
      << "(g = log sigmoid(z) / 16, beta = sigmoid(z'), seeded; meta.json's `token_inputs`). The "
      << "error is the float32 kernels' rounding; the speed-up is over `full` as above. "
      << kColumnsText << "\n\n";
  return out.str() + per_length_tables(
                         rows, true, [](const ReportRow& r) { return !r.approximates_softmax(); });
}

std::string peers_table(const std::vector<ReportRow>& rows) {
  std::ostringstream out;
  out << "## Peers: exact attention in NumPy and PyTorch (CPU), same shapes, same run\n\n";
  bool any = false;
  for (const auto& r : rows) any |= r.variant == "numpy" || r.variant == "torch";
  if (!any) {
    out << "No peer rows (run the sweep with `--peers`).\n\n";
    return out.str();
  }
  out << "Median time of one call; in brackets the peer's time over our `full`'s (how much "
      << "faster `full` is).\n\n| N | B,H,D | causal | input | full | numpy | torch |\n"
      << "|---|---|---|---|---|---|---|\n";
  std::map<std::pair<std::int64_t, Context>, std::map<std::string, const ReportRow*>> table;
  for (const auto& r : rows)  // the peers run in float32 only
    if ((r.variant == "full" && r.dtype == "float32") || r.variant == "numpy" ||
        r.variant == "torch")
      table[{r.n, context_of(r)}].emplace(r.variant, &r);
  for (const auto& [key, cells] : table) {
    const auto& c = key.second;
    auto cell = [&](const std::string& v) -> std::string {
      const auto it = cells.find(v);
      if (it == cells.end()) return kDash;
      const ReportRow& r = *it->second;
      if (!r.ok() || !r.time_median_s)
        return md_escape(r.status + (r.message.empty() ? "" : ": " + r.message));
      std::string s = time_text(*r.time_median_s);
      const auto full = cells.find("full");
      if (v != "full" && full != cells.end() && full->second->ok() && full->second->time_median_s)
        s += fmt(" (%.2fx)", *r.time_median_s / *full->second->time_median_s);
      return s;
    };
    out << "| " << key.first << " | " << std::get<0>(c) << "," << std::get<1>(c) << ","
        << std::get<2>(c) << " | " << std::get<3>(c) << " | " << code(std::get<4>(c)) << " | "
        << cell("full") << " | " << cell("numpy") << " | " << cell("torch") << " |\n";
  }
  out << "\n";
  return out.str();
}

namespace {

// The row's setting as its float32 twin's (`causal` without the dtype at its end).
std::string float32_setting(const ReportRow& r) {
  return r.dtype == "float32" ? r.causal
                              : r.causal.substr(0, r.causal.size() - (2 + r.dtype.size()));
}

}  // namespace

std::string precision_tables(const std::vector<ReportRow>& rows) {
  bool any = false;
  for (const auto& r : rows) any |= r.dtype != "float32";
  if (!any) return "";
  // A problem: (N, the float32 context, seed); per spec, its float32 and its bf16 row (an ok
  // one where there are several). Peers run in float32 only; the variants that are not
  // softmax attention are measured against another reference.
  struct Pair {
    const ReportRow* float32 = nullptr;
    const ReportRow* bf16 = nullptr;
  };
  using Problem = std::tuple<std::int64_t, Context, std::string>;
  std::map<Problem, std::map<std::string, Pair>> problems;
  std::set<Problem> with_bf16;
  std::vector<std::string> specs;  // full first, then in order of appearance
  for (const auto& r : rows) {
    if (!r.approximates_softmax() || r.variant == "numpy" || r.variant == "torch" ||
        (r.dtype != "float32" && r.dtype != "bf16"))
      continue;
    Context c = context_of(r);
    std::get<3>(c) = float32_setting(r);
    const Problem problem{r.n, c, r.seed};
    Pair& pair = problems[problem][r.spec];
    const ReportRow*& slot = r.dtype == "bf16" ? pair.bf16 : pair.float32;
    if (!slot || (!slot->ok() && r.ok())) slot = &r;
    if (r.dtype == "bf16") with_bf16.insert(problem);
    if (std::find(specs.begin(), specs.end(), r.spec) == specs.end()) specs.push_back(r.spec);
  }
  std::stable_partition(specs.begin(), specs.end(),
                        [](const std::string& s) { return s == "full"; });
  const auto error = [](const ReportRow* r) -> std::string {
    if (!r) return kDash;
    if (!r->ok()) return md_escape(r->status);
    return opt_fmt("%.2e", r->rel_fro);
  };

  std::ostringstream out;
  out << "## Precision: bf16 rounding beside each approximation's error\n\n"
      << "Exact `full` on q, k, v rounded to bfloat16 (Attention's bf16 forward, on the path "
      << "meta.json's `kernels_bf16` names, into a bf16 output) against float64 softmax attention "
      << "of the float32 inputs: the error that bf16 rounding alone brings. Beside it, on the same "
      << "problem (N, shape, causal setting and mask, input, seed) and against the same reference, "
      << "each approximation of softmax attention in float32 and, where measured, in bf16 "
      << "(rel_fro = ||out - ref||_F / ||ref||_F). The last column is the float32 error over "
      << "full's bf16 error: below 1, the approximation is more accurate than bf16 rounding "
      << "itself. The variants that are not softmax attention and the peers are left out.\n\n";
  std::int64_t length = -1;
  for (const auto& [problem, pairs] : problems) {
    if (!with_bf16.count(problem)) continue;
    const auto& [n, c, seed] = problem;
    if (n != length) {
      out << (length < 0 ? "" : "\n") << "### N = " << n << "\n\n"
          << "| spec | input | causal | B,H,D | seed | float32 | bf16 | full in bf16 | float32 "
             "over full in bf16 |\n|---|---|---|---|---|---|---|---|---|\n";
      length = n;
    }
    const auto full = pairs.find("full");
    const ReportRow* full16 = full == pairs.end() ? nullptr : full->second.bf16;
    for (const auto& spec : specs) {
      const auto it = pairs.find(spec);
      if (it == pairs.end()) continue;
      const Pair& pair = it->second;
      std::string ratio = kDash;
      if (pair.float32 && pair.float32->ok() && pair.float32->rel_fro && full16 && full16->ok() &&
          full16->rel_fro && *full16->rel_fro > 0) {
        const double x = *pair.float32->rel_fro / *full16->rel_fro;
        ratio = fmt("%.2g", x) + (x < 1 ? " (more accurate)" : "");
      }
      out << "| " << code(spec) << " | " << code(std::get<4>(c)) << " | " << std::get<3>(c) << " | "
          << std::get<0>(c) << "," << std::get<1>(c) << "," << std::get<2>(c) << " | "
          << md_escape(seed) << " | " << error(pair.float32) << " | " << error(pair.bf16) << " | "
          << error(full16) << " | " << ratio << " |\n";
    }
  }
  out << "\n";
  return out.str();
}

// ---------------------------------------------------------------- plots

namespace {

std::string slug(const std::string& s) {
  std::string out;
  for (char c : s) out += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return out;
}

// Errors of exactly 0 cannot sit on a log axis; they are drawn at this floor.
constexpr double kErrorFloor = 1e-9;

// One series per variant of the rows `keep` picks, in context `c`: its representative spec's
// (n, y) for the rows where y gives a value.
std::vector<Series> series_per_variant(
    const std::vector<ReportRow>& rows, const Context& c,
    const std::function<bool(const ReportRow&)>& keep,
    const std::function<std::optional<double>(const ReportRow&)>& y) {
  std::vector<ReportRow> kept;
  for (const auto& r : rows)
    if (keep(r)) kept.push_back(r);
  std::vector<Series> out;
  for (const auto& v : variants_in_order(kept)) {
    const auto spec = v == "full" ? std::optional<std::string>("full")
                                  : representative_spec(kept, v, preferred_tokens(v), c);
    if (!spec) continue;
    Series s{short_spec(*spec), {}};
    for (const auto& r : kept)
      if (r.spec == *spec && r.ok() && context_of(r) == c)
        if (const auto value = y(r)) s.xy.emplace_back(double(r.n), *value);
    std::sort(s.xy.begin(), s.xy.end());
    if (!s.xy.empty()) out.push_back(std::move(s));
  }
  return out;
}

// The context of the main problem `ctx` with input `input`, or where the rows `keep` picks hold
// none (a trained model's input has its own shape, and a causal model is measured causal only)
// the input's own main context; nullopt when the input has no such rows.
std::optional<Context> input_context(const std::vector<ReportRow>& rows, const Context& ctx,
                                     const std::string& input,
                                     const std::function<bool(const ReportRow&)>& keep) {
  Context c = ctx;
  std::get<4>(c) = input;
  for (const auto& r : rows)
    if (r.ok() && keep(r) && context_of(r) == c) return c;
  return main_context(rows, [&](const ReportRow& r) { return r.input == input && keep(r); });
}

// What every plot's axes say, with units.
const char* const kLengthAxis = "set xlabel 'sequence length N (tokens)'\n";
const char* const kErrorUnits = " (||out - ref||_F / ||ref||_F, dimensionless)";

std::string plots_section(const std::vector<ReportRow>& rows, const fs::path& dir,
                          const ReportOptions& options, ReportOutput& output) {
  std::ostringstream md;
  md << "## Plots\n\n";
  const auto ctx = main_context(rows, [](const ReportRow&) { return true; });
  if (!ctx) {
    md << "No ok rows to plot.\n\n";
    return md.str();
  }
  Plotter plotter(dir / "plots", options.gnuplot, output);
  md << "Problem: " << describe(*ctx) << "; one line per variant (its spec as in the LRA "
     << "table, else the spec with most points), each in its own colour and marker. Data and "
     << "gnuplot scripts sit beside the PNGs. The error plots and the Pareto frontiers hold the "
     << "approximations of softmax attention only; the variants that compute something else "
     << "have their numerical error plotted apart, and their time with the others.\n\n";

  const auto every = [](const ReportRow&) { return true; };
  const auto softmax = [](const ReportRow& r) { return r.approximates_softmax(); };
  const auto other = [](const ReportRow& r) { return !r.approximates_softmax(); };
  const std::string common =
      "set grid\nset key below left Left reverse maxcols 2 noenhanced\nset logscale x 2\n";
  plotter.plot(
      "time_vs_n",
      series_per_variant(rows, *ctx, every, [](const ReportRow& r) { return r.time_median_s; }),
      common + kLengthAxis + "set logscale y\nset ylabel 'time per forward call (s)'\nset title " +
          gp_quote("Time vs N (" + describe(*ctx) + ")") + " noenhanced\n",
      "using 1:2 with linespoints lw 2");
  md << "![time vs N](plots/time_vs_n.png)\n\n";

  std::set<std::string> inputs;
  for (const auto& r : rows)
    if (r.ok() && r.rel_fro) inputs.insert(r.input);
  const auto error = [](const ReportRow& r) -> std::optional<double> {
    if (!r.rel_fro) return std::nullopt;
    return std::max(*r.rel_fro, kErrorFloor);
  };
  // The error against softmax attention, then the others' numerical error, per input.
  struct ErrorPlot {
    const char* prefix;
    std::function<bool(const ReportRow&)> keep;
    const char* ylabel;
    const char* title;
  };
  const ErrorPlot error_plots[] = {
      {"error_vs_n_", softmax, "relative error vs fp64 softmax attention",
       "Error of the softmax approximations vs N"},
      {"numerical_error_vs_n_", other, "relative error vs its own fp64 definition",
       "Numerical error of the variants that are not softmax attention vs N"}};
  for (const ErrorPlot& plot : error_plots)
    for (const auto& input : inputs) {
      const auto c = input_context(rows, *ctx, input, plot.keep);
      if (!c) continue;
      const auto errors = series_per_variant(rows, *c, plot.keep, error);
      // One length (a trained model's input) is a column of the tables, not a curve.
      std::set<double> lengths;
      for (const auto& series : errors)
        for (const auto& [n, value] : series.xy) lengths.insert(n);
      if (lengths.size() < 2) continue;
      const std::string name = plot.prefix + slug(input);
      plotter.plot(name, errors,
                   common + kLengthAxis + "set logscale y\nset format y '10^{%L}'\nset ylabel " +
                       gp_quote(std::string(plot.ylabel) + kErrorUnits) + "\nset title " +
                       gp_quote(std::string(plot.title) + ", input " + input + " (" +
                                describe_plain(*c) + ")") +
                       " noenhanced\n",
                   "using 1:2 with linespoints lw 2");
      md << "![" << plot.title << ", " << md_escape(input) << "](plots/" << name << ".png)\n\n";
    }

  // Pareto per N: every approximation of softmax attention of the main problem shape and causal
  // mode, one frontier per input distribution (the error depends on the input more than on
  // anything else); every series its own colour and marker.
  const auto rel = relative_to_full(rows);
  std::set<std::int64_t> lengths;
  for (const auto& r : rows) lengths.insert(r.n);
  for (std::int64_t n : lengths) {
    std::string data, body;
    std::size_t blocks = 0, total = 0;
    for (const auto& input : inputs) {
      const auto c = input_context(rows, *ctx, input, softmax);
      if (!c) continue;
      // The input, and its shape where it is not the title's.
      const std::string what =
          "input " + input +
          (describe_plain(*c) == describe_plain(*ctx) ? "" : " (" + describe_plain(*c) + ")");
      std::vector<ParetoPoint> points;
      std::vector<std::string> labels;
      for (std::size_t i = 0; i < rows.size(); ++i) {
        const ReportRow& r = rows[i];
        if (r.n != n || context_of(r) != *c || !rel[i].speedup || !r.rel_fro ||
            r.variant == "numpy" || r.variant == "torch" || !r.approximates_softmax())
          continue;
        points.push_back({*rel[i].speedup, std::max(*r.rel_fro, kErrorFloor)});
        labels.push_back(short_spec(r.spec));
      }
      if (points.empty()) continue;
      total += points.size();
      const auto front = pareto_frontier(points);
      data += "# all points (" + what + "): speedup rel_fro spec\n";
      for (std::size_t i = 0; i < points.size(); ++i)
        data += fmt("%.9g", points[i].speedup) + " " + fmt("%.9g", points[i].error) + " " +
                gp_quote(labels[i]) + "\n";
      data += "\n\n# Pareto frontier (" + what + "; larger speed-up, smaller error)\n";
      for (std::size_t i : front)
        data += fmt("%.9g", points[i].speedup) + " " + fmt("%.9g", points[i].error) + " " +
                gp_quote(labels[i]) + "\n";
      data += "\n\n";
      const SeriesStyle all_style = series_style(blocks), best_style = series_style(blocks + 1);
      const std::string file = "'pareto_n" + std::to_string(n) + ".dat'";
      body += std::string(body.empty() ? "plot " : ", \\\n     ") + file + " index " +
              std::to_string(blocks) + " using 1:2 with points ps 1.2 " + all_style.gnuplot() +
              " title " + gp_quote("all points, " + what) + ", \\\n     " + file + " index " +
              std::to_string(blocks + 1) + " using 1:2 with linespoints lw 3 ps 1.5 " +
              best_style.gnuplot() + " title " + gp_quote("Pareto frontier, " + what) +
              ", \\\n     " + file + " index " + std::to_string(blocks + 1) +
              " using 1:2:3 with labels offset char 1,0.6 left font ',8' tc rgb '" +
              best_style.colour + "' noenhanced notitle";
      blocks += 2;
    }
    if (total < 2) continue;
    const std::string name = "pareto_n" + std::to_string(n);
    plotter.raw(
        name, data,
        "set grid\nset logscale xy\nset format y '10^{%L}'\nset key below left Left reverse "
        "maxcols 2 noenhanced\nset offsets graph 0.05, graph 0.35, graph 0.1, graph 0.05\n"
        "set xlabel 'speed-up over full (time of full / time of the spec, same run)'\n"
        "set ylabel " +
            gp_quote(std::string("relative error vs fp64 softmax attention") + kErrorUnits) +
            "\nset title " +
            gp_quote("Error vs speed-up of the softmax approximations, N = " + std::to_string(n) +
                     " (" + describe_plain(*ctx) + " unless a series says otherwise)") +
            " noenhanced\n" + body + "\n");
    md << "![Pareto N=" << n << "](plots/" << name << ".png)\n\n";
  }
  if (!output.plot_note.empty()) md << "Note: " << md_escape(output.plot_note) << ".\n\n";
  return md.str();
}

std::string meta_section(const fs::path& meta_path) {
  std::ostringstream md;
  md << "## Context\n\n";
  std::ifstream in(meta_path);
  if (!in) {
    md << "No meta.json beside rows.csv: the run's context is unknown.\n\n";
    return md.str();
  }
  try {
    nlohmann::json meta;
    in >> meta;
    for (const auto& [key, value] : meta.items()) {
      if (value.is_object()) {
        for (const auto& [k2, v2] : value.items()) {
          std::string text = v2.is_string() ? v2.get<std::string>() : v2.dump();
          if (text.size() > 160) text = text.substr(0, 157) + "...";
          md << "- " << key << "." << k2 << ": " << md_escape(text) << "\n";
        }
      } else {
        std::string text = value.is_string() ? value.get<std::string>() : value.dump();
        if (text.size() > 160) text = text.substr(0, 157) + "...";
        md << "- " << key << ": " << md_escape(text) << "\n";
      }
    }
  } catch (const nlohmann::json::exception& e) {
    md << "meta.json could not be read: " << e.what() << "\n";
  }
  md << "\n";
  return md.str();
}

}  // namespace

ReportOutput render_report(const std::string& dir, const ReportOptions& options) {
  const fs::path base(dir);
  const auto rows = read_report_rows((base / "rows.csv").string());
  ReportOutput output;
  std::map<std::string, int> status_count;
  for (const auto& r : rows) ++status_count[r.status];

  std::ostringstream md;
  md << "# attnlab results: "
     << md_escape(base.filename().empty() ? base.parent_path().filename().string()
                                          : base.filename().string())
     << "\n\nRendered by `attnlab report` from `rows.csv` (" << rows.size() << " rows:";
  for (const auto& [s, c] : status_count) md << " " << c << " " << s;
  md << "), nothing re-run. \"" << kDash << "\" marks a point that was not measured or not ok.\n\n";
  md << meta_section(base / "meta.json");
  md << lra_table(rows) << linformer_table(rows) << peers_table(rows);
  if (options.plots) md << plots_section(rows, base, options, output);
  md << error_tables(rows) << own_error_tables(rows) << precision_tables(rows);

  output.markdown_path = (base / "report.md").string();
  write_atomically(output.markdown_path, md.str());  // an old report or none, never half of one
  return output;
}

}  // namespace attnlab::harness
