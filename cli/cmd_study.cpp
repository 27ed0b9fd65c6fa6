// attnlab study NAME [--out DIR] [--size tiny|documented] [--seed S] [--weights DIR]: one of the
// studies of studies/study.hpp, written to DIR (default runs/studies/NAME, which git ignores; the
// committed ones are in results/studies/NAME, written with --out by scripts/regenerate-results.sh).
#include <cstdio>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "attnlab/factory.hpp"
#include "cli/options.hpp"
#include "studies/study.hpp"

namespace attnlab::cli {
namespace {

struct StudyCommand {
  std::string name, out, size = "documented";
  studies::StudyOptions options;
};

std::string names() {
  return join_names(studies::study_names());
}

void run(StudyCommand& c) {
  c.options.size = studies::parse_size(c.size);
  c.options.out_dir = c.out.empty() ? "runs/studies/" + c.name : c.out;
  const auto result = studies::run_study(c.name, c.options);
  std::printf("%s\n%s: %s, rows.csv, meta.json and %zu plot(s) in %s\n",
              result.table.markdown().c_str(), c.name.c_str(), result.report_path.c_str(),
              result.plots.pngs.size(), c.options.out_dir.c_str());
  if (!result.plots.plot_note.empty()) std::printf("note: %s\n", result.plots.plot_note.c_str());
}

}  // namespace

void add_study_command(CLI::App& app) {
  auto c = std::make_shared<StudyCommand>();
  CLI::App* cmd = app.add_subcommand(
      "study", "Reproduce a finding of the seeds and papers with our models: table, rows, plot");
  cmd->footer("Studies: " + names() +
              ".\ntrained and prune analyse a trained checkpoint (--weights DIR, required); the "
              "others run on seeded weights (no --weights).\nEach writes report.md, rows.csv, "
              "meta.json and plots/ to its folder; see results/studies/README.md.");
  cmd->add_option("name", c->name, "The study")->required();
  cmd->add_option("--out", c->out, "Output folder (default runs/studies/NAME)");
  cmd->add_option("--size", c->size, "tiny (seconds, for tests) or documented")
      ->capture_default_str();
  cmd->add_option("--seed", c->options.seed, "Seed of every random draw")
      ->check(kNotNegative)
      ->capture_default_str();
  cmd->add_option("--gnuplot", c->options.gnuplot, "gnuplot program")->capture_default_str();
  cmd->add_option("--weights", c->options.weights,
                  "Checkpoint folder of attnlab train (e.g. runs/lm/checkpoint, or the run "
                  "folder): the model the studies trained and prune analyse, beside its "
                  "untrained initialisation; its config is read from its state.txt");
  cmd->callback([c] { run(*c); });
}

}  // namespace attnlab::cli
