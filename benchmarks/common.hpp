// Shared pieces of the microbenchmarks: seeded inputs, FLOP counters, the sgemm yardsticks
// (in-process and, with other OpenBLAS core types, in child processes), the kernel path in the
// context and the process's peak resident memory.
#pragma once

#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <benchmark/benchmark.h>
#include <cblas.h>

#include "attnlab/attnlab.hpp"
#include "attnlab/blas.hpp"
#include "attnlab/kernels.hpp"

extern "C" char* openblas_get_corename(void);
extern char** environ;

/// BENCHMARK_MAIN with OpenBLAS's best kernels for this CPU (blas::use_fitting_core: a re-execution
/// with OPENBLAS_CORETYPE set when it is unset and OpenBLAS chose a weaker core), named in the
/// JSON.
#define ATTNLAB_BENCHMARK_MAIN()                                                         \
  int main(int argc, char** argv) {                                                      \
    attnlab::blas::use_fitting_core(argv);                                               \
    benchmark::AddCustomContext("blas", attnlab::blas::describe(attnlab::blas::info())); \
    benchmark::Initialize(&argc, argv);                                                  \
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;                    \
    benchmark::RunSpecifiedBenchmarks();                                                 \
    benchmark::Shutdown();                                                               \
    return 0;                                                                            \
  }                                                                                      \
  int main(int, char**)

namespace attnlab::bench {

// Every JSON names the kernel path the forwards took unless a benchmark says otherwise.
inline const bool kKernelsInContext = [] {
  benchmark::AddCustomContext("kernels", kernels::isa_name(kernels::active_isa()));
  benchmark::AddCustomContext("kernels_bf16", kernels::bf16_path_name(kernels::active_bf16_path()));
  return true;
}();

inline Tensor random_tensor(std::size_t b, std::size_t h, std::size_t n, std::size_t d,
                            std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Tensor t = Tensor::from_shape({b, h, n, d});
  for (float& x : t) x = normal(rng);
  return t;
}

/// Reports `flops` per iteration as a rate (GFLOP/s in the JSON as FLOP/s with k-prefix).
inline void set_flops(benchmark::State& state, double flops) {
  state.counters["FLOPS"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate,
                                               benchmark::Counter::kIs1000);
}

inline double peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

/// OpenBLAS sgemm C[m x n] = A[m x k] B[k x n]: the yardstick for every GFLOP/s ratio, with the
/// core type of this process's environment (the label names the one OpenBLAS chose).
inline void BM_sgemm(benchmark::State& state) {
  const auto m = static_cast<int>(state.range(0)), n = static_cast<int>(state.range(1)),
             k = static_cast<int>(state.range(2));
  std::vector<float> a(std::size_t(m) * k, 0.5f), b(std::size_t(k) * n, 0.25f),
      c(std::size_t(m) * n);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a.data(), k, b.data(), n,
                0.0f, c.data(), n);
    benchmark::DoNotOptimize(c.data());
  }
  set_flops(state, 2.0 * m * n * k);
  const char* env = std::getenv("OPENBLAS_CORETYPE");
  state.SetLabel(std::string("in-process, OPENBLAS_CORETYPE=") + (env ? env : "unset") + " -> " +
                 openblas_get_corename());
}

/// The OPENBLAS_CORETYPE of OpenBLAS's fastest sgemm kernels for this CPU's family: what
/// blas::fitting_core raises the weakest core to (Cooperlake or SkylakeX with AVX-512, Haswell
/// with AVX2 + FMA, ...), Prescott on a CPU with none of these.
inline std::string family_coretype() {
  const std::string best = blas::fitting_core("Prescott", blas::cpu_flags());
  return best.empty() ? "Prescott" : best;
}

