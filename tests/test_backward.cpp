// Backward passes of the softmax variants (full, sliding, bigbird, linformer with the gradients
// of E and F): each against central finite differences of an fp64 forward on small shapes,
// against the fp64 reference backward across tile edges, and against PyTorch autograd on the
// same inputs; every mask kind each variant supports, Nq != Nk. Plus the interface's checks and
// the saved log-sum-exp.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include <xtensor/xadapt.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xview.hpp>

#include "grad_helpers.hpp"
#include "helpers.hpp"
#include "patterns.hpp"
#include "variants/bigbird.hpp"
#include "variants/linformer.hpp"
#include "variants/sliding.hpp"

using namespace attnlab;
using attnlab::test::Arrays64;
using attnlab::test::random_tensor;
using attnlab::test::require_close;
using attnlab::test::require_close_grad;
using attnlab::test::require_error;

namespace {

// fp32 kernels against fp64: each gradient element sums up to a few hundred products rounded at
// ~1e-7 relative, and dS = P ∘ (dP - rowsum(dO ∘ O)) subtracts numbers of size ~|dO|·|v| ~ 5
// (Dv up to 24), so absolute errors of ~1e-6 appear on gradients of size ~1. Measured worst
// over every case in this file: 5.1e-6 absolute (on sliding's dv of size 11.5); the bounds keep
// a margin of about 6x.
constexpr double kRtol = 1e-4, kAtol = 3e-5;
// The fp64 reference backward against fp64 central differences (h = 1e-5): both are exact up to
// ~1e-10 (see central_differences); measured worst 2.7e-10.
constexpr double kRtol64 = 1e-7, kAtol64 = 1e-8;

Tensor64 to64(const Tensor& t) {
  return xt::cast<double>(t);
}

xt::xtensor<bool, 2> random_bool_mask(std::size_t nq, std::size_t nk, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  xt::xtensor<bool, 2> m = xt::xtensor<bool, 2>::from_shape({nq, nk});
  for (auto&& x : m) x = (rng() % 4) != 0;  // about a quarter of the pairs masked
  return m;
}

struct MaskCase {
  std::string name;
  Mask mask;
};

// Every mask kind for batch 2 (key padding needs one length per item; one item is padded to
// nothing, so its rows see no key and must get zero gradients). causal: whether the variant
// takes causal masks at these lengths.
std::vector<MaskCase> mask_cases(std::size_t heads, std::size_t nq, std::size_t nk, bool causal,
                                 std::uint64_t seed) {
  std::vector<MaskCase> cases;
  cases.push_back({"none", {}});
  if (causal) {
    for (Causal c : {Causal::top_left, Causal::bottom_right}) {
      Mask m;
      m.causal = c;
      cases.push_back({std::string("causal ") + causal_name(c), m});
    }
  }
  Mask padded;
  padded.key_lengths = {static_cast<std::int64_t>(nk) - 1, 0};
  cases.push_back({"key padding", padded});
  Mask shared;
  shared.allow(random_bool_mask(nq, nk, seed));
  shared.scale = 0.37;
  cases.push_back({"boolean mask, scale 0.37", shared});
  Mask per_head;
  std::mt19937_64 rng(seed + 1);
  per_head.allowed = xt::xtensor<bool, 4>::from_shape({2, heads, nq, nk});
  for (auto&& x : per_head.allowed) x = rng() % 3 != 0;
  cases.push_back({"per-head boolean mask", per_head});
  Mask all = shared;
  all.key_lengths = {static_cast<std::int64_t>(nk), static_cast<std::int64_t>(nk / 2 + 1)};
  if (causal) all.causal = Causal::bottom_right;
  cases.push_back({"padding, boolean and causal together", all});
  return cases;
}

struct Backward {
  Tensor out, d_out;
  Saved saved;
  Gradients g;
};

// forward saving the lse, then backward with a random d_out; also checks that the backward
// without the saved lse (recomputed) gives bitwise the same gradients.
Backward run_backward(const Attention& a, const Tensor& q, const Tensor& k, const Tensor& v,
                      const Mask& mask, std::uint64_t seed) {
  Backward r;
  a.forward(q, k, v, mask, {}, r.out, r.saved);
  r.d_out = random_tensor(q.shape()[0], q.shape()[1], q.shape()[2], v.shape()[3], seed);
  r.g = a.backward(q, k, v, mask, {}, r.out, r.d_out, r.saved).qkv;
  const Gradients again = a.backward(q, k, v, mask, {}, r.out, r.d_out).qkv;
  CHECK((again.dq == r.g.dq));
  CHECK((again.dk == r.g.dk));
  CHECK((again.dv == r.g.dv));
  return r;
}

void require_grads(const Gradients& g, const Arrays64& want, double rtol, double atol,
                   const std::string& what) {
  require_close_grad(to64(g.dq), want[0], rtol, atol, what + ": dq");
  require_close_grad(to64(g.dk), want[1], rtol, atol, what + ": dk");
  require_close_grad(to64(g.dv), want[2], rtol, atol, what + ": dv");
}

// The backend's gradients against central differences of the fp64 reference forward with the
// same pattern (and that reference's own backward against them, tightly).
void check_finite_differences(const Attention& a, std::size_t nq, std::size_t nk, const Mask& mask,
                              const Pattern& pattern, std::uint64_t seed) {
  const std::size_t heads = 2, dk = 3, dv = 4;
  const Tensor q = random_tensor(2, heads, nq, dk, seed),
               k = random_tensor(2, heads, nk, dk, seed + 1),
               v = random_tensor(2, heads, nk, dv, seed + 2);
  const Backward r = run_backward(a, q, k, v, mask, seed + 3);
  const double scale = mask.softmax_scale(dk);
  const Arrays64 fd = test::central_differences(
      [&](const Arrays64& x) -> xt::xarray<double> {
        return reference_attention(Tensor64(x[0]), Tensor64(x[1]), Tensor64(x[2]), scale, pattern);
      },
      {to64(q), to64(k), to64(v)}, to64(r.d_out));
  const Gradients64 ref =
      reference_attention_backward(to64(q), to64(k), to64(v), scale, pattern, to64(r.d_out));
  require_grads(r.g, fd, kRtol, kAtol, a.spec() + " vs finite differences");
  require_close_grad(ref.dq, fd[0], kRtol64, kAtol64, "reference dq vs finite differences");
  require_close_grad(ref.dk, fd[1], kRtol64, kAtol64, "reference dk vs finite differences");
  require_close_grad(ref.dv, fd[2], kRtol64, kAtol64, "reference dv vs finite differences");
}

// The backend's gradients against the fp64 reference backward, on shapes that cross tile edges.
void check_reference(const Attention& a, std::size_t batch, std::size_t heads, std::size_t nq,
                     std::size_t nk, std::size_t dk, std::size_t dv, const Mask& mask,
                     const Pattern& pattern, std::uint64_t seed) {
  const Tensor q = random_tensor(batch, heads, nq, dk, seed),
               k = random_tensor(batch, heads, nk, dk, seed + 1),
               v = random_tensor(batch, heads, nk, dv, seed + 2);
  const Backward r = run_backward(a, q, k, v, mask, seed + 3);
  const Gradients64 ref = reference_attention_backward(
      to64(q), to64(k), to64(v), mask.softmax_scale(dk), pattern, to64(r.d_out));
  require_grads(r.g, {ref.dq, ref.dk, ref.dv}, kRtol, kAtol, a.spec() + " vs fp64 reference");
}

// A softmax variant at (nq, nk): its pattern for a mask, on 2 x 2 heads.
using PatternOf = std::function<Pattern(const Mask&, const Dims&)>;

void check_variant_small(const Attention& a, const PatternOf& pattern_of, bool causal) {
  for (const auto& [nq, nk] : {std::pair<std::size_t, std::size_t>{5, 7}, {7, 5}, {6, 6}}) {
    const bool with_causal = causal && (nq == nk || a.support().causal_cross);
    for (const MaskCase& c : mask_cases(2, nq, nk, with_causal, nq * 10 + nk)) {
      INFO(a.spec() << " Nq=" << nq << " Nk=" << nk << " mask: " << c.name);
      const Dims d{2, 2, nq, nk, 3, 4};
      check_finite_differences(a, nq, nk, c.mask, pattern_of(c.mask, d), nq + 3 * nk);
    }
  }
}

}  // namespace

