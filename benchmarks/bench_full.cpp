// Exact attention against the OpenBLAS sgemm yardsticks, in one binary so ratios come from one
// run. B = 1, H = 8; N = 256 ... 16384 at D = 64, plain and causal, with an O(N^2) fit; D = 128
// (per-FLOP speed against D = 64); the AVX2 kernel path beside the fastest one; sgemm with this
// environment's OPENBLAS_CORETYPE and, in child processes, with it unset and set to the CPU's
// family (OpenBLAS's best kernels here).
#include "common.hpp"

using namespace attnlab;

namespace {

constexpr std::size_t kHeads = 8;

// Arguments: N, causal, D, kernel path (0 = the fastest this CPU runs, else 1 + kernels::Isa).
void BM_full(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const bool causal = state.range(1) != 0;
  const auto dim = static_cast<std::size_t>(state.range(2));
  const kernels::Isa path = state.range(3) == 0 ? kernels::supported_isas().back()
                                                : static_cast<kernels::Isa>(state.range(3) - 1);
  if (!kernels::isa_supported(path)) {
    state.SkipWithError("this CPU cannot run the kernel path");
    return;
  }
  kernels::use_isa(path);
  const auto full = make_attention("full");
  const Tensor q = bench::random_tensor(1, kHeads, n, dim, 1);
  const Tensor k = bench::random_tensor(1, kHeads, n, dim, 2);
  const Tensor v = bench::random_tensor(1, kHeads, n, dim, 3);
  Tensor out = Tensor::from_shape({1, kHeads, n, dim});  // reused: kernels timed, not page faults
  Mask mask;
  if (causal) mask.causal = Causal::top_left;
  // Untimed first call: it page-faults the output in (at large N the only iteration timed).
  full->forward(q, k, v, mask, {}, out);
  for (auto _ : state) {
    full->forward(q, k, v, mask, {}, out);
    benchmark::DoNotOptimize(out.data());
  }
  // Useful work only: QK^T and PV over the visible pairs (about half of them when causal).
  const double pairs = causal ? 0.5 * n * (n + 1) : double(n) * n;
  bench::set_flops(state, 4.0 * kHeads * pairs * dim);
  state.SetComplexityN(static_cast<std::int64_t>(n));
  state.counters["peak_rss_MiB"] = bench::peak_rss_mib();
  state.SetLabel(kernels::isa_name(path));
}

constexpr std::int64_t kFastest = 0, kAvx2 = 1 + static_cast<std::int64_t>(kernels::Isa::avx2);

}  // namespace

BENCHMARK(BM_full)
    ->ArgNames({"N", "causal", "D", "isa"})
    ->ArgsProduct({benchmark::CreateRange(256, 16384, 2), {0, 1}, {64}, {kFastest}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Complexity(benchmark::oNSquared);

// D = 128 beside D = 64 at the same lengths; the AVX2 path beside the fastest.
BENCHMARK(BM_full)
    ->Name("BM_full_d128")
    ->ArgNames({"N", "causal", "D", "isa"})
    ->Args({4096, 0, 128, kFastest})
    ->Args({16384, 0, 128, kFastest})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_full)
    ->Name("BM_full_avx2")
    ->ArgNames({"N", "causal", "D", "isa"})
    ->Args({4096, 0, 64, kAvx2})
    ->Args({4096, 1, 64, kAvx2})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// One long sequence, alone in its process (--benchmark_filter=BM_full_long) for peak memory.
BENCHMARK(BM_full)
    ->Name("BM_full_long")
    ->Args({32768, 0, 64, kFastest})
    ->Iterations(1)
    ->Unit(benchmark::kSecond)
    ->UseRealTime();

// sgemm at the attention's own shape (N x N x 64 scores) and square, the BLAS best case.
const int kSgemm = bench::register_sgemm({{4096, 4096, 64}, {2048, 2048, 2048}});

ATTNLAB_BENCHMARK_MAIN();
