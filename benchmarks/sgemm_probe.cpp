// One OpenBLAS sgemm measurement in a process of its own. OpenBLAS reads OPENBLAS_CORETYPE once,
// when it loads, so the benchmarks start this as a child (bench::BM_sgemm_coretype) to time the
// yardstick with another core type's kernels than their own environment's, in the same run.
// Usage: sgemm_probe M N K CALLS
// Prints "SECONDS CORENAME": the wall time of CALLS calls C[M x N] = A[M x K] B[K x N] after one
// untimed warm-up call, and the core type OpenBLAS chose.
#include <cblas.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

extern "C" char* openblas_get_corename(void);

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: sgemm_probe M N K CALLS\n");
    return 2;
  }
  const int m = std::atoi(argv[1]), n = std::atoi(argv[2]), k = std::atoi(argv[3]);
  const int calls = std::atoi(argv[4]);
  if (m < 1 || n < 1 || k < 1 || calls < 1) {
    std::fprintf(stderr, "sgemm_probe: M, N, K and CALLS must be integers >= 1\n");
    return 2;
  }
  std::vector<float> a(std::size_t(m) * k, 0.5f), b(std::size_t(k) * n, 0.25f),
      c(std::size_t(m) * n);
  const auto gemm = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a.data(), k, b.data(), n,
                0.0f, c.data(), n);
  };
  gemm();  // warm-up: OpenBLAS's threads and buffers
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) gemm();
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  std::printf("%.9f %s\n", took.count(), openblas_get_corename());
  return c[0] == 0.125f * k ? 0 : 1;  // also keeps the products from being optimised away
}
