#include "harness/meta.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <omp.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "attnlab/blas.hpp"
#include "attnlab/error.hpp"
#include "attnlab/kernels.hpp"
#include "harness/build_info.hpp"

namespace attnlab::harness {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

nlohmann::json run_context() {
  nlohmann::json j;
  const std::string commit = build_info::git_describe();
  const bool dirty = commit.size() > 6 && commit.substr(commit.size() - 6) == "-dirty";
  j["git_commit"] = dirty ? commit.substr(0, commit.size() - 6) : commit;
  j["git_dirty"] = dirty;
  j["compiler"] = build_info::compiler();
  j["compiler_flags"] = build_info::flags();
  j["build_type"] = build_info::build_type();
  j["cpu_model"] = blas::cpu_model();
  j["cpu_flags"] = blas::cpu_flags();
  const blas::Info blas = blas::info();
  j["blas"] = {{"config", blas.config},
               {"corename", blas.corename},
               {"threads", blas.threads},
               {"core_source", blas::source_name(blas.source)},  // openblas, user or attnlab
               {"detected", blas.detected},
               {"better_core", blas.better},
               {"threading", blas.threading}};  // OpenMP, pthreads or sequential
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  j["OPENBLAS_CORETYPE"] = coretype ? nlohmann::json(coretype) : nlohmann::json(nullptr);
  j["kernels"] = kernels::isa_name(kernels::active_isa());  // the path that ran (ATTNLAB_ISA)
  j["kernels_bf16"] = kernels::bf16_path_name(kernels::active_bf16_path());  // bf16 inputs' path
  j["threads"] = {{"omp_max_threads", omp_get_max_threads()},
                  {"nproc", std::thread::hardware_concurrency()}};
  j["date"] = utc_now();
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  j["hostname"] = host;
  j["load_average"] = load_average();
  return j;
}

std::string load_average() {
  std::ifstream load("/proc/loadavg");
  std::string l1, l5, l15;
  load >> l1 >> l5 >> l15;
  return l1.append(" ").append(l5).append(" ").append(
      l15);  // in place: GCC 12 warns falsely on + chains
}

double load_average_1min() {
  double one = -1;
  std::istringstream(load_average()) >> one;
  return one;
}

void write_atomically(const std::string& path, const std::string& text) {
  // POSIX calls, not streams, so a failure can say why (ENOSPC, EROFS, EACCES, EFBIG).
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const auto fail = [&](const std::string& what) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw Error("cannot write " + path + ": " + what + ": " + why);
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    const std::string why = std::strerror(errno);
    throw Error("cannot write " + path + ": " + why);
  }
  for (std::size_t done = 0; done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      fail("write");
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) fail("fsync");
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("rename");
}

void record_run(const std::string& dir, const SweepConfig& config, const nlohmann::json& extra) {
  const std::string path = dir + "/meta.json";
  nlohmann::json meta = nlohmann::json::object();
  if (std::filesystem::exists(path)) {
    try {
      meta = nlohmann::json::parse(read_text(path));
    } catch (const std::exception& e) {
      throw Error(path + ": not valid JSON (" + e.what() + ")");
    }
  }
  nlohmann::json run = run_context();
  run["config_origin"] = config.origin;
  run["config"] = config.text;
  for (auto it = extra.begin(); it != extra.end(); ++it) run[it.key()] = it.value();
  nlohmann::json runs = meta.contains("runs") ? meta["runs"] : nlohmann::json::array();
  runs.push_back(run);
  meta = run;
  meta["runs"] = runs;
  write_atomically(path, meta.dump(2) + "\n");
}

void write_merged_meta(const std::string& out_dir, const std::vector<std::string>& in_dirs) {
  nlohmann::json merged = nlohmann::json::object(), from = nlohmann::json::array();
  for (const auto& dir : in_dirs) {
    const std::string path = dir + "/meta.json";
    nlohmann::json m = nullptr;
    if (std::filesystem::exists(path)) {
      try {
        m = nlohmann::json::parse(read_text(path));
      } catch (const std::exception& e) {
        throw Error(path + ": not valid JSON (" + e.what() + ")");
      }
    }
    if (merged.empty() && m.is_object())
      for (auto it = m.begin(); it != m.end(); ++it)
        if (it.key() != "runs") merged[it.key()] = it.value();
    from.push_back({{"dir", dir}, {"meta", m}});
  }
  merged["merged_at"] = utc_now();
  merged["merged_by"] = run_context();
  merged["merged_from"] = from;
  write_atomically(out_dir + "/meta.json", merged.dump(2) + "\n");
}

}  // namespace attnlab::harness
