// Sliding-window attention against our own full attention and the OpenBLAS sgemm yardstick, in
// one binary so every ratio comes from one run. B = 1, H = 8, D = 64, left = right = 128;
// N = 1024 ... 65536 with an O(N) fit, full up to N = 8192 (it is O(N^2)).
#include "common.hpp"

using namespace attnlab;

namespace {

constexpr std::size_t kHeads = 8, kDim = 64;

// Runs one spec on random q, k, v of length N; FLOPS counts only the attended pairs.
void run(benchmark::State& state, const std::string& spec) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const auto attention = make_attention(spec);
  const Tensor q = bench::random_tensor(1, kHeads, n, kDim, 1);
  const Tensor k = bench::random_tensor(1, kHeads, n, kDim, 2);
  const Tensor v = bench::random_tensor(1, kHeads, n, kDim, 3);
  const Mask mask;
  Tensor out = Tensor::from_shape({1, kHeads, n, kDim});  // reused: kernels timed, not page faults
  // Untimed first call: it page-faults the output in (at large N the only iteration timed).
  attention->forward(q, k, v, mask, {}, out);
  for (auto _ : state) {
    attention->forward(q, k, v, mask, {}, out);
    benchmark::DoNotOptimize(out.data());
  }
  bench::set_flops(state, attention->flops(Dims{1, kHeads, n, n, kDim, kDim}, mask));
  state.SetComplexityN(static_cast<std::int64_t>(n));
  state.counters["peak_rss_MiB"] = bench::peak_rss_mib();
}

void BM_sliding(benchmark::State& state) {
  run(state, "sliding:left=128,right=128");
}
void BM_full(benchmark::State& state) {
  run(state, "full");
}
// The dilated path (residue classes gathered) with global tokens: same number of window keys.
void BM_sliding_dilated(benchmark::State& state) {
  run(state, "sliding:left=128,right=128,dilation=4,global=16");
}

}  // namespace

BENCHMARK(BM_sliding)
    ->ArgName("N")
    ->RangeMultiplier(2)
    ->Range(1024, 65536)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Complexity(benchmark::oN);

BENCHMARK(BM_full)
    ->ArgName("N")
    ->RangeMultiplier(2)
    ->Range(1024, 8192)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Complexity(benchmark::oNSquared);

BENCHMARK(BM_sliding_dilated)
    ->ArgName("N")
    ->Arg(4096)
    ->Arg(16384)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// One long sequence, alone in its process (--benchmark_filter=BM_sliding_long) for peak memory.
BENCHMARK(BM_sliding)
    ->Name("BM_sliding_long")
    ->Arg(65536)
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// sgemm at attention's score shape and square, in-process and with OpenBLAS's best kernels for
// the CPU (child processes): the yardsticks.
const int kSgemm = bench::register_sgemm({{4096, 4096, 64}, {2048, 2048, 2048}});

ATTNLAB_BENCHMARK_MAIN();
