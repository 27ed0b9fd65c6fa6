// Exact attention: the fast float32 kernel against the float64 reference, a case checked by
// hand, and the properties any softmax attention must have.
#include <algorithm>
#include <cmath>
#include <numeric>

#include <xtensor-blas/xlinalg.hpp>
#include <xtensor/xview.hpp>

#include "helpers.hpp"

using namespace attnlab;
using attnlab::test::random_tensor;
using attnlab::test::require_close;

namespace {

// fp32 against fp64: products and sums over up to 2000 keys round at ~1e-7 each, and exp2 is a
// polynomial with ~1e-8 relative error, so outputs (weighted means of N(0,1) values) agree to
// a few 1e-6; the bounds leave a margin of about 5x over what was measured.
constexpr double kRtol = 1e-4, kAtol = 2e-5;

const auto full = make_attention("full");

void check_against_reference(std::size_t b, std::size_t h, std::size_t nq, std::size_t nk,
                             std::size_t dk, std::size_t dv, const Mask& mask, std::uint64_t seed) {
  const Tensor q = random_tensor(b, h, nq, dk, seed);
  const Tensor k = random_tensor(b, h, nk, dk, seed + 1);
  const Tensor v = random_tensor(b, h, nk, dv, seed + 2);
  INFO("B=" << b << " H=" << h << " Nq=" << nq << " Nk=" << nk << " Dk=" << dk << " Dv=" << dv
            << " causal=" << causal_name(mask.causal) << " key_lengths=" << mask.has_key_lengths()
            << " bool=" << mask.has_allowed());
  require_close(full->forward(q, k, v, mask), reference_attention(q, k, v, mask), kRtol, kAtol);
}

xt::xtensor<bool, 2> random_bool_mask(std::size_t nq, std::size_t nk, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  xt::xtensor<bool, 2> m = xt::xtensor<bool, 2>::from_shape({nq, nk});
  for (auto&& x : m) x = (rng() % 4) != 0;  // about a quarter of the pairs masked
  return m;
}

}  // namespace

TEST_CASE("full equals the fp64 reference over many lengths", "[exact]") {
  // Primes, tile edges (48 queries, 128 keys) and their neighbours, up to 2000.
  for (std::size_t n : {1, 2, 3, 5, 7, 13, 47, 48, 49, 97, 127, 128, 129, 257, 1009, 2000}) {
    check_against_reference(1, 2, n, n, 16, 16, {}, n);
    Mask causal;
    causal.causal = Causal::top_left;
    check_against_reference(1, 2, n, n, 16, 16, causal, n + 7);
  }
  check_against_reference(1, 1, 2000, 2000, 64, 64, {}, 99);
}

TEST_CASE("full handles cross-attention and Dv != Dk under every mask kind", "[exact]") {
  const std::pair<std::size_t, std::size_t> lengths[] = {{1, 7},    {7, 1},     {37, 211},
                                                         {211, 37}, {100, 100}, {129, 300}};
  for (auto [nq, nk] : lengths) {
    for (Causal c : {Causal::none, Causal::top_left, Causal::bottom_right}) {
      Mask mask;
      mask.causal = c;
      check_against_reference(2, 3, nq, nk, 24, 40, mask, nq * 31 + nk);

      mask.key_lengths = {static_cast<std::int64_t>(nk), static_cast<std::int64_t>(nk / 2)};
      check_against_reference(2, 3, nq, nk, 24, 8, mask, nq * 17 + nk);

      Mask with_bool = mask;
      with_bool.allow(random_bool_mask(nq, nk, nq + nk));
      check_against_reference(2, 3, nq, nk, 8, 24, with_bool, nq + 3 * nk);
    }
  }
}

TEST_CASE("full honours a per-head boolean mask and an explicit scale", "[exact]") {
  std::mt19937_64 rng(5);
  Mask mask;
  mask.allowed = xt::xtensor<bool, 4>::from_shape({2, 3, 50, 70});
  for (auto&& x : mask.allowed) x = rng() % 3 != 0;
  mask.scale = 0.37;
  check_against_reference(2, 3, 50, 70, 16, 16, mask, 11);
}

