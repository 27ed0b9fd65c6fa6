// Exact attention against the OpenBLAS sgemm yardstick, in one binary so ratios come from one
// run. B = 1, H = 8, D = 64; N = 256 ... 8192, plain and causal, with an O(N^2) fit.
#include "common.hpp"

using namespace attnlab;

namespace {

constexpr std::size_t kHeads = 8, kDim = 64;

void BM_full(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const bool causal = state.range(1) != 0;
  const auto full = make_attention("full");
  const Tensor q = bench::random_tensor(1, kHeads, n, kDim, 1);
  const Tensor k = bench::random_tensor(1, kHeads, n, kDim, 2);
  const Tensor v = bench::random_tensor(1, kHeads, n, kDim, 3);
  Mask mask;
  if (causal) mask.causal = Causal::top_left;
  for (auto _ : state) benchmark::DoNotOptimize(full->forward(q, k, v, mask));
  // Useful work only: QK^T and PV over the visible pairs (about half of them when causal).
  const double pairs = causal ? 0.5 * n * (n + 1) : double(n) * n;
  bench::set_flops(state, 4.0 * kHeads * pairs * kDim);
  state.SetComplexityN(static_cast<std::int64_t>(n));
  state.counters["peak_rss_MiB"] = bench::peak_rss_mib();
}

}  // namespace

BENCHMARK(BM_full)
    ->ArgNames({"N", "causal"})
    ->ArgsProduct({benchmark::CreateRange(256, 8192, 2), {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Complexity(benchmark::oNSquared);

// One long sequence, alone in its process (--benchmark_filter=BM_full_long) for peak memory.
BENCHMARK(BM_full)->Name("BM_full_long")->Args({32768, 0})->Iterations(1)->Unit(benchmark::kSecond)->UseRealTime();

// sgemm at the attention's own shape (N x N x 64 scores) and square, the BLAS best case.
BENCHMARK(attnlab::bench::BM_sgemm)
    ->ArgNames({"m", "n", "k"})
    ->Args({4096, 4096, 64})
    ->Args({2048, 2048, 2048})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

BENCHMARK_MAIN();
