// Linformer: the exact reduction (k = N, identity projections) against our full attention, the
// general setting against an explicitly projected float64 reference, the projection matrices'
// sharing and distributions, learned matrices, key padding, refusals and bad parameters.
#include <algorithm>
#include <cmath>
#include <numbers>

#include <xtensor/xview.hpp>

#include "helpers.hpp"
#include "variants/linformer.hpp"

using namespace attnlab;
using attnlab::test::random_tensor;
using attnlab::test::require_close;
using attnlab::test::require_error;

namespace {

std::unique_ptr<LinformerAttention> make(const std::string& spec) {
  auto a = make_attention(spec);
  auto* l = dynamic_cast<LinformerAttention*>(a.get());
  REQUIRE(l != nullptr);
  a.release();
  return std::unique_ptr<LinformerAttention>(l);
}

// The definition, written out in float64 and independent of the kernel: per (b, h),
// K' = E_h[:, :n] K[:n], V' = F_h[:, :n] V[:n] with n the unpadded length, then
// softmax(Q K'^T scale) V' over all k projected rows.
Tensor64 projected_reference(const Tensor& q, const Tensor& k, const Tensor& v,
                             const LinformerAttention& a, const Mask& mask) {
  const std::size_t B = q.shape()[0], H = q.shape()[1], nq = q.shape()[2], nk = k.shape()[2],
                    dk = q.shape()[3], dv = v.shape()[3], rows = a.k();
  const double scale = mask.softmax_scale(dk);
  Tensor64 out = xt::zeros<double>({B, H, nq, dv});
  for (std::size_t b = 0; b < B; ++b) {
    const std::size_t n =
        mask.has_key_lengths() ? static_cast<std::size_t>(mask.key_lengths[b]) : nk;
    for (std::size_t h = 0; h < H; ++h) {
      const auto e = a.projection('E', h, nk), f = a.projection('F', h, nk);
      xt::xtensor<double, 2> kp = xt::zeros<double>({rows, dk}), vp = xt::zeros<double>({rows, dv});
      for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t j = 0; j < n; ++j) {
          for (std::size_t c = 0; c < dk; ++c) kp(r, c) += double(e(r, j)) * k(b, h, j, c);
          for (std::size_t c = 0; c < dv; ++c) vp(r, c) += double(f(r, j)) * v(b, h, j, c);
        }
      std::vector<double> s(rows);
      for (std::size_t i = 0; i < nq; ++i) {
        double top = -INFINITY, sum = 0;
        for (std::size_t r = 0; r < rows; ++r) {
          double dot = 0;
          for (std::size_t c = 0; c < dk; ++c) dot += double(q(b, h, i, c)) * kp(r, c);
          top = std::max(top, s[r] = dot * scale);
        }
        for (double& x : s) sum += x = std::exp(x - top);
        for (std::size_t r = 0; r < rows; ++r)
          for (std::size_t c = 0; c < dv; ++c) out(b, h, i, c) += s[r] / sum * vp(r, c);
      }
    }
  }
  return out;
}

// fp32 kernel against the fp64 definition. The projections sum up to ~1000 products (rounding
// ~1e-7 relative each, and gaussian E makes K' entries ~sqrt(N/k) larger than K's, so logits
// grow too), then the full kernel adds its own ~1e-6. Measured worst |error| / max|ref| over
// these cases: 2.7e-6; the bound leaves a margin of ~10x.
void check_projected(const std::string& spec, std::size_t b, std::size_t h, std::size_t nq,
                     std::size_t nk, std::size_t dk, std::size_t dv, const Mask& mask,
                     std::uint64_t seed) {
  const auto a = make(spec);
  const Tensor q = random_tensor(b, h, nq, dk, seed), k = random_tensor(b, h, nk, dk, seed + 1),
               v = random_tensor(b, h, nk, dv, seed + 2);
  INFO(spec << " B=" << b << " H=" << h << " Nq=" << nq << " Nk=" << nk << " Dk=" << dk
            << " Dv=" << dv << " padded=" << mask.has_key_lengths());
  const Tensor64 ref = projected_reference(q, k, v, *a, mask);
  const double peak = std::max(1e-30, xt::amax(xt::abs(ref))());
  require_close(a->forward(q, k, v, mask), ref, 1e-4, 3e-5 * peak);
}

