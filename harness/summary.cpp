#include "harness/summary.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include "harness/trained_inputs.hpp"

namespace attnlab::harness {
namespace {

// A speed-up table covers one problem shape and causal setting: B, H, D, causal.
using Shape = std::tuple<std::int64_t, std::int64_t, std::int64_t, std::string>;
Shape shape_of(const ReportRow& r) {
  return {r.batch, r.heads, r.dim, r.causal};
}

bool is_peer(const ReportRow& r) {
  return r.variant == "numpy" || r.variant == "torch";
}

// full first, then the variants in the order they first appear, peers last.
std::vector<std::string> specs_in_order(const std::vector<ReportRow>& rows) {
  std::vector<std::string> specs;
  std::map<std::string, int> rank;
  for (const auto& r : rows)
    if (rank.emplace(r.spec, r.variant == "full" ? 0 : is_peer(r) ? 2 : 1).second)
      specs.push_back(r.spec);
  std::stable_sort(specs.begin(), specs.end(),
                   [&](const auto& a, const auto& b) { return rank[a] < rank[b]; });
  return specs;
}

std::optional<double> geomean(const std::vector<double>& xs) {
  if (xs.empty()) return std::nullopt;
  double log_sum = 0;
  for (double x : xs) log_sum += std::log(x);
  return std::exp(log_sum / double(xs.size()));
}

// What a cell shows when none of its rows is ok: the first row's status ("unsup." for
// unsupported, to keep columns narrow), else "-" (not run).
std::string status_text(const std::vector<const ReportRow*>& cell) {
  if (cell.empty()) return "-";
  return cell.front()->status == "unsupported" ? "unsup." : cell.front()->status;
}

// Per row of a result set: full's time for full rows, the speed-up over full for the others.
std::vector<std::optional<double>> cell_values(const std::vector<ReportRow>& rows) {
  const auto rel = relative_to_full(rows);
  std::vector<std::optional<double>> out(rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i)
    out[i] = rows[i].variant == "full" && rows[i].ok() ? rows[i].time_median_s : rel[i].speedup;
  return out;
}

std::string value_text(bool is_full, double x) {
  return is_full ? time_text(x) : fmt::format("{:.2f}x", x);
}

class Table {
 public:
  explicit Table(std::vector<std::string> header) { rows_.push_back(std::move(header)); }
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  // First column left-aligned, the others right-aligned, two spaces between columns.
  std::string str() const {
    std::vector<std::size_t> width;
    for (const auto& r : rows_)
      for (std::size_t c = 0; c < r.size(); ++c) {
        if (width.size() <= c) width.push_back(0);
        width[c] = std::max(width[c], r[c].size());
      }
    std::string out;
    for (const auto& r : rows_) {
      std::string line = "  ";
      for (std::size_t c = 0; c < r.size(); ++c)
        line += c == 0 ? fmt::format("{:<{}}", r[c], width[c])
                       : fmt::format("  {:>{}}", r[c], width[c]);
      out += line + "\n";
    }
    return out;
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

std::string meta_text(const nlohmann::json& meta, const char* key) {
  if (!meta.is_object() || !meta.contains(key) || meta[key].is_null()) return "";
  return meta[key].is_string() ? meta[key].get<std::string>() : meta[key].dump();
}

// "OpenBLAS core SkylakeX (set by attnlab: OpenBLAS detected Prescott)", from meta.json's "blas"
// (older runs without its core_source: "OPENBLAS_CORETYPE=Haswell").
std::string blas_text(const nlohmann::json& meta) {
  if (!meta.is_object()) return "BLAS core unknown (no meta.json)";
  const std::string coretype = meta_text(meta, "OPENBLAS_CORETYPE");
  const nlohmann::json blas = meta.contains("blas") ? meta["blas"] : nlohmann::json();
  if (!blas.is_object() || !blas.contains("core_source"))
    return "OPENBLAS_CORETYPE=" + (coretype.empty() ? std::string("unset") : coretype);
  const std::string source = meta_text(blas, "core_source");
  std::string text = "OpenBLAS core " + meta_text(blas, "corename") + " (";
  if (source == "attnlab")
    text += "set by attnlab: OpenBLAS detected " + meta_text(blas, "detected");
  else if (source == "user")
    text += "OPENBLAS_CORETYPE=" + coretype + " set by the user";
  else
    text += "detected by OpenBLAS";
  const std::string better = meta_text(blas, "better_core");
  if (!better.empty()) text += "; the CPU supports " + better;
  return text + ")";
}

// "AMD EPYC, 2 threads, OpenBLAS core Haswell (OPENBLAS_CORETYPE=Haswell set by the user),
// load 0.52 0.61 0.70, 2026-12-01T03:00:00Z"
std::string machine_text(const nlohmann::json& meta) {
  if (!meta.is_object()) return "context unknown (no meta.json)";
  std::string threads = "?";
  if (meta.contains("threads") && meta["threads"].contains("omp_max_threads"))
    threads = meta["threads"]["omp_max_threads"].dump();
  return meta_text(meta, "cpu_model") + ", " + threads + " threads, " + blas_text(meta) +
         ", load " + meta_text(meta, "load_average") + ", " + meta_text(meta, "date");
}

// The rows of `rows` with this spec, length and (when given) shape.
std::vector<std::size_t> cell_rows(const std::vector<ReportRow>& rows, const std::string& spec,
                                   std::int64_t n, const Shape* shape = nullptr) {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < rows.size(); ++i)
    if (rows[i].spec == spec && rows[i].n == n && (!shape || shape_of(rows[i]) == *shape))
      out.push_back(i);
  return out;
}

std::vector<std::string> header(const std::vector<std::int64_t>& lengths) {
  std::vector<std::string> h{"spec"};
  for (auto n : lengths) h.push_back("N=" + std::to_string(n));
  return h;
}

// One table per shape and causal setting; a reference sub-row under each spec when given.
std::string speedup_tables(const SummaryRun& run, const SummaryRun* reference) {
  const auto values = cell_values(run.rows);
  std::map<std::string, double> ref_by_key;  // the reference's value of each point
  if (reference) {
    const auto ref_values = cell_values(reference->rows);
    for (std::size_t i = 0; i < reference->rows.size(); ++i)
      if (ref_values[i]) ref_by_key.emplace(reference->rows[i].key, *ref_values[i]);
  }
  // The shapes in order, those of the trained models' inputs (their own heads and head size)
  // after the synthetic ones; each with the lengths it has, and whether the reference has any
  // of its points.
  std::map<Shape, std::set<std::int64_t>> lengths_of;
  std::map<Shape, bool> synthetic, in_reference;
  for (const auto& r : run.rows) {
    lengths_of[shape_of(r)].insert(r.n);
    synthetic[shape_of(r)] |= !is_trained_input(r.input);
    in_reference[shape_of(r)] |= ref_by_key.count(r.key) != 0;
  }
  std::vector<Shape> shapes;
  for (const auto& [shape, lengths] : lengths_of) shapes.push_back(shape);
  std::stable_partition(shapes.begin(), shapes.end(),
                        [&](const Shape& shape) { return synthetic[shape]; });
  std::string out;
  for (const Shape& shape : shapes) {
    const auto& [batch, heads, dim, causal] = shape;
    const bool with_reference = reference && in_reference[shape];
    out += fmt::format(
        "\nSpeed-up over exact full, causal {}, B={} H={} D={} (full's row: its time "
        "per call){}:\n",
        causal, batch, heads, dim,
        with_reference ? ";\n  below each spec: the same points in " + reference->dir : "");
    const std::vector<std::int64_t> lengths(lengths_of[shape].begin(), lengths_of[shape].end());
    Table table(header(lengths));
    for (const auto& spec : specs_in_order(run.rows)) {
      std::vector<std::string> ours{short_spec(spec)},
          theirs{"  " + (reference ? reference->dir : "")};
      bool any = false;
      for (auto n : lengths) {
        std::vector<double> mine, ref;
        std::vector<const ReportRow*> cell;
        for (std::size_t i : cell_rows(run.rows, spec, n, &shape)) {
          cell.push_back(&run.rows[i]);
          if (values[i]) mine.push_back(*values[i]);
          const auto it = ref_by_key.find(run.rows[i].key);
          if (it != ref_by_key.end()) ref.push_back(it->second);
        }
        any |= !cell.empty();
        const bool is_full = spec == "full";
        ours.push_back(mine.empty() ? status_text(cell) : value_text(is_full, *geomean(mine)));
        theirs.push_back(ref.empty() ? "-" : value_text(is_full, *geomean(ref)));
      }
      if (!any) continue;
      table.add(ours);
      if (with_reference) table.add(theirs);
    }
    out += table.str();
  }
  return out;
}

// A column of an error table: its heading and the rows it takes.
struct ErrorColumn {
  std::string heading;
  std::function<bool(const ReportRow&)> takes;
};

// The columns N=... of the lengths of `rows`.
std::vector<ErrorColumn> length_columns(const std::vector<ReportRow>& rows) {
  std::set<std::int64_t> lengths;
  for (const auto& r : rows) lengths.insert(r.n);
  std::vector<ErrorColumn> out;
  for (auto n : lengths)
    out.push_back({"N=" + std::to_string(n), [n](const ReportRow& r) { return r.n == n; }});
  return out;
}

// Per spec of `rows`, the worst rel_fro (and below it the lowest mean cosine) of each column's
// rows, under `title`; empty when there are no rows.
std::string error_table(const std::string& title, const std::vector<ReportRow>& rows,
                        const std::vector<ErrorColumn>& columns) {
  if (rows.empty()) return "";
  std::vector<std::string> heading{"spec"};
  for (const auto& c : columns) heading.push_back(c.heading);
  Table table(heading);
  for (const auto& spec : specs_in_order(rows)) {
    std::vector<std::string> rel_fro_line{short_spec(spec)}, cos_line{"  mean cosine"};
    for (const auto& column : columns) {
      std::vector<const ReportRow*> cell;
      std::optional<double> rel_fro, cos;
      for (const ReportRow& r : rows) {
        if (r.spec != spec || !column.takes(r)) continue;
        cell.push_back(&r);
        if (!r.ok() || !r.rel_fro || !r.mean_cos) continue;
        rel_fro = std::max(rel_fro.value_or(0.0), *r.rel_fro);
        cos = std::min(cos.value_or(1.0), *r.mean_cos);
      }
      rel_fro_line.push_back(rel_fro ? fmt::format("{:.2g}", *rel_fro) : status_text(cell));
      cos_line.push_back(cos ? fmt::format("{:.4f}", *cos) : "");
    }
    table.add(rel_fro_line);
    table.add(cos_line);
  }
  return "\n" + title + table.str();
}

// The approximations of softmax attention on the synthetic inputs, then on the trained models'
// inputs (a column per input and length), then the variants that compute something else, in
// float32; then every point in bf16 (its own table: bf16 rounding is an error of its own).
std::string error_tables(const SummaryRun& run) {
  std::vector<ReportRow> synthetic, trained, other, bf16;
  std::vector<std::string> trained_inputs;  // in order of appearance
  for (const auto& r : run.rows) {
    if (r.dtype != "float32") {
      bf16.push_back(r);
    } else if (!r.approximates_softmax()) {
      other.push_back(r);
    } else if (is_trained_input(r.input)) {
      trained.push_back(r);
      if (std::find(trained_inputs.begin(), trained_inputs.end(), r.input) == trained_inputs.end())
        trained_inputs.push_back(r.input);
    } else {
      synthetic.push_back(r);
    }
  }
  std::vector<ErrorColumn> trained_columns;
  for (const auto& input : trained_inputs) {
    std::set<std::int64_t> lengths;
    for (const auto& r : trained)
      if (r.input == input) lengths.insert(r.n);
    for (auto n : lengths)
      trained_columns.push_back(
          {trained_input_label(input) + ", N=" + std::to_string(n),
           [input, n](const ReportRow& r) { return r.input == input && r.n == n; }});
  }
  return error_table(
             "Error against exact softmax attention (fp64), the worst over the synthetic inputs "
             "and causal\n  settings: rel_fro on each spec's line, mean cosine below it:\n",
             synthetic, length_columns(synthetic)) +
         error_table(
             "Error against exact softmax attention on a trained model's q, k, v (held-out data; "
             "input\n  trained:DIR,layer=L, its causal settings), rel_fro and mean cosine as "
             "above:\n",
             trained, trained_columns) +
         error_table(
             "Not softmax attention (a decaying or delta-rule memory): numerical error against "
             "its own\n  fp64 definition, with seeded token inputs, the worst over every input "
             "and causal setting:\n",
             other, length_columns(other)) +
         error_table(
             "In bf16 (q, k, v rounded to bfloat16): error against the fp64 reference of the "
             "float32 inputs\n  (softmax attention, or a variant's own definition), the worst over "
             "every input and causal setting:\n",
             bf16, length_columns(bf16));
}

// sgemm rate of the run and full's best rate against it.
std::string yardstick_text(const SummaryRun& run) {
  std::optional<double> sgemm;
  const ReportRow* best = nullptr;
  for (const auto& r : run.rows) {
    if (r.sgemm_gflops) sgemm = r.sgemm_gflops;
    if (r.variant == "full" && r.dtype == "float32" && r.ok() && r.gflops &&
        (!best || *r.gflops > *best->gflops))
      best = &r;
  }
  if (!sgemm) return "";
  std::string out =
      fmt::format("\nYardstick: OpenBLAS sgemm 1024^3 at {:.1f} GFLOP/s in this run, {}", *sgemm,
                  blas_text(run.meta));
  if (best)
    out += fmt::format(";\n  exact full at best {:.1f} GFLOP/s ({:.2f} of it), at N={}, causal {}",
                       *best->gflops, *best->gflops / *sgemm, best->n, best->causal);
  return out + ".\n";
}

// "7.1 us", "1.23 ms", "2.50 s": a decode step spans microseconds to seconds.
std::string step_time_text(double seconds) {
  if (seconds < 1e-3) return fmt::format("{:.1f} us", seconds * 1e6);
  if (seconds < 1) return fmt::format("{:.2f} ms", seconds * 1e3);
  return fmt::format("{:.2f} s", seconds);
}

std::string bytes_text(double bytes) {
  if (bytes < 1048576) return fmt::format("{:.0f} KiB", bytes / 1024);
  if (bytes < 1073741824) return fmt::format("{:.1f} MiB", bytes / 1048576);
  return fmt::format("{:.2f} GiB", bytes / 1073741824);
}

}  // namespace

std::string sweep_summary(const SummaryRun& run, const SummaryRun* reference) {
  std::map<std::string, int> by_status;
  for (const auto& r : run.rows) ++by_status[r.status];
  std::string statuses;
  for (const auto& [status, count] : by_status)
    statuses += (statuses.empty() ? "" : ", ") + std::to_string(count) + " " + status;
  std::string out =
      fmt::format("Summary of {}: {} points ({})\n  measured on {}\n", run.dir, run.rows.size(),
                  statuses.empty() ? "none" : statuses, machine_text(run.meta));
  if (reference)
    out += fmt::format("Reference {}\n  measured on {}\n", reference->dir,
                       machine_text(reference->meta));
  if (run.rows.empty()) return out;
  out += speedup_tables(run, reference);
  out += error_tables(run);
  out += yardstick_text(run);
  return out;
}

std::string decode_summary(const std::string& dir, const DecodeResults& results) {
  std::set<std::pair<std::int64_t, std::int64_t>> shapes;  // (D, Hkv)
  std::vector<std::string> specs;                          // in order of appearance
  for (const DecodeRow& r : results.rows) {
    if (r.kind != "step") continue;
    shapes.insert({r.dim, r.kv});
    if (std::find(specs.begin(), specs.end(), r.spec) == specs.end()) specs.push_back(r.spec);
  }
  std::string out = fmt::format(
      "\nDecode sweep of {}: streaming read bandwidth {:.1f} GB/s; per variant, its "
      "step at the largest\n  context measured, the bytes it held there, and the "
      "context from which its step is cheaper than full's:\n",
      dir, results.bandwidth_gbps);
  if (shapes.empty()) return out + "  no step row measured\n";
  for (const auto& [dim, kv] : shapes) {
    const DecodeRow* any = nullptr;
    bool full_measured = false;
    for (const DecodeRow& r : results.rows)
      if (r.kind == "step" && r.dim == dim && r.kv == kv) {
        any = &r;
        full_measured |= r.variant == "full";
      }
    out += fmt::format("\nDecoding, B={} H={} Hkv={} D={}:\n", any->batch, any->heads, kv, dim);
    Table table({"spec", "context", "step", "held", "cheaper than full from"});
    for (const std::string& spec : specs) {
      const DecodeRow* last = nullptr;  // the row at the spec's largest context
      for (const DecodeRow& r : results.rows)
        if (r.kind == "step" && r.spec == spec && r.dim == dim && r.kv == kv &&
            (!last || r.context > last->context))
          last = &r;
      if (!last) continue;
      std::string from = "-";
      if (last->variant != "full" && full_measured) {
        const auto n = cheaper_than_full_from(results, spec, dim, kv);
        from = n ? tokens_text(*n) : "none up to " + tokens_text(last->context);
      }
      table.add({short_spec(spec), tokens_text(last->context), step_time_text(last->time),
                 bytes_text(last->bytes), from});
    }
    out += table.str();
    for (const DecodeRow& r : results.rows)  // full's step on every thread and on one
      if (r.kind == "threads" && r.dim == dim && r.kv == kv && std::isfinite(r.one_thread_time))
        out += fmt::format("  full's step at {} on one thread: {}, on {}: {} ({:.2f}x)\n",
                           tokens_text(r.context), step_time_text(r.one_thread_time), r.threads,
                           step_time_text(r.time), r.one_thread_time / r.time);
  }
  return out;
}

}  // namespace attnlab::harness
