// BigBird: the block layout against the rules of the spec, the kernel against a dense fp64
// reference built from that layout, the exact reductions against full attention, error that
// does not grow with the pattern, and the messages for bad parameters.
#include <cmath>
#include <set>

#include "helpers.hpp"
#include "patterns.hpp"
#include "variants/bigbird.hpp"

using namespace attnlab;
using attnlab::test::random_tensor;
using attnlab::test::require_close;
using attnlab::test::require_error;

namespace {

// fp32 kernel against fp64: the same bound as full's test (sums over at most ~1000 keys, exp2 by
// polynomial with ~1e-8 relative error; measured errors are a few 1e-6).
constexpr double kRtol = 1e-4, kAtol = 2e-5;

BigBirdConfig config(std::int64_t block, std::int64_t window, std::int64_t global,
                     std::int64_t random, std::int64_t seed) {
  BigBirdConfig c;
  c.block = block;
  c.window = window;
  c.global = global;
  c.random = random;
  c.seed = seed;
  return c;
}

std::string spec_of(const BigBirdConfig& c) {
  return BigBirdAttention(c).spec();
}

void check_against_reference(const BigBirdConfig& c, std::size_t batch, std::size_t heads,
                             std::size_t nq, std::size_t nk, std::size_t dk, std::size_t dv,
                             const Mask& mask, std::uint64_t seed) {
  const Tensor q = random_tensor(batch, heads, nq, dk, seed);
  const Tensor k = random_tensor(batch, heads, nk, dk, seed + 1);
  const Tensor v = random_tensor(batch, heads, nk, dv, seed + 2);
  INFO(spec_of(c) << " B=" << batch << " H=" << heads << " Nq=" << nq << " Nk=" << nk
                  << " causal=" << causal_name(mask.causal)
                  << " key_lengths=" << mask.has_key_lengths() << " bool=" << mask.has_allowed());
  const Dims d = check_qkv(q, k, v);
  const Tensor64 ref =
      reference_attention(q, k, v, mask.softmax_scale(dk), test::bigbird_pattern(c, mask, d));
  require_close(BigBirdAttention(c).forward(q, k, v, mask), ref, kRtol, kAtol);
}

xt::xtensor<bool, 2> random_bool_mask(std::size_t nq, std::size_t nk, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  xt::xtensor<bool, 2> m = xt::xtensor<bool, 2>::from_shape({nq, nk});
  for (auto&& x : m) x = (rng() % 4) != 0;
  return m;
}

// The rules of the spec, restated independently of bigbird_layout's code; `prefix` > 0
// (prefix-LM, causal only) opens the causal cut up to the prefix's last block.
void check_layout_rules(const BigBirdConfig& c, std::size_t heads, std::size_t n, bool causal,
                        std::size_t prefix = 0) {
  Mask mask;
  if (causal) mask.causal = Causal::top_left;
  if (prefix > 0) mask.prefix_lengths = {std::int64_t(prefix)};
  const BigBirdLayout l = bigbird_layout(c, Dims{1, heads, n, n, 1, 1}, mask, 0);
  const std::size_t nb = (n + c.block - 1) / c.block;
  INFO(spec_of(c) << " N=" << n << " causal=" << causal << " prefix=" << prefix);
  REQUIRE(l.query_blocks == nb);
  REQUIRE(l.key_blocks == nb);
  std::set<std::size_t> globals;
  for (std::size_t j = 0; j < nb; ++j)
    if (j < std::size_t(c.global + 1) / 2 || nb - 1 - j < std::size_t(c.global / 2))
      globals.insert(j);
  const std::int64_t half = (c.window - 1) / 2;
  for (std::size_t h = 0; h < heads; ++h)
    for (std::size_t i = 0; i < nb; ++i) {
      INFO("head " << h << " query block " << i);
      const auto blocks = l.blocks(h, i);
      // The highest key block allowed: the diagonal, or the prefix's last block past it.
      const std::size_t prefix_block = prefix > 0 ? (prefix - 1) / c.block : 0;
      const std::size_t last = causal ? std::max(i, prefix_block) : nb - 1;
      REQUIRE(l.last_key_block(i) == last);
      for (std::size_t a = 1; a < blocks.size(); ++a) REQUIRE(blocks[a - 1] < blocks[a]);
      for (const auto j : blocks) REQUIRE(j <= last);
      if (globals.count(i)) {  // a global query block attends everything allowed
        REQUIRE(blocks.size() == last + 1);
        for (const auto j : blocks) REQUIRE(l.kind(h, i, j) == BlockKind::global);
        continue;
      }
      std::size_t fixed = 0, randoms = 0;
      for (std::size_t j = 0; j <= last; ++j) {
        const bool in_window = std::abs(std::int64_t(j) - std::int64_t(i)) <= half;
        const BlockKind kind = l.kind(h, i, j);
        if (globals.count(j)) {
          REQUIRE(kind == BlockKind::global);
          ++fixed;
        } else if (in_window) {
          REQUIRE(kind == BlockKind::window);
          ++fixed;
        } else {
          REQUIRE((kind == BlockKind::none || kind == BlockKind::random));
          randoms += kind == BlockKind::random;
        }
      }
      REQUIRE(randoms == std::min<std::size_t>(c.random, last + 1 - fixed));
      REQUIRE(blocks.size() == fixed + randoms);
    }
}

// Inputs whose attention is local: q_i = k_i are sinusoids of the position with periods longer
// than the sequence, so q_i . k_j falls off with |i - j| (plus a little noise).
void local_inputs(std::size_t heads, std::size_t n, std::size_t dim, Tensor& q, Tensor& k,
                  Tensor& v) {
  q = random_tensor(1, heads, n, dim, 41, 0.1f);
  k = random_tensor(1, heads, n, dim, 42, 0.1f);
  v = random_tensor(1, heads, n, dim, 43);
  for (std::size_t h = 0; h < heads; ++h)
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t f = 0; f < dim / 2; ++f) {
        const double w = 3.14159265358979 * double(f + 1) / double(n), a = 2.2;
        q(0, h, i, 2 * f) += float(a * std::cos(w * double(i)));
        q(0, h, i, 2 * f + 1) += float(a * std::sin(w * double(i)));
        k(0, h, i, 2 * f) += float(a * std::cos(w * double(i)));
        k(0, h, i, 2 * f + 1) += float(a * std::sin(w * double(i)));
      }
}

}  // namespace

