// The one progress line of attnlab (the sweep, the studies, training): on a terminal one line
// redrawn in place, elsewhere (logs, CI) plain lines that stay. Callers choose the text and when
// a plain line is worth printing; this owns the stream, the terminal test and the line's end.
// Internal (not installed).
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>

namespace attnlab {

/// A progress line on a stream: redrawn in place on a terminal, plain lines elsewhere.
class ProgressLine {
 public:
  /// Progress on `stream`; nullptr: silent (every call does nothing).
  explicit ProgressLine(std::FILE* stream);
  /// Ends a redrawn line, so that what follows starts on its own.
  ~ProgressLine();
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  /// Whether it prints nothing (made with a null stream).
  bool silent() const { return out_ == nullptr; }
  /// Whether the stream is a terminal (redraw() shows anything).
  bool terminal() const { return tty_; }

  /// On a terminal: replaces the line with `text`. Elsewhere: nothing.
  void redraw(const std::string& text);
  /// One line of `text` that stays (a redrawn line is erased first).
  void print(const std::string& text);

 private:
  std::FILE* out_;
  bool tty_, drawn_ = false;
};

/// "42s", "3m05s", "1h02m"; "?" for a negative or non-finite time.
std::string format_duration(double seconds);

/// The time left at the mean pace so far: `elapsed` / `done` * (`total` - `done`); NaN when
/// nothing is done yet.
double eta_seconds(double elapsed, std::size_t done, std::size_t total);

}  // namespace attnlab
