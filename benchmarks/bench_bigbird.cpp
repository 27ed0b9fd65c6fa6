// BigBird (defaults: block 64, window 3, global 2, random 3) against our own full attention and
// the OpenBLAS sgemm yardstick, in one binary so every ratio comes from one run.
// B = 1, H = 8, D = 64; N = 1024 ... 65536 for bigbird with an O(N) fit, N = 1024 ... 4096 for
// full.
#include "common.hpp"
#include "variants/bigbird.hpp"

using namespace attnlab;

namespace {

constexpr std::size_t kHeads = 8, kDim = 64;

void run(benchmark::State& state, const std::string& spec, double pairs) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const auto attention = make_attention(spec);
  const Tensor q = bench::random_tensor(1, kHeads, n, kDim, 1);
  const Tensor k = bench::random_tensor(1, kHeads, n, kDim, 2);
  const Tensor v = bench::random_tensor(1, kHeads, n, kDim, 3);
  Tensor out = Tensor::from_shape({1, kHeads, n, kDim});  // reused: kernels timed, not page faults
  // Untimed first call: it page-faults the output in (at large N the only iteration timed).
  attention->forward(q, k, v, Mask{}, {}, out);
  for (auto _ : state) {
    attention->forward(q, k, v, Mask{}, {}, out);
    benchmark::DoNotOptimize(out.data());
  }
  // Useful work only: QK^T and PV over the (query, key) pairs the pattern computes.
  bench::set_flops(state, 4.0 * pairs * kDim);
  state.counters["pairs_per_query"] = pairs / double(kHeads * n);
  state.SetComplexityN(static_cast<std::int64_t>(n));
  state.counters["peak_rss_MiB"] = bench::peak_rss_mib();
}

void BM_bigbird(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const BigBirdLayout layout = bigbird_layout(BigBirdConfig{}, kHeads, n, n, false);
  run(state, "bigbird", layout.pairs(n, n));
}

void BM_full(benchmark::State& state) {
  const auto n = static_cast<double>(state.range(0));
  run(state, "full", kHeads * n * n);
}

}  // namespace

BENCHMARK(BM_bigbird)
    ->ArgName("N")
    ->RangeMultiplier(2)
    ->Range(1024, 65536)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Complexity(benchmark::oN);

BENCHMARK(BM_full)
    ->ArgName("N")
    ->RangeMultiplier(2)
    ->Range(1024, 4096)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// N = 65536 alone in its process (--benchmark_filter=BM_bigbird_long) for its peak memory.
BENCHMARK(BM_bigbird)
    ->Name("BM_bigbird_long")
    ->Arg(65536)
    ->Iterations(1)
    ->Unit(benchmark::kSecond)
    ->UseRealTime();

// sgemm at the shape of full attention's scores and square, in-process and with OpenBLAS's best
// kernels for the CPU (child processes): the yardsticks for GFLOP/s ratios.
const int kSgemm = bench::register_sgemm({{4096, 4096, 64}, {2048, 2048, 2048}});

ATTNLAB_BENCHMARK_MAIN();
