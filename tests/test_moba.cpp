// MoBA: the selection against the paper's gate restated by brute force, the kernel against a
// dense fp64 reference of the same selection, the exact reduction to full attention, the
// backward against finite differences, the fp64 reference and PyTorch autograd, and the
// messages for bad parameters.
#include <algorithm>
#include <memory>
#include <random>
#include <set>

#include "grad_helpers.hpp"
#include "helpers.hpp"
#include "variants/moba.hpp"

using namespace attnlab;
using attnlab::test::Arrays64;
using attnlab::test::random_tensor;
using attnlab::test::require_close;
using attnlab::test::require_close_grad;
using attnlab::test::require_error;

namespace {

// fp32 kernel against fp64: full's bounds (sums over at most a few hundred keys, exp2 by a
// polynomial with ~1e-8 relative error; measured errors are a few 1e-6).
constexpr double kRtol = 1e-4, kAtol = 2e-5;
// Gradients: test_backward.cpp's bounds for the softmax variants (dS subtracts numbers of size
// ~|dO|·|v|, so absolute errors of ~1e-6 appear on gradients of size ~1).
constexpr double kGradRtol = 1e-4, kGradAtol = 3e-5;

Tensor64 to64(const Tensor& t) {
  return xt::cast<double>(t);
}

MobaConfig config(std::int64_t block, std::int64_t topk) {
  MobaConfig c;
  c.block = block;
  c.topk = topk;
  return c;
}

// The paper's gate, restated with the dense rule of its reference code: every block's score
// q · mean(valid keys), the own block at +infinity, future (causal) and empty blocks removed;
// the topk best kept. Returns the kept blocks of one query, as a set.
std::set<std::size_t> brute_force_selection(const MobaConfig& c, const Tensor& q, const Tensor& k,
                                            const Mask& mask, std::size_t b, std::size_t h,
                                            std::size_t i) {
  const Dims d = check_qkv(q, k, k);
  const auto block = static_cast<std::size_t>(c.block);
  const std::size_t blocks = (d.nk + block - 1) / block, valid = mask.valid_keys(b, d.nk);
  const std::int64_t p = mask.position(i, d);
  std::vector<std::pair<double, std::size_t>> gate;  // (score, block)
  for (std::size_t j = 0; j < blocks; ++j) {
    const std::size_t lo = j * block, hi = std::min(d.nk, lo + block);
    const bool own = p >= std::int64_t(lo) && p < std::int64_t(hi);
    if (own) {
      gate.push_back({std::numeric_limits<double>::infinity(), j});
      continue;
    }
    if (lo >= valid) continue;
    if (mask.causal != Causal::none && std::int64_t(hi) - 1 > p) continue;
    double score = 0;
    for (std::size_t c2 = 0; c2 < d.dk; ++c2) {
      double mean = 0;
      for (std::size_t t = lo; t < std::min(hi, valid); ++t) mean += k(b, d.kv_head(h), t, c2);
      score += double(q(b, h, i, c2)) * mean / double(std::min(hi, valid) - lo);
    }
    gate.push_back({score, j});
  }
  std::sort(gate.begin(), gate.end(), [](auto x, auto y) {
    return x.first > y.first || (x.first == y.first && x.second < y.second);
  });
  std::set<std::size_t> kept;
  for (std::size_t x = 0; x < std::min<std::size_t>(gate.size(), std::size_t(c.topk)); ++x)
    kept.insert(gate[x].second);
  return kept;
}

// MoBA's pattern: the selection, then the Mask's own rule.
Pattern moba_pattern(std::shared_ptr<const MobaSelection> s, const Mask& mask, const Dims& d) {
  return [s, &mask, d](std::size_t b, std::size_t h, std::size_t i, std::size_t j) {
    return s->selects(b, h, i, j) && mask.may_attend(b, h, i, j, d);
  };
}

struct MaskCase {
  std::string name;
  Mask mask;
};

// The mask kinds MoBA's selection reads (causal alignment, padding) and one it only intersects
// (a boolean mask), for batch 2.
std::vector<MaskCase> mask_cases(std::size_t nq, std::size_t nk, std::uint64_t seed) {
  std::vector<MaskCase> cases;
  cases.push_back({"none", {}});
  for (Causal c : {Causal::top_left, Causal::bottom_right}) {
    Mask m;
    m.causal = c;
    cases.push_back({std::string("causal ") + causal_name(c), m});
  }
  Mask padded;
  padded.causal = Causal::top_left;
  padded.key_lengths = {static_cast<std::int64_t>(nk) - 1, static_cast<std::int64_t>(nk / 2)};
  cases.push_back({"causal, key padding", padded});
  Mask boolean;
  std::mt19937_64 rng(seed);
  xt::xtensor<bool, 2> allowed = xt::xtensor<bool, 2>::from_shape({nq, nk});
  for (auto&& x : allowed) x = rng() % 4 != 0;
  boolean.allow(allowed);
  boolean.causal = Causal::bottom_right;
  boolean.scale = 0.37;
  cases.push_back({"boolean, causal, scale 0.37", boolean});
  return cases;
}

}  // namespace

