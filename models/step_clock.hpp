// Where a training step's time goes (training::measure_split): while a StepClock runs on a
// thread, the layers called on that thread add the wall-clock time of their attention cores'
// calls (forward and backward, models/multi_head_attention.hpp) and of their GEMMs (affine and
// affine_backward, models/layers.hpp: every projection, feed-forward and head product) into it.
// Stopped, a layer pays one branch on a thread-local pointer per call.
#pragma once

namespace attnlab::models {

/// Seconds spent in each measured part while the clock ran.
struct StepClock {
  double attention = 0;  ///< inside the attention cores' forward and backward calls
  double gemm = 0;       ///< inside the layers' GEMMs
};

/// Runs `clock` on this thread for the scope's life (one at a time; the previous one resumes
/// after).
class RunningClock {
 public:
  /// Starts `clock` on this thread.
  explicit RunningClock(StepClock& clock);
  /// Stops it; the previous clock, if any, runs again.
  ~RunningClock();
  RunningClock(const RunningClock&) = delete;
  RunningClock& operator=(const RunningClock&) = delete;

 private:
  StepClock* previous_;
};

/// The parts a layer times.
enum class StepPart {
  attention,  ///< an attention core's forward or backward call
  gemm,       ///< a GEMM
};

/// Adds the scope's time to `part` of the clock running on this thread, if any.
class TimedPart {
 public:
  /// Starts timing `part` (nothing when no clock runs).
  explicit TimedPart(StepPart part);
  /// Adds the time since the start to the clock's `part`.
  ~TimedPart();
  TimedPart(const TimedPart&) = delete;
  TimedPart& operator=(const TimedPart&) = delete;

 private:
  double* into_;
  long long start_ns_ = 0;
};

}  // namespace attnlab::models
