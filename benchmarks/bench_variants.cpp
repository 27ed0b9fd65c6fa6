// Every registered variant in one binary: its default spec (from attention_names(), so a new
// variant appears here without edits) plus a few other settings, N = 256 ... 65536 (exact `full`
// up to 8192: 16384 would take ~10 s a call on 2 cores), with Complexity() fits, GFLOP/s (from the
// variant's declared flops()), error against the fp64 reference on 32 seeded query rows, peak
// RSS, and the OpenBLAS sgemm yardstick in the same run. B = 1, H = 8, D = 64, gaussian inputs,
// no mask. benchmarks/run_microbench.sh writes the JSON to results/microbench/.
#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "common.hpp"

using namespace attnlab;

namespace {

constexpr std::size_t kHeads = 8, kDim = 64, kErrorRows = 32;
constexpr std::int64_t kMaxN = 65536, kMaxFullN = 8192;

// Settings beside the defaults; those whose variant is not registered are left out.
const char* const kExtraSpecs[] = {
    "sliding:left=64,right=64",
    "sliding:left=256,right=256",
    "bigbird:block=32",
    "linformer:k=128,max_len=65536",
    "linformer:k=512,max_len=65536",
    "linear:feature=favor,m=64",
    "linear:feature=dpfp,nu=2",
    "linear:rule=delta",
};

// A default spec with max_len (Linformer) raised so that every length of the sweep is accepted.
std::string long_enough(std::string spec) {
  const auto at = spec.find("max_len=");
  if (at == std::string::npos) return spec;
  const auto end = spec.find(',', at);
  return spec.replace(at, end == std::string::npos ? std::string::npos : end - at,
                      "max_len=" + std::to_string(kMaxN));
}

// Output rows `rows` along the sequence axis, to compare with the sampled reference.
Tensor pick_rows(const Tensor& out, const std::vector<std::size_t>& rows) {
  const auto& s = out.shape();
  Tensor picked = Tensor::from_shape({s[0], s[1], rows.size(), s[3]});
  for (std::size_t h = 0; h < s[1]; ++h)
    for (std::size_t r = 0; r < rows.size(); ++r)
      for (std::size_t d = 0; d < s[3]; ++d) picked(0, h, r, d) = out(0, h, rows[r], d);
  return picked;
}

void BM_attention(benchmark::State& state, const std::string& spec) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const Tensor q = bench::random_tensor(1, kHeads, n, kDim, 1);
  const Tensor k = bench::random_tensor(1, kHeads, n, kDim, 2);
  const Tensor v = bench::random_tensor(1, kHeads, n, kDim, 3);
  try {
    const auto attention = make_attention(spec);
    // Error once, outside the timed loop (this call is also the warm-up).
    std::vector<std::size_t> rows;
    std::mt19937_64 rng(7);
    for (std::size_t r = 0; r < std::min(kErrorRows, n); ++r) rows.push_back(rng() % n);
    const ErrorMetrics err = compare(pick_rows(attention->forward(q, k, v), rows),
                                     reference_attention(q, k, v, Mask{}, rows));
    for (auto _ : state) benchmark::DoNotOptimize(attention->forward(q, k, v));
    const double flops = attention->flops(check_qkv(q, k, v), Mask{});
    if (std::isfinite(flops)) bench::set_flops(state, flops);
    state.counters["rel_fro"] = err.rel_fro;
    state.counters["mean_cos"] = err.mean_cos;
    state.counters["p99_row"] = err.p99_row;
    state.counters["peak_rss_MiB"] = bench::peak_rss_mib();
    state.SetComplexityN(static_cast<std::int64_t>(n));
  } catch (const Error& e) {
    state.SkipWithError(e.what());
  }
}

void register_all() {
  std::vector<std::string> specs;
  for (const auto& name : attention_names())
    specs.push_back(long_enough(make_attention(name)->spec()));
  for (const char* extra : kExtraSpecs) {
    try {
      specs.push_back(make_attention(extra)->spec());
    } catch (const Error&) {  // variant not registered in this build
    }
  }
  for (const auto& spec : specs) {
    const bool exact = spec == "full";
    auto* b =
        benchmark::RegisterBenchmark(("BM_attention<" + spec + ">").c_str(), BM_attention, spec);
    b->ArgName("N")->Unit(benchmark::kMillisecond)->UseRealTime()->Complexity();
    if (exact) {
      b->RangeMultiplier(2)->Range(256, kMaxFullN);
    } else {
      b->RangeMultiplier(4)->Range(256, kMaxN);
    }
  }
  // The yardstick: sgemm at the attention's own score shape and square, the BLAS best case.
  benchmark::RegisterBenchmark("BM_sgemm", bench::BM_sgemm)
      ->ArgNames({"m", "n", "k"})
      ->Args({4096, 4096, 64})
      ->Args({2048, 2048, 2048})
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
}

}  // namespace

int main(int argc, char** argv) {
  blas::use_fitting_core(argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  register_all();
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  benchmark::AddCustomContext("openblas_config", openblas_get_config());
  benchmark::AddCustomContext("openblas_corename", openblas_get_corename());
  benchmark::AddCustomContext("openblas_coretype_env", coretype ? coretype : "unset");
  benchmark::AddCustomContext("blas", blas::describe(blas::info()));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
