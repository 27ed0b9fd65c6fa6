#include "training/run.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "attnlab/csv.hpp"
#include "attnlab/error.hpp"
#include "attnlab/progress.hpp"

namespace attnlab::training {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

const CsvRecord kLogHeader = {"step", "loss", "accuracy", "seconds", "bits"};
// Appended at every step, so synced with each checkpoint rather than each line (a step can take
// a few ms, an fsync as long): a kill loses nothing either way, and a resume cuts the logs back
// to the checkpoint's step.
const CsvAppendOptions kLogOptions = {
    .header_now = false, .sync_each_append = false, .holder = "another training run"};

std::string fixed(const char* format, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, x);
  return buf;
}

CsvRecord log_row(std::size_t step, const Score& s, double seconds) {
  return {std::to_string(step), fixed("%.6f", s.loss), fixed("%.6f", s.accuracy()),
          fixed("%.4f", seconds), fixed("%.6f", s.bits())};
}

// Keeps the rows of a log whose step (first column) is at most `step`: what a resumed run has
// done. A row of another width than the header goes too.
void cut_log(CsvAppender& log, std::size_t step) {
  log.keep_only([step](const CsvRecord& row) {
    char* end = nullptr;
    const unsigned long long row_step = std::strtoull(row[0].c_str(), &end, 10);
    return !row[0].empty() && *end == '\0' && row_step <= step;
  });
}

// Training's text on the progress line: redrawn at every step on a terminal; elsewhere a plain
// line every ~5% of the steps and at each evaluation.
class StepProgress {
 public:
  StepProgress(std::size_t steps, std::FILE* stream)
      : steps_(steps), every_(std::max<std::size_t>(1, steps / 20)), line_(stream) {}

  void show(std::size_t step, const Score& batch, const Score* eval, double seconds_per_step) {
    if (eval) last_eval_ = 100 * eval->accuracy();
    const bool log_line = eval || step % every_ == 0 || step == steps_;
    if (line_.silent() || (!line_.terminal() && !log_line)) return;
    char text[256];
    std::snprintf(text, sizeof text, "step %zu/%zu  loss %.4f  acc %5.1f%%", step, steps_,
                  batch.loss, 100 * batch.accuracy());
    std::string line = text;
    if (last_eval_ >= 0) {
      std::snprintf(text, sizeof text, "  eval %5.1f%%", last_eval_);
      line += text;
    }
    std::snprintf(text, sizeof text, "  %.3f s/step  ETA %s", seconds_per_step,
                  format_duration(seconds_per_step * double(steps_ - step)).c_str());
    line += text;
    if (line_.terminal())
      line_.redraw(line);
    else
      line_.print(line);
  }

 private:
  std::size_t steps_, every_;
  ProgressLine line_;
  double last_eval_ = -1;
};

// run_training in the folder options.out, which exists.
RunResult train_into(Trainer& trainer, const RunOptions& o, const RunEvents& events) {
  const std::string checkpoint = o.out + "/checkpoint";
  RunResult result;
  if (Trainer::has_checkpoint(checkpoint)) {
    trainer.load(checkpoint);
    result.resumed_at = trainer.steps();
    if (events.resumed) events.resumed(checkpoint, result.resumed_at);
  }
  CsvAppender train_log(o.out + "/train.csv", kLogHeader, kLogOptions);
  CsvAppender eval_log(o.out + "/eval.csv", kLogHeader, kLogOptions);
  cut_log(train_log, result.resumed_at);
  cut_log(eval_log, result.resumed_at);
  if (events.loop_starting) events.loop_starting();

  bool started = false;
  const auto first_step = [&] {
    if (started) return;
    started = true;
    if (events.first_step) events.first_step();
  };
  StepProgress progress(o.steps, o.progress);
  bool evaluated = false;
  for (std::size_t step = result.resumed_at + 1; step <= o.steps; ++step) {
    const auto start = Clock::now();
    const Score batch = trainer.step(&result.times);
    first_step();
    const double took = std::chrono::duration<double>(Clock::now() - start).count();
    trainer.seconds += took;
    result.session_seconds += took;
    train_log.append(log_row(step, batch, trainer.seconds));
    evaluated = step % o.eval_every == 0 || step == o.steps;
    if (evaluated) {
      result.eval = trainer.evaluate();
      eval_log.append(log_row(step, result.eval, trainer.seconds));
    }
    progress.show(step, batch, evaluated ? &result.eval : nullptr,
                  result.session_seconds / double(step - result.resumed_at));
    if (step % o.checkpoint_every == 0 || step == o.steps) {
      train_log.sync();
      eval_log.sync();
      trainer.save(checkpoint);
    }
  }
  first_step();
  if (!evaluated) result.eval = trainer.evaluate();  // nothing left to train: score what is there
  result.trained = trainer.steps() - result.resumed_at;
  return result;
}

}  // namespace

RunResult run_training(Trainer& trainer, const RunOptions& options, const RunEvents& events) {
  if (options.eval_every == 0 || options.checkpoint_every == 0)
    throw Error("training run: eval_every and checkpoint_every must be at least 1");
  if (options.out.empty()) throw Error("training run: no output folder given");
  const bool fresh_out = !fs::exists(options.out);
  fs::create_directories(options.out);
  try {
    return train_into(trainer, options, events);
  } catch (...) {
    std::error_code ec;
    if (fresh_out && fs::is_empty(options.out, ec)) fs::remove(options.out, ec);  // no trace
    throw;
  }
}

}  // namespace attnlab::training
