#include "harness/rows.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "attnlab/error.hpp"

namespace attnlab::harness {
namespace {

std::string errno_text() { return std::strerror(errno); }

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read " + path + ": " + errno_text());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Checks the header and turns records into rows; `what` names the file in messages.
std::vector<Row> to_rows(const std::vector<std::vector<std::string>>& records,
                         const std::string& what) {
  std::vector<Row> rows;
  if (records.empty()) return rows;
  const auto& names = column_names();
  const auto& header = records.front();
  bool same = header.size() == kColumnCount;
  for (std::size_t c = 0; same && c < kColumnCount; ++c) same = header[c] == names[c];
  if (!same)
    throw Error(what + ":1: the header is not the rows.csv schema (expected " +
                csv_line(std::vector<std::string>(names.begin(), names.end())).substr(0, 60) +
                "...)");
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

void write_fully(int fd, const std::string& data, const std::string& path) {
  // One write(2): on a local file system an O_APPEND write of a line is not interleaved and is
  // either complete or torn only by a crash. A failed or short write (disk full, `ulimit -f`)
  // is cut away again, so the file keeps exactly its complete rows.
  struct stat st {};
  const off_t before = ::fstat(fd, &st) == 0 ? st.st_size : -1;
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string why = errno_text();
      if (before >= 0 && ::ftruncate(fd, before) == 0) ::fsync(fd);
      throw Error("cannot append to " + path + ": " + why +
                  " (the rows written before are intact; the same command resumes)");
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) throw Error("cannot fsync " + path + ": " + errno_text());
}

std::string header_line() {
  const auto& names = column_names();
  return csv_line(std::vector<std::string>(names.begin(), names.end()));
}

}  // namespace

const std::array<const char*, kColumnCount>& column_names() {
  static const std::array<const char*, kColumnCount> names = {
      "key", "spec", "variant", "n", "batch", "heads", "dim", "causal", "input", "seed",
      "status", "message", "reps", "time_median_s", "time_min_s", "time_max_s", "time_iqr_s",
      "peak_mem_bytes", "flops", "gflops", "sgemm_gflops", "sgemm_fraction", "err_rows",
      "rel_fro", "max_abs", "mean_cos", "p99_row", "shard"};
  return names;
}

bool is_timing_column(Col c) {
  switch (c) {
    case Col::reps: case Col::time_median_s: case Col::time_min_s: case Col::time_max_s:
    case Col::time_iqr_s: case Col::peak_mem_bytes: case Col::gflops: case Col::sgemm_gflops:
    case Col::sgemm_fraction: case Col::shard:
      return true;
    default:
      return false;
  }
}

std::string format_number(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", x);
  return buf;
}

std::string csv_line(const std::vector<std::string>& fields) {
  std::string line;
  for (std::size_t i = 0; i < fields.size(); ++i) {
    if (i) line += ',';
    const std::string& f = fields[i];
    if (f.find_first_of(",\"\r\n") == std::string::npos) {
      line += f;
      continue;
    }
    line += '"';
    for (char c : f) line += c == '"' ? std::string("\"\"") : std::string(1, c);
    line += '"';
  }
  return line + '\n';
}

std::string csv_line(const Row& row) {
  return csv_line(std::vector<std::string>(row.cells.begin(), row.cells.end()));
}

std::vector<std::vector<std::string>> parse_csv(const std::string& text,
                                                std::size_t* torn_tail_offset) {
  std::vector<std::vector<std::string>> records;
  std::vector<std::string> record;
  std::string field;
  bool quoted = false;
  std::size_t start = 0;  // where the current record began
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c != '"') field += c;
      else if (i + 1 < text.size() && text[i + 1] == '"') field += '"', ++i;
      else quoted = false;
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      record.push_back(std::move(field));
      field.clear();
    } else if (c == '\n') {
      if (!field.empty() && field.back() == '\r') field.pop_back();
      record.push_back(std::move(field));
      field.clear();
      records.push_back(std::move(record));
      record.clear();
      start = i + 1;
    } else {
      field += c;
    }
  }
  if (torn_tail_offset) *torn_tail_offset = start < text.size() ? start : std::string::npos;
  return records;
}

std::vector<Row> read_rows(const std::string& path) {
  return to_rows(parse_csv(read_all(path)), path);
}

RowsFile::RowsFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error("cannot open " + path + ": " + errno_text());
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd_);
    throw Error(path + " is locked: another sweep is writing to it");
  }
  try {
    const std::string text = read_all(path);
    std::size_t torn = std::string::npos;
    const auto records = parse_csv(text, &torn);
    if (torn != std::string::npos) {  // a crash inside write(): drop the partial last line
      repaired_ = text.size() - torn;
      if (::ftruncate(fd_, static_cast<off_t>(torn)) != 0 || ::fsync(fd_) != 0)
        throw Error("cannot truncate the torn last line of " + path + ": " + errno_text());
    }
    if (records.empty()) {
      if (torn != std::string::npos && torn != 0)
        throw Error(path + ": no complete header line");
      write_fully(fd_, header_line(), path);
    }
    rows_ = to_rows(records, path);
    for (const Row& r : rows_) keys_.insert(r[Col::key]);
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

RowsFile::~RowsFile() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the flock
}

void RowsFile::append(const Row& row) {
  write_fully(fd_, csv_line(row), path_);
  rows_.push_back(row);
  keys_.insert(row[Col::key]);
}

std::size_t RowsFile::drop(const std::function<bool(const Row&)>& drop) {
  std::vector<Row> kept;
  std::string text = header_line();
  for (const Row& r : rows_)
    if (!drop(r)) text += csv_line(r), kept.push_back(r);
  const std::size_t dropped = rows_.size() - kept.size();
  if (dropped == 0) return 0;
  // The new file is locked before it replaces the old one, so no other sweep can slip in.
  const std::string tmp = path_ + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_RDWR | O_APPEND | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error("cannot write " + tmp + ": " + errno_text());
  try {
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) throw Error("cannot lock " + tmp + ": " + errno_text());
    write_fully(fd, text, tmp);
    if (::rename(tmp.c_str(), path_.c_str()) != 0)
      throw Error("cannot rename " + tmp + " to " + path_ + ": " + errno_text());
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd_);
  fd_ = fd;
  rows_ = std::move(kept);
  keys_.clear();
  for (const Row& r : rows_) keys_.insert(r[Col::key]);
  return dropped;
}

}  // namespace attnlab::harness
