// `attnlab report <dir>`: tables and plots rendered from <dir>/rows.csv (+ meta.json), never by
// re-running anything (the ann-benchmarks way: raw rows first, metrics and plots later).
//
// Speed-up and memory ratios are derived here by joining each row with the `full` row of the
// same (n, batch, heads, dim, causal, input), preferring the same seed; `causal` holds the mask
// spec too when the row has one ("top-left, documents:count=16"), and the dtype when it is not
// float32 ("top-left, bf16": a bf16 point's speed-up is over full in bf16). A point that is
// missing or not `ok` prints as "—", never as a number.
//
// Output: <dir>/report.md, and under <dir>/plots/ a gnuplot data file (.dat), script (.gp) and
// PNG per plot: time vs N (log-log), error vs N per input distribution, and per N the Pareto
// frontier of error against speed-up over full (all points faint, the frontier bold).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "harness/plot.hpp"

namespace attnlab::harness {

/// One row of rows.csv (columns documented in docs/sweep.md): the typed view of a harness::Row,
/// the one schema (harness/rows.hpp). Empty numeric cells are nullopt.
struct ReportRow {
  std::string key, spec, variant, causal, input, status, message, shard, token_inputs;
  /// q, k, v's type: "float32" (also for an older run's rows, which have no dtype column) or
  /// "bf16"; a dtype other than float32 is also the end of `causal` (", bf16").
  std::string dtype = "float32";
  std::int64_t n = 0, batch = 0, heads = 0, dim = 0, reps = 0;
  std::string seed;
  /// What the error columns were measured against: "softmax" (exact softmax attention) or "own"
  /// (the variant's own float64 definition). A row without it (an older attnlab's, or a point
  /// that did not run) takes its spec's declaration, Support::approximates_softmax; an older
  /// row of a variant that declares "own" then has no error columns (they were measured
  /// against softmax, which says nothing of such a variant).
  std::string error_vs = "softmax";
  std::optional<double> time_median_s, time_min_s, time_max_s, time_iqr_s, peak_mem_bytes, flops,
      gflops, sgemm_gflops, sgemm_fraction, err_rows, rel_fro, max_abs, mean_cos, p99_row;
  bool ok() const { return status == "ok"; }
  /// An approximation of softmax attention (the error tables and Pareto frontiers), not a
  /// variant that computes something else (listed apart, with its numerical error).
  bool approximates_softmax() const { return error_vs != "own"; }
};

/// RFC-4180 CSV (attnlab/csv.hpp) with a header line; the schema's columns are found by name,
/// any subset (others are ignored). Throws Error naming `what`, the
/// line and the column for a missing required column or a malformed number.
std::vector<ReportRow> parse_report_rows(std::istream& in, const std::string& what = "rows.csv");
std::vector<ReportRow> read_report_rows(const std::string& path);

/// What a row gains from its `full` partner: full time / row time, row memory / full memory.
struct Relative {
  std::optional<double> speedup, memory_ratio;
};
/// One entry per row, in order. Rows that are not ok, or have no ok full partner, get nullopt.
std::vector<Relative> relative_to_full(const std::vector<ReportRow>& rows);

/// "12.3 ms" below a second, "4.05 s" above.
std::string time_text(double seconds);

/// A label for tables and plots: the variant name and only the settings that differ from its
/// defaults ("linformer:k=128,share=kv"); a spec the factory does not know is kept whole.
std::string short_spec(const std::string& spec);

/// A point of the Pareto plot: larger speed-up and smaller error are better.
struct ParetoPoint {
  double speedup = 0, error = 0;
};
/// Indices of the points no other point beats on both axes (ties on both keep the first), in
/// increasing speed-up.
std::vector<std::size_t> pareto_frontier(const std::vector<ParetoPoint>& points);

/// The markdown sections, each usable on its own (the tests check them one by one).
std::string lra_table(const std::vector<ReportRow>& rows);
std::string linformer_table(const std::vector<ReportRow>& rows);
/// Every approximation of softmax attention (and peers) per length: its error against exact
/// softmax attention, speed-up and time.
std::string error_tables(const std::vector<ReportRow>& rows);
/// The variants that compute something else per length: their numerical error against their
/// own float64 definition, the token inputs they were given, speed-up and time.
std::string own_error_tables(const std::vector<ReportRow>& rows);
std::string peers_table(const std::vector<ReportRow>& rows);
/// Where the rows hold bf16 points (else ""): per length, exact `full`'s bf16 error against
/// float64 beside each approximation's float32 error (and its own bf16 error) on the same
/// problem, so a reader sees which approximations are more accurate than bf16 rounding itself.
std::string precision_tables(const std::vector<ReportRow>& rows);

struct ReportOptions {
  bool plots = true;
  std::string gnuplot = "gnuplot";  // skipped with a note in report.md when it cannot be run
};

/// report.md's path and the plots' files (data_files, pngs, plot_note: harness/plot.hpp).
struct ReportOutput : PlotFiles {
  std::string markdown_path;
};

/// Reads <dir>/rows.csv and <dir>/meta.json (optional), writes report.md and plots/.
ReportOutput render_report(const std::string& dir, const ReportOptions& options = {});

}  // namespace attnlab::harness
