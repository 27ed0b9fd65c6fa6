// The studies of `attnlab study NAME`: the findings of ../shared/seeds/ and the papers in
// ../shared/anchors/papers.md, reproduced with our own model layers and numbers.
//
//   spectrum       is attention low-rank after softmax? (Linformer, Figure 1)
//   rank-collapse  pure attention loses rank doubly exponentially with depth (Dong et al. 2021)
//   capacity       how many key-value pairs a fast-weight memory holds (Schlag et al. 2021)
//   symmetry       W_Q = W_K makes the scores symmetric; what that does to self-attention
//   heads          at fixed d_model, h = 1..16: attention on the token itself, row entropy
//   swap           every variant in the same model: error against full by layer and N, time
//   trained        the measures above per layer and head on a trained checkpoint beside its
//                  initialisation, plus positional and rare-token heads (Voita et al. 2019)
//   prune          heads of a trained checkpoint removed one at a time and in order of
//                  importance: held-out bits against heads removed (Michel et al. 2019)
//
// The last two analyse a model trained by `attnlab train` (StudyOptions::weights, --weights DIR:
// its checkpoint folder, the config read from its state.txt) on the task's held-out set; the
// others run on seeded, untrained weights and refuse --weights.
// Each study writes to its folder: report.md (what it asks, the setup, the table, the plots,
// the paper's figure or claim beside ours, the run's context), rows.csv (the raw rows), meta.json
// (harness::run_context() at the start, the load average at the end, the options) and plots/
// (PNG via gnuplot, with .dat and .gp beside). Size::tiny runs in about a second, for the tests;
// Size::documented is the size report.md documents (the committed results/studies/).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "harness/plot.hpp"

namespace attnlab::studies {

/// How big a study runs.
enum class Size {
  tiny,       ///< about a second: what the tests run
  documented  ///< the size report.md documents (results/studies/)
};

/// "tiny" or "documented".
const char* size_name(Size s);

/// The Size named `text`; throws Error quoting the text otherwise.
Size parse_size(const std::string& text);

/// Where and how a study runs.
struct StudyOptions {
  std::string out_dir;           ///< the study's folder (created; its files are replaced)
  Size size = Size::documented;  ///< tiny for tests
  std::uint64_t seed = 1;        ///< every random draw derives from it
  std::string gnuplot = "gnuplot";
  bool progress = true;  ///< one line per step on stderr
  /// The checkpoint folder of `attnlab train` (DIR/checkpoint) a study of trained weights
  /// analyses, its config read from its state.txt; "" for the studies of seeded weights. Only
  /// the studies that take weights accept it, and they require it (run_study throws Error).
  std::string weights;
};

/// A markdown table: header cells and rows of cells.
struct Table {
  std::vector<std::string> header;             ///< column titles
  std::vector<std::vector<std::string>> rows;  ///< one vector of cells per row

  /// "| a | b |\n|---|---|\n| 1 | 2 |\n".
  std::string markdown() const;
};

/// Raw rows for rows.csv: column names, then one cell per column and row (numbers as %.9g).
struct Csv {
  std::vector<std::string> columns;            ///< the header line
  std::vector<std::vector<std::string>> rows;  ///< the records

  /// Appends a record; throws Error when it does not have one cell per column.
  void add(std::vector<std::string> cells);

  /// RFC-4180 text (attnlab/csv.hpp's csv_line): cells with commas, quotes or line breaks
  /// quoted. run_study writes it whole, atomically (a study's rows.csv is not appended to).
  std::string text() const;
};

/// What a study produced, in memory and on disk.
struct StudyResult {
  std::string name;          ///< the study's name
  Table table;               ///< its main table, as printed in report.md
  Csv rows;                  ///< the raw rows, as written to rows.csv
  std::string report_path;   ///< <out_dir>/report.md
  harness::PlotFiles plots;  ///< under <out_dir>/plots/
};

/// The registered study names, in the order above (each study's .cpp registers itself).
std::vector<std::string> study_names();

/// Whether study `name` analyses a trained checkpoint (StudyOptions::weights); throws Error
/// listing the studies when there is none of that name.
bool study_takes_weights(const std::string& name);

/// Runs one study (a study_names() entry; throws Error listing them otherwise) and writes its
/// folder.
StudyResult run_study(const std::string& name, const StudyOptions& options);

/// "%.9g" (attnlab/csv.hpp's format_number): how numbers enter rows.csv.
std::string raw(double x);

/// printf-style formatting of one number for a table cell ("%.3f", "%.2e", ...).
std::string cell(const char* format, double x);

}  // namespace attnlab::studies
