// forward is safe to call from several threads at once on one object (attention.hpp): 4 threads
// share one backend of every variant, each running a different problem (shapes, masks) several
// times, and every output equals the serial one. CI also runs this test in a ThreadSanitizer
// build (.ci/run), which reports any data race even when the outputs happen to agree.
#include <thread>
#include <vector>

#include "helpers.hpp"

using namespace attnlab;
using attnlab::test::random_tensor;

namespace {

struct Problem {
  Tensor q, k, v;
  Mask mask;
};

// Different sizes per thread: linformer draws projection columns lazily as N grows, so the
// threads race to extend the same matrices.
std::vector<Problem> problems(std::size_t count) {
  std::vector<Problem> out;
  for (std::size_t t = 0; t < count; ++t) {
    const std::size_t n = 24 + 8 * t, seed = 10 * t;
    const auto len = static_cast<std::int64_t>(n);
    Problem p{random_tensor(2, 2, n, 8, seed),
              random_tensor(2, 2, n, 8, seed + 1),
              random_tensor(2, 2, n, 8, seed + 2),
              {}};
    if (t % 2 == 1) p.mask.key_lengths = {len, len - 5};
    if (t == 2) p.mask.causal = Causal::top_left;
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace

TEST_CASE("one backend of every variant serves 4 threads at once", "[threads]") {
  std::vector<std::string> specs;
  for (const auto& name : attention_names()) specs.push_back(name);
  for (const char* s :
       {"linformer:share=kv,k=16", "linformer:share=layer,k=16", "linear:feature=favor,m=32",
        "linear:feature=dpfp", "linear:rule=delta,beta=0.5"})
    specs.push_back(s);
  const std::vector<Problem> work = problems(4);
  for (const std::string& spec : specs) {
    INFO(spec);
    // The serial outputs, each from a fresh backend (so no state is shared with the threads).
    std::vector<Tensor> serial;
    for (const Problem& p : work) {
      try {
        serial.push_back(make_attention(spec)->forward(p.q, p.k, p.v, p.mask));
      } catch (const Unsupported&) {
        serial.emplace_back();  // refused the same way in the threads
      }
    }
    const auto shared = make_attention(spec);
    std::vector<std::vector<Tensor>> got(work.size());
    std::vector<std::thread> threads;
    for (std::size_t t = 0; t < work.size(); ++t)
      threads.emplace_back([&, t] {
        for (int rep = 0; rep < 3; ++rep) {
          try {
            got[t].push_back(shared->forward(work[t].q, work[t].k, work[t].v, work[t].mask));
          } catch (const Unsupported&) {
            got[t].emplace_back();
          }
        }
      });
    for (auto& th : threads) th.join();
    for (std::size_t t = 0; t < work.size(); ++t)
      for (const Tensor& out : got[t]) {
        INFO("thread " << t);
        REQUIRE(out.shape() == serial[t].shape());
        // Each thread's OpenMP team may differ in size from the serial run's, which can change
        // the order of float additions: equal to a few ulps, not bitwise.
        if (out.size()) REQUIRE(xt::amax(xt::abs(out - serial[t]))() <= 1e-5f);
      }
  }
}