TEST_CASE("the fp64 reference backward equals central finite differences", "[backward]") {
  // A random pattern with an empty row, and Nq != Nk, Dk != Dv.
  const Tensor q = random_tensor(2, 2, 5, 3, 1), k = random_tensor(2, 2, 7, 3, 2),
               v = random_tensor(2, 2, 7, 4, 3), d_out = random_tensor(2, 2, 5, 4, 4);
  const Pattern pattern = [](std::size_t b, std::size_t h, std::size_t i, std::size_t j) {
    return i != 2 && (b + 3 * h + 5 * i + 7 * j) % 3 != 0;
  };
  const Arrays64 fd = test::central_differences(
      [&](const Arrays64& x) -> xt::xarray<double> {
        return reference_attention(Tensor64(x[0]), Tensor64(x[1]), Tensor64(x[2]), 0.6, pattern);
      },
      {to64(q), to64(k), to64(v)}, to64(d_out));
  const Gradients64 g =
      reference_attention_backward(to64(q), to64(k), to64(v), 0.6, pattern, to64(d_out));
  require_close_grad(g.dq, fd[0], kRtol64, kAtol64, "dq");
  require_close_grad(g.dk, fd[1], kRtol64, kAtol64, "dk");
  require_close_grad(g.dv, fd[2], kRtol64, kAtol64, "dv");
  CHECK(xt::amax(xt::abs(xt::view(g.dq, xt::all(), xt::all(), 2, xt::all())))() == 0.0);
}

