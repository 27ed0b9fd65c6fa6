#include "models/step_clock.hpp"

#include <chrono>

namespace attnlab::models {
namespace {

thread_local StepClock* running = nullptr;

long long now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

RunningClock::RunningClock(StepClock& clock) : previous_(running) {
  running = &clock;
}

RunningClock::~RunningClock() {
  running = previous_;
}

TimedPart::TimedPart(StepPart part)
    : into_(!running                      ? nullptr
            : part == StepPart::attention ? &running->attention
                                          : &running->gemm) {
  if (into_) start_ns_ = now_ns();
}

TimedPart::~TimedPart() {
  if (into_) *into_ += double(now_ns() - start_ns_) * 1e-9;
}

}  // namespace attnlab::models