TEST_CASE("full: three tokens checked by hand", "[exact]") {
  // The worked example of the seed notes: the sentence 我 是 谁 embedded as a 3 x 4 matrix X,
  // with Q = K = V = X (identity projections) and scale 1/sqrt(4) = 1/2:
  //   x1 = [1,0,1,0]  x2 = [0,2,0,2]  x3 = [1,1,1,1]
  //   X X^T / 2 = [[1,0,1],[0,4,2],[1,2,2]]
  //   row 1: softmax([1,0,1]) = [e, 1, e] / (2e + 1)
  //          out = (e x1 + x2 + e x3) / (2e + 1) = [2e, 2 + e, 2e, 2 + e] / (2e + 1)
  //   row 2: softmax([0,4,2]) = [1, e^4, e^2] / (1 + e^4 + e^2)
  //          out = [1 + e^2, 2e^4 + e^2, 1 + e^2, 2e^4 + e^2] / (1 + e^4 + e^2)
  //   row 3: softmax([1,2,2]) = [e, e^2, e^2] / (e + 2e^2)
  //          out = [e + e^2, 3e^2, e + e^2, 3e^2] / (e + 2e^2)
  Tensor x = {{{{1, 0, 1, 0}, {0, 2, 0, 2}, {1, 1, 1, 1}}}};
  const double e = std::exp(1.0), e2 = e * e, e4 = e2 * e2;
  const double r1 = 2 * e + 1, r2 = 1 + e4 + e2, r3 = e + 2 * e2;
  Tensor64 expected = {{{{2 * e / r1, (2 + e) / r1, 2 * e / r1, (2 + e) / r1},
                         {(1 + e2) / r2, (2 * e4 + e2) / r2, (1 + e2) / r2, (2 * e4 + e2) / r2},
                         {(e + e2) / r3, 3 * e2 / r3, (e + e2) / r3, 3 * e2 / r3}}}};
  require_close(full->forward(x, x, x), expected, 1e-6, 1e-6);
  // Row 1 numerically: 2e/(2e+1) = 0.844637, (2+e)/(2e+1) = 0.733046.
  CHECK(full->forward(x, x, x)(0, 0, 0, 0) == Approx(0.844637).epsilon(1e-5));
}

TEST_CASE("attention rows are probability distributions", "[exact]") {
  // With V = identity the output is the attention matrix itself.
  const std::size_t n = 67;
  const Tensor q = random_tensor(1, 2, n, 16, 1, 2.0f), k = random_tensor(1, 2, n, 16, 2, 2.0f);
  Tensor eye = xt::zeros<float>({1ul, 2ul, n, n});
  for (std::size_t h = 0; h < 2; ++h)
    for (std::size_t i = 0; i < n; ++i) eye(0, h, i, i) = 1.0f;
  for (Causal c : {Causal::none, Causal::top_left}) {
    Mask mask;
    mask.causal = c;
    mask.key_lengths = {50};
    const Tensor p = full->forward(q, k, eye, mask);
    for (std::size_t h = 0; h < 2; ++h)
      for (std::size_t i = 0; i < n; ++i) {
        double total = 0;
        for (std::size_t j = 0; j < n; ++j) {
          REQUIRE(p(0, h, i, j) >= 0.0f);
          if (j >= mask.visible_keys(0, i, check_qkv(q, k, eye))) REQUIRE(p(0, h, i, j) == 0.0f);
          total += p(0, h, i, j);
        }
        REQUIRE(total == Approx(1.0).epsilon(1e-5));
      }
  }
}

TEST_CASE("permuting keys together with their values leaves the output unchanged", "[exact]") {
  const std::size_t n = 150;
  const Tensor q = random_tensor(1, 2, 40, 16, 3), k = random_tensor(1, 2, n, 16, 4),
               v = random_tensor(1, 2, n, 24, 5);
  std::vector<std::size_t> perm(n);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937_64(6));
  Tensor kp = k, vp = v;
  for (std::size_t h = 0; h < 2; ++h)
    for (std::size_t j = 0; j < n; ++j) {
      xt::view(kp, 0, h, j, xt::all()) = xt::view(k, 0, h, perm[j], xt::all());
      xt::view(vp, 0, h, j, xt::all()) = xt::view(v, 0, h, perm[j], xt::all());
    }
  // Summation order changes, so equal to rounding only.
  REQUIRE(xt::allclose(full->forward(q, k, v), full->forward(q, kp, vp), 1e-5, 1e-6));
}

TEST_CASE("under a causal mask a later key or value never changes an earlier output", "[exact]") {
  const std::size_t n = 300, t = 173;
  const Tensor q = random_tensor(1, 2, n, 16, 7), k = random_tensor(1, 2, n, 16, 8),
               v = random_tensor(1, 2, n, 16, 9);
  Mask mask;
  mask.causal = Causal::top_left;
  const Tensor before = full->forward(q, k, v, mask);
  Tensor k2 = k, v2 = v;
  xt::view(k2, xt::all(), xt::all(), t, xt::all()) += 3.0f;
  xt::view(v2, xt::all(), xt::all(), t, xt::all()) -= 5.0f;
  const Tensor after = full->forward(q, k2, v2, mask);
  // Masked keys get probability exactly 0, so earlier rows are bitwise equal.
  REQUIRE((xt::view(before, xt::all(), xt::all(), xt::range(0, t), xt::all()) ==
           xt::view(after, xt::all(), xt::all(), xt::range(0, t), xt::all())));
  REQUIRE((xt::view(before, xt::all(), xt::all(), t, xt::all()) !=
           xt::view(after, xt::all(), xt::all(), t, xt::all())));
}