// Sequences that vary slowly along the positions: what a low-rank projection can keep.
Tensor smooth_tensor(std::size_t h, std::size_t n, std::size_t d, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> freq(1, 3);
  std::uniform_real_distribution<double> phase(0, 2 * std::numbers::pi);
  Tensor t = Tensor::from_shape({1, h, n, d});
  for (std::size_t hh = 0; hh < h; ++hh)
    for (std::size_t c = 0; c < d; ++c) {
      const double f = freq(rng), p = phase(rng);
      for (std::size_t i = 0; i < n; ++i)
        t(0, hh, i, c) = static_cast<float>(2 * std::sin(2 * std::numbers::pi * f * i / n + p));
    }
  return t;
}

}  // namespace

TEST_CASE("linformer with k = N and identity projections equals full attention", "[linformer]") {
  const auto full = make_attention("full");
  for (std::size_t n : {1, 2, 7, 47, 48, 49, 64, 127, 129, 300}) {
    INFO("N = " << n);
    const auto a = make_attention("linformer:k=" + std::to_string(n) +
                                  ",init=identity,max_len=" + std::to_string(n + 13));
    const Tensor q = random_tensor(2, 3, n, 16, n), k = random_tensor(2, 3, n, 16, n + 1),
                 v = random_tensor(2, 3, n, 16, n + 2);
    // K' = [I | 0] K is exact in fp32 (products by 1 and sums of exact zeros), so both run the
    // same kernel on the same numbers: the tolerance only guards against summation order.
    require_close(a->forward(q, k, v), xt::cast<double>(full->forward(q, k, v)), 1e-6, 1e-7);
  }
  // Cross-attention, Dv != Dk and an explicit scale reduce the same way.
  const auto a = make_attention("linformer:k=37,init=identity,max_len=40,share=layer");
  const Tensor q = random_tensor(2, 2, 101, 24, 1), k = random_tensor(2, 2, 37, 24, 2),
               v = random_tensor(2, 2, 37, 8, 3);
  Mask m;
  m.scale = 0.31;
  require_close(a->forward(q, k, v, m), xt::cast<double>(full->forward(q, k, v, m)), 1e-6, 1e-7);
}

TEST_CASE("linformer equals the explicitly projected fp64 reference", "[linformer]") {
  // Primes, the full kernel's tile edges (48 queries, 128 keys) and their neighbours.
  for (std::size_t n : {1, 2, 3, 5, 13, 47, 48, 49, 97, 128, 129, 257, 1009}) {
    for (std::size_t k : {1, 7, 32, 64}) {
      const std::string spec =
          "linformer:k=" + std::to_string(k) + ",max_len=1100,seed=" + std::to_string(n);
      check_projected(spec, 1, 2, n, n, 16, 16, {}, n * 7 + k);
    }
  }
}

TEST_CASE("linformer: every share and init mode, padding, cross-attention, Dv != Dk",
          "[linformer]") {
  const std::pair<std::size_t, std::size_t> lengths[] = {{1, 7},    {7, 1},     {37, 211},
                                                         {211, 37}, {100, 100}, {129, 300}};
  for (const char* share : {"none", "kv", "layer"}) {
    for (const char* init : {"gaussian", "xavier", "identity"}) {
      for (auto [nq, nk] : lengths) {
        const std::string spec =
            std::string("linformer:k=24,max_len=300,share=") + share + ",init=" + init + ",seed=3";
        check_projected(spec, 2, 3, nq, nk, 24, 40, {}, nq * 31 + nk);
        Mask padded;
        padded.key_lengths = {static_cast<std::int64_t>(nk), static_cast<std::int64_t>(nk / 2)};
        check_projected(spec, 2, 3, nq, nk, 16, 8, padded, nq * 17 + nk);
      }
    }
  }
}