TEST_CASE("full: backward equals finite differences under every mask kind", "[backward]") {
  const auto full = make_attention("full");
  check_variant_small(
      *full,
      [](const Mask& m, const Dims& d) -> Pattern {
        return [&m, d](std::size_t b, std::size_t h, std::size_t i, std::size_t j) {
          return m.may_attend(b, h, i, j, d);
        };
      },
      true);
}

TEST_CASE("full: backward equals the fp64 reference across tile edges", "[backward]") {
  const auto full = make_attention("full");
  // 96-query (the backward's), 48-query (the forward's) and 128-key tiles; one head (tiles split
  // over private dK/dV sums) and three.
  const std::pair<std::size_t, std::size_t> lengths[] = {{1, 1},   {47, 49},   {49, 129},
                                                         {97, 95}, {200, 130}, {130, 300}};
  for (auto [nq, nk] : lengths)
    for (std::size_t heads : {1, 3}) {
      if (heads == 3 && nq * nk > 97 * 95) continue;  // keeps the test short
      for (const MaskCase& c : mask_cases(heads, nq, nk, true, nq + nk)) {
        INFO("Nq=" << nq << " Nk=" << nk << " heads=" << heads << " mask: " << c.name);
        const Dims d{2, heads, nq, nk, 16, 24};
        const Mask& m = c.mask;
        check_reference(
            *full, 2, heads, nq, nk, 16, 24, m,
            [&m, d](std::size_t b, std::size_t h, std::size_t i, std::size_t j) {
              return m.may_attend(b, h, i, j, d);
            },
            nq * 7 + nk);
      }
    }
}

TEST_CASE("sliding: backward equals finite differences and the fp64 reference", "[backward]") {
  for (const SlidingConfig& c :
       {SlidingConfig{1, 2, 1, 0}, SlidingConfig{1, 1, 2, 1}, SlidingConfig{2, 0, 3, 2}}) {
    const SlidingAttention a(c);
    check_variant_small(
        a, [c](const Mask& m, const Dims& d) { return test::sliding_pattern(c, m, d); }, true);
  }
  // Across tiles (24 queries, 128 keys), with dilation and global tokens.
  for (const SlidingConfig& c : {SlidingConfig{20, 9, 1, 0}, SlidingConfig{13, 17, 3, 5}}) {
    const SlidingAttention a(c);
    for (auto [nq, nk] : {std::pair<std::size_t, std::size_t>{300, 300}, {150, 260}}) {
      for (const MaskCase& mc : mask_cases(2, nq, nk, true, nq)) {
        INFO(a.spec() << " Nq=" << nq << " Nk=" << nk << " mask: " << mc.name);
        const Dims d{2, 2, nq, nk, 8, 12};
        check_reference(a, 2, 2, nq, nk, 8, 12, mc.mask, test::sliding_pattern(c, mc.mask, d), nk);
      }
    }
  }
}

TEST_CASE("bigbird: backward equals finite differences and the fp64 reference", "[backward]") {
  for (const BigBirdConfig& c : {BigBirdConfig{2, 1, 1, 1, 3}, BigBirdConfig{3, 3, 0, 1, 5}}) {
    const BigBirdAttention a(c);
    check_variant_small(
        a, [c](const Mask& m, const Dims& d) { return test::bigbird_pattern(c, m, d); }, true);
  }
  const BigBirdConfig c{16, 3, 2, 2, 7};
  const BigBirdAttention a(c);
  for (auto [nq, nk] : {std::pair<std::size_t, std::size_t>{200, 200}, {150, 90}}) {
    for (const MaskCase& mc : mask_cases(2, nq, nk, nq == nk, nq)) {
      INFO(a.spec() << " Nq=" << nq << " Nk=" << nk << " mask: " << mc.name);
      const Dims d{2, 2, nq, nk, 8, 12};
      check_reference(a, 2, 2, nq, nk, 8, 12, mc.mask, test::bigbird_pattern(c, mc.mask, d), nk);
    }
  }
}