TEST_CASE("scores are symmetric exactly when W_Q = W_K", "[exact]") {
  // The first insight of the seed essay: q_i . k_j = x_i W_Q W_K^T x_j is symmetric in (i, j)
  // only when W_Q W_K^T is. We read the scores back through attention itself: with V = I the
  // output is P, and log P_ij - log P_ji = scale (S_ij - S_ji) + lse_j - lse_i, so the cycle
  // sum over (i, j, k) of that difference is scale * the cycle sum of S_ij - S_ji: zero for
  // every triple iff S is symmetric.
  const std::size_t n = 12, d_model = 16, dk = 8;
  const xt::xtensor<double, 2> x =
      xt::cast<double>(xt::view(random_tensor(1, 1, n, d_model, 1), 0, 0));
  const xt::xtensor<double, 2> wq =
      xt::cast<double>(xt::view(random_tensor(1, 1, d_model, dk, 2, 0.25f), 0, 0));
  const xt::xtensor<double, 2> wk =
      xt::cast<double>(xt::view(random_tensor(1, 1, d_model, dk, 3, 0.25f), 0, 0));
  Tensor eye = xt::zeros<float>({1ul, 1ul, n, n});
  for (std::size_t i = 0; i < n; ++i) eye(0, 0, i, i) = 1.0f;
  auto max_cycle = [&](const xt::xtensor<double, 2>& a, const xt::xtensor<double, 2>& b) {
    Tensor q = Tensor::from_shape({1, 1, n, dk}), k = Tensor::from_shape({1, 1, n, dk});
    xt::view(q, 0, 0) = xt::cast<float>(xt::linalg::dot(x, a));
    xt::view(k, 0, 0) = xt::cast<float>(xt::linalg::dot(x, b));
    const Tensor p = full->forward(q, k, eye);
    auto asym = [&](std::size_t i, std::size_t j) {
      return std::log(double(p(0, 0, i, j))) - std::log(double(p(0, 0, j, i)));
    };
    double worst = 0;
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < n; ++j)
        for (std::size_t l = 0; l < n; ++l)
          worst = std::max(worst, std::abs(asym(i, j) + asym(j, l) + asym(l, i)));
    return worst;
  };
  CHECK(max_cycle(wq, wq) < 1e-4);  // symmetric: only float rounding (measured ~1e-6)
  CHECK(max_cycle(wq, wk) > 1.0);   // distinct projections: measured ~10
}

TEST_CASE("full is numerically safe", "[exact]") {
  SECTION("logits of +-1e4 give no NaN or Inf") {
    Tensor q = random_tensor(1, 2, 100, 8, 1), k = random_tensor(1, 2, 100, 8, 2);
    const Tensor v = random_tensor(1, 2, 100, 8, 3);
    q *= 100.0f;  // |q . k| * scale reaches ~1e4
    k *= 100.0f;
    Mask mask;
    const Tensor out = full->forward(q, k, v, mask);
    REQUIRE(xt::all(xt::isfinite(out)));
    require_close(out, reference_attention(q, k, v, mask), kRtol, kAtol);
  }
  SECTION("a query that sees no key returns zeros") {
    const Tensor q = random_tensor(2, 1, 5, 8, 1), k = random_tensor(2, 1, 3, 8, 2),
                 v = random_tensor(2, 1, 3, 8, 3);
    Mask mask;
    mask.causal = Causal::bottom_right;  // Nq = 5 > Nk = 3: queries 0 and 1 see nothing
    mask.key_lengths = {3, 0};           // item 1 has no keys at all
    const Tensor out = full->forward(q, k, v, mask);
    REQUIRE(xt::all(xt::equal(xt::view(out, 0, 0, xt::range(0, 2)), 0.0f)));
    REQUIRE(xt::all(xt::equal(xt::view(out, 1), 0.0f)));
    REQUIRE(xt::any(xt::not_equal(xt::view(out, 0, 0, 2), 0.0f)));
    require_close(out, reference_attention(q, k, v, mask), kRtol, kAtol);
  }
}
