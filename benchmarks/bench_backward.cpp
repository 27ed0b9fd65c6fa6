// Backward passes against their forwards, measured in pairs: forward (saving the row
// log-sum-exp, as a training step does) and backward alternate in one loop, so the shared
// machine's drift hits both alike, and each ratio comes from one run. B = 1, H = 8, D = 64;
// outputs and gradients are written into tensors reused across iterations (kernels are timed,
// not page faults).
//   BM_full_backward     full, N = 1024 ... 4096, plain and causal (target at N = 4096: the
//                        backward at most 3x the forward)
//   BM_variant_backward  every variant's default spec at N = 4096, for information
#include <chrono>
#include <string>

#include "common.hpp"

using namespace attnlab;

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kHeads = 8, kDim = 64;

template <class F>
double timed(F&& f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Times forward and backward of `spec` at length n alternately; returns {forward s, backward s}
// per iteration.
std::pair<double, double> forward_backward(benchmark::State& state, const std::string& spec,
                                           std::size_t n, bool causal) {
  const auto attention = make_attention(spec);
  const Tensor q = bench::random_tensor(1, kHeads, n, kDim, 1);
  const Tensor k = bench::random_tensor(1, kHeads, n, kDim, 2);
  const Tensor v = bench::random_tensor(1, kHeads, n, kDim, 3);
  const Tensor d_out = bench::random_tensor(1, kHeads, n, kDim, 4);
  Mask mask;
  if (causal) mask.causal = Causal::top_left;
  Tensor out;
  RowLogSumExp lse;
  Gradients g;
  attention->forward(q, k, v, mask, out, lse);
  attention->backward(q, k, v, mask, out, d_out, lse, g);  // warm: every buffer allocated
  double forward_s = 0, backward_s = 0;
  bool backward_first = false;  // alternate which one leads
  for (auto _ : state) {
    for (int turn = 0; turn < 2; ++turn) {
      if ((turn == 0) == backward_first)
        backward_s += timed([&] { attention->backward(q, k, v, mask, out, d_out, lse, g); });
      else
        forward_s += timed([&] { attention->forward(q, k, v, mask, out, lse); });
    }
    backward_first = !backward_first;
  }
  const double iterations = static_cast<double>(state.iterations());
  forward_s /= iterations;
  backward_s /= iterations;
  state.counters["forward_ms"] = 1e3 * forward_s;
  state.counters["backward_ms"] = 1e3 * backward_s;
  state.counters["ratio"] = backward_s / forward_s;
  state.counters["peak_rss_MiB"] = bench::peak_rss_mib();
  return {forward_s, backward_s};
}

void BM_full_backward(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const bool causal = state.range(1) != 0;
  const auto [forward_s, backward_s] = forward_backward(state, "full", n, causal);
  // Useful FLOPs over the visible pairs (about half of them when causal): the forward's QK^T
  // and PV, the backward's QK^T, dO V^T, dS K, dS^T Q and P^T dO.
  const double pairs = causal ? 0.5 * double(n) * double(n + 1) : double(n) * double(n);
  state.counters["forward_GFLOPs"] = 4.0 * kHeads * pairs * kDim / forward_s / 1e9;
  state.counters["backward_GFLOPs"] = 10.0 * kHeads * pairs * kDim / backward_s / 1e9;
}

void BM_variant_backward(benchmark::State& state, const std::string& spec) {
  forward_backward(state, spec, 4096, false);
  state.SetLabel(spec);
}

}  // namespace

BENCHMARK(BM_full_backward)
    ->ArgNames({"N", "causal"})
    ->ArgsProduct({{1024, 2048, 4096}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

BENCHMARK_CAPTURE(BM_variant_backward, sliding, std::string("sliding"))
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_variant_backward, bigbird, std::string("bigbird"))
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_variant_backward, linformer, std::string("linformer"))
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_variant_backward, linear, std::string("linear"))
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_variant_backward, linear_favor,
                  std::string("linear:feature=favor"))
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_variant_backward, linear_delta, std::string("linear:rule=delta"))
    ->Unit(benchmark::kMillisecond)->UseRealTime();

ATTNLAB_BENCHMARK_MAIN();
