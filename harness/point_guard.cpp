#include "harness/point_guard.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string_view>

#include "harness/meta.hpp"

namespace attnlab::harness {
namespace {

constexpr int kFatalSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};

// The handler may only use async-signal-safe calls: the marker path is copied here beforehand.
char g_marker[4096];
volatile std::sig_atomic_t g_armed = 0;
struct sigaction g_previous[NSIG];

const char* signal_name(int sig) {
  switch (sig) {
    case SIGSEGV:
      return "SIGSEGV";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGILL:
      return "SIGILL";
    default:
      return "SIGABRT";
  }
}

extern "C" void on_fatal_signal(int sig) {
  if (g_armed) {
    const int fd = ::open(g_marker, O_WRONLY | O_APPEND | O_CLOEXEC);
    if (fd >= 0) {
      const char* name = signal_name(sig);
      [[maybe_unused]] ssize_t w = ::write(fd, "signal ", 7);
      w = ::write(fd, name, std::strlen(name));
      w = ::write(fd, "\n", 1);
      ::close(fd);
    }
  }
  // Whatever handled the signal before (the default action, a sanitizer's report) handles it now.
  ::sigaction(sig, &g_previous[sig], nullptr);
  ::raise(sig);
}

long long monotonic_us() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
}

// "oom_kill N" in a cgroup file, -1 when absent.
long oom_kill_field(const std::string& path) {
  std::ifstream in(path);
  std::string name;
  long value = 0;
  while (in >> name >> value)
    if (name == "oom_kill") return value;
  return -1;
}

}  // namespace

bool kernel_oom_killed(long pid, long long since_us) {
  if (pid <= 0) return false;
  const int fd = ::open("/dev/kmsg", O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return false;
  const std::string needle = "Killed process " + std::to_string(pid) + " ";
  char buf[8192];
  bool found = false;
  while (!found) {
    const ssize_t n = ::read(fd, buf, sizeof buf);  // one record per read
    if (n < 0 && errno == EPIPE) continue;          // records overwritten meanwhile
    if (n <= 0) break;                              // EAGAIN: the end of the log
    const std::string_view record(buf, static_cast<std::size_t>(n));
    // "priority,sequence,microseconds,flags;message": only kills after the point began count.
    const auto c1 = record.find(','), c2 = record.find(',', c1 + 1);
    if (c1 == std::string_view::npos || c2 == std::string_view::npos) continue;
    const long long ts = std::atoll(std::string(record.substr(c2 + 1, 20)).c_str());
    found = ts + 1000000 >= since_us && record.find(needle) != std::string_view::npos;
  }
  ::close(fd);
  return found;
}

long cgroup_oom_kills() {
  std::ifstream in("/proc/self/cgroup");
  for (std::string line; std::getline(in, line);) {
    const auto c1 = line.find(':'), c2 = line.find(':', c1 + 1);
    if (c2 == std::string::npos) continue;
    const std::string controllers = line.substr(c1 + 1, c2 - c1 - 1), path = line.substr(c2 + 1);
    long n = -1;
    if (controllers == "memory")
      n = oom_kill_field("/sys/fs/cgroup/memory" + path + "/memory.oom_control");
    if (controllers.empty()) {
      n = oom_kill_field("/sys/fs/cgroup" + path + "/memory.events");
      if (n < 0) n = oom_kill_field("/sys/fs/cgroup/unified" + path + "/memory.events");
    }
    if (n >= 0) return n;
  }
  return -1;
}

PointGuard::PointGuard(const std::string& dir) : path_(dir + "/running") {
  std::ifstream in(path_);
  std::string key, signal;
  long pid = -1, oom_kills = -1;
  long long started_us = 0;
  int faults = 0;
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::string name;
    fields >> name;
    if (name == "key")
      fields >> key;
    else if (name == "faults")
      fields >> faults;
    else if (name == "pid")
      fields >> pid;
    else if (name == "oom_kills")
      fields >> oom_kills;
    else if (name == "started_us")
      fields >> started_us;
    else if (name == "signal")
      fields >> signal;
  }
  if (!key.empty()) {  // a process died while running `key`: was it the point's doing?
    if (!signal.empty()) {
      cause_ = "crashed with " + signal;
    } else if (kernel_oom_killed(pid, started_us) ||
               (oom_kills >= 0 && cgroup_oom_kills() > oom_kills)) {
      cause_ = "killed by the kernel's OOM killer";
    }
    key_ = key;
    faults_ = faults + (cause_.empty() ? 0 : 1);
  }
  std::snprintf(g_marker, sizeof g_marker, "%s", path_.c_str());
  struct sigaction action {};
  action.sa_handler = on_fatal_signal;
  sigemptyset(&action.sa_mask);
  for (int sig : kFatalSignals) ::sigaction(sig, &action, &g_previous[sig]);
}

PointGuard::~PointGuard() {
  g_armed = 0;
  for (int sig : kFatalSignals) ::sigaction(sig, &g_previous[sig], nullptr);
}

void PointGuard::discard_if_stored(const std::unordered_set<std::string>& stored) {
  if (key_.empty() || !stored.count(key_)) return;
  key_.clear();
  cause_.clear();
  faults_ = 0;
  std::remove(path_.c_str());
}

void PointGuard::begin(const std::string& key) {
  g_armed = 0;
  std::ostringstream marker;
  marker << "key " << key << "\nfaults " << faults(key) << "\npid " << ::getpid() << "\noom_kills "
         << cgroup_oom_kills() << "\nstarted_us " << monotonic_us() << "\n";
  write_atomically(path_, marker.str());
  g_armed = 1;
}

void PointGuard::end() {
  g_armed = 0;
  std::remove(path_.c_str());
}

}  // namespace attnlab::harness
