// The scan engine's clients (variants/linear_scan.hpp) forward and backward, causal, B = 1,
// H = 8, D = 64, beside the OpenBLAS sgemm yardstick in the same run:
//   BM_forward   delta, gated-delta, retnet, gla, linear (the sum rule, elu1) and linear's delta
//                rule at N = 4096, 16384, 65536, GFLOP/s from the variant's flops() (useful
//                FLOPs of the recurrence: 4·Dk·Dv per token for a delta-rule write, 2·Dk·Dv
//                for a sum-rule write and for each read), Complexity() fit
//   BM_backward  the same variants at N = 4096 and 16384: backward through the interface's door
//                (AllGradients, the forward's Saved); time divided by the forward's of that N
//                gives the backward/forward ratio (render_linear_family.py)
// g = logsigmoid of a N(2, 1) draw (decays ~0.88 per token, as a trained gate), beta uniform in
// [0, 1], both given to the variants that take them. Every call writes into kept outputs.
// Issue 46's forms beside them: "gla+channels" and "kda+channels" take the same gate drawn per
// key channel (TokenInputs::channel_log_decay [1, H, N, Dk]) in place of the per-token one;
// "delta-product:steps=2" takes k, v, g and beta with two rows per token (time over N tokens).
#include <cmath>
#include <random>
#include <string>

#include "common.hpp"

using namespace attnlab;

namespace {

constexpr std::size_t kHeads = 8, kDim = 64;

// The variant of a benchmark name: the spec before "+channels".
std::string spec_of(const std::string& name) {
  return name.substr(0, name.find("+channels"));
}

struct Problem {
  Tensor q, k, v, d_out, out, channels;
  TokenTensor g, beta;
  TokenInputs in;
  Mask mask;
  Saved saved;
  AllGradients grads;
  // name: a spec, "+channels" for the per-channel gate; rows: key rows per token.
  Problem(const Attention& a, const std::string& name, std::size_t n, std::size_t rows = 1)
      : q(bench::random_tensor(1, kHeads, n, kDim, 1)),
        k(bench::random_tensor(1, kHeads, rows * n, kDim, 2)),
        v(bench::random_tensor(1, kHeads, rows * n, kDim, 3)),
        d_out(bench::random_tensor(1, kHeads, n, kDim, 4)) {
    mask.causal = Causal::top_left;
    std::mt19937_64 rng(5);
    std::normal_distribution<float> normal(2.0f, 1.0f);
    std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
    g = TokenTensor::from_shape({1, kHeads, rows * n});
    beta = TokenTensor::from_shape({1, kHeads, rows * n});
    for (float& x : g) x = -std::log1p(std::exp(-normal(rng)));  // logsigmoid
    for (float& x : beta) x = uniform(rng);
    const bool per_channel = name != spec_of(name);
    in = TokenInputs::of(a.support().log_decay && !per_channel ? &g : nullptr,
                         a.support().beta ? &beta : nullptr);
    if (per_channel) {
      channels = Tensor::from_shape({1, kHeads, n, kDim});
      for (float& x : channels) x = -std::log1p(std::exp(-normal(rng)));
      in.channel_log_decay = TensorRef(channels);
    }
  }
};

// Key rows per token: DeltaProduct's steps, else 1.
std::size_t rows_of(const Attention& a) {
  const std::string s = a.spec();
  return s.rfind("delta-product:steps=", 0) == 0 ? std::stoul(s.substr(20)) : 1;
}

void BM_forward(benchmark::State& state, const std::string& name) {
  const auto a = make_attention(spec_of(name));
  const auto n = static_cast<std::size_t>(state.range(0));
  Problem p(*a, name, n, rows_of(*a));
  // One call first: the steady state of a training loop (kept outputs and saved states), not
  // the first touch of their pages, which a single timed iteration at N = 65536 would include.
  a->forward(p.q, p.k, p.v, p.mask, p.in, p.out, p.saved);
  for (auto _ : state) {
    a->forward(p.q, p.k, p.v, p.mask, p.in, p.out, p.saved);
    benchmark::DoNotOptimize(p.out.data());
  }
  state.SetComplexityN(static_cast<std::int64_t>(n));
  bench::set_flops(state, a->flops({1, kHeads, n, rows_of(*a) * n, kDim, kDim}, p.mask));
  state.counters["peak_rss_MiB"] = bench::peak_rss_mib();
}

void BM_backward(benchmark::State& state, const std::string& name) {
  const auto a = make_attention(spec_of(name));
  const auto n = static_cast<std::size_t>(state.range(0));
  Problem p(*a, name, n, rows_of(*a));
  a->forward(p.q, p.k, p.v, p.mask, p.in, p.out, p.saved);
  for (auto _ : state) {
    a->backward(p.q, p.k, p.v, p.mask, p.in, p.out, p.d_out, p.saved, p.grads);
    benchmark::DoNotOptimize(p.grads.qkv.dq.data());
  }
  state.counters["peak_rss_MiB"] = bench::peak_rss_mib();
}

const int kRegistered = [] {
  for (const char* spec : {"delta", "gated-delta", "retnet", "gla", "linear", "linear:rule=delta",
                           "gla+channels", "kda+channels", "delta-product:steps=2"}) {
    benchmark::RegisterBenchmark((std::string("BM_forward/") + spec).c_str(), BM_forward,
                                 std::string(spec))
        ->ArgNames({"N"})
        ->Arg(4096)
        ->Arg(16384)
        ->Arg(65536)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime()
        ->Complexity(benchmark::oN);
    benchmark::RegisterBenchmark((std::string("BM_backward/") + spec).c_str(), BM_backward,
                                 std::string(spec))
        ->ArgNames({"N"})
        ->Arg(4096)
        ->Arg(16384)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
  return bench::register_sgemm({{4096, 4096, 64}});
}();

}  // namespace

BENCHMARK_MAIN();
