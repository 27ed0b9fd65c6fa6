#include "attnlab/blas.hpp"

#include <strings.h>
#include <unistd.h>

#include <cblas.h>
#include <omp.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>

namespace attnlab::blas {
namespace {

// Set by use_fitting_core() beside OPENBLAS_CORETYPE: the core OpenBLAS detected on its own.
constexpr const char* kDetectedVariable = "ATTNLAB_OPENBLAS_DETECTED";

// The instruction-set level of an x86 OpenBLAS core (0.3.21's names): 0 SSE, 1 AVX, 2 AVX2,
// 3 AVX-512; -1 for a name not listed here, which fitting_core() leaves alone.
int core_level(std::string_view corename) {
  struct Core {
    const char* name;
    int level;
  };
  static constexpr Core kCores[] = {
      {"Unknown", 0},     {"Katmai", 0},        {"Coppermine", 0},     {"Northwood", 0},
      {"Prescott", 0},    {"Banias", 0},        {"Atom", 0},           {"Core2", 0},
      {"Penryn", 0},      {"Dunnington", 0},    {"Nehalem", 0},        {"Athlon", 0},
      {"Opteron", 0},     {"Opteron(SSE3)", 0}, {"Barcelona", 0},      {"Nano", 0},
      {"Bobcat", 0},      {"Sandybridge", 1},   {"Bulldozer", 1},      {"Piledriver", 1},
      {"Steamroller", 1}, {"Excavator", 1},     {"Haswell", 2},        {"Zen", 2},
      {"SkylakeX", 3},    {"Cooperlake", 3},    {"SapphireRapids", 3},
  };
  for (const Core& c : kCores)
    if (corename.size() == std::strlen(c.name) &&
        strncasecmp(corename.data(), c.name, corename.size()) == 0)
      return c.level;
  return -1;
}

std::set<std::string> flag_set(std::string_view flags) {
  std::set<std::string> out;
  std::istringstream words{std::string(flags)};
  for (std::string w; words >> w;) out.insert(w);
  return out;
}

// The value of `key` for the first processor in /proc/cpuinfo.
std::string cpuinfo_field(const char* key) {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    name.erase(name.find_last_not_of(" \t") + 1);
    if (name == key) return colon + 2 <= line.size() ? line.substr(colon + 2) : "";
  }
  return "";
}

const char* env(const char* name) {
  const char* value = std::getenv(name);
  return value && *value ? value : nullptr;
}

}  // namespace

const char* source_name(CoreSource source) {
  switch (source) {
    case CoreSource::user:
      return "user";
    case CoreSource::attnlab:
      return "attnlab";
    case CoreSource::openblas:
      break;
  }
  return "openblas";
}

std::string fitting_core(std::string_view corename, std::string_view cpu_flags) {
  const int level = core_level(corename);
  if (level < 0) return "";
  const auto flags = flag_set(cpu_flags);
  const auto has = [&](std::initializer_list<const char*> names) {
    for (const char* n : names)
      if (!flags.count(n)) return false;
    return true;
  };
  std::string best;
  int best_level = -1;
  if (has({"avx512f", "avx512bw", "avx512dq", "avx512vl"})) {
    best = has({"avx512_bf16"}) ? "Cooperlake" : "SkylakeX";
    best_level = 3;
  } else if (has({"avx2", "fma"})) {
    best = "Haswell";
    best_level = 2;
  } else if (has({"avx"})) {
    best = "Sandybridge";
    best_level = 1;
  }
  return best_level > level ? best : "";
}

std::string cpu_flags() {
  return cpuinfo_field("flags");
}

std::string cpu_model() {
  return cpuinfo_field("model name");
}

Info info() {
  Info i;
  i.corename = openblas_get_corename();
  i.threads = openblas_get_num_threads();
  i.config = openblas_get_config();
  i.better = fitting_core(i.corename, cpu_flags());
  switch (openblas_get_parallel()) {
    case 0:
      i.threading = "sequential";
      break;
    case 1:
      i.threading = "pthreads";
      break;
    default:
      i.threading = "OpenMP";
      break;
  }
  const char* coretype = env("OPENBLAS_CORETYPE");
  const char* detected = env(kDetectedVariable);
  i.coretype = coretype ? coretype : "";
  if (!coretype) {
    i.source = CoreSource::openblas;
    i.detected = i.corename;
  } else if (detected && fitting_core(detected, cpu_flags()) == coretype) {
    i.source = CoreSource::attnlab;  // the variable still holds what use_fitting_core() set
    i.detected = detected;
  } else {
    i.source = CoreSource::user;
  }
  return i;
}

std::string describe(const Info& i) {
  std::string text = i.config + ", core " + i.corename + ", " +
                     (i.threading.empty() ? "" : i.threading + ", ") + std::to_string(i.threads) +
                     (i.threads == 1 ? " thread (" : " threads (");
  switch (i.source) {
    case CoreSource::attnlab:
      text +=
          "OPENBLAS_CORETYPE=" + i.coretype + " set by attnlab: OpenBLAS detected " + i.detected;
      break;
    case CoreSource::user:
      text += "OPENBLAS_CORETYPE=" + i.coretype + " set by the user";
      break;
    case CoreSource::openblas:
      text += "detected by OpenBLAS, OPENBLAS_CORETYPE unset";
      break;
  }
  if (!i.better.empty()) text += "; this CPU supports " + i.better;
  return text + ")";
}

void use_fitting_core(char** argv) {
  if (env("OPENBLAS_CORETYPE")) return;  // the user's choice, or ours after the re-execution
  const std::string corename = openblas_get_corename();
  const std::string better = fitting_core(corename, cpu_flags());
  if (better.empty()) return;
  setenv("OPENBLAS_CORETYPE", better.c_str(), 1);
  setenv(kDetectedVariable, corename.c_str(), 1);
  std::fflush(nullptr);
  execv("/proc/self/exe", argv);
  // Still here: run on with OpenBLAS's choice, and say so.
  const std::string why = std::strerror(errno);
  unsetenv("OPENBLAS_CORETYPE");
  unsetenv(kDetectedVariable);
  std::fprintf(stderr, "attnlab: warning: could not re-execute with OPENBLAS_CORETYPE=%s (%s)\n",
               better.c_str(), why.c_str());
  warn_if_slow();
}

bool competing_thread_pools(const Info& info, int omp_threads) {
  return info.threading == "pthreads" && info.threads > 1 && omp_threads > 1;
}

void warn_if_slow() {
  static std::once_flag once;
  std::call_once(once, [] {
    const Info i = info();
    if (i.source == CoreSource::openblas && !i.better.empty())
      std::fprintf(stderr,
                   "attnlab: warning: OpenBLAS runs its %s kernels on a CPU that supports %s; "
                   "matrix products may run several times slower (set OPENBLAS_CORETYPE=%s)\n",
                   i.corename.c_str(), i.better.c_str(), i.better.c_str());
    if (competing_thread_pools(i, omp_get_max_threads()))
      std::fprintf(stderr,
                   "attnlab: warning: OpenBLAS's pthreads build runs %d threads of its own "
                   "beside OpenMP's; the two pools slow each other down (use OpenBLAS's OpenMP "
                   "build, Debian's libopenblas0-openmp, or set OPENBLAS_NUM_THREADS=1)\n",
                   i.threads);
  });
}

}  // namespace attnlab::blas