TEST_CASE("softmax variants: backward equals PyTorch autograd on the same inputs", "[backward]") {
  struct Expected {
    std::size_t index;
    std::string what;
    Gradients g;
  };
  test::TorchGrads torch;
  std::vector<Expected> expected;
  const auto add = [&](const Attention& a, std::size_t nq, std::size_t nk, const MaskCase& c,
                       const Pattern& pattern, std::uint64_t seed) {
    const Tensor q = random_tensor(2, 2, nq, 8, seed), k = random_tensor(2, 2, nk, 8, seed + 1),
                 v = random_tensor(2, 2, nk, 6, seed + 2);
    const Backward r = run_backward(a, q, k, v, c.mask, seed + 3);
    const Dims d{2, 2, nq, nk, 8, 6};
    const std::size_t i = torch.add({{"kind", "softmax"}, {"scale", c.mask.softmax_scale(8)}},
                                    {{"q", q},
                                     {"k", k},
                                     {"v", v},
                                     {"d_out", r.d_out},
                                     {"allowed", test::dense_pattern(pattern, d)}});
    expected.push_back(
        {i,
         a.spec() + " Nq=" + std::to_string(nq) + " Nk=" + std::to_string(nk) + " mask: " + c.name,
         r.g});
  };
  const auto full = make_attention("full");
  const SlidingConfig sc{3, 2, 2, 1};
  const SlidingAttention sliding(sc);
  const BigBirdConfig bc{4, 3, 1, 1, 2};
  const BigBirdAttention bigbird(bc);
  for (const auto& [nq, nk] : {std::pair<std::size_t, std::size_t>{20, 33}, {33, 20}, {26, 26}})
    for (const MaskCase& c : mask_cases(2, nq, nk, true, nq * nk)) {
      const Dims d{2, 2, nq, nk, 8, 6};
      const Mask& m = c.mask;
      add(
          *full, nq, nk, c,
          [&m, d](std::size_t b, std::size_t h, std::size_t i, std::size_t j) {
            return m.may_attend(b, h, i, j, d);
          },
          nq + nk);
      add(sliding, nq, nk, c, test::sliding_pattern(sc, m, d), nq + 2 * nk);
      if (m.causal != Causal::none && nq != nk) continue;  // bigbird: causal needs Nq == Nk
      add(bigbird, nq, nk, c, test::bigbird_pattern(bc, m, d), nq + 3 * nk);
    }
  if (!torch.run()) return;
  for (const Expected& e : expected) {
    require_grads(e.g,
                  {torch.grad(e.index, "q"), torch.grad(e.index, "k"), torch.grad(e.index, "v")},
                  kRtol, kAtol, e.what + " vs torch");
  }
}

namespace {

// Linformer's definition in fp64 on fp64 inputs: per (b, h), K' = E_h[:, :n] K[:n] and
// V' = F_h[:, :n] V[:n] (n: the unpadded length), then softmax attention over all k rows.
// e, f: [H, k, Nk], the matrices each head uses.
xt::xarray<double> linformer64(const Tensor64& q, const Tensor64& k, const Tensor64& v,
                               const xt::xarray<double>& e, const xt::xarray<double>& f,
                               const std::vector<std::size_t>& lengths, double scale) {
  const std::size_t batch = q.shape()[0], heads = q.shape()[1], rows = e.shape()[1];
  Tensor64 kp = xt::zeros<double>({batch, heads, rows, k.shape()[3]});
  Tensor64 vp = xt::zeros<double>({batch, heads, rows, v.shape()[3]});
  for (std::size_t b = 0; b < batch; ++b)
    for (std::size_t h = 0; h < heads; ++h)
      for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t j = 0; j < lengths[b]; ++j) {
          for (std::size_t c = 0; c < k.shape()[3]; ++c)
            kp(b, h, r, c) += e(h, r, j) * k(b, h, j, c);
          for (std::size_t c = 0; c < v.shape()[3]; ++c)
            vp(b, h, r, c) += f(h, r, j) * v(b, h, j, c);
        }
  return reference_attention(q, kp, vp, scale, [](auto...) { return true; });
}

// The matrices each head of `a` uses at Nk keys, [H, k, Nk].
std::pair<xt::xarray<float>, xt::xarray<float>> used_projections(const LinformerAttention& a,
                                                                 std::size_t heads,
                                                                 std::size_t nk) {
  xt::xarray<float> e = xt::zeros<float>({heads, a.k(), nk}), f = e;
  for (std::size_t h = 0; h < heads; ++h) {
    xt::view(e, h) = a.projection('E', h, nk);
    xt::view(f, h) = a.projection('F', h, nk);
  }
  return {e, f};
}

