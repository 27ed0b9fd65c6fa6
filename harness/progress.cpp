#include "harness/progress.hpp"

namespace attnlab::harness {

Progress::Progress(std::size_t total, std::FILE* stream)
    : total_(total), line_(stream), t0_(std::chrono::steady_clock::now()) {}

double Progress::elapsed() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
}

void Progress::draw(const std::string& label) {
  const double seconds = elapsed();
  constexpr int kWidth = 30;
  const int filled = total_ ? static_cast<int>(kWidth * finished_ / total_) : kWidth;
  std::string bar(static_cast<std::size_t>(filled), '=');
  bar.resize(kWidth, ' ');
  const std::string shown = label.size() > 72 ? label.substr(0, 69) + "..." : label;
  char text[256];
  std::snprintf(text, sizeof text, "[%s] %zu/%zu  %s elapsed  ETA %s  ", bar.c_str(), finished_,
                total_, format_duration(seconds).c_str(),
                format_duration(eta_seconds(seconds, finished_, total_)).c_str());
  line_.redraw(text + shown);
}

void Progress::start(const std::string& label) {
  draw(label);
}

void Progress::done(const std::string& label, const std::string& status, double seconds) {
  ++finished_;
  if (line_.silent()) return;
  if (line_.terminal()) {
    draw(label + " " + status);
    return;
  }
  char took[32] = "", head[64];
  if (seconds >= 0) std::snprintf(took, sizeof took, " in %.2fs", seconds);
  std::snprintf(head, sizeof head, "[%zu/%zu] ", finished_, total_);
  const std::string eta = format_duration(eta_seconds(elapsed(), finished_, total_));
  line_.print(head + label + ": " + status + took + " (ETA " + eta + ")");
}

}  // namespace attnlab::harness