/// Runs sgemm_probe (beside this binary) with OPENBLAS_CORETYPE = coretype, or without it when
/// coretype is empty: the seconds of `calls` sgemm calls and the core name OpenBLAS chose.
inline std::pair<double, std::string> run_sgemm_probe(const std::string& coretype, int m, int n,
                                                      int k, int calls) {
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0) throw std::runtime_error("cannot read /proc/self/exe");
  std::string probe(self, static_cast<std::size_t>(len));
  probe = probe.substr(0, probe.rfind('/') + 1) + "sgemm_probe";
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e)
    if (std::string(*e).rfind("OPENBLAS_CORETYPE=", 0) != 0) env.emplace_back(*e);
  if (!coretype.empty()) env.push_back("OPENBLAS_CORETYPE=" + coretype);
  std::vector<std::string> args = {probe, std::to_string(m), std::to_string(n), std::to_string(k),
                                   std::to_string(calls)};
  auto pointers = [](std::vector<std::string>& v) {
    std::vector<char*> p;
    for (auto& x : v) p.push_back(x.data());
    p.push_back(nullptr);
    return p;
  };
  std::vector<char*> argv = pointers(args), envp = pointers(env);
  int out[2];
  if (pipe(out) != 0) throw std::runtime_error("pipe failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, probe.c_str(), &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  std::string text;
  char buf[256];
  for (ssize_t got; (got = read(out[0], buf, sizeof buf)) > 0;)
    text.append(buf, static_cast<std::size_t>(got));
  close(out[0]);
  int status = 0;
  if (spawned != 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
      WEXITSTATUS(status) != 0)
    throw std::runtime_error(probe + " failed (is it built?)");
  char name[128] = {};
  double seconds = 0;
  if (std::sscanf(text.c_str(), "%lf %127s", &seconds, name) != 2 || !(seconds > 0))
    throw std::runtime_error(probe + ": unexpected output '" + text + "'");
  return {seconds, name};
}

/// BM_sgemm in a child process (sgemm_probe) whose OPENBLAS_CORETYPE is `coretype`: "unset"
/// removes it, "family" is family_coretype(). OpenBLAS's best kernels for this CPU, timed in the
/// same run as everything else. Manual time: the child's timing of its own calls, not its start.
inline void BM_sgemm_coretype(benchmark::State& state, const std::string& coretype) {
  const auto m = static_cast<int>(state.range(0)), n = static_cast<int>(state.range(1)),
             k = static_cast<int>(state.range(2));
  const double flops = 2.0 * m * n * k;
  const int calls = std::max(1, static_cast<int>(40e9 / flops));  // ~0.1-0.4 s per child
  const std::string set = coretype == "unset"    ? ""
                          : coretype == "family" ? family_coretype()
                                                 : coretype;
  std::string chosen;
  for (auto _ : state) {
    try {
      const auto [seconds, name] = run_sgemm_probe(set, m, n, k, calls);
      state.SetIterationTime(seconds);
      chosen = name;
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
      return;
    }
  }
  set_flops(state, flops * calls);
  state.SetLabel("child, OPENBLAS_CORETYPE=" + (set.empty() ? std::string("unset") : set) + " -> " +
                 chosen);
}

/// Registers the yardsticks at each shape {m, n, k}: BM_sgemm (this environment's core type) and
/// BM_sgemm_coretype/unset and /family (child processes). Returns a value to initialise a static.
inline int register_sgemm(std::initializer_list<std::array<std::int64_t, 3>> shapes) {
  for (const auto& s : shapes) {
    const std::vector<std::int64_t> args(s.begin(), s.end());
    benchmark::RegisterBenchmark("BM_sgemm", BM_sgemm)
        ->ArgNames({"m", "n", "k"})
        ->Args(args)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    for (const char* type : {"unset", "family"})
      benchmark::RegisterBenchmark((std::string("BM_sgemm_coretype/") + type).c_str(),
                                   BM_sgemm_coretype, std::string(type))
          ->ArgNames({"m", "n", "k"})
          ->Args(args)
          ->Unit(benchmark::kMillisecond)
          ->UseManualTime();
  }
  return 0;
}

}  // namespace attnlab::bench
