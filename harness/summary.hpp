// The terminal summary a sweep prints when it ends (`attnlab sweep`, `./dev run`): per spec and
// length, the speed-up over exact `full` and the error against the fp64 reference, taken from
// the rows, beside a committed reference run of the same grid where one exists. report.md holds
// everything else; this is the first screen a user reads.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/decode.hpp"
#include "harness/report.hpp"

namespace attnlab::harness {

/// A result set as the summary reads it.
struct SummaryRun {
  std::string dir;              ///< where it lives, printed in headings
  std::vector<ReportRow> rows;  ///< only the points of the grid being summarised
  nlohmann::json meta;          ///< its meta.json (null when absent): machine and load
};

/// Plain text for a terminal, about 100 columns wide: a context line, one speed-up table per
/// problem shape and causal setting (rows = specs, columns = N; full's row gives its time per
/// call; peers' rows their speed-up, below 1 when slower than full; every spec, whatever it
/// computes), the error table of the approximations of softmax attention against it (rel_fro
/// and below it the mean cosine, the worst over inputs and causal settings), the table of the
/// variants that compute something else against their own fp64 definition (ReportRow::error_vs,
/// in the same form, when there are any), and the sgemm yardstick. Speed-ups are geometric means
/// over the inputs (and seeds) of each cell. With `reference`, a row under each spec gives the
/// reference's values for the same points. Cells with no ok row show the status ("unsup.", "oom",
/// "error") or "-" when no point was run.
std::string sweep_summary(const SummaryRun& run, const SummaryRun* reference = nullptr);

/// The lines a decode sweep (`attnlab decode`, the end of `./dev run`) prints, from the rows of
/// `dir`: the run's read bandwidth, then per (D, Hkv) a table of each variant's step time at its
/// largest measured context, the bytes it held there, and the context from which its step is
/// cheaper than full's (cheaper_than_full_from: "none up to N" when it never is, "-" for full
/// and where full has no row), and full's step time on one thread against all (threads rows).
std::string decode_summary(const std::string& dir, const DecodeResults& results);

}  // namespace attnlab::harness
