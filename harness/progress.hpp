// Progress of a sweep on stderr, through attnlab/progress.hpp's line: a bar with counts and an
// ETA redrawn in place when stderr is a terminal, one plain line per point otherwise (logs, CI).
// The ETA is the mean time per point run so far times the points left: rough, since long points
// come last in each shape group.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <string>

#include "attnlab/progress.hpp"

namespace attnlab::harness {

class Progress {
 public:
  /// `total` points to run (already-done points are not counted); `stream` nullptr: silent.
  Progress(std::size_t total, std::FILE* stream);

  /// Shows that `label` is running (terminal only).
  void start(const std::string& label);
  /// One point finished with `status` after `seconds` (< 0: unknown, e.g. another MPI rank's).
  void done(const std::string& label, const std::string& status, double seconds);

 private:
  void draw(const std::string& label);
  double elapsed() const;
  std::size_t total_, finished_ = 0;
  ProgressLine line_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace attnlab::harness