TEST_CASE("linformer zeroes padded keys and values before projecting", "[linformer]") {
  const auto a = make_attention("linformer:k=16,max_len=64");
  const Tensor q = random_tensor(2, 2, 20, 8, 1);
  Tensor k = random_tensor(2, 2, 50, 8, 2), v = random_tensor(2, 2, 50, 8, 3);
  Mask m;
  m.key_lengths = {30, 0};
  const Tensor before = a->forward(q, k, v, m);
  // What lies in the padding cannot matter at all.
  xt::view(k, xt::all(), xt::all(), xt::range(30, 50), xt::all()) = 1e6f;
  xt::view(v, xt::all(), xt::all(), xt::range(30, 50), xt::all()) = -1e6f;
  CHECK((a->forward(q, k, v, m) == before));
  // An item with no valid key projects to zero keys and values: its output is zero.
  CHECK(xt::all(xt::equal(xt::view(before, 1), 0.0f)));
}

TEST_CASE("linformer shares matrices as its spec says", "[linformer]") {
  const auto none = make("linformer:k=8,max_len=32,share=none");
  const auto kv = make("linformer:k=8,max_len=32,share=kv");
  const auto layer = make("linformer:k=8,max_len=32,share=layer");
  CHECK_FALSE((none->projection('E', 0, 32) == none->projection('F', 0, 32)));
  CHECK_FALSE((none->projection('E', 0, 32) == none->projection('E', 1, 32)));
  CHECK((kv->projection('E', 1, 32) == kv->projection('F', 1, 32)));
  CHECK_FALSE((kv->projection('E', 0, 32) == kv->projection('E', 1, 32)));
  CHECK((layer->projection('E', 0, 32) == layer->projection('F', 3, 32)));
  // Columns are drawn in order and never depend on the sequence length that asked for them.
  const auto fresh = make("linformer:k=8,max_len=32,share=none");
  const auto first = fresh->projection('E', 1, 5);
  CHECK((xt::view(none->projection('E', 1, 32), xt::all(), xt::range(0, 5)) == first));
  // The seed is the only source of randomness.
  const auto other = make("linformer:k=8,max_len=32,share=none,seed=1");
  CHECK_FALSE((other->projection('E', 0, 32) == none->projection('E', 0, 32)));
  const Tensor x = random_tensor(1, 2, 20, 8, 4);
  CHECK((none->forward(x, x, x) == make("linformer:k=8,max_len=32")->forward(x, x, x)));
}

TEST_CASE("linformer draws E and F from the documented distributions", "[linformer]") {
  const std::size_t k = 64, m = 4096;
  const auto g = make("linformer:k=64,max_len=4096,init=gaussian,seed=5")->projection('E', 0, m);
  const double n = double(k * m);
  const double mean = xt::sum(g)() / n, var = xt::sum(xt::square(g))() / n - mean * mean;
  CHECK(std::abs(mean) < 1e-3);                 // std of the mean: 0.125 / 512 = 2.4e-4
  CHECK(var == Approx(1.0 / k).epsilon(0.02));  // N(0, 1/k); relative std of var: 0.3%

  const auto x = make("linformer:k=64,max_len=4096,init=xavier,seed=5")->projection('F', 2, m);
  const double a = std::sqrt(6.0 / double(k + m));
  CHECK(xt::amax(xt::abs(x))() <= a);
  CHECK(xt::sum(xt::square(x))() / n == Approx(a * a / 3).epsilon(0.02));  // U(-a, a)

  const auto id = make("linformer:k=5,max_len=9,init=identity")->projection('E', 0, 9);
  xt::xtensor<float, 2> expected = xt::zeros<float>({5, 9});
  for (std::size_t i = 0; i < 5; ++i) expected(i, i) = 1;
  CHECK((id == expected));
}

