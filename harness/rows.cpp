#include "harness/rows.hpp"

#include <algorithm>

#include "attnlab/error.hpp"

namespace attnlab::harness {
namespace {

CsvRecord header_record() {
  const auto& names = column_names();
  return CsvRecord(names.begin(), names.end());
}

// Checks the header and turns records into rows; `what` names the file in messages.
std::vector<Row> to_rows(const std::vector<CsvRecord>& records, const std::string& what) {
  std::vector<Row> rows;
  if (records.empty()) return rows;
  const auto& names = column_names();
  const auto& header = records.front();
  bool same = header.size() == kColumnCount;
  for (std::size_t c = 0; same && c < kColumnCount; ++c) same = header[c] == names[c];
  if (!same)
    throw Error(what + ":1: the header is not the rows.csv schema of this attnlab (expected " +
                csv_line(header_record()).substr(0, 60) +
                "...); a run of an older attnlab is measured again with --restart (its rows are "
                "kept as rows.csv.old)");
  for (std::size_t r = 1; r < records.size(); ++r) {
    if (records[r].size() != kColumnCount)
      throw Error(what + ": record " + std::to_string(r + 1) + " has " +
                  std::to_string(records[r].size()) + " fields, expected " +
                  std::to_string(kColumnCount));
    Row row;
    for (std::size_t c = 0; c < kColumnCount; ++c) row.cells[c] = records[r][c];
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace

const std::array<const char*, kColumnCount>& column_names() {
  static const std::array<const char*, kColumnCount> names = {"key",
                                                              "spec",
                                                              "variant",
                                                              "n",
                                                              "batch",
                                                              "heads",
                                                              "dim",
                                                              "causal",
                                                              "mask",
                                                              "dtype",
                                                              "input",
                                                              "seed",
                                                              "token_inputs",
                                                              "status",
                                                              "message",
                                                              "reps",
                                                              "time_median_s",
                                                              "time_min_s",
                                                              "time_max_s",
                                                              "time_iqr_s",
                                                              "peak_mem_bytes",
                                                              "flops",
                                                              "gflops",
                                                              "sgemm_gflops",
                                                              "sgemm_fraction",
                                                              "error_vs",
                                                              "err_rows",
                                                              "rel_fro",
                                                              "max_abs",
                                                              "mean_cos",
                                                              "p99_row",
                                                              "shard"};
  return names;
}

bool is_timing_column(Col c) {
  switch (c) {
    case Col::reps:
    case Col::time_median_s:
    case Col::time_min_s:
    case Col::time_max_s:
    case Col::time_iqr_s:
    case Col::peak_mem_bytes:
    case Col::gflops:
    case Col::sgemm_gflops:
    case Col::sgemm_fraction:
    case Col::shard:
      return true;
    default:
      return false;
  }
}

std::string csv_line(const Row& row) {
  return csv_line(std::vector<std::string>(row.cells.begin(), row.cells.end()));
}

std::vector<Row> read_rows(const std::string& path) {
  return to_rows(read_csv(path), path);
}

bool find_column(const std::string& name, Col& column) {
  const auto& names = column_names();
  for (std::size_t c = 0; c < kColumnCount; ++c)
    if (name == names[c]) {
      column = static_cast<Col>(c);
      return true;
    }
  return false;
}

RowsFile::RowsFile(const std::string& path)
    : file_(path, header_record(), {.holder = "another sweep"}) {
  rows_ = to_rows(file_.records(), path);
  for (const Row& r : rows_) keys_.insert(r[Col::key]);
}

void RowsFile::append(const Row& row) {
  file_.append(CsvRecord(row.cells.begin(), row.cells.end()));
  rows_.push_back(row);
  keys_.insert(row[Col::key]);
}

std::size_t RowsFile::drop(const std::function<bool(const Row&)>& drop) {
  const std::size_t dropped = file_.keep_only([&](const CsvRecord& record) {
    Row row;
    std::copy(record.begin(), record.end(), row.cells.begin());
    return !drop(row);
  });
  if (dropped == 0) return 0;
  rows_ = to_rows(file_.records(), file_.path());
  keys_.clear();
  for (const Row& r : rows_) keys_.insert(r[Col::key]);
  return dropped;
}

}  // namespace attnlab::harness
