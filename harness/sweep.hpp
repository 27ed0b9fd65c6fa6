// attnlab sweep and attnlab merge: run a grid (harness/config.hpp) point by point into
// <dir>/rows.csv + meta.json, resumably, in shards or across MPI ranks; and join result sets.
//
// Resume: a point whose key is already in rows.csv is not run again, whatever its status (with
// retry_errors, rows of status "error" are dropped first and run again). A process killed from
// outside (SIGKILL, Ctrl-C, a scheduler) loses nothing: the point it was running runs again. A
// point that itself killed the process twice (a crash, the kernel's OOM killer) is recorded as
// status "error" (harness/point_guard.hpp). A failure to write (disk full, read-only directory)
// throws Error naming the file and the reason; the rows written before it stay intact.
#pragma once

#include <cstddef>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "harness/config.hpp"
#include "harness/grid.hpp"
#include "harness/rows.hpp"

namespace attnlab::harness {

struct SweepOptions {
  std::string out_dir;                     // empty: default_out_dir(config)
  Shard shard;                             // 1/1: the whole grid
  bool mpi = false;                        // split across MPI ranks, rows gathered on rank 0
  bool restart = false;                    // rows.csv -> rows.csv.old first: every point runs again
  bool retry_errors = false;               // rows of status "error" are dropped and run again
  std::FILE* progress = stderr;            // nullptr: silent
  std::function<void(const Row&)> on_row;  // called after each row is safely appended
  std::function<void(const Point&)> on_point;  // called as a point starts (after its marker)
};

struct SweepSummary {
  std::string dir;
  std::size_t grid = 0;            // points in the whole grid
  std::size_t selected = 0;        // in this shard
  std::size_t done_before = 0;     // of those, already in rows.csv
  std::size_t retried = 0;         // "error" rows dropped by retry_errors
  std::size_t repaired_bytes = 0;  // a torn last line of rows.csv dropped on opening
  std::size_t ran = 0;             // rows written by this run (all ranks)
  std::map<std::string, std::size_t> by_status;
  double sgemm_gflops = 0;
};

/// runs/<config.name>: a sweep measures this machine into a folder git ignores; committing a run
/// to results/ is a deliberate `--out results/<name>` (scripts/regenerate-results.sh).
std::string default_out_dir(const SweepConfig& config);

/// The committed reference run of a config: results/<config.name>.
std::string reference_dir(const SweepConfig& config);

SweepSummary run_sweep(const SweepConfig& config, const SweepOptions& options);

struct MergeSummary {
  std::size_t rows = 0, duplicates = 0;
};

/// Joins the rows of `in_dirs` (and of out_dir/rows.csv if it exists) into out_dir, deduplicated
/// by key; the same key with different non-timing columns throws Error naming both places.
MergeSummary merge_results(const std::string& out_dir, const std::vector<std::string>& in_dirs);

}  // namespace attnlab::harness
