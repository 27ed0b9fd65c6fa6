// attnlab report DIR: renders DIR/report.md and DIR/plots/ from DIR/rows.csv (+ meta.json), or
// from a decode sweep's DIR/decode.csv, without re-running anything (harness/report.hpp,
// harness/decode.hpp).
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "attnlab/error.hpp"
#include "harness/decode.hpp"
#include "harness/report.hpp"

namespace attnlab::cli {

void add_report_command(CLI::App& app) {
  auto dir = std::make_shared<std::string>();
  auto options = std::make_shared<harness::ReportOptions>();
  auto no_plots = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand(
      "report",
      "Render DIR/report.md (tables beside the papers' numbers) and DIR/plots/ (gnuplot) from "
      "DIR/rows.csv (or a decode sweep's DIR/decode.csv), re-running nothing");
  cmd->add_option("dir", *dir, "result directory holding rows.csv (and meta.json)")->required();
  cmd->add_flag("--no-plots", *no_plots, "tables only");
  cmd->add_option("--gnuplot", options->gnuplot, "gnuplot executable")->capture_default_str();
  cmd->callback([dir, options, no_plots] {
    namespace fs = std::filesystem;
    if (!fs::exists(*dir + "/rows.csv") && fs::exists(*dir + "/decode.csv")) {  // attnlab decode's
      if (*no_plots)
        throw Error("--no-plots: " + *dir +
                    " holds a decode sweep (decode.csv), whose report always draws its plots");
      harness::render_decode_report(*dir, options->gnuplot);
      std::printf("report: %s/report.md\n", dir->c_str());
      return;
    }
    options->plots = !*no_plots;
    const harness::ReportOutput out = harness::render_report(*dir, *options);
    std::printf("report: %s, %zu plots\n", out.markdown_path.c_str(), out.pngs.size());
    if (options->plots && !out.plot_note.empty())
      std::fprintf(stderr, "report: %s\n", out.plot_note.c_str());
  });
}

}  // namespace attnlab::cli
