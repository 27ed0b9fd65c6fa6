// Peers: NumPy and PyTorch exact attention through /usr/bin/python3 harness/peers.py. Each peer
// either runs and matches the fp64 reference, or is skipped with a message (never an error).
#include <catch2/catch.hpp>

#include "attnlab/attnlab.hpp"
#include "harness/peers.hpp"
#include "helpers.hpp"

using namespace attnlab;
using namespace attnlab::harness;

TEST_CASE("peers compute exact attention or say why they were skipped", "[peers]") {
  const Tensor q = test::random_tensor(1, 2, 48, 16, 11), k = test::random_tensor(1, 2, 48, 16, 12),
               v = test::random_tensor(1, 2, 48, 16, 13);
  for (const std::string& which : peer_names())
    for (const bool causal : {false, true}) {
      INFO(which << (causal ? " causal" : ""));
      const PeerResult r = run_peer(which, q, k, v, causal, 3);
      if (r.status == "skipped") {
        WARN(which << " skipped: " << r.message);
        CHECK_FALSE(r.message.empty());
        continue;
      }
      INFO(r.message);
      REQUIRE(r.status == "ok");
      CHECK(r.times_s.size() == 3);
      CHECK(r.time_min_s <= r.time_median_s);
      CHECK(r.time_median_s <= r.time_max_s);
      CHECK(r.time_iqr_s >= 0);
      CHECK(r.peak_mem_bytes >= 0);
      CHECK_FALSE(r.backend.empty());
      Mask mask;
      if (causal) mask.causal = Causal::top_left;
      // float32 matmuls and exp in another library: rounding differs from our fp64 reference.
      test::require_close(r.output, reference_attention(q, k, v, mask), 1e-4, 1e-5);
    }
}

TEST_CASE("peers: unknown names throw, impossible setups are skipped", "[peers]") {
  const Tensor t = test::random_tensor(1, 1, 8, 4, 1);
  CHECK_THROWS_WITH(run_peer("jax", t, t, t, false, 1), Catch::Contains("'jax'"));
  CHECK_THROWS_WITH(run_peer("numpy", t, t, t, false, 0), Catch::Contains("reps=0"));

  PeerOptions no_python;
  no_python.python = "/nonexistent/python3";
  const PeerResult a = run_peer("numpy", t, t, t, false, 1, no_python);
  CHECK(a.status == "skipped");
  CHECK_THAT(a.message, Catch::Contains("/nonexistent/python3"));

  PeerOptions tiny;
  tiny.max_score_bytes = 100;  // 8 x 8 scores x 4 bytes = 256 > 100
  const PeerResult b = run_peer("torch", t, t, t, false, 1, tiny);
  CHECK(b.status == "skipped");
  CHECK_THAT(b.message, Catch::Contains("score matrix"));

  PeerOptions no_script;
  no_script.script = "/nonexistent/peers.py";
  CHECK(run_peer("numpy", t, t, t, false, 1, no_script).status == "skipped");
}
