#include "harness/progress.hpp"

#include <unistd.h>

#include <cmath>

namespace attnlab::harness {

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const long t = std::lround(s);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, t / 60 % 60);
  else if (t >= 60) std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%lds", t);
  return buf;
}

Progress::Progress(std::size_t total, std::FILE* stream)
    : total_(total), out_(stream), tty_(stream && isatty(fileno(stream))),
      t0_(std::chrono::steady_clock::now()) {}

Progress::~Progress() {
  if (out_ && tty_) std::fputc('\n', out_);
}

void Progress::draw(const std::string& label) {
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  const double eta = finished_ ? elapsed / double(finished_) * double(total_ - finished_) : NAN;
  constexpr int kWidth = 30;
  const int filled = total_ ? static_cast<int>(kWidth * finished_ / total_) : kWidth;
  std::string bar(static_cast<std::size_t>(filled), '=');
  bar.resize(kWidth, ' ');
  std::string shown = label.size() > 72 ? label.substr(0, 69) + "..." : label;
  std::fprintf(out_, "\r\033[K[%s] %zu/%zu  %s elapsed  ETA %s  %s", bar.c_str(), finished_, total_,
               format_duration(elapsed).c_str(), format_duration(eta).c_str(), shown.c_str());
  std::fflush(out_);
}

void Progress::start(const std::string& label) {
  if (out_ && tty_) draw(label);
}

void Progress::done(const std::string& label, const std::string& status, double seconds) {
  ++finished_;
  if (!out_) return;
  if (tty_) {
    draw(label + " " + status);
    return;
  }
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  const double eta = elapsed / double(finished_) * double(total_ - finished_);
  char took[32] = "";
  if (seconds >= 0) std::snprintf(took, sizeof took, " in %.2fs", seconds);
  std::fprintf(out_, "[%zu/%zu] %s: %s%s (ETA %s)\n", finished_, total_, label.c_str(),
               status.c_str(), took, format_duration(eta).c_str());
  std::fflush(out_);
}

}  // namespace attnlab::harness