struct LinformerCase {
  std::string spec;
  std::size_t nq, nk;
  Mask mask;
};

std::vector<LinformerCase> linformer_cases() {
  Mask padded;
  padded.key_lengths = {4, 0};  // one item padded to nothing
  Mask scaled;
  scaled.scale = 0.37;
  scaled.key_lengths = {7, 5};
  return {{"linformer:k=3,max_len=9,seed=2", 5, 7, {}},
          {"linformer:k=4,max_len=7,share=kv,init=xavier", 7, 6, padded},
          {"linformer:k=5,max_len=8,share=layer", 4, 7, scaled}};
}

std::unique_ptr<LinformerAttention> make_linformer(const std::string& spec) {
  return std::unique_ptr<LinformerAttention>(
      dynamic_cast<LinformerAttention*>(make_attention(spec).release()));
}

// The first nk columns (last axis) of a projection gradient [H, k, max_len] or [k, max_len], and
// the largest |entry| of the rest (which must be zero: those columns were not used).
std::pair<xt::xarray<double>, double> split_columns(const ParameterTensor& g, std::size_t nk) {
  const std::size_t columns = g.shape.back(), rows = g.values.size() / columns;
  std::vector<std::size_t> shape = g.shape;
  shape.back() = nk;
  xt::xarray<double> used = xt::zeros<double>(shape);
  double rest = 0;
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t j = 0; j < columns; ++j) {
      const double x = g.values[r * columns + j];
      if (j < nk)
        used.data()[r * nk + j] = x;
      else
        rest = std::max(rest, std::abs(x));
    }
  return {used, rest};
}

// The gradients the backward reports for the distinct matrices of `spec`'s share, from those of
// each head's E and F ([H, k, Nk] each): a tied matrix's is the sum over its uses.
std::vector<xt::xarray<double>> tied(const std::string& spec, const xt::xarray<double>& de,
                                     const xt::xarray<double>& df) {
  if (spec.find("share=kv") != std::string::npos) return {de + df};
  if (spec.find("share=layer") != std::string::npos) return {xt::sum(de + df, {0})};
  return {de, df};
}

std::vector<std::size_t> lengths_of(const Mask& mask, std::size_t batch, std::size_t nk) {
  std::vector<std::size_t> lengths(batch, nk);
  for (std::size_t b = 0; b < mask.key_lengths.size(); ++b)
    lengths[b] = static_cast<std::size_t>(mask.key_lengths[b]);
  return lengths;
}

}  // namespace

TEST_CASE("linformer: backward and the gradients of E and F equal finite differences",
          "[backward]") {
  for (const LinformerCase& c : linformer_cases()) {
    INFO(c.spec << " Nq=" << c.nq << " Nk=" << c.nk << " padded=" << c.mask.has_key_lengths());
    const auto a = make_linformer(c.spec);
    const Tensor q = random_tensor(2, 2, c.nq, 3, 1), k = random_tensor(2, 2, c.nk, 3, 2),
                 v = random_tensor(2, 2, c.nk, 4, 3);
    Tensor out;
    Saved saved;
    a->forward(q, k, v, c.mask, {}, out, saved);
    const Tensor d_out = random_tensor(2, 2, c.nq, 4, 4);
    AllGradients all;
    a->backward(q, k, v, c.mask, {}, out, d_out, saved, all);
    const Gradients& g = all.qkv;
    const AllGradients plain = a->backward(q, k, v, c.mask, {}, out, d_out);  // lse recomputed
    CHECK((plain.qkv.dq == g.dq));
    CHECK((plain.qkv.dk == g.dk));
    CHECK((plain.qkv.dv == g.dv));
    const auto [e, f] = used_projections(*a, 2, c.nk);
    const auto lengths = lengths_of(c.mask, 2, c.nk);
    const double scale = c.mask.softmax_scale(3);
    const Arrays64 fd = test::central_differences(
        [&](const Arrays64& x) {
          return linformer64(Tensor64(x[0]), Tensor64(x[1]), Tensor64(x[2]), x[3], x[4], lengths,
                             scale);
        },
        {to64(q), to64(k), to64(v), xt::cast<double>(e), xt::cast<double>(f)}, to64(d_out));
    require_grads(g, fd, kRtol, kAtol, c.spec + " vs finite differences");
    // The learned tensors are the distinct matrices of `share`, as parameters() names and shapes
    // them; each gradient is the sum over the matrix's uses (per head, then over heads for
    // layer), zero in the columns >= Nk that no key used.
    const std::vector<ParameterTensor> params = a->parameters(2);
    const std::vector<xt::xarray<double>> want = tied(c.spec, fd[3], fd[4]);
    REQUIRE(all.parameters.size() == params.size());
    REQUIRE(want.size() == params.size());
    for (std::size_t i = 0; i < params.size(); ++i) {
      INFO("parameter " << params[i].name);
      CHECK(all.parameters[i].name == params[i].name);
      CHECK(all.parameters[i].shape == params[i].shape);
      CHECK(all.parameters[i].shape.back() == a->max_len());
      const auto [used, rest] = split_columns(all.parameters[i], c.nk);
      require_close_grad(used, want[i], kRtol, kAtol, "d" + params[i].name);
      CHECK(rest == 0.0);
    }
  }
}