TEST_CASE("bigbird: the layout follows the rules of the spec", "[bigbird]") {
  for (bool causal : {false, true})
    for (std::size_t n : {1, 15, 16, 17, 100, 257, 640}) {
      check_layout_rules(config(16, 3, 2, 3, 0), 3, n, causal);
      check_layout_rules(config(16, 1, 0, 2, 5), 2, n, causal);
      check_layout_rules(config(7, 5, 3, 4, 9), 2, n, causal);
      check_layout_rules(config(16, 3, 1, 0, 1), 1, n, causal);
      check_layout_rules(config(64, 3, 2, 3, 0), 2, n, causal);
    }
  check_layout_rules(config(5, 3, 2, 100, 3), 2, 60, false);  // more randoms than blocks left
  // Prefix-LM: the causal cut moves out to the prefix's last block (odd N, prefixes inside a
  // block, on a block edge and of every key).
  for (std::size_t n : {37, 100})
    for (std::size_t prefix :
         {std::size_t{1}, std::size_t{9}, std::size_t{16}, std::size_t{17}, std::size_t{36}, n}) {
      check_layout_rules(config(8, 3, 2, 3, 0), 2, n, true, prefix);
      check_layout_rules(config(7, 1, 0, 2, 5), 2, n, true, prefix);
      check_layout_rules(config(8, 11, 2, 3, 0), 1, n, true, prefix);
    }
}

TEST_CASE("bigbird: a prefix of 0 is the causal layout, of every key the non-causal one",
          "[bigbird]") {
  for (const BigBirdConfig& c : {config(8, 3, 2, 3, 1), config(5, 1, 1, 4, 2)})
    for (std::size_t n : {37, 64}) {
      INFO(spec_of(c) << " N=" << n);
      const Dims d{1, 2, n, n, 1, 1};
      Mask prefix;
      prefix.causal = Causal::top_left;
      const auto rows = [](const BigBirdLayout& l) {
        std::vector<std::vector<std::uint32_t>> r;
        for (std::size_t h = 0; h < l.heads; ++h)
          for (std::size_t i = 0; i < l.query_blocks; ++i)
            r.emplace_back(l.blocks(h, i).begin(), l.blocks(h, i).end());
        return r;
      };
      prefix.prefix_lengths = {0};
      CHECK(rows(bigbird_layout(c, d, prefix, 0)) == rows(bigbird_layout(c, 2, n, n, true)));
      prefix.prefix_lengths = {std::int64_t(n)};
      CHECK(rows(bigbird_layout(c, d, prefix, 0)) == rows(bigbird_layout(c, 2, n, n, false)));
    }
}