TEST_CASE("moba: the selection is the paper's gate", "[moba]") {
  // Odd lengths, a partial last block, grouped heads, cross-attention, padding.
  for (const auto& [nq, nk] : {std::pair<std::size_t, std::size_t>{37, 37}, {20, 45}, {45, 20}})
    for (const MobaConfig& c : {config(4, 3), config(5, 1), config(8, 2), config(3, 20)})
      for (const MaskCase& mc : mask_cases(nq, nk, nq + nk)) {
        INFO("block " << c.block << " topk " << c.topk << " Nq=" << nq << " Nk=" << nk
                      << " mask: " << mc.name);
        const Tensor q = random_tensor(2, 4, nq, 6, 1), k = random_tensor(2, 2, nk, 6, 2);
        const MobaSelection s = moba_selection(c, q, k, mc.mask);
        for (std::size_t b = 0; b < 2; ++b)
          for (std::size_t h = 0; h < 4; ++h)
            for (std::size_t i = 0; i < nq; ++i) {
              const auto got = s.blocks(b, h, i);
              REQUIRE(std::is_sorted(got.begin(), got.end()));
              REQUIRE(std::set<std::size_t>(got.begin(), got.end()) ==
                      brute_force_selection(c, q, k, mc.mask, b, h, i));
            }
      }
  // The own block always counts: topk=1 is the own block alone (block-diagonal attention).
  const Tensor q = random_tensor(1, 1, 10, 4, 3), k = random_tensor(1, 1, 10, 4, 4);
  const MobaSelection one = moba_selection(config(4, 1), q, k, {});
  for (std::size_t i = 0; i < 10; ++i) {
    const auto row = one.blocks(0, 0, i);
    REQUIRE(row.size() == 1);
    CHECK(row[0] == i / 4);
  }
}

TEST_CASE("moba: forward equals the dense fp64 reference of its selection", "[moba]") {
  for (const auto& [nq, nk] :
       {std::pair<std::size_t, std::size_t>{200, 200}, {77, 131}, {131, 77}, {1, 50}})
    for (const MobaConfig& c : {config(16, 3), config(7, 2), config(64, 2)})
      for (const MaskCase& mc : mask_cases(nq, nk, nq * nk)) {
        INFO("block " << c.block << " topk " << c.topk << " Nq=" << nq << " Nk=" << nk
                      << " mask: " << mc.name);
        const Tensor q = random_tensor(2, 4, nq, 8, nq), k = random_tensor(2, 2, nk, 8, nk + 1),
                     v = random_tensor(2, 2, nk, 12, nk + 2);
        const Dims d = check_qkv(q, k, v);
        const auto s = std::make_shared<MobaSelection>(moba_selection(c, q, k, mc.mask));
        const Tensor64 ref =
            reference_attention(q, k, v, mc.mask.softmax_scale(8), moba_pattern(s, mc.mask, d));
        require_close(MobaAttention(c).forward(q, k, v, mc.mask), ref, kRtol, kAtol);
      }
}

