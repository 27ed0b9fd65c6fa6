// rows.csv: the raw results of a sweep, one row per grid point (docs/sweep.md lists the columns):
// the one row schema, which the sweep writes and the report reads.
//
// attnlab/csv.hpp's dialect and appender: rows are appended by one write(2) + fsync, so a killed
// sweep leaves at most a torn LAST line, which opening the file for appending cuts away (and the
// point is run again). The file is flock()ed while a sweep appends to it.
#pragma once

#include <array>
#include <cstddef>
#include <functional>
#include <string>
#include <unordered_set>
#include <vector>

#include "attnlab/csv.hpp"

namespace attnlab::harness {

enum class Col : std::size_t {
  key,
  spec,
  variant,
  n,
  batch,
  heads,
  dim,
  causal,
  mask,
  dtype,
  input,
  seed,
  token_inputs,
  status,
  message,
  reps,
  time_median_s,
  time_min_s,
  time_max_s,
  time_iqr_s,
  peak_mem_bytes,
  flops,
  gflops,
  sgemm_gflops,
  sgemm_fraction,
  error_vs,
  err_rows,
  rel_fro,
  max_abs,
  mean_cos,
  p99_row,
  shard,
  count
};
inline constexpr std::size_t kColumnCount = static_cast<std::size_t>(Col::count);

/// The header names, in file order.
const std::array<const char*, kColumnCount>& column_names();

/// Columns that depend on the machine's speed or load, not on the point: the rest of a row
/// must be reproducible (shard + merge and MPI runs are checked against an unsharded run on it).
bool is_timing_column(Col c);

struct Row {
  std::array<std::string, kColumnCount> cells;
  std::string& operator[](Col c) { return cells[static_cast<std::size_t>(c)]; }
  const std::string& operator[](Col c) const { return cells[static_cast<std::size_t>(c)]; }
};

using attnlab::csv_line;  // beside the overload for a Row, which would hide it
/// One CSV line of a row, with '\n'.
std::string csv_line(const Row& row);

/// The column of `name` in the schema; false when it has none.
bool find_column(const std::string& name, Col& column);

/// Reads a rows.csv: checks the header and the column count of every row (Error naming the file
/// and line otherwise); a torn last line is ignored (not repaired: the file is not written).
std::vector<Row> read_rows(const std::string& path);

/// A rows.csv opened for appending (created with its header when missing).
class RowsFile {
 public:
  explicit RowsFile(const std::string& path);
  RowsFile(const RowsFile&) = delete;
  RowsFile& operator=(const RowsFile&) = delete;

  const std::vector<Row>& rows() const { return rows_; }
  bool has(const std::string& key) const { return keys_.count(key) != 0; }
  /// Bytes of a torn last line removed when the file was opened (0 normally).
  std::size_t repaired_bytes() const { return file_.repaired_bytes(); }

  /// Appends one row atomically (single write + fsync). On an I/O failure (disk full, file size
  /// limit) the file is cut back to its complete rows and Error names the file and the reason.
  void append(const Row& row);

  /// Removes the rows for which `drop` is true (a new file renamed over the old one, so a crash
  /// keeps one or the other); returns how many.
  std::size_t drop(const std::function<bool(const Row&)>& drop);

 private:
  CsvAppender file_;
  std::vector<Row> rows_;
  std::unordered_set<std::string> keys_;
};

}  // namespace attnlab::harness
