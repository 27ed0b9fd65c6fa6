// The guard of a sweep against points that kill the process, without punishing outside kills.
//
// While a point runs, <dir>/running names it (key, the process id, the kernel's OOM-kill count of
// the process's memory cgroup). A process that finds the file left behind by a dead predecessor
// asks why it died:
//   - the point crashed it: a fatal signal (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) runs a
//     handler that appends "signal NAME" to the file before the process dies;
//   - the kernel's OOM killer ended it: /dev/kmsg holds "Killed process <pid>", or the cgroup's
//     oom_kill count rose since the point began;
//   - anything else (SIGKILL or SIGTERM from outside: Ctrl-C, a scheduler, a preempted machine) is
//     no fault of the point: it simply runs again, however often that happens.
// A point that killed the process twice is recorded as status "error" (naming the cause) so the
// sweep can finish; `attnlab sweep --retry-errors` tries such rows again.
#pragma once

#include <string>
#include <unordered_set>

namespace attnlab::harness {

class PointGuard {
 public:
  /// Reads and classifies <dir>/running if a dead process left it; installs the signal handlers.
  explicit PointGuard(const std::string& dir);
  ~PointGuard();  // restores the previous signal handlers
  PointGuard(const PointGuard&) = delete;
  PointGuard& operator=(const PointGuard&) = delete;

  /// How often the point `key` killed a process before (0, 1, 2...), and the last cause.
  int faults(const std::string& key) const { return key == key_ ? faults_ : 0; }
  const std::string& cause() const { return cause_; }

  /// A dead process may have stored its point's row and died before removing the marker: such a
  /// marker (its key among `stored`) is removed, so a finished folder holds no `running`.
  void discard_if_stored(const std::unordered_set<std::string>& stored);

  /// Marks `key` as running (the marker is written atomically before the point starts).
  void begin(const std::string& key);
  /// The point finished (its row is stored): removes the marker.
  void end();

 private:
  std::string path_, key_, cause_;
  int faults_ = 0;
};

/// Whether the kernel log (/dev/kmsg) records that the OOM killer ended process `pid` at or after
/// `since_us` (CLOCK_MONOTONIC microseconds); false when it does not or cannot be read.
bool kernel_oom_killed(long pid, long long since_us);

/// The oom_kill count of this process's memory cgroup (v2 memory.events or v1
/// memory.oom_control), -1 when unknown.
long cgroup_oom_kills();

}  // namespace attnlab::harness
