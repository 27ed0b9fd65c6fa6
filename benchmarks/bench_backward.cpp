// Backward passes against their forwards, measured in pairs: forward (saving the row
// log-sum-exp, as a training step does) and backward alternate in one loop, so the shared
// machine's drift hits both alike, and the ratio comes from one run. B = 1, H = 8, D = 64.
//   BM_full_backward   full, N = 1024 ... 4096, plain and causal: backward / forward
//                      (target at N = 4096: at most 3x).
#include <chrono>
#include <utility>

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

void BM_full_backward(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const bool causal = state.range(1) != 0;
  const auto full = make_attention("full");
  const Tensor q = bench::random_tensor(1, kHeads, n, kDim, 1);
  const Tensor k = bench::random_tensor(1, kHeads, n, kDim, 2);
  const Tensor v = bench::random_tensor(1, kHeads, n, kDim, 3);
  const Tensor d_out = bench::random_tensor(1, kHeads, n, kDim, 4);
  Mask mask;
  if (causal) mask.causal = Causal::top_left;
  Tensor out;
  RowLogSumExp lse;
  Gradients g;  // reused, like out: kernels are timed, not page faults
  full->forward(q, k, v, mask, out, lse);
  double forward_s = 0, backward_s = 0;
  bool backward_first = false;  // alternate which one leads
  for (auto _ : state) {
    for (int turn = 0; turn < 2; ++turn) {
      if ((turn == 0) == backward_first)
        backward_s += timed([&] { full->backward(q, k, v, mask, out, d_out, lse, g); });
      else
        forward_s += timed([&] { full->forward(q, k, v, mask, out, lse); });
    }
    backward_first = !backward_first;
  }
  const double iterations = static_cast<double>(state.iterations());
  // Useful FLOPs: the forward's QK^T and PV, the backward's QK^T, dO V^T, dS K, dS^T Q and
  // P^T dO, over the visible pairs (about half of them when causal).
  const double pairs = causal ? 0.5 * double(n) * double(n + 1) : double(n) * double(n);
  state.counters["forward_ms"] = 1e3 * forward_s / iterations;
  state.counters["backward_ms"] = 1e3 * backward_s / iterations;
  state.counters["ratio"] = backward_s / forward_s;
  state.counters["backward_GFLOPs"] = 10.0 * kHeads * pairs * kDim / (backward_s / iterations) / 1e9;
  state.counters["forward_GFLOPs"] = 4.0 * kHeads * pairs * kDim / (forward_s / iterations) / 1e9;
  state.counters["peak_rss_MiB"] = bench::peak_rss_mib();
}

}  // namespace

BENCHMARK(BM_full_backward)
    ->ArgNames({"N", "causal"})
    ->ArgsProduct({{1024, 2048, 4096}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

BENCHMARK_MAIN();
