// What the study implementations share (not installed): the report.md sections, the writer of
// a study's folder, progress lines, and one function per study.
#pragma once

#include <string>
#include <vector>

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

/// One line on stderr ("NAME: line") when options.progress.
void progress(const StudyOptions& options, const std::string& study, const std::string& line);

/// Each study computes its rows, table, plots and report; run_study writes the folder.
struct StudyOutput {
  Table table;
  Csv rows;
  Report report;
};

/// The studies: each fills `plots` through a harness::Plotter on <out_dir>/plots.
StudyOutput spectrum_study(const StudyOptions& o, harness::PlotFiles& plots);
StudyOutput rank_collapse_study(const StudyOptions& o, harness::PlotFiles& plots);
StudyOutput capacity_study(const StudyOptions& o, harness::PlotFiles& plots);
StudyOutput symmetry_study(const StudyOptions& o, harness::PlotFiles& plots);
StudyOutput heads_study(const StudyOptions& o, harness::PlotFiles& plots);
StudyOutput swap_study(const StudyOptions& o, harness::PlotFiles& plots);

/// <out_dir>/plots.
std::string plots_dir(const StudyOptions& o);

}  // namespace attnlab::studies
