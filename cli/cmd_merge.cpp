// attnlab merge OUT_DIR IN_DIR...: joins the rows of sharded sweeps into one result set
// (harness/sweep.hpp merge_results; docs/sweep.md), or those of sharded decode sweeps when the
// first input holds a decode.csv and no rows.csv (harness/decode.hpp merge_decode_results).
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "harness/decode.hpp"
#include "harness/sweep.hpp"

namespace attnlab::cli {

namespace fs = std::filesystem;

void add_merge_command(CLI::App& app) {
  auto out = std::make_shared<std::string>();
  auto ins = std::make_shared<std::vector<std::string>>();
  CLI::App* cmd = app.add_subcommand(
      "merge",
      "Join the rows.csv (or a decode sweep's decode.csv) of several result directories "
      "(shards) into OUT_DIR, one row per key; conflicting duplicates are an error. meta.json "
      "records every input.");
  cmd->add_option("out_dir", *out, "output directory")->required();
  cmd->add_option("in_dirs", *ins, "input directories")->required();
  cmd->callback([out, ins] {
    const std::string& first = ins->front();
    if (!fs::exists(first + "/rows.csv") && fs::exists(first + "/decode.csv")) {
      const auto [rows, duplicates] = harness::merge_decode_results(*out, *ins);
      std::printf(
          "merge: %zu rows (%zu duplicates dropped) -> %s/decode.csv; report: %s/report.md\n", rows,
          duplicates, out->c_str(), out->c_str());
      return;
    }
    const harness::MergeSummary s = harness::merge_results(*out, *ins);
    std::printf("merge: %zu rows (%zu duplicates dropped) -> %s/rows.csv\n", s.rows, s.duplicates,
                out->c_str());
  });
}

}  // namespace attnlab::cli
