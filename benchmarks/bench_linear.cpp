// Linear attention against our own exact `full` (plain and causal) and the OpenBLAS sgemm
// yardstick, in one binary so every ratio comes from one run. B = 1, H = 8, D = 64.
//   BM_full          N = 1024, 4096 (the baselines)
//   BM_linear        elu1 sum rule, plain and causal, N = 1024 ... 65536 (the O(N) fit)
//   BM_linear_spec   the delta rule and the favor / dpfp maps at N = 4096
//   BM_scaling       time(65536) / time(4096) of one spec: each iteration runs 16 forwards at
//                    N = 4096 and one at 65536, in alternating order, timing each group, so the
//                    shared machine's slow spells hit both sides of the ratio alike; cold = 1
//                    evicts the caches before every forward
//   BM_linear_fresh  elu1 non-causal at N = 4096 and 65536 with a freshly allocated output per
//                    call (the returning forward): what the page faults of a new output cost
//   BM_step          one recurrent decoding step (all 8 heads) at position ~1024 and one at
//                    ~65536, alternated step by step (two states), per-step times and ratio
// Every forward except BM_linear_fresh writes into one output tensor kept across iterations
// (Attention::forward(q, k, v, mask, {}, out)), so kernels are timed, not the kernel's page faults.
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common.hpp"
#include "variants/linear.hpp"

using namespace attnlab;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

constexpr std::size_t kHeads = 8, kDim = 64;

// One forward problem of length n with its own reused output.
struct Problem {
  Tensor q, k, v, out;
  Mask mask;
  Problem(std::size_t n, bool causal)
      : q(bench::random_tensor(1, kHeads, n, kDim, 1)),
        k(bench::random_tensor(1, kHeads, n, kDim, 2)),
        v(bench::random_tensor(1, kHeads, n, kDim, 3)) {
    if (causal) mask.causal = Causal::top_left;
  }
  void run(const Attention& attention) {
    attention.forward(q, k, v, mask, {}, out);
    benchmark::DoNotOptimize(out.data());
  }
};