TEST_CASE("linformer uses learned matrices given through the API", "[linformer]") {
  const auto a = make("linformer:k=6,max_len=40");
  std::mt19937_64 rng(9);
  std::normal_distribution<float> normal(0, 0.5f);
  xt::xarray<float> e = xt::xarray<float>::from_shape({3, 6, 40}), f = e;
  for (float& x : e) x = normal(rng);
  for (float& x : f) x = normal(rng);
  a->set_projections(e, f);
  CHECK(a->spec() == "linformer:k=6,share=none,init=supplied,max_len=40,seed=0");
  CHECK((a->projection('F', 2, 40) == xt::view(f, 2)));
  const Tensor q = random_tensor(2, 3, 11, 8, 1), k = random_tensor(2, 3, 33, 8, 2),
               v = random_tensor(2, 3, 33, 8, 3);
  Mask m;
  m.key_lengths = {33, 20};
  const Tensor64 ref = projected_reference(q, k, v, *a, m);
  require_close(a->forward(q, k, v, m), ref, 1e-4, 3e-5 * xt::amax(xt::abs(ref))());
  require_error<Error>(
      [&] {
        a->forward(random_tensor(1, 2, 5, 8, 1), random_tensor(1, 2, 5, 8, 2),
                   random_tensor(1, 2, 5, 8, 3));
      },
      {"3 heads", "input has 2"});

  // One [k, max_len] pair is shared by every head.
  const xt::xarray<float> shared = xt::view(e, 0);
  a->set_projections(shared, shared);
  CHECK((a->projection('E', 5, 40) == shared));
  CHECK((a->projection('F', 0, 40) == shared));

  require_error<Error>(
      [&] {
        a->set_projections(xt::zeros<float>({6, 39}), shared);
      },
      {"E has shape [6, 39]", "[6, 40]"});
  require_error<Error>(
      [&] {
        a->set_projections(shared, xt::zeros<float>({2, 5, 40}));
      },
      {"F has shape [2, 5, 40]"});
  require_error<Error>(
      [&] {
        a->set_projections(shared, xt::zeros<float>({1, 6, 40}));
      },
      {"E has shape [6, 40] but F has shape [1, 6, 40]"});
  xt::xarray<float> bad = shared;
  bad(1, 1) = NAN;
  require_error<Error>([&] { a->set_projections(shared, bad); }, {"F", "non-finite"});
  require_error<Error>([] { make_attention("linformer:init=supplied"); },
                       {"init=supplied", "set_projections", "--E"});
}

TEST_CASE("linformer error does not grow with k on smooth sequences", "[linformer]") {
  // Keys and values that vary slowly along the sequence (a few sine periods), N = 256, two heads
  // with their own gaussian E, F. rel_fro against full attention, measured:
  //   k = 8: 9.34, 16: 6.34, 32: 4.52, 64: 2.51, 128: 1.42, 256: 1.01.
  // Gaussian V' = F V has entries ~sqrt(N/k) times V's, which is why the error exceeds 1 and
  // stays near 1 even at k = N (a random rotation is not the identity): the paper's JL argument
  // bounds P E^T F V, not softmax(Q (E K)^T) F V, so only trained E, F approximate well.
  // Identity projections (the first k tokens) reach full attention at k = N, measured:
  //   k = 8: 2.116, 16: 2.118, 32: 2.05, 64: 1.67, 128: 1.16, 256: 3.2e-7.
  const std::size_t n = 256;
  const Tensor q = random_tensor(1, 2, n, 32, 1), k = smooth_tensor(2, n, 32, 2),
               v = smooth_tensor(2, n, 32, 3);
  const Tensor64 ref = reference_attention(q, k, v, Mask{});
  for (const char* init : {"gaussian", "identity"}) {
    double previous = INFINITY;
    for (std::size_t rows : {8, 16, 32, 64, 128, 256}) {
      const double err = compare(make_attention("linformer:max_len=256,k=" + std::to_string(rows) +
                                                ",init=" + init)
                                     ->forward(q, k, v),
                                 ref)
                             .rel_fro;
      INFO(init << " k = " << rows << ": rel_fro " << err);
      CHECK(err <= previous * 1.02);  // 2%: seeds differ per k, allow a hair of noise
      previous = err;
    }
    if (std::string(init) == "identity")
      CHECK(previous < 1e-6);
    else
      CHECK(previous < 2.0);
  }
}

