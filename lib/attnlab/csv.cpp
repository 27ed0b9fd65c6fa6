#include "attnlab/csv.hpp"

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

namespace attnlab {
namespace {

std::string errno_text() {
  return std::strerror(errno);
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read " + path + ": " + errno_text());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void write_fully(int fd, const std::string& data, const std::string& path, bool sync = true) {
  // One write(2): on a local file system an O_APPEND write of a line is not interleaved and is
  // either complete or torn only by a crash. A failed or short write (disk full, `ulimit -f`)
  // is cut away again, so the file keeps exactly its complete lines.
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
  if (sync && ::fsync(fd) != 0) throw Error("cannot fsync " + path + ": " + errno_text());
}

}  // namespace

std::string csv_line(const CsvRecord& fields) {
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

std::string format_number(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", x);
  return buf;
}

std::vector<CsvRecord> parse_csv(const std::string& text, std::size_t* torn_tail_offset,
                                 std::vector<std::size_t>* first_lines) {
  std::vector<CsvRecord> records;
  CsvRecord record;
  std::string field;
  bool quoted = false;
  std::size_t start = 0;                  // where the current record began
  std::size_t line = 1, record_line = 1;  // the line being read, the record's first
  if (first_lines) first_lines->clear();
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n') ++line;
    if (quoted) {
      if (c != '"')
        field += c;
      else if (i + 1 < text.size() && text[i + 1] == '"')
        field += '"', ++i;
      else
        quoted = false;
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
      if (first_lines) first_lines->push_back(record_line);
      start = i + 1;
      record_line = line;
    } else {
      field += c;
    }
  }
  if (torn_tail_offset) *torn_tail_offset = start < text.size() ? start : std::string::npos;
  return records;
}

std::vector<CsvRecord> read_csv(const std::string& path, std::size_t* torn_tail_offset) {
  return parse_csv(read_all(path), torn_tail_offset);
}

CsvAppender::CsvAppender(std::string path, CsvRecord header, CsvAppendOptions options)
    : path_(std::move(path)), header_(std::move(header)), options_(std::move(options)) {
  if (!options_.header_now && ::access(path_.c_str(), F_OK) != 0) return;  // the first append
  open_locked();
  if (!records_.empty() || !options_.header_now) return;
  try {
    write_fully(fd_, csv_line(header_), path_);
  } catch (...) {
    ::close(fd_);  // a throwing constructor runs no destructor
    throw;
  }
  records_.push_back(header_);
}

void CsvAppender::open_locked() {
  fd_ = ::open(path_.c_str(), O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error("cannot open " + path_ + ": " + errno_text());
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd_);
    fd_ = -1;
    throw Error(path_ + " is locked: " + options_.holder + " is writing to it");
  }
  try {
    const std::string text = read_all(path_);
    std::size_t torn = std::string::npos;
    records_ = parse_csv(text, &torn);
    if (torn != std::string::npos) {  // a crash inside write(): drop the partial last line
      repaired_ = text.size() - torn;
      if (::ftruncate(fd_, static_cast<off_t>(torn)) != 0 || ::fsync(fd_) != 0)
        throw Error("cannot truncate the torn last line of " + path_ + ": " + errno_text());
    }
    if (records_.empty() && torn != std::string::npos && torn != 0)
      throw Error(path_ + ": no complete header line");
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

CsvAppender::~CsvAppender() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the flock
}

void CsvAppender::append(const CsvRecord& record) {
  if (fd_ < 0) open_locked();
  const bool start = records_.empty();
  write_fully(fd_, (start ? csv_line(header_) : std::string()) + csv_line(record), path_,
              options_.sync_each_append);
  if (start) records_.push_back(header_);  // appended records are not kept: a log may be long
}

void CsvAppender::sync() {
  if (fd_ >= 0 && ::fsync(fd_) != 0) throw Error("cannot fsync " + path_ + ": " + errno_text());
}

std::size_t CsvAppender::keep_only(const std::function<bool(const CsvRecord&)>& keep) {
  if (fd_ < 0) return 0;
  records_ = parse_csv(read_all(path_));  // appended lines too (the file is ours: locked)
  if (records_.empty()) return 0;
  std::vector<CsvRecord> kept{header_};
  std::string text = csv_line(header_);
  for (std::size_t r = 1; r < records_.size(); ++r)
    if (records_[r].size() == header_.size() && keep(records_[r]))
      text += csv_line(records_[r]), kept.push_back(records_[r]);
  const std::size_t dropped = records_.size() - kept.size();
  if (dropped == 0 && records_.front() == header_) return 0;
  // The new file is locked before it replaces the old one, so no other writer can slip in.
  const std::string tmp = path_ + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_RDWR | O_APPEND | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error("cannot write " + tmp + ": " + errno_text());
  try {
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0)
      throw Error("cannot lock " + tmp + ": " + errno_text());
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
  records_ = std::move(kept);
  return dropped;
}

}  // namespace attnlab