TEST_CASE("linformer: E and F through parameters() and set_parameters(), by share", "[backward]") {
  const Tensor q = random_tensor(2, 3, 6, 4, 1), k = random_tensor(2, 3, 9, 4, 2),
               v = random_tensor(2, 3, 9, 5, 3);
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"linformer:k=3,max_len=12", {"E", "F"}},
      {"linformer:k=3,max_len=12,share=kv", {"E"}},
      {"linformer:k=3,max_len=12,share=layer", {"E"}}};
  for (const auto& [spec, names] : cases) {
    INFO(spec);
    const auto a = make_attention(spec);
    const Tensor drawn = a->forward(q, k, v);
    std::vector<ParameterTensor> params = a->parameters(3);
    REQUIRE(params.size() == names.size());
    for (std::size_t i = 0; i < params.size(); ++i) {
      CHECK(params[i].name == names[i]);
      const std::size_t per = spec.ends_with("layer") ? 3 * 12 : 3 * 3 * 12;
      CHECK(params[i].values.size() == per);
    }
    // Set back as they are: the same output, bitwise; then moved: another output.
    a->set_parameters(params);
    CHECK((a->forward(q, k, v) == drawn));
    CHECK(a->spec().find("init=supplied") != std::string::npos);
    for (float& x : params[0].values) x *= 0.5f;
    a->set_parameters(params);
    CHECK_FALSE((a->forward(q, k, v) == drawn));
    CHECK(a->parameters(3)[0].values == params[0].values);
    // Bad input names what is wrong.
    std::vector<ParameterTensor> unknown = params;
    unknown.push_back({"G", {1}, {0.0f}});
    require_error<Error>([&] { a->set_parameters(unknown); }, {"no parameter 'G'"});
    std::vector<ParameterTensor> short_shape = params;
    short_shape[0].values.pop_back();
    require_error<Error>([&] { a->set_parameters(short_shape); },
                         {"parameter E", "values for its shape"});
    std::vector<ParameterTensor> not_finite = params;
    not_finite[0].values[1] = NAN;
    require_error<Error>([&] { a->set_parameters(not_finite); }, {"E", "non-finite"});
  }
  const auto none = make_attention("linformer:k=3,max_len=12");
  std::vector<ParameterTensor> e_only = none->parameters(3);
  e_only.pop_back();
  require_error<Error>([&] { none->set_parameters(e_only); }, {"parameter F not given", "E and F"});
  // A tie of share=kv is kept: set_projections refuses an F that differs from E.
  const auto kv = make_linformer("linformer:k=3,max_len=12,share=kv");
  const xt::xarray<float> e = xt::ones<float>({3, 3, 12});
  require_error<Error>([&] { kv->set_projections(e, 2.0f * e); }, {"share=kv", "F given differs"});
  // A backend without learned tensors has none to give or take.
  const auto full = make_attention("full");
  CHECK(full->parameters(3).empty());
  full->set_parameters({});
  require_error<Unsupported>(
      [&] {
        full->set_parameters({{"E", {1}, {0.0f}}});
      },
      {"full", "learned parameters"});
}