TEST_CASE("moba: top-k covering every block is full attention", "[moba]") {
  // Causal or not: with K >= ceil(Nk / B) every candidate is kept, and B >= Nk is one block.
  for (const auto& [nq, nk] : {std::pair<std::size_t, std::size_t>{150, 150}, {90, 130}})
    for (const MobaConfig& c : {config(16, 10), config(7, 22), config(200, 1)})
      for (const MaskCase& mc : mask_cases(nq, nk, nq)) {
        INFO("block " << c.block << " topk " << c.topk << " Nq=" << nq << " Nk=" << nk
                      << " mask: " << mc.name);
        const Tensor q = random_tensor(1, 2, nq, 16, 5), k = random_tensor(1, 2, nk, 16, 6),
                     v = random_tensor(1, 2, nk, 16, 7);
        Mask m = mc.mask;
        if (m.has_key_lengths()) m.key_lengths.resize(1);
        require_close(MobaAttention(c).forward(q, k, v, m), reference_attention(q, k, v, m), kRtol,
                      kAtol);
      }
  // And below that it is not: a causal top-2 of 16-key blocks drops keys at N = 150.
  Mask causal;
  causal.causal = Causal::top_left;
  const Tensor q = random_tensor(1, 2, 150, 16, 5), k = random_tensor(1, 2, 150, 16, 6),
               v = random_tensor(1, 2, 150, 16, 7);
  const Tensor sparse = MobaAttention(config(16, 2)).forward(q, k, v, causal);
  const Tensor64 full = reference_attention(q, k, v, causal);
  CHECK(xt::amax(xt::abs(to64(sparse) - full))() > 1e-2);
}

TEST_CASE("moba: backward equals finite differences and the fp64 reference", "[moba]") {
  // Finite differences of the dense fp64 forward with the selection held fixed: a top-k has no
  // gradient, and a step of 1e-5 flips no choice at these random inputs.
  for (const auto& [nq, nk] : {std::pair<std::size_t, std::size_t>{9, 9}, {6, 11}, {11, 6}})
    for (const MaskCase& mc : mask_cases(nq, nk, nq + 7)) {
      INFO("Nq=" << nq << " Nk=" << nk << " mask: " << mc.name);
      const MobaAttention a(config(3, 2));
      const Tensor q = random_tensor(2, 2, nq, 3, nq), k = random_tensor(2, 2, nk, 3, nk + 1),
                   v = random_tensor(2, 2, nk, 4, nk + 2);
      const Dims d = check_qkv(q, k, v);
      Tensor out;
      Saved saved;
      a.forward(q, k, v, mc.mask, {}, out, saved);
      const Tensor d_out = random_tensor(2, 2, nq, 4, 9);
      const Gradients g = a.backward(q, k, v, mc.mask, {}, out, d_out, saved).qkv;
      const auto s = std::make_shared<MobaSelection>(moba_selection(a.config(), q, k, mc.mask));
      const Pattern pattern = moba_pattern(s, mc.mask, d);
      const double scale = mc.mask.softmax_scale(3);
      const Arrays64 fd = test::central_differences(
          [&](const Arrays64& x) -> xt::xarray<double> {
            return reference_attention(Tensor64(x[0]), Tensor64(x[1]), Tensor64(x[2]), scale,
                                       pattern);
          },
          {to64(q), to64(k), to64(v)}, to64(d_out));
      require_close_grad(to64(g.dq), fd[0], kGradRtol, kGradAtol, "dq vs finite differences");
      require_close_grad(to64(g.dk), fd[1], kGradRtol, kGradAtol, "dk vs finite differences");
      require_close_grad(to64(g.dv), fd[2], kGradRtol, kGradAtol, "dv vs finite differences");
    }
  // Across tile edges (queries tiles of up to 96 rows, 128-key chunks) with grouped heads.
  for (const auto& [nq, nk] : {std::pair<std::size_t, std::size_t>{300, 300}, {130, 257}}) {
    const MobaAttention a(config(32, 3));
    for (const MaskCase& mc : mask_cases(nq, nk, nq)) {
      INFO("Nq=" << nq << " Nk=" << nk << " mask: " << mc.name);
      const Tensor q = random_tensor(2, 4, nq, 8, 1), k = random_tensor(2, 2, nk, 8, 2),
                   v = random_tensor(2, 2, nk, 12, 3);
      const Dims d = check_qkv(q, k, v);
      const Tensor out = a.forward(q, k, v, mc.mask);
      const Tensor d_out = random_tensor(2, 4, nq, 12, 4);
      const Gradients g = a.backward(q, k, v, mc.mask, {}, out, d_out).qkv;
      const auto s = std::make_shared<MobaSelection>(moba_selection(a.config(), q, k, mc.mask));
      const Gradients64 ref =
          reference_attention_backward(to64(q), to64(k), to64(v), mc.mask.softmax_scale(8),
                                       moba_pattern(s, mc.mask, d), to64(d_out));
      require_close_grad(to64(g.dq), ref.dq, kGradRtol, kGradAtol, "dq vs fp64 reference");
      require_close_grad(to64(g.dk), ref.dk, kGradRtol, kGradAtol, "dk vs fp64 reference");
      require_close_grad(to64(g.dv), ref.dv, kGradRtol, kGradAtol, "dv vs fp64 reference");
    }
  }
}

