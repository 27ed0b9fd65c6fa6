#include "studies/study.hpp"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "attnlab/csv.hpp"
#include "attnlab/error.hpp"
#include "attnlab/progress.hpp"
#include "harness/meta.hpp"
#include "studies/common.hpp"

namespace attnlab::studies {
namespace fs = std::filesystem;
namespace {

std::string text_of(const nlohmann::json& meta, const char* key) {
  if (!meta.contains(key)) return "unknown";
  return meta[key].is_string() ? meta[key].get<std::string>() : meta[key].dump();
}

// The run's context, from meta.json's fields: what the numbers were measured on.
std::string context_section(const nlohmann::json& meta) {
  const auto& threads = meta.value("threads", nlohmann::json::object());
  return "## Context\n\n- commit " + text_of(meta, "git_commit") +
         (meta.value("git_dirty", false) ? " with uncommitted changes" : "") + ", built " +
         text_of(meta, "build_type") + " with " + text_of(meta, "compiler") +
         "\n- machine: " + text_of(meta, "cpu_model") + ", " + text_of(threads, "nproc") +
         " cores, " + text_of(threads, "omp_max_threads") + " OpenMP threads, OpenBLAS core " +
         text_of(meta["blas"], "corename") + " (OPENBLAS_CORETYPE " +
         text_of(meta, "OPENBLAS_CORETYPE") + ")\n- run: " + text_of(meta, "date") + ", " +
         cell("%.1f", meta.value("seconds", 0.0)) + " s, size " + text_of(meta, "size") +
         ", seed " + text_of(meta, "seed") +
         "\n- load average (1, 5, 15 min): " + text_of(meta, "load_average") + " at the start, " +
         text_of(meta, "load_after") +
         " at the end; the machine is shared, so times are noisy and only ratios measured in the "
         "same run are compared\n\nEverything in meta.json; the raw rows in rows.csv.\n";
}

std::string report_text(const std::string& name, const StudyOutput& s,
                        const harness::PlotFiles& plots, const nlohmann::json& meta) {
  const Report& r = s.report;
  std::string md = "# " + name + ": " + r.title + "\n\n" + r.question + "\n\n## Setup\n\n" +
                   r.setup + "\n\n## Result\n\n" + s.table.markdown() + "\n" + r.reading + "\n\n";
  for (const auto& [caption, png] : r.figures) md += "![" + caption + "](" + png + ")\n\n";
  if (!plots.plot_note.empty()) md += "Note: " + plots.plot_note + ".\n\n";
  md += "## Beside the paper\n\n" + r.paper + "\n\n";
  if (!r.extra.empty()) md += r.extra + "\n\n";
  return md + context_section(meta);
}

}  // namespace

const char* size_name(Size s) {
  return s == Size::tiny ? "tiny" : "documented";
}

Size parse_size(const std::string& text) {
  if (text == "tiny") return Size::tiny;
  if (text == "documented") return Size::documented;
  throw Error("study size '" + text + "': expected tiny or documented");
}

std::string Table::markdown() const {
  auto line = [](const std::vector<std::string>& cells) {
    std::string s = "|";
    for (const auto& c : cells) s += " " + c + " |";
    return s + "\n";
  };
  std::string md = line(header) + "|";
  for (std::size_t i = 0; i < header.size(); ++i) md += "---|";
  md += "\n";
  for (const auto& row : rows) md += line(row);
  return md;
}

void Csv::add(std::vector<std::string> cells) {
  if (cells.size() != columns.size())
    throw Error("rows.csv: a record of " + std::to_string(cells.size()) + " cells for " +
                std::to_string(columns.size()) + " columns");
  rows.push_back(std::move(cells));
}

std::string Csv::text() const {
  std::string text = csv_line(columns);  // attnlab/csv.hpp: the sweep's and training's dialect
  for (const auto& r : rows) text += csv_line(r);
  return text;
}

std::string raw(double x) {
  return format_number(x);
}

std::string cell(const char* format, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, x);
  return buf;
}

void progress(const StudyOptions& options, const std::string& study, const std::string& line) {
  ProgressLine(options.progress ? stderr : nullptr).print(study + ": " + line);
}

std::string plots_dir(const StudyOptions& o) {
  return (fs::path(o.out_dir) / "plots").string();
}

Registry<StudyMaker>& study_registry() {
  static Registry<StudyMaker> registry("study");
  return registry;
}

std::vector<std::string> study_names() {
  return study_registry().names();
}

bool study_takes_weights(const std::string& name) {
  return study_registry().at(name, "study name").takes_weights;
}

StudyResult run_study(const std::string& name, const StudyOptions& options) {
  const StudyMaker study = study_registry().at(name, "study name");
  if (options.out_dir.empty()) throw Error("study " + name + ": no output folder given");
  if (study.takes_weights && options.weights.empty())
    throw Error("study " + name +
                " analyses a trained model: give --weights DIR, the "
                "checkpoint folder of attnlab train (e.g. runs/lm/checkpoint)");
  if (!study.takes_weights && !options.weights.empty())
    throw Error("study " + name + " runs on seeded weights and takes no --weights ('" +
                options.weights + "'); the studies of a trained checkpoint are " + [] {
                  std::string list;
                  for (const auto& n : study_names())
                    if (study_takes_weights(n)) list += (list.empty() ? "" : ", ") + n;
                  return list;
                }());
  const bool fresh_out = !fs::exists(options.out_dir);
  fs::create_directories(options.out_dir);

  nlohmann::json meta = harness::run_context();
  const auto start = std::chrono::steady_clock::now();
  StudyResult result;
  result.name = name;
  StudyOutput out;
  try {
    out = study.run(options, result.plots);
  } catch (...) {  // a study that fails (a bad --weights folder) leaves no folder it created
    std::error_code ec;
    if (fresh_out) fs::remove_all(options.out_dir, ec);
    throw;
  }
  meta["study"] = name;
  meta["size"] = size_name(options.size);
  meta["seed"] = options.seed;
  if (!options.weights.empty()) meta["weights"] = options.weights;
  meta["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  meta["load_after"] = harness::load_average();

  const fs::path dir(options.out_dir);
  harness::write_atomically((dir / "rows.csv").string(), out.rows.text());
  harness::write_atomically((dir / "meta.json").string(), meta.dump(2) + "\n");
  result.report_path = (dir / "report.md").string();
  harness::write_atomically(result.report_path, report_text(name, out, result.plots, meta));
  result.table = std::move(out.table);
  result.rows = std::move(out.rows);
  return result;
}

}  // namespace attnlab::studies
