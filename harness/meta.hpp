// meta.json beside rows.csv: the context every result carries (git commit and dirty flag,
// compiler and flags, build type, CPU model and flags, BLAS and OPENBLAS_CORETYPE, threads, date,
// hostname) and the config. Each sweep invocation appends its context to "runs"; the top-level
// fields are those of the latest run.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/config.hpp"

namespace attnlab::harness {

/// The context of this process (no config): see above.
nlohmann::json run_context();

/// Adds a run (context + config + extra fields) to <dir>/meta.json, written atomically.
void record_run(const std::string& dir, const SweepConfig& config, const nlohmann::json& extra);

/// meta.json of a merge: the first input's context at top level, every input's meta under
/// "merged_from".
void write_merged_meta(const std::string& out_dir, const std::vector<std::string>& in_dirs);

/// Writes `text` to `path` through a temporary file and rename(2).
void write_atomically(const std::string& path, const std::string& text);

/// UTC ISO-8601, e.g. 2026-11-29T12:00:00Z.
std::string utc_now();

/// The 1, 5 and 15-minute load averages as /proc/loadavg words them ("0.52 0.58 0.59"): the one
/// reader of the load, for meta.json, the studies and training's summary.json.
std::string load_average();

/// The 1-minute load average; -1 where /proc/loadavg cannot be read.
double load_average_1min();

}  // namespace attnlab::harness