TEST_CASE("bigbird: random blocks are reproducible per seed and differ across heads", "[bigbird]") {
  const std::size_t n = 64 * 64, heads = 4;
  const BigBirdLayout a = bigbird_layout(config(64, 3, 2, 3, 7), heads, n, n, false);
  const BigBirdLayout b = bigbird_layout(config(64, 3, 2, 3, 7), heads, n, n, false);
  const BigBirdLayout other = bigbird_layout(config(64, 3, 2, 3, 8), heads, n, n, false);
  const BigBirdLayout more = bigbird_layout(config(64, 3, 2, 4, 7), heads, n, n, false);
  std::size_t seed_differs = 0, head_differs = 0;
  for (std::size_t h = 0; h < heads; ++h)
    for (std::size_t i = 0; i < a.query_blocks; ++i) {
      const auto ra = a.blocks(h, i), rb = b.blocks(h, i), ro = other.blocks(h, i);
      REQUIRE(std::vector(ra.begin(), ra.end()) == std::vector(rb.begin(), rb.end()));
      seed_differs += std::vector(ra.begin(), ra.end()) != std::vector(ro.begin(), ro.end());
      if (h > 0) {
        const auto r0 = a.blocks(0, i);
        head_differs += std::vector(ra.begin(), ra.end()) != std::vector(r0.begin(), r0.end());
      }
      // One more random block keeps the earlier draws (so error tests over R are nested).
      for (const auto j : ra) REQUIRE(more.kind(h, i, j) == a.kind(h, i, j));
    }
  // 62 non-global query blocks choose 3 of ~59 blocks: a repeat is rare (chance ~3e-5 each).
  CHECK(seed_differs >= 4 * 60);
  CHECK(head_differs >= 3 * 60);

  // Same seed, bitwise-same output; another seed, another output.
  const Tensor q = random_tensor(1, 2, 640, 16, 1), k = random_tensor(1, 2, 640, 16, 2),
               v = random_tensor(1, 2, 640, 16, 3);
  const auto x = make_attention("bigbird:block=16,seed=3");
  CHECK((x->forward(q, k, v) == make_attention(x->spec())->forward(q, k, v)));
  CHECK((x->forward(q, k, v) != make_attention("bigbird:block=16,seed=4")->forward(q, k, v)));
}

TEST_CASE("bigbird: causal layouts look only at the past", "[bigbird]") {
  const BigBirdLayout l = bigbird_layout(config(8, 5, 2, 3, 1), 2, 200, 200, true);
  for (std::size_t h = 0; h < 2; ++h)
    for (std::size_t i = 0; i < l.query_blocks; ++i) {
      const auto blocks = l.blocks(h, i);
      REQUIRE(!blocks.empty());
      CHECK(blocks.back() == i);  // the diagonal block, cut to j <= i inside by the mask
    }
}

TEST_CASE("bigbird: exact reductions equal full attention", "[bigbird]") {
  // Same kernel engine over the same key chunks in a different row tiling: rows are independent
  // in the GEMM tile, so only the order of folds can differ; fp32 vs fp32 agrees to ~1e-7.
  constexpr double rtol = 1e-5, atol = 1e-6;
  const auto full = make_attention("full");
  auto same_as_full = [&](const std::string& spec, std::size_t n, const Mask& mask,
                          std::uint64_t seed) {
    const Tensor q = random_tensor(2, 2, n, 16, seed), k = random_tensor(2, 2, n, 16, seed + 1),
                 v = random_tensor(2, 2, n, 16, seed + 2);
    INFO(spec << " N=" << n << " causal=" << causal_name(mask.causal));
    require_close(make_attention(spec)->forward(q, k, v, mask),
                  xt::cast<double>(full->forward(q, k, v, mask)), rtol, atol);
  };
  Mask causal;
  causal.causal = Causal::top_left;
  Mask padded;
  for (std::size_t n : {1, 13, 64, 100, 257}) {
    const std::size_t blocks = (n + 15) / 16;
    padded.key_lengths = {std::int64_t(n), std::int64_t(n / 2)};
    const std::string all_global = "bigbird:block=16,global=" + std::to_string(blocks);
    const std::string wide =
        "bigbird:block=16,global=0,random=0,window=" + std::to_string(2 * blocks - 1);
    for (const Mask& m : {Mask{}, causal, padded}) {
      same_as_full(all_global, n, m, n);
      same_as_full(wide, n, m, n + 5);
    }
    // Defaults (block 64): up to 5 blocks, every block is global, in the window or random.
    same_as_full("bigbird", n, {}, n + 9);
  }
}

