#include "attnlab/progress.hpp"

#include <unistd.h>

#include <cmath>

namespace attnlab {

ProgressLine::ProgressLine(std::FILE* stream)
    : out_(stream), tty_(stream && isatty(fileno(stream))) {}

ProgressLine::~ProgressLine() {
  if (drawn_) std::fputc('\n', out_);
}

void ProgressLine::redraw(const std::string& text) {
  if (!out_ || !tty_) return;
  std::fprintf(out_, "\r\033[K%s", text.c_str());
  std::fflush(out_);
  drawn_ = true;
}

void ProgressLine::print(const std::string& text) {
  if (!out_) return;
  std::fprintf(out_, "%s%s\n", drawn_ ? "\r\033[K" : "", text.c_str());
  std::fflush(out_);
  drawn_ = false;
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const long t = std::lround(s);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, t / 60 % 60);
  else if (t >= 60)
    std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%lds", t);
  return buf;
}

double eta_seconds(double elapsed, std::size_t done, std::size_t total) {
  return done ? elapsed / double(done) * double(total - done) : NAN;
}

}  // namespace attnlab
