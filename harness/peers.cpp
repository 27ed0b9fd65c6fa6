#include "harness/peers.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "attnlab/error.hpp"
#include "attnlab/npy.hpp"
#include "attnlab/stats.hpp"

namespace attnlab::harness {
namespace fs = std::filesystem;
namespace {

// A scratch directory removed on every exit path.
struct ScratchDir {
  fs::path path;
  ScratchDir() {
    std::string tmpl = (fs::temp_directory_path() / "attnlab-peer-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw Error("peers: cannot create a directory under /tmp");
    path = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// Runs argv with stdout+stderr into `log`; returns the exit status, or -1 if it could not start.
int run_process(const std::vector<std::string>& argv, const fs::path& log) {
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    if (!std::freopen(log.c_str(), "w", stdout) || dup2(fileno(stdout), STDERR_FILENO) < 0)
      _exit(127);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string last_line(const fs::path& file) {
  std::ifstream in(file);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  return last;
}

PeerResult skipped(std::string why) {
  PeerResult r;
  r.status = "skipped";
  r.message = std::move(why);
  return r;
}

}  // namespace

std::vector<std::string> peer_names() {
  return {"numpy", "torch"};
}

std::string find_peers_script() {
  if (const char* env = std::getenv("ATTNLAB_PEERS_SCRIPT")) return env;
  std::vector<fs::path> candidates = {"harness/peers.py"};
#ifdef ATTNLAB_SOURCE_DIR
  candidates.emplace_back(fs::path(ATTNLAB_SOURCE_DIR) / "harness" / "peers.py");
#endif
  for (const auto& c : candidates)
    if (fs::exists(c)) return fs::absolute(c).string();
  return "";
}

PeerResult run_peer(const std::string& which, const Tensor& q, const Tensor& k, const Tensor& v,
                    bool causal, int reps, const PeerOptions& options) {
  const auto names = peer_names();
  if (std::find(names.begin(), names.end(), which) == names.end())
    throw Error("peer '" + which + "': unknown (expected numpy or torch)");
  if (reps < 1) throw Error("peer reps=" + std::to_string(reps) + ": expected at least 1");
  const Dims d = check_qkv(q, k, v);

  const double score_bytes = 4.0 * double(d.batch) * double(d.heads) * double(d.nq) * double(d.nk);
  if (score_bytes > double(options.max_score_bytes))
    return skipped(which + ": the dense score matrix needs " +
                   std::to_string(static_cast<long long>(score_bytes / (1 << 20))) +
                   " MiB, over the peers' limit of " +
                   std::to_string(options.max_score_bytes >> 20) + " MiB");
  if (access(options.python.c_str(), X_OK) != 0)
    return skipped(which + ": python not found at " + options.python);
  const std::string script = options.script.empty() ? find_peers_script() : options.script;
  if (script.empty() || !fs::exists(script))
    return skipped(which + ": harness/peers.py not found (set ATTNLAB_PEERS_SCRIPT)");

  ScratchDir dir;
  attnlab::save_npy((dir.path / "q.npy").string(), q);
  attnlab::save_npy((dir.path / "k.npy").string(), k);
  attnlab::save_npy((dir.path / "v.npy").string(), v);
  std::vector<std::string> argv = {options.python, script,
                                   which,          dir.path.string(),
                                   "--reps",       std::to_string(reps),
                                   "--warmup",     std::to_string(options.warmup)};
  argv.insert(argv.end(), {"--max-score-bytes", std::to_string(options.max_score_bytes)});
  if (causal) argv.emplace_back("--causal");
  if (options.threads > 0) argv.insert(argv.end(), {"--threads", std::to_string(options.threads)});
  const fs::path log = dir.path / "log.txt";
  const int rc = run_process(argv, log);

  PeerResult r;
  std::ifstream in(dir.path / "result.json");
  if (rc != 0 || !in) {
    r.status = rc >= 128 ? "oom" : "error";  // killed by a signal: most often the OOM killer
    r.message = which + ": peers.py exited with " + std::to_string(rc) + ": " + last_line(log);
    return r;
  }
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    r.status = "error";
    r.message = which + ": unreadable result.json: " + e.what();
    return r;
  }
  r.status = j.value("status", "error");
  r.message = j.value("message", "");
  r.backend = j.value("backend", "");
  r.times_s = j.value("times_s", std::vector<double>{});
  r.peak_mem_bytes = j.value("peak_mem_bytes", std::int64_t{0});
  if (r.status != "ok") return r;
  if (r.times_s.empty()) {
    r.status = "error";
    r.message = which + ": no timings returned";
    return r;
  }
  std::vector<double> sorted = r.times_s;
  std::sort(sorted.begin(), sorted.end());
  r.time_min_s = sorted.front();
  r.time_max_s = sorted.back();
  r.time_median_s = quantile(sorted, 0.5);
  r.time_iqr_s = quantile(sorted, 0.75) - quantile(sorted, 0.25);
  try {
    r.output = to_bhnd(load_npy_float((dir.path / "out.npy").string(), {4}), "out.npy");
  } catch (const Error& e) {  // e.g. a NaN in the peer's output
    r.status = "error";
    r.message = which + ": " + e.what();
  }
  return r;
}

}  // namespace attnlab::harness
