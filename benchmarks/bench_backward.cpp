// Backward passes against their forwards and the sgemm yardsticks, measured in one binary so
// every ratio comes from one run: the plain forward, the forward that saves the row
// log-sum-exp (as a training step does) and the backward rotate within each iteration, each
// leading in turn, so the shared machine's drift hits all three alike. B = 1, H = 8, D = 64;
// outputs and gradients are written into tensors reused across iterations (kernels are timed,
// not page faults).
//   BM_full_backward     full, N = 1024, 4096, 16384, plain and causal (targets at N = 4096 and
//                        16384: backward at most 2.6x the forward with the log-sum-exp, at least
//                        0.6x the best sgemm on useful FLOPs; that forward at least 0.95x plain)
//   BM_variant_backward  sliding and bigbird at N = 4096 and 16384 (backward / forward <= 2.6),
//                        the other variants' default specs at N = 4096, for information
//   BM_sgemm*            the yardsticks (benchmarks/common.hpp)
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

struct Times {
  double forward_s, forward_lse_s, backward_s;  // per iteration
};

// Times the plain forward, the forward saving the log-sum-exp and the backward of `spec` at
// length n, rotating which one leads.
Times forward_backward(benchmark::State& state, const std::string& spec, std::size_t n,
                       bool causal) {
  const auto attention = make_attention(spec);
  const Tensor q = bench::random_tensor(1, kHeads, n, kDim, 1);
  const Tensor k = bench::random_tensor(1, kHeads, n, kDim, 2);
  const Tensor v = bench::random_tensor(1, kHeads, n, kDim, 3);
  const Tensor d_out = bench::random_tensor(1, kHeads, n, kDim, 4);
  Mask mask;
  if (causal) mask.causal = Causal::top_left;
  Tensor out, plain_out;
  Saved saved;
  AllGradients g;
  attention->forward(q, k, v, mask, {}, plain_out);
  attention->forward(q, k, v, mask, {}, out, saved);
  attention->backward(q, k, v, mask, {}, out, d_out, saved, g);  // warm: every buffer allocated
  double seconds[3] = {0, 0, 0};
  const auto run = [&](int which) {
    if (which == 0) return timed([&] { attention->forward(q, k, v, mask, {}, plain_out); });
    if (which == 1) return timed([&] { attention->forward(q, k, v, mask, {}, out, saved); });
    return timed([&] { attention->backward(q, k, v, mask, {}, out, d_out, saved, g); });
  };
  int lead = 0;
  for (auto _ : state) {
    for (int turn = 0; turn < 3; ++turn) {
      const int which = (lead + turn) % 3;
      seconds[which] += run(which);
    }
    lead = (lead + 1) % 3;
  }
  const double iterations = static_cast<double>(state.iterations());
  const Times t{seconds[0] / iterations, seconds[1] / iterations, seconds[2] / iterations};
  state.counters["forward_ms"] = 1e3 * t.forward_s;
  state.counters["forward_lse_ms"] = 1e3 * t.forward_lse_s;
  state.counters["backward_ms"] = 1e3 * t.backward_s;
  state.counters["ratio"] = t.backward_s / t.forward_lse_s;  // what a training step pays
  state.counters["lse_over_plain"] = t.forward_lse_s / t.forward_s;
  state.counters["peak_rss_MiB"] = bench::peak_rss_mib();
  return t;
}

void BM_full_backward(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const bool causal = state.range(1) != 0;
  const Times t = forward_backward(state, "full", n, causal);
  // Useful FLOPs over the visible pairs (about half of them when causal): the forward's QK^T
  // and PV, the backward's QK^T, dO V^T, dS K, dS^T Q and P^T dO.
  const double pairs = causal ? 0.5 * double(n) * double(n + 1) : double(n) * double(n);
  state.counters["forward_GFLOPs"] = 4.0 * kHeads * pairs * kDim / t.forward_s / 1e9;
  state.counters["forward_lse_GFLOPs"] = 4.0 * kHeads * pairs * kDim / t.forward_lse_s / 1e9;
  state.counters["backward_GFLOPs"] = 10.0 * kHeads * pairs * kDim / t.backward_s / 1e9;
}

void BM_variant_backward(benchmark::State& state, const std::string& spec) {
  forward_backward(state, spec, static_cast<std::size_t>(state.range(0)), false);
  state.SetLabel(spec);
}

// sgemm at the shape of full attention's scores and square, in-process and with OpenBLAS's best
// kernels for this CPU (child processes).
const int kSgemm = bench::register_sgemm({{4096, 4096, 64}, {2048, 2048, 2048}});

}  // namespace

BENCHMARK(BM_full_backward)
    ->ArgNames({"N", "causal"})
    ->ArgsProduct({{1024, 4096, 16384}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

BENCHMARK_CAPTURE(BM_variant_backward, sliding, std::string("sliding"))
    ->ArgName("N")
    ->Arg(4096)
    ->Arg(16384)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_variant_backward, bigbird, std::string("bigbird"))
    ->ArgName("N")
    ->Arg(4096)
    ->Arg(16384)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_variant_backward, linformer, std::string("linformer"))
    ->ArgName("N")
    ->Arg(4096)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_variant_backward, linear, std::string("linear"))
    ->ArgName("N")
    ->Arg(4096)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_variant_backward, linear_favor, std::string("linear:feature=favor"))
    ->ArgName("N")
    ->Arg(4096)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_variant_backward, linear_delta, std::string("linear:rule=delta"))
    ->ArgName("N")
    ->Arg(4096)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

ATTNLAB_BENCHMARK_MAIN();