TEST_CASE("linformer: backward equals PyTorch autograd, E and F included", "[backward]") {
  test::TorchGrads torch;
  struct Expected {
    std::size_t index;
    std::string what;
    AllGradients g;
    std::string spec;
    std::size_t nk;
  };
  std::vector<Expected> expected;
  for (const auto& [spec, nq, nk] :
       {std::tuple<std::string, std::size_t, std::size_t>{"linformer:k=20,max_len=150", 60, 130},
        {"linformer:k=16,max_len=100,share=kv,init=xavier", 100, 57}}) {
    for (const bool padded : {false, true}) {
      const auto a = make_linformer(spec);
      Mask mask;
      if (padded) mask.key_lengths = {static_cast<std::int64_t>(nk / 3), 0};
      const Tensor q = random_tensor(2, 2, nq, 8, nq), k = random_tensor(2, 2, nk, 8, nk),
                   v = random_tensor(2, 2, nk, 6, nk + 1), d_out = random_tensor(2, 2, nq, 6, 5);
      const Tensor out = a->forward(q, k, v, mask);
      Expected e{0, spec + (padded ? " padded" : ""), {}, spec, nk};
      e.g = a->backward(q, k, v, mask, {}, out, d_out);
      const auto [em, fm] = used_projections(*a, 2, nk);
      const auto lengths = lengths_of(mask, 2, nk);
      e.index = torch.add({{"kind", "linformer"},
                           {"scale", mask.softmax_scale(8)},
                           {"lengths", std::vector<std::size_t>(lengths.begin(), lengths.end())}},
                          {{"q", q}, {"k", k}, {"v", v}, {"d_out", d_out}, {"E", em}, {"F", fm}});
      expected.push_back(std::move(e));
    }
  }
  if (!torch.run()) return;
  for (const Expected& e : expected) {
    require_grads(e.g.qkv,
                  {torch.grad(e.index, "q"), torch.grad(e.index, "k"), torch.grad(e.index, "v")},
                  kRtol, kAtol, e.what + " vs torch");
    const auto want = tied(e.spec, torch.grad(e.index, "E"), torch.grad(e.index, "F"));
    REQUIRE(e.g.parameters.size() == want.size());
    for (std::size_t i = 0; i < want.size(); ++i)
      require_close_grad(split_columns(e.g.parameters[i], e.nk).first, want[i], kRtol, kAtol,
                         e.what + ": d" + e.g.parameters[i].name + " vs torch");
  }
}

TEST_CASE("the saved log-sum-exp is each row's log-sum-exp; -inf for rows without keys",
          "[backward]") {
  const auto full = make_attention("full");
  const Tensor q = random_tensor(2, 1, 60, 8, 1), k = random_tensor(2, 1, 140, 8, 2),
               v = random_tensor(2, 1, 140, 8, 3);
  Mask mask;
  mask.causal = Causal::bottom_right;
  mask.key_lengths = {140, 0};
  Tensor out;
  Saved saved;
  full->forward(q, k, v, mask, {}, out, saved);
  const RowLogSumExp& lse = saved.lse;
  REQUIRE(lse.shape() == (std::array<std::size_t, 3>{2, 1, 60}));
  CHECK((out == full->forward(q, k, v, mask)));  // saving the lse changes nothing else
  const Dims d{2, 1, 60, 140, 8, 8};
  for (std::size_t i = 0; i < 60; ++i) {
    std::vector<double> logits;
    for (std::size_t j = 0; j < mask.visible_keys(0, i, d); ++j) {
      double dot = 0;
      for (std::size_t c = 0; c < 8; ++c) dot += double(q(0, 0, i, c)) * k(0, 0, j, c);
      logits.push_back(dot / std::sqrt(8.0));
    }
    const double top = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (double x : logits) sum += std::exp(x - top);
    CHECK(lse(0, 0, i) == Approx(top + std::log(sum)).epsilon(1e-5));
    CHECK(lse(1, 0, i) == -std::numeric_limits<float>::infinity());
  }
  // linear attention has no softmax: nothing to save.
  make_attention("linear")->forward(q, k, v, Mask{}, {}, out, saved);
  CHECK(saved.lse.size() == 0);
}

TEST_CASE("backward into a caller's gradients reuses their storage", "[backward]") {
  const auto full = make_attention("full");
  const Tensor q = random_tensor(1, 2, 50, 8, 1), k = random_tensor(1, 2, 70, 8, 2),
               v = random_tensor(1, 2, 70, 4, 3), d_out = random_tensor(1, 2, 50, 4, 4);
  Tensor out;
  Saved saved;
  full->forward(q, k, v, {}, {}, out, saved);
  const Gradients fresh = full->backward(q, k, v, {}, {}, out, d_out, saved).qkv;
  AllGradients all;
  Gradients& g = all.qkv;
  g.dk = random_tensor(1, 2, 70, 8, 5);  // right shape, stale values: all overwritten
  const float* dk_storage = g.dk.data();
  full->backward(q, k, v, {}, {}, out, d_out, saved, all);
  CHECK(g.dk.data() == dk_storage);
  CHECK((g.dq == fresh.dq));
  CHECK((g.dk == fresh.dk));
  CHECK((g.dv == fresh.dv));
}