void run_forward(benchmark::State& state, const std::string& spec, std::size_t n, bool causal,
                 bool fresh_output = false) {
  const auto attention = make_attention(spec);
  Problem p(n, causal);
  for (auto _ : state) {
    if (fresh_output)
      benchmark::DoNotOptimize(attention->forward(p.q, p.k, p.v, p.mask).data());
    else
      p.run(*attention);
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

template <class F>
double timed(F&& f) {
  const auto t0 = Clock::now();
  f();
  return seconds_since(t0);
}

// Runs `first` and `second` (each returns the seconds it timed) once per iteration, alternating
// which goes first, and returns their mean seconds per iteration: both sides of a ratio see the
// same stretch of a noisy machine.
template <class First, class Second>
std::pair<double, double> alternate(benchmark::State& state, First&& first, Second&& second) {
  double first_s = 0, second_s = 0;
  bool second_leads = false;
  for (auto _ : state) {
    for (int turn = 0; turn < 2; ++turn) {
      if ((turn == 0) == second_leads)
        second_s += second();
      else
        first_s += first();
    }
    second_leads = !second_leads;
  }
  const double iterations = static_cast<double>(state.iterations());
  return {first_s / iterations, second_s / iterations};
}

// cold = 1: before every timed forward, untimed, read a 64 MiB buffer (twice the L3), so that
// both lengths find their inputs in DRAM, as a model's fresh activations would be.
void BM_scaling(benchmark::State& state, const std::string& spec) {
  const bool causal = state.range(0) != 0, cold = state.range(1) != 0;
  constexpr std::size_t kShort = 4096, kLong = 65536, kRepeat = kLong / kShort;
  const auto attention = make_attention(spec);
  Problem short_problem(kShort, causal), long_problem(kLong, causal);
  const std::vector<std::uint64_t> evict(cold ? std::size_t(8) << 20 : 0, 1);
  const auto run = [&](Problem& p) {
    std::uint64_t sum = 0;
    for (const std::uint64_t x : evict) sum ^= x;
    benchmark::DoNotOptimize(sum);
    return timed([&] { p.run(*attention); });
  };
  const auto [short_s, long_s] = alternate(
      state,
      [&] {
        double s = 0;
        for (std::size_t r = 0; r < kRepeat; ++r) s += run(short_problem);
        return s;
      },
      [&] { return run(long_problem); });
  state.counters["ms_4096"] = 1e3 * short_s / kRepeat;
  state.counters["ms_65536"] = 1e3 * long_s;
  state.counters["ratio"] = long_s / (short_s / kRepeat);
}

// Tokens for the recurrent benchmarks, cycled: a step's cost must not depend on which token.
const std::vector<Tensor>& token_pool() {
  static const std::vector<Tensor> pool = [] {
    std::vector<Tensor> tokens;
    for (std::uint64_t t = 0; t < 256; ++t)
      tokens.push_back(bench::random_tensor(1, kHeads, 1, kDim, 100 + t));
    return tokens;
  }();
  return pool;
}

void step(TokenDecoder& decoder) {
  const Tensor& x = token_pool()[decoder.tokens() % token_pool().size()];
  benchmark::DoNotOptimize(decoder.step(x, x, x));
}

void BM_step(benchmark::State& state) {
  const bool delta = state.range(0) != 0;
  const auto attention = make_attention(delta ? "linear:rule=delta" : "linear");
  const auto near_decoder = attention->start_decoding({1, kHeads, kDim, kDim});
  const auto far_decoder = attention->start_decoding({1, kHeads, kDim, kDim});
  TokenDecoder &near = *near_decoder, &far = *far_decoder;
  while (near.tokens() < 1024) step(near);
  while (far.tokens() < 65536) step(far);
  const auto [near_s, far_s] = alternate(
      state, [&] { return timed([&] { step(near); }); }, [&] { return timed([&] { step(far); }); });
  state.counters["us_at_1024"] = 1e6 * near_s;
  state.counters["us_at_65536"] = 1e6 * far_s;
  state.counters["ratio"] = far_s / near_s;
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
    ->ArgsProduct({{4096}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_linear_spec, favor256, std::string("linear:feature=favor,m=256"))
    ->ArgNames({"N", "causal"})
    ->ArgsProduct({{4096}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_linear_spec, dpfp1, std::string("linear:feature=dpfp,nu=1"))
    ->ArgNames({"N", "causal"})
    ->ArgsProduct({{4096}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Two iterations: each is 2 x 16 forwards' worth of work (up to ~2 s for favor).
BENCHMARK_CAPTURE(BM_scaling, elu1, std::string("linear"))
    ->ArgNames({"causal", "cold"})
    ->ArgsProduct({{0, 1}, {0, 1}})
    ->Iterations(2)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_scaling, delta, std::string("linear:rule=delta"))
    ->ArgNames({"causal", "cold"})
    ->ArgsProduct({{0, 1}, {0, 1}})
    ->Iterations(2)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_scaling, favor256, std::string("linear:feature=favor,m=256"))
    ->ArgNames({"causal", "cold"})
    ->ArgsProduct({{0, 1}, {0, 1}})
    ->Iterations(2)
    ->Unit(benchmark::kMillisecond);

BENCHMARK(BM_linear_fresh)
    ->ArgNames({"N"})
    ->Args({4096})
    ->Args({65536})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

BENCHMARK(BM_step)
    ->ArgNames({"delta"})
    ->DenseRange(0, 1)
    ->Iterations(4000)  // steps 1024 .. 5024 and 65536 .. 69536
    ->Unit(benchmark::kMicrosecond);

BENCHMARK(attnlab::bench::BM_sgemm)
    ->ArgNames({"m", "n", "k"})
    ->Args({4096, 4096, 64})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

ATTNLAB_BENCHMARK_MAIN();
