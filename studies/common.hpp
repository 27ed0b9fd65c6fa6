// What the study implementations share (not installed): the report.md sections, the writer of
// a study's folder, progress lines, and the registry each study adds itself to from its own .cpp
// (attnlab/factory.hpp's Registry, as the variants and the training tasks do).
#pragma once

#include <string>
#include <vector>

#include "attnlab/factory.hpp"
#include "studies/study.hpp"

namespace attnlab::studies {

/// The parts of a study's report.md, in order.
struct Report {
  std::string title;     ///< the heading after "# NAME: "
  std::string question;  ///< what the study asks and whose claim it tests
  std::string setup;     ///< sizes, inputs, definitions of the columns
  std::string reading;   ///< how to read the table (after it)
  std::string paper;     ///< the paper's figure or claim, beside ours
  std::vector<std::pair<std::string, std::string>> figures;  ///< (caption, plots/NAME.png)
  std::string extra;     ///< further sections, markdown
};

/// One line on stderr ("NAME: line") when options.progress (attnlab/progress.hpp's line).
void progress(const StudyOptions& options, const std::string& study, const std::string& line);

/// Each study computes its rows, table, plots and report; run_study writes the folder.
struct StudyOutput {
  Table table;    ///< the main table
  Csv rows;       ///< the raw rows
  Report report;  ///< the text around the table
};

/// A study (studies/study.hpp): draws its plots into `plots` through a harness::Plotter on
/// <out_dir>/plots and returns its table, rows and report.
using StudyMaker = StudyOutput (*)(const StudyOptions& o, harness::PlotFiles& plots);

/// The studies' registry: each study's .cpp adds itself with one Registrar, e.g.
/// `const Registrar<StudyMaker> kRegistrar(study_registry(), "swap", swap_study, 60);`.
Registry<StudyMaker>& study_registry();

/// <out_dir>/plots.
std::string plots_dir(const StudyOptions& o);

}  // namespace attnlab::studies