TEST_CASE("bigbird equals the dense fp64 reference over many lengths", "[bigbird]") {
  Mask causal;
  causal.causal = Causal::top_left;
  Mask bottom;
  bottom.causal = Causal::bottom_right;
  for (std::size_t n : {1, 2, 7, 13, 16, 17, 47, 64, 97, 128, 129, 257, 389, 1009}) {
    check_against_reference(config(16, 3, 2, 3, 0), 1, 2, n, n, 16, 16, {}, n);
    check_against_reference(config(16, 3, 2, 3, 1), 1, 2, n, n, 16, 16, causal, n + 3);
    check_against_reference(config(7, 5, 1, 2, 2), 1, 2, n, n, 8, 8, bottom, n + 7);
  }
  check_against_reference(config(64, 3, 2, 3, 0), 1, 2, 1000, 1000, 32, 32, {}, 11);
  check_against_reference(config(50, 1, 3, 1, 0), 1, 2, 1000, 1000, 32, 32, causal, 12);
}

TEST_CASE("bigbird under causal prefix-LM sees its prefix, forward and backward", "[bigbird]") {
  // The reported case: block 8, window 11 covers every block of N = 37, so BigBird is full
  // attention, and a prefix of 9 tokens must reach key 8 (block 1) from query block 0.
  // Backward: fp32 gradients against the fp64 ones, sums of at most ~40 terms of O(1).
  constexpr double kGradRtol = 1e-4, kGradAtol = 2e-5;
  const auto full = make_attention("full");
  const BigBirdConfig configs[] = {config(8, 11, 2, 3, 0), config(8, 3, 2, 3, 1),
                                   config(4, 1, 1, 2, 5), config(5, 3, 0, 1, 2)};
  for (const BigBirdConfig& c : configs) {
    const BigBirdAttention a(c);
    for (std::size_t n : {37, 23, 40})
      for (std::int64_t prefix : {0, 1, 9, 16, 20}) {
        Mask mask;
        mask.causal = Causal::top_left;
        // Two items with their own prefixes: the second's is the whole sequence or 3 tokens.
        mask.prefix_lengths = {prefix, prefix == 0 ? std::int64_t(n) : 3};
        INFO(a.spec() << " N=" << n << " prefix_lengths=" << prefix << ","
                      << mask.prefix_lengths[1]);
        const Tensor q = random_tensor(2, 2, n, 8, n), k = random_tensor(2, 2, n, 8, n + 1),
                     v = random_tensor(2, 2, n, 6, n + 2), d_out = random_tensor(2, 2, n, 6, n + 3);
        const Dims d = check_qkv(q, k, v);
        const Pattern pattern = test::bigbird_pattern(c, mask, d);
        Tensor out;
        Saved saved;
        a.forward(q, k, v, mask, {}, out, saved);
        require_close(out, reference_attention(q, k, v, mask.softmax_scale(8), pattern), kRtol,
                      kAtol);
        const AllGradients g = a.backward(q, k, v, mask, {}, out, d_out, saved);
        const Gradients64 want = reference_attention_backward(
            xt::cast<double>(q), xt::cast<double>(k), xt::cast<double>(v), mask.softmax_scale(8),
            pattern, xt::cast<double>(d_out));
        require_close(g.qkv.dq, want.dq, kGradRtol, kGradAtol);
        require_close(g.qkv.dk, want.dk, kGradRtol, kGradAtol);
        require_close(g.qkv.dv, want.dv, kGradRtol, kGradAtol);
        if (c.window < 2 * std::int64_t((n + 7) / 8) - 1) continue;
        // The exact reduction, independent of the layout's code: full under the same mask.
        require_close(out, xt::cast<double>(full->forward(q, k, v, mask)), 1e-5, 1e-6);
        CHECK(a.flops(d, mask) == Approx(full->flops(d, mask)));  // the same visible pairs
      }
  }
  // Packed documents, a prefix each (the second opens blocks past its first query block).
  const BigBirdConfig c = config(4, 3, 1, 2, 3);
  Mask mask;
  mask.causal = Causal::top_left;
  mask.documents = {0, 13, 13, 37};
  mask.prefix_lengths = {5, 0, 11};
  const Tensor q = random_tensor(1, 2, 37, 8, 7), k = random_tensor(1, 2, 37, 8, 8),
               v = random_tensor(1, 2, 37, 8, 9);
  require_close(BigBirdAttention(c).forward(q, k, v, mask),
                reference_attention(q, k, v, mask.softmax_scale(8),
                                    test::bigbird_pattern(c, mask, check_qkv(q, k, v))),
                kRtol, kAtol);
}

