// What the study implementations share (not installed): the report.md sections, the writer of
// a study's folder, progress lines, and the registry each study adds itself to from its own .cpp
// (attnlab/factory.hpp's Registry, as the variants and the training tasks do).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "attnlab/factory.hpp"
#include "studies/study.hpp"
#include "training/trainer.hpp"

namespace attnlab::studies {

/// The parts of a study's report.md, in order.
struct Report {
  std::string title;     ///< the heading after "# NAME: "
  std::string question;  ///< what the study asks and whose claim it tests
  std::string setup;     ///< sizes, inputs, definitions of the columns
  std::string reading;   ///< how to read the table (after it)
  std::string paper;     ///< the paper's figure or claim, beside ours
  std::vector<std::pair<std::string, std::string>> figures;  ///< (caption, plots/NAME.png)
  std::string extra;                                         ///< further sections, markdown
};

/// One line on stderr ("NAME: line") when options.progress (attnlab/progress.hpp's line).
void progress(const StudyOptions& options, const std::string& study, const std::string& line);

/// Each study computes its rows, table, plots and report; run_study writes the folder.
struct StudyOutput {
  Table table;    ///< the main table
  Csv rows;       ///< the raw rows
  Report report;  ///< the text around the table
};

/// A study's entry in study_registry().
struct StudyMaker {
  /// The study (studies/study.hpp): draws its plots into `plots` through a harness::Plotter on
  /// <out_dir>/plots and returns its table, rows and report.
  StudyOutput (*run)(const StudyOptions& o, harness::PlotFiles& plots);
  /// Whether it analyses a trained checkpoint (requires StudyOptions::weights) or seeded weights
  /// (refuses it).
  bool takes_weights = false;
};

/// The studies' registry: each study's .cpp adds itself with one Registrar, e.g.
/// `const Registrar<StudyMaker> kRegistrar(study_registry(), "swap", {swap_study, false}, 60);`.
Registry<StudyMaker>& study_registry();

/// <out_dir>/plots.
std::string plots_dir(const StudyOptions& o);

/// A trained checkpoint beside its initialisation, for the studies that take weights: two
/// Trainers of the checkpoint's config (training::checkpoint_config), one holding the
/// checkpoint's weights, the other the weights `attnlab train` started from (seeded from the
/// config's seed, or its init folder). Their held_out() is the run's held-out set.
struct TrainedPair {
  std::string checkpoint;                        ///< the checkpoint folder loaded
  std::unique_ptr<training::Trainer> trained;    ///< at the checkpoint's step
  std::unique_ptr<training::Trainer> untrained;  ///< at step 0

  /// The model and the run in words, for a report's setup: task, sizes, switches, seed, steps,
  /// the held-out set and the checkpoint folder.
  std::string describe() const;
};

/// Loads options.weights: a checkpoint folder, or a run folder holding one in checkpoint/.
/// Throws Error naming the folder when it is neither, or what in it does not fit.
TrainedPair load_trained(const StudyOptions& options);

/// "bits per byte" for the text task, "bits per target" otherwise: what Score::bits() is.
std::string bits_unit(const training::TrainConfig& config);

}  // namespace attnlab::studies
