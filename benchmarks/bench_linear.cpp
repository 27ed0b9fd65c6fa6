// Linear attention against our own exact `full` (plain and causal) and the OpenBLAS sgemm
// yardstick, in one binary so every ratio comes from one run. B = 1, H = 8, D = 64.
//   BM_full        N = 1024, 4096 (the baselines)
//   BM_linear      elu1 sum rule, plain and causal, N = 1024 ... 65536 (O(N) fit), plus the delta
//                  rule and the favor / dpfp maps at N = 4096 and 65536
//   BM_linear_fresh  elu1 non-causal at N = 4096 and 65536 with a freshly allocated output
//                  per call (the returning forward): what the page faults of a new output cost
//   BM_step        one recurrent decoding step (all 8 heads) after `pos` tokens
// Every forward except BM_linear_fresh writes into one output tensor kept across iterations
// (Attention::forward(q, k, v, mask, out)), so kernels are timed, not the kernel's page faults.
#include <string>

#include "common.hpp"
#include "variants/linear.hpp"

using namespace attnlab;

namespace {

constexpr std::size_t kHeads = 8, kDim = 64;

void run_forward(benchmark::State& state, const std::string& spec, std::size_t n, bool causal,
                 bool fresh_output = false) {
  const auto attention = make_attention(spec);
  const Tensor q = bench::random_tensor(1, kHeads, n, kDim, 1);
  const Tensor k = bench::random_tensor(1, kHeads, n, kDim, 2);
  const Tensor v = bench::random_tensor(1, kHeads, n, kDim, 3);
  Mask mask;
  if (causal) mask.causal = Causal::top_left;
  Tensor out;
  for (auto _ : state) {
    if (fresh_output)
      out = attention->forward(q, k, v, mask);
    else
      attention->forward(q, k, v, mask, out);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetComplexityN(static_cast<std::int64_t>(n));
  state.counters["peak_rss_MiB"] = bench::peak_rss_mib();
}

void BM_full(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const bool causal = state.range(1) != 0;
  run_forward(state, "full", n, causal);
  const double pairs = causal ? 0.5 * n * (n + 1) : double(n) * n;
  bench::set_flops(state, 4.0 * kHeads * pairs * kDim);
}

// elu1, sum rule: FLOPs of the state products only (2 N Dphi Dv each way, Dphi = Dv = D).
void BM_linear(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const bool causal = state.range(1) != 0;
  run_forward(state, "linear", n, causal);
  bench::set_flops(state, 4.0 * kHeads * n * kDim * kDim);
}

void BM_linear_spec(benchmark::State& state, const std::string& spec) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const bool causal = state.range(1) != 0;
  run_forward(state, spec, n, causal);
}

void BM_linear_fresh(benchmark::State& state) {
  run_forward(state, "linear", static_cast<std::size_t>(state.range(0)), false, true);
}

void BM_step(benchmark::State& state) {
  const auto pos = static_cast<std::size_t>(state.range(0));
  const bool delta = state.range(1) != 0;
  const auto attention = make_attention(delta ? "linear:rule=delta" : "linear");
  LinearState decoder =
      dynamic_cast<const LinearAttention&>(*attention).start(1, kHeads, kDim, kDim);
  // A pool of tokens, cycled: the step's cost must not depend on which token it is.
  constexpr std::size_t kPool = 256;
  std::vector<Tensor> tokens;
  for (std::size_t t = 0; t < kPool; ++t)
    tokens.push_back(bench::random_tensor(1, kHeads, 1, kDim, 100 + t));
  while (decoder.position() < pos) {
    const Tensor& x = tokens[decoder.position() % kPool];
    benchmark::DoNotOptimize(decoder.step(x, x, x));
  }
  for (auto _ : state) {
    const Tensor& x = tokens[decoder.position() % kPool];
    benchmark::DoNotOptimize(decoder.step(x, x, x));
  }
  state.counters["position"] = static_cast<double>(pos);
}

}  // namespace

BENCHMARK(BM_full)
    ->ArgNames({"N", "causal"})
    ->ArgsProduct({{1024, 4096}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

BENCHMARK(BM_linear)
    ->ArgNames({"N", "causal"})
    ->ArgsProduct({benchmark::CreateRange(1024, 65536, 4), {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Complexity(benchmark::oN);

BENCHMARK_CAPTURE(BM_linear_spec, delta, std::string("linear:rule=delta"))
    ->ArgNames({"N", "causal"})
    ->ArgsProduct({{4096, 65536}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_linear_spec, favor256, std::string("linear:feature=favor,m=256"))
    ->ArgNames({"N", "causal"})
    ->ArgsProduct({{4096, 65536}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_linear_spec, dpfp1, std::string("linear:feature=dpfp,nu=1"))
    ->ArgNames({"N", "causal"})
    ->ArgsProduct({{4096}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

BENCHMARK(BM_linear_fresh)
    ->ArgNames({"N"})
    ->Args({4096})
    ->Args({65536})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

BENCHMARK(BM_step)
    ->ArgNames({"pos", "delta"})
    ->ArgsProduct({{1024, 65536}, {0, 1}})
    ->Iterations(2000)  // one warm-up per repetition: steps pos .. pos + 2000
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

BENCHMARK(attnlab::bench::BM_sgemm)
    ->ArgNames({"m", "n", "k"})
    ->Args({4096, 4096, 64})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

BENCHMARK_MAIN();