TEST_CASE("bigbird honours padding, boolean masks, cross-attention and Dv != Dk", "[bigbird]") {
  const std::pair<std::size_t, std::size_t> lengths[] = {{1, 7},    {7, 1},     {37, 211},
                                                         {211, 37}, {100, 100}, {129, 300}};
  for (auto [nq, nk] : lengths) {
    const BigBirdConfig c = config(16, 3, 2, 2, 4);
    for (Causal cm : {Causal::none, Causal::top_left, Causal::bottom_right}) {
      if (cm != Causal::none && nq != nk) continue;  // refused: see the Unsupported test
      Mask mask;
      mask.causal = cm;
      check_against_reference(c, 2, 3, nq, nk, 24, 40, mask, nq * 31 + nk);
      mask.key_lengths = {std::int64_t(nk), std::int64_t(nk / 2)};
      check_against_reference(c, 2, 3, nq, nk, 24, 8, mask, nq * 17 + nk);
      Mask with_bool = mask;
      with_bool.allow(random_bool_mask(nq, nk, nq + nk));
      check_against_reference(c, 2, 3, nq, nk, 8, 24, with_bool, nq + 3 * nk);
    }
  }
  // A per-head boolean mask and an explicit scale.
  std::mt19937_64 rng(5);
  Mask mask;
  mask.allowed = xt::xtensor<bool, 4>::from_shape({2, 3, 90, 90});
  for (auto&& x : mask.allowed) x = rng() % 3 != 0;
  mask.scale = 0.37;
  check_against_reference(config(10, 3, 2, 2, 0), 2, 3, 90, 90, 16, 16, mask, 11);
}

TEST_CASE("bigbird: error does not grow as the pattern grows", "[bigbird]") {
  // Local inputs, N = 512 in 32 blocks of 16; error against exact fp64 attention.
  Tensor q, k, v;
  local_inputs(2, 512, 16, q, k, v);
  const Tensor64 exact = reference_attention(q, k, v, Mask{});
  auto error = [&](const std::string& spec) {
    return compare(make_attention(spec)->forward(q, k, v), exact).rel_fro;
  };
  // Window 1, 3, ..., 63 (no globals or randoms: nested patterns). Measured rel_fro: 0.96,
  // 0.089, 0.0034, 7.5e-4, ... 2.5e-5 at W = 61, 6.8e-7 at W = 63 (= 2 * 32 - 1, exact).
  double previous = 1e9;
  for (int w = 1; w <= 63; w += 2) {
    const double e = error("bigbird:block=16,global=0,random=0,window=" + std::to_string(w));
    INFO("window " << w << ": rel_fro " << e);
    CHECK(e <= previous + 1e-6);
    previous = e;
  }
  CHECK(previous < 1e-5);
  // Random blocks 0..30 on top of window 3 (draws are nested: see the layout test). Measured:
  // 0.089, 0.088, 0.087, 0.084, ... 0.016 at R = 28, 1.6e-5 at R = 29 (the two edge blocks
  // still miss one block), 6.8e-7 at R = 30 (everything).
  previous = 1e9;
  for (int r = 0; r <= 30; ++r) {
    const double e = error("bigbird:block=16,global=0,window=3,random=" + std::to_string(r));
    INFO("random " << r << ": rel_fro " << e);
    CHECK(e <= previous + 1e-6);
    previous = e;
  }
  CHECK(previous < 1e-5);
  // Global blocks 0..32 with window 1 (nested: the front and back sets only grow). Measured:
  // 0.96, 0.95, 0.93, ... 0.11 at G = 30, 6.8e-7 at G = 31 (every query block global).
  previous = 1e9;
  for (int g = 0; g <= 32; ++g) {
    const double e = error("bigbird:block=16,window=1,random=0,global=" + std::to_string(g));
    INFO("global " << g << ": rel_fro " << e);
    CHECK(e <= previous + 1e-6);
    previous = e;
  }
  CHECK(previous < 1e-5);
}