template <class T>
bool bitwise_equal(const T& a, const T& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST_CASE("softmax variants: gradients are bitwise equal across runs and thread counts",
          "[backward]") {
  // One head (its tiles split over private dK/dV sums) and six heads (whole heads per task);
  // plain and causal; lengths off and on the 48-query, 128-key tile edges.
  const int threads_before = omp_get_max_threads();
  for (const std::string& spec : test::engine_clients())
    for (auto [heads, n] : {std::pair<std::size_t, std::size_t>{1, 300}, {6, 384}})
      for (const Causal causal : {Causal::none, Causal::top_left}) {
        INFO(spec << " heads=" << heads << " N=" << n << " causal=" << (causal != Causal::none));
        const auto a = make_attention(spec);
        const Tensor q = random_tensor(1, heads, n, 32, 1), k = random_tensor(1, heads, n, 32, 2),
                     v = random_tensor(1, heads, n, 32, 3),
                     d_out = random_tensor(1, heads, n, 32, 4);
        Mask mask;
        mask.causal = causal;
        Tensor out1;
        Saved saved1;
        AllGradients all1;
        const Gradients& g1 = all1.qkv;
        omp_set_num_threads(1);
        a->forward(q, k, v, mask, {}, out1, saved1);
        a->backward(q, k, v, mask, {}, out1, d_out, saved1, all1);
        for (int threads : {2, 3, 2}) {
          INFO("threads=" << threads);
          omp_set_num_threads(threads);
          Tensor out;
          Saved saved;
          a->forward(q, k, v, mask, {}, out, saved);
          CHECK(bitwise_equal(out, out1));
          CHECK(bitwise_equal(saved.lse, saved1.lse));
          const Gradients g = a->backward(q, k, v, mask, {}, out, d_out, saved).qkv;
          CHECK(bitwise_equal(g.dq, g1.dq));
          CHECK(bitwise_equal(g.dk, g1.dk));
          CHECK(bitwise_equal(g.dv, g1.dv));
        }
      }
  omp_set_num_threads(threads_before);
}

TEST_CASE("backward validates its arguments and names what is wrong", "[backward]") {
  const auto full = make_attention("full");
  const Tensor q = random_tensor(1, 2, 5, 4, 1), k = random_tensor(1, 2, 6, 4, 2),
               v = random_tensor(1, 2, 6, 3, 3);
  const Tensor out = full->forward(q, k, v), d_out = random_tensor(1, 2, 5, 3, 4);
  const Tensor wrong = random_tensor(1, 2, 5, 4, 5);
  require_error([&] { full->backward(q, k, v, {}, {}, wrong, d_out); },
                {"full", "out", "[1, 2, 5, 4]", "[1, 2, 5, 3]"});
  require_error([&] { full->backward(q, k, v, {}, {}, out, wrong); }, {"d_out", "[1, 2, 5, 4]"});
  Saved short_lse;
  short_lse.lse = RowLogSumExp::from_shape({1, 2, 4});
  require_error([&] { full->backward(q, k, v, {}, {}, out, d_out, short_lse); },
                {"lse", "[1, 2, 4]", "[1, 2, 5]"});
  require_error([&] { full->backward(q, q, v, {}, {}, out, d_out); }, {"k and v"});
  AllGradients g;
  g.qkv.dq = q;
  require_error([&] { full->backward(g.qkv.dq, k, v, {}, {}, out, d_out, {}, g); },
                {"must not share storage with q, k"});
  Mask bad;
  bad.key_lengths = {7};
  require_error([&] { full->backward(q, k, v, bad, {}, out, d_out); }, {"key_lengths[0] = 7"});
  // The support checks of forward apply to backward too.
  Mask causal;
  causal.causal = Causal::top_left;
  const auto bigbird = make_attention("bigbird:block=2");
  require_error<Unsupported>([&] { bigbird->backward(q, k, v, causal, {}, out, d_out); },
                             {"bigbird", "causal masks with Nq != Nk"});
}

namespace {
// A backend that has a forward and no backward: support().backward stays false.
class ForwardOnly final : public Attention {
 public:
  std::string spec() const override { return "forward-only"; }
  Support support() const override { return {}; }

 protected:
  void compute(TensorRef, TensorRef, TensorRef, const Mask&, const TokenInputs&, const Dims&,
               Tensor& out, Saved*) const override {
    out.fill(0.0f);
  }
};
}  // namespace

TEST_CASE("a backend without a backward refuses it as Unsupported", "[backward]") {
  const ForwardOnly a;
  CHECK_FALSE(a.support().backward);
  CHECK(a.support().describe().find("backward") == std::string::npos);
  const Tensor x = random_tensor(1, 1, 3, 2, 1);
  const Tensor out = a.forward(x, x, x);
  require_error<Unsupported>([&] { a.backward(x, x, x, {}, {}, out, out); },
                             {"forward-only does not support backward"});
  for (const std::string& name : attention_names()) {  // every built-in backend has one
    INFO(name);
    CHECK(make_attention(name)->support().backward);
  }
}