TEST_CASE("moba: backward equals PyTorch autograd of the selected pattern", "[moba]") {
  struct Expected {
    std::size_t index;
    std::string what;
    Gradients g;
  };
  test::TorchGrads torch;
  std::vector<Expected> expected;
  const MobaAttention a(config(5, 2));
  for (const auto& [nq, nk] : {std::pair<std::size_t, std::size_t>{23, 31}, {26, 26}})
    for (const MaskCase& mc : mask_cases(nq, nk, nq * nk)) {
      const Tensor q = random_tensor(2, 2, nq, 8, nq), k = random_tensor(2, 2, nk, 8, nk + 1),
                   v = random_tensor(2, 2, nk, 6, nk + 2);
      const Dims d = check_qkv(q, k, v);
      const Tensor out = a.forward(q, k, v, mc.mask);
      const Tensor d_out = random_tensor(2, 2, nq, 6, 5);
      const auto s = std::make_shared<MobaSelection>(moba_selection(a.config(), q, k, mc.mask));
      const std::size_t i =
          torch.add({{"kind", "softmax"}, {"scale", mc.mask.softmax_scale(8)}},
                    {{"q", q},
                     {"k", k},
                     {"v", v},
                     {"d_out", d_out},
                     {"allowed", test::dense_pattern(moba_pattern(s, mc.mask, d), d)}});
      expected.push_back({i, "Nq=" + std::to_string(nq) + " mask: " + mc.name,
                          a.backward(q, k, v, mc.mask, {}, out, d_out).qkv});
    }
  if (!torch.run()) return;
  for (const Expected& e : expected) {
    require_close_grad(to64(e.g.dq), torch.grad(e.index, "q"), kGradRtol, kGradAtol,
                       e.what + ": dq vs torch");
    require_close_grad(to64(e.g.dk), torch.grad(e.index, "k"), kGradRtol, kGradAtol,
                       e.what + ": dk vs torch");
    require_close_grad(to64(e.g.dv), torch.grad(e.index, "v"), kGradRtol, kGradAtol,
                       e.what + ": dv vs torch");
  }
}

TEST_CASE("moba: flops count the selected pairs of causal self-attention exactly", "[moba]") {
  // 100 queries in 16-key blocks, top-3: query i reads i % 16 + 1 own keys and min(2, i / 16)
  // earlier blocks of 16.
  Mask causal;
  causal.causal = Causal::top_left;
  double pairs = 0;
  for (std::size_t i = 0; i < 100; ++i)
    pairs += double(i % 16 + 1) + 16.0 * double(std::min<std::size_t>(2, i / 16));
  const Dims d{1, 2, 100, 100, 8, 8};
  CHECK(MobaAttention(config(16, 3)).flops(d, causal) == 2.0 * pairs * 2 * 16);
}

TEST_CASE("moba: bad parameters and packed documents are refused by name", "[moba]") {
  require_error([] { make_attention("moba:block=0"); }, {"block=0", "expected an integer >= 1"});
  require_error([] { make_attention("moba:topk=0"); }, {"topk=0", ">= 1"});
  require_error([] { make_attention("moba:topk=-2"); }, {"topk=-2", ">= 1"});
  require_error([] { make_attention("moba:block=1.5"); }, {"block=1.5", "integer"});
  require_error([] { make_attention("moba:blocks=4"); }, {"unknown key 'blocks'", "block, topk"});
  require_error([] { MobaAttention(config(4, 0)); }, {"moba", "topk=0"});
  require_error([] { MobaAttention(config(-1, 2)); }, {"moba", "block=-1"});
  const Tensor x = random_tensor(1, 1, 8, 4, 1);
  Mask documents;
  documents.documents = {0, 3, 8};
  require_error<Unsupported>([&] { make_attention("moba:block=2")->forward(x, x, x, documents); },
                             {"moba", "packed documents", "varlen"});
  // The spec round-trips with every key in order.
  CHECK(make_attention("moba:topk=2,block=64")->spec() == "moba:block=64,topk=2");
}
