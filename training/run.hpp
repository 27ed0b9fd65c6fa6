// A training run: the loop of `attnlab train`, for any caller (the CLI, a study, the Python
// API). In the folder `out`:
//   train.csv   step,loss,accuracy,seconds,bits: every step's batch score (bits: loss in bits
//               per target; bits per byte for the text task), training seconds so far
//   eval.csv    the same columns for the held-out score every eval_every steps and at the end
//   checkpoint/ the Trainer's checkpoint (training/trainer.hpp) every checkpoint_every steps and
//               at the end
// Both logs grow by whole lines (attnlab/csv.hpp: one write each, fsync with each checkpoint, a
// torn last line cut away when reopened) and appear with their first row, so a run that fails
// before its first step leaves no file, and a folder it created is removed again. Calling it again
// with the same folder resumes from the checkpoint: the logs are cut back to the checkpoint's step
// and training continues bitwise as an uninterrupted run would (docs/training.md).
#pragma once

#include <cstddef>
#include <cstdio>
#include <functional>
#include <string>

#include "training/trainer.hpp"

namespace attnlab::training {

/// How long a run trains and where it writes.
struct RunOptions {
  std::size_t steps = 1000;            ///< train until this step
  std::size_t eval_every = 100;        ///< held-out score every this many steps (and the last)
  std::size_t checkpoint_every = 100;  ///< checkpoint every this many steps (and the last)
  std::string out = "runs/train";      ///< the run's folder (created when missing)
  std::FILE* progress = stderr;        ///< the progress line (attnlab/progress.hpp); nullptr: none
};

/// What the caller hears during a run; each may be left empty.
struct RunEvents {
  /// A checkpoint (its folder) was loaded: training continues after `step`.
  std::function<void(const std::string& checkpoint, std::size_t step)> resumed;
  /// The logs are cut back to the checkpoint and the first step is next: where to start
  /// measuring the loop (heap, load).
  std::function<void()> loop_starting;
  /// This session's first step ran (or there was none left to run).
  std::function<void()> first_step;
};

/// What a run did in this session.
struct RunResult {
  Score eval;                  ///< the held-out score at the last step
  std::size_t resumed_at = 0;  ///< the checkpoint's step it continued from (0: a fresh run)
  std::size_t trained = 0;     ///< steps run in this session
  double session_seconds = 0;  ///< their wall-clock time (trainer.seconds has the whole run's)
  StepTimes times;             ///< their split into data, gradients and update
};

/// Trains `trainer` until options.steps, logging, evaluating and checkpointing into options.out;
/// resumes from options.out/checkpoint when there is one. Error (and no trace of a failed start)
/// on bad options, another run's checkpoint or an I/O failure.
RunResult run_training(Trainer& trainer, const RunOptions& options, const RunEvents& events = {});

}  // namespace attnlab::training
