// Forwards of one spec in a loop for profilers (benchmarks/profile.sh), until the process has
// used SECONDS of CPU time (so that setting up stays a small part of the profile however loaded
// the machine is); the inputs come from a cheap generator.
// Usage: forward_loop SPEC N D CAUSAL SECONDS   (B = 1, H = 8, Nq = Nk = N, Dk = Dv = D)
// Prints the kernel path, the number of forwards, their mean wall time and useful GFLOP/s.
#include <time.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "attnlab/attnlab.hpp"
#include "attnlab/kernels.hpp"

using namespace attnlab;

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: forward_loop SPEC N D CAUSAL SECONDS\n");
    return 2;
  }
  try {
    const std::string spec = argv[1];
    const auto n = static_cast<std::size_t>(std::atol(argv[2]));
    const auto d = static_cast<std::size_t>(std::atol(argv[3]));
    const bool causal = std::atoi(argv[4]) != 0;
    const double seconds = std::atof(argv[5]);
    constexpr std::size_t kHeads = 8;
    const auto attention = make_attention(spec);
    Tensor q = Tensor::from_shape({1, kHeads, n, d}), k = Tensor::from_shape({1, kHeads, n, d});
    Tensor v = Tensor::from_shape({1, kHeads, n, d}), out = Tensor::from_shape({1, kHeads, n, d});
    std::uint64_t state = 1;
    for (Tensor* t : {&q, &k, &v})
      for (float& x : *t) {  // uniform in [-1.7, 1.7): unit variance, no library call
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        x = static_cast<float>(static_cast<double>(state >> 11) * 0x1.0p-53 * 3.4641 - 1.7320);
      }
    Mask mask;
    if (causal) mask.causal = Causal::top_left;
    attention->forward(q, k, v, mask, {}, out);  // warm-up
    using Clock = std::chrono::steady_clock;
    const auto cpu_seconds = [] {
      timespec t{};
      clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
      return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
    };
    const auto start = Clock::now();
    const double cpu_start = cpu_seconds();
    int calls = 0;
    do {
      attention->forward(q, k, v, mask, {}, out);
      ++calls;
    } while (cpu_seconds() - cpu_start < seconds);
    const double took = std::chrono::duration<double>(Clock::now() - start).count();
    const double flops = attention->flops(Dims{1, kHeads, n, n, d, d}, mask);
    std::printf("%s N=%zu D=%zu causal=%d kernels=%s: %d forwards, %.2f ms each, %.1f GFLOP/s\n",
                attention->spec().c_str(), n, d, causal ? 1 : 0,
                kernels::isa_name(kernels::active_isa()), calls, took / calls * 1e3,
                flops * calls / took / 1e9);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "forward_loop: %s\n", e.what());
    return 2;
  }
  return 0;
}
