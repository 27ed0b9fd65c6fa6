// Shared pieces of the microbenchmarks: seeded inputs, FLOP counters, the sgemm yardstick and
// the process's peak resident memory.
#pragma once

#include <sys/resource.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>
#include <cblas.h>

#include "attnlab/attnlab.hpp"

namespace attnlab::bench {

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

/// OpenBLAS sgemm C[m x n] = A[m x k] B[k x n]: the yardstick for every GFLOP/s ratio.
inline void BM_sgemm(benchmark::State& state) {
  const auto m = static_cast<int>(state.range(0)), n = static_cast<int>(state.range(1)),
             k = static_cast<int>(state.range(2));
  std::vector<float> a(std::size_t(m) * k, 0.5f), b(std::size_t(k) * n, 0.25f),
      c(std::size_t(m) * n);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a.data(), k, b.data(),
                n, 0.0f, c.data(), n);
    benchmark::DoNotOptimize(c.data());
  }
  set_flops(state, 2.0 * m * n * k);
}

}  // namespace attnlab::bench