TEST_CASE("linformer refuses causal and boolean masks, saying why", "[linformer]") {
  const auto a = make_attention("linformer:k=8,max_len=64");
  const Tensor x = random_tensor(1, 2, 16, 8, 1);
  for (Causal c : {Causal::top_left, Causal::bottom_right}) {
    Mask m;
    m.causal = c;
    require_error<Unsupported>([&] { a->forward(x, x, x, m); }, {"linformer", "causal", "future"});
    require_error<Unsupported>([&] { a->forward(random_tensor(1, 2, 9, 8, 1), x, x, m); },
                               {"linformer", "causal", "future"});
  }
  Mask m;
  m.allow(xt::ones<bool>({16ul, 16ul}));
  require_error<Unsupported>([&] { a->forward(x, x, x, m); },
                             {"linformer", "boolean masks", "projected keys"});
}

TEST_CASE("linformer rejects bad parameters, naming them", "[linformer]") {
  require_error<Error>([] { make_attention("linformer:k=0"); }, {"k=0", "at least 1"});
  require_error<Error>([] { make_attention("linformer:k=-3"); }, {"k=-3", "at least 1"});
  require_error<Error>([] { make_attention("linformer:max_len=0"); }, {"max_len=0", "at least 1"});
  require_error<Error>([] { make_attention("linformer:k=300,max_len=200"); },
                       {"k=300", "max_len = 200"});
  require_error<Error>([] { make_attention("linformer:share=head"); },
                       {"share=head", "none|kv|layer"});
  require_error<Error>([] { make_attention("linformer:init=orthogonal"); },
                       {"init=orthogonal", "gaussian|xavier|identity"});
  require_error<Error>([] { make_attention("linformer:seed=-1"); }, {"seed=-1", ">= 0"});
  require_error<Error>([] { make_attention("linformer:k=12x"); }, {"k=12x", "integer"});
  require_error<Error>([] { make_attention("linformer:window=3"); }, {"window=3", "unknown key"});
  // N > max_len is only known at the call.
  const auto a = make_attention("linformer:k=4,max_len=10");
  const Tensor x = random_tensor(1, 1, 11, 8, 1);
  require_error<Error>([&] { a->forward(x, x, x); }, {"Nk = 11", "max_len = 10"});
  CHECK_NOTHROW(a->forward(random_tensor(1, 1, 30, 8, 1), random_tensor(1, 1, 10, 8, 2),
                           random_tensor(1, 1, 10, 8, 3)));  // Nq is not limited
  // The constructor checks the same constraints for API users.
  using L = LinformerAttention;
  require_error<Error>([] { L(0, L::Share::none, L::Init::gaussian, 8, 0); }, {"k = 0"});
  require_error<Error>([] { L(9, L::Share::none, L::Init::gaussian, 8, 0); },
                       {"k = 9", "max_len = 8"});
  require_error<Error>([] { L(1, L::Share::none, L::Init::gaussian, 0, 0); }, {"max_len = 0"});
}

TEST_CASE("linformer specs round-trip", "[linformer]") {
  const auto a = make_attention("linformer: seed=7, init=xavier, k=12, share=kv, max_len=99");
  CHECK(a->spec() == "linformer:k=12,share=kv,init=xavier,max_len=99,seed=7");
  CHECK(make_attention(a->spec())->spec() == a->spec());
  CHECK(make_attention("linformer")->spec() ==
        "linformer:k=256,share=none,init=gaussian,max_len=4096,seed=0");
  // flops: projections 2·k·(Dk + Dv) per key, attention the same per query, per head.
  const Dims d{2, 3, 10, 20, 8, 4};
  Mask m;
  m.key_lengths = {20, 5};
  CHECK(a->flops(d, {}) == Approx(2.0 * 12 * 12 * 3 * (40 + 20)));
  CHECK(a->flops(d, m) == Approx(2.0 * 12 * 12 * 3 * (25 + 20)));
}
