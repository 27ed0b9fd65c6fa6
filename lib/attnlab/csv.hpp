// CSV files that grow by whole lines: the one CSV dialect, reader and appender of attnlab (the
// sweep's rows.csv, the report, a study's rows.csv, training's train.csv and eval.csv).
//
// RFC 4180, header first. Lines are appended by one write(2) of the whole line to an O_APPEND
// descriptor (followed by fsync, or synced when the writer says), so a killed writer leaves at
// most a torn LAST line (a crash inside write); opening the file for appending drops such a line
// (no trailing '\n') and truncates it away. The file is flock()ed while it is open for appending.
// Internal (not installed).
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace attnlab {

/// One record: its fields in file order.
using CsvRecord = std::vector<std::string>;

/// One CSV line with '\n'; fields quoted when they contain a comma, quote or line break.
std::string csv_line(const CsvRecord& fields);

/// A number for a CSV cell: "%.9g" (round-trips a float; doubles to 9 digits), "nan", "inf" and
/// "-inf" as such.
std::string format_number(double x);

/// Parses CSV text (quoted fields may hold commas, quotes and line breaks; a "\r\n" ends a line
/// as "\n" does). A last record without a terminating '\n' is not returned: its start goes to
/// `torn_tail_offset` (npos when there is none). `first_lines` gets the 1-based line on which
/// each returned record starts (a quoted line break counts as a line).
std::vector<CsvRecord> parse_csv(const std::string& text, std::size_t* torn_tail_offset = nullptr,
                                 std::vector<std::size_t>* first_lines = nullptr);

/// parse_csv of the file at `path`; Error naming it when it cannot be read.
std::vector<CsvRecord> read_csv(const std::string& path, std::size_t* torn_tail_offset = nullptr);

/// How a CsvAppender writes.
struct CsvAppendOptions {
  /// A missing or empty file gets its header at opening; false: with the first append (a
  /// missing file is then created by it too, so a writer that never appends leaves no file).
  bool header_now = true;
  /// fsync after every append (a row that is on disk survives a power loss, not only a kill);
  /// false: at sync() only, for a log that grows faster than fsync keeps up with.
  bool sync_each_append = true;
  /// Who holds the lock in the message when it is taken: "another sweep".
  std::string holder = "another process";
};

/// A CSV file opened for appending whole lines, as described above.
class CsvAppender {
 public:
  /// Opens (or creates, options.header_now) `path`, locks it, and cuts away a torn last line.
  /// Error when it is locked or has a torn header.
  CsvAppender(std::string path, CsvRecord header, CsvAppendOptions options = {});
  ~CsvAppender();
  CsvAppender(const CsvAppender&) = delete;
  CsvAppender& operator=(const CsvAppender&) = delete;

  /// The records read at opening (the header first, when there was one), or those keep_only
  /// kept; not the ones appended since (a log may be long).
  const std::vector<CsvRecord>& records() const { return records_; }
  /// Bytes of a torn last line removed at opening (0 normally).
  std::size_t repaired_bytes() const { return repaired_; }
  /// The file it appends to.
  const std::string& path() const { return path_; }

  /// Appends one record atomically (single write + fsync). On an I/O failure (disk full, file
  /// size limit) the file is cut back to its complete lines and Error names the file and reason.
  void append(const CsvRecord& record);
  /// fsync of what was appended (nothing to do with sync_each_append).
  void sync();

  /// Rewrites the file (as it is now, appended records included) with the header and the
  /// records for which `keep` is true (a locked new file renamed over the old one, so a crash
  /// keeps one or the other); returns how many went. Records of another width than the header
  /// go too.
  std::size_t keep_only(const std::function<bool(const CsvRecord&)>& keep);

 private:
  void open_locked();  // opens, locks, reads and repairs path_

  std::string path_;
  CsvRecord header_;
  CsvAppendOptions options_;
  int fd_ = -1;
  std::vector<CsvRecord> records_;
  std::size_t repaired_ = 0;
};

}  // namespace attnlab