TEST_CASE("bigbird declares its FLOPs from the layout", "[bigbird]") {
  const BigBirdAttention a(config(16, 3, 2, 3, 0));
  const Dims d{2, 3, 200, 200, 8, 24};
  const BigBirdLayout layout = bigbird_layout(a.config(), 3, 200, 200, false);
  // Without masks: every layout pair, for both batch items, 2 (Dk + Dv) FLOPs each.
  CHECK(a.flops(d, {}) == Approx(2 * layout.pairs(200, 200) * 2 * 32));
  // Exact reduction: every block global gives full attention's count, 4 B H N^2 D (Dk=Dv=D).
  const Dims square{1, 2, 100, 100, 16, 16};
  CHECK(BigBirdAttention(config(16, 3, 7, 3, 0)).flops(square, {}) ==
        Approx(make_attention("full")->flops(square, {})));
  Mask causal;
  causal.causal = Causal::top_left;
  CHECK(BigBirdAttention(config(16, 3, 7, 3, 0)).flops(square, causal) ==
        Approx(make_attention("full")->flops(square, causal)));
  Mask padded;
  padded.key_lengths = {50};
  CHECK(BigBirdAttention(config(16, 3, 7, 3, 0)).flops(square, padded) ==
        Approx(make_attention("full")->flops(square, padded)));
}

TEST_CASE("bigbird: bad parameters name the parameter", "[bigbird]") {
  require_error<Error>([] { make_attention("bigbird:block=0"); }, {"block=0", ">= 1"});
  require_error<Error>([] { make_attention("bigbird:block=-3"); }, {"block=-3"});
  require_error<Error>([] { make_attention("bigbird:window=4"); }, {"window=4", "odd"});
  require_error<Error>([] { make_attention("bigbird:window=0"); }, {"window=0", "odd"});
  require_error<Error>([] { make_attention("bigbird:global=-1"); }, {"global=-1", ">= 0"});
  require_error<Error>([] { make_attention("bigbird:random=-2"); }, {"random=-2", ">= 0"});
  require_error<Error>([] { make_attention("bigbird:seed=-1"); }, {"seed=-1", ">= 0"});
  require_error<Error>([] { make_attention("bigbird:block=8.5"); }, {"block=8.5", "integer"});
  require_error<Error>([] { make_attention("bigbird:blocks=8"); }, {"blocks=8", "unknown key"});
  // The same checks guard the C++ API.
  require_error<Error>([] { BigBirdAttention(config(16, 2, 2, 3, 0)); }, {"window=2", "odd"});
  require_error<Error>([] { bigbird_layout(config(0, 3, 2, 3, 0), 1, 8, 8, false); }, {"block=0"});
  require_error<Error>([] { bigbird_layout(config(4, 3, 2, 3, 0), 1, 8, 9, true); },
                       {"causal", "Nq == Nk"});
}

TEST_CASE("bigbird refuses causal cross-attention, saying why", "[bigbird]") {
  const auto b = make_attention("bigbird:block=8");
  const Tensor q = random_tensor(1, 1, 20, 8, 1), k = random_tensor(1, 1, 30, 8, 2);
  Mask mask;
  mask.causal = Causal::bottom_right;
  require_error<Unsupported>([&] { b->forward(q, k, k, mask); },
                             {"bigbird", "causal", "Nq != Nk", "block diagonal"});
  CHECK(make_attention("bigbird")->spec() == "bigbird:block=64,window=3,global=2,random=3,seed=0");
}
