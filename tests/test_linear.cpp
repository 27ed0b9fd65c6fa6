// Linear attention: every O(N) kernel against its O(N^2) fp64 form (the feature-map kernel
// matrix, or for the delta rule the fast-weight recurrence written out in fp64), the recurrent
// state against the causal batch, FAVOR+ converging to softmax, the delta rule as a memory, and
// the refusals.
#include <cmath>
#include <limits>

#include <xtensor/xview.hpp>

#include "helpers.hpp"
#include "variants/linear.hpp"
#include "variants/recurrence_reference.hpp"

using namespace attnlab;
using attnlab::test::random_tensor;
using attnlab::test::require_close;
using attnlab::test::require_error;

namespace {

// fp32 kernels against fp64 references. All features are non-negative, so numerators and
// denominators are sums of non-negative terms accurate to ~1e-7 relative each; favor adds
// float exp2 (~1e-8) and log-features of size ~10 rounded at ~1e-6 absolute. The delta rule
// carries rounding through up to 150 sequential writes. Measured over the many-N and cross cases
// below: worst absolute difference 1.1e-6 on outputs of size ~1, so these bounds keep a margin of
// about 20x.
constexpr double kRtol = 2e-4, kAtol = 2e-5;

const char* kSpecs[] = {
    "linear",
    "linear:feature=relu",
    "linear:feature=favor,m=32,seed=3",
    "linear:feature=dpfp,nu=2",
    "linear:rule=delta",
    "linear:feature=favor,m=24,rule=delta,beta=0.7",
    "linear:feature=dpfp,nu=3,rule=delta,beta=0.5",
    "linear:feature=relu,rule=delta,eps=0",
    "linear:feature=taylor",
    "linear:feature=taylor,taylor_dim=3,seed=2",
    "linear:feature=taylor,taylor_dim=5,eps=0",
};

void check_spec(const std::string& spec, std::size_t nq, std::size_t nk, std::size_t dk,
                std::size_t dv, const Mask& mask, std::uint64_t seed) {
  const auto a = make_attention(spec);
  const Tensor q = random_tensor(2, 2, nq, dk, seed), k = random_tensor(2, 2, nk, dk, seed + 1),
               v = random_tensor(2, 2, nk, dv, seed + 2);
  INFO(spec << " Nq=" << nq << " Nk=" << nk << " Dk=" << dk << " Dv=" << dv
            << " causal=" << causal_name(mask.causal) << " padded=" << mask.has_key_lengths());
  require_close(a->forward(q, k, v, mask), own_reference(*a, q, k, v, mask, {}), kRtol, kAtol);
}

}  // namespace

TEST_CASE("linear: every O(N) form equals its O(N^2) fp64 form over many N", "[linear]") {
  // Around the 48-token chunk edges, and past them.
  for (const char* spec : kSpecs)
    for (std::size_t n : {1, 2, 5, 47, 48, 49, 97, 150}) {
      Mask plain, causal;
      causal.causal = Causal::top_left;
      check_spec(spec, n, n, 8, 8, plain, n);
      check_spec(spec, n, n, 8, 8, causal, n + 100);
      Mask padded = causal;  // padded keys write nothing
      padded.key_lengths = {std::int64_t(n), std::int64_t(n / 2)};
      check_spec(spec, n, n, 8, 12, padded, n + 200);
      padded.causal = Causal::none;
      check_spec(spec, n, n, 8, 12, padded, n + 300);
    }
}

TEST_CASE("linear: cross-attention and Dv != Dk for the non-causal forms", "[linear]") {
  for (const char* spec : kSpecs)
    for (auto [nq, nk] :
         {std::pair<std::size_t, std::size_t>{1, 7}, {7, 1}, {37, 130}, {130, 37}}) {
      Mask mask;
      check_spec(spec, nq, nk, 6, 10, mask, nq * 7 + nk);
      mask.key_lengths = {std::int64_t(nk), std::int64_t((nk + 1) / 2)};
      mask.scale = 0.3;
      check_spec(spec, nq, nk, 6, 10, mask, nq * 5 + nk);
    }
}

TEST_CASE("linear: favor stays finite and exact when key norms differ wildly", "[linear]") {
  // Keys 0 and 60 are 20x longer than the rest: their log-features sit hundreds below the
  // others', so the running stabiliser jumps inside a chunk (the direct path) and float
  // features of those keys underflow to zero where the fp64 weights are ~e^-400 anyway.
  const std::string spec = "linear:feature=favor,m=32,seed=9";
  Tensor q = random_tensor(1, 2, 100, 8, 1), k = random_tensor(1, 2, 100, 8, 2);
  const Tensor v = random_tensor(1, 2, 100, 8, 3);
  xt::view(k, xt::all(), xt::all(), 0, xt::all()) *= 20.0f;
  xt::view(k, xt::all(), xt::all(), 60, xt::all()) *= 20.0f;
  Mask causal;
  causal.causal = Causal::top_left;
  const Tensor out = make_attention(spec)->forward(q, k, v, causal);
  REQUIRE(xt::all(xt::isfinite(out)));
  require_close(out, own_reference(*make_attention(spec), q, k, v, causal, {}), kRtol, kAtol);
  // Row 0 sees only key 0, so it is v_0 up to eps relative to its one kernel value.
  CHECK(out(0, 1, 0, 3) == Approx(v(0, 1, 0, 3)).epsilon(1e-4));
}

TEST_CASE("linear: padded keys and values are never read", "[linear]") {
  for (const char* spec : kSpecs)
    for (Causal c : {Causal::none, Causal::top_left}) {
      INFO(spec << " causal=" << causal_name(c));
      const auto a = make_attention(spec);
      const Tensor q = random_tensor(1, 2, 70, 8, 4), k = random_tensor(1, 2, 70, 8, 5),
                   v = random_tensor(1, 2, 70, 8, 6);
      Mask mask;
      mask.causal = c;
      mask.key_lengths = {50};
      Tensor k2 = k, v2 = v;
      const float nan = std::numeric_limits<float>::quiet_NaN();
      xt::view(k2, xt::all(), xt::all(), xt::range(50, 70), xt::all()) = nan;
      xt::view(v2, xt::all(), xt::all(), xt::range(50, 70), xt::all()) = nan;
      // Same arithmetic on the same valid keys: bitwise equal.
      CHECK((a->forward(q, k, v, mask) == a->forward(q, k2, v2, mask)));
    }
}

TEST_CASE("linear: the recurrent decoder reproduces the causal batch output", "[linear]") {
  for (const char* spec : kSpecs) {
    INFO(spec);
    const auto a = make_attention(spec);
    const std::size_t n = 110;  // three chunks, the last one partial
    const Tensor q = random_tensor(2, 3, n, 8, 7), k = random_tensor(2, 3, n, 8, 8),
                 v = random_tensor(2, 3, n, 5, 9);
    Mask causal;
    causal.causal = Causal::top_left;
    const Tensor batch = a->forward(q, k, v, causal);
    const auto decoder = a->start_decoding({2, 3, 8, 5});
    Tensor stepped = Tensor::from_shape({2, 3, n, 5});
    for (std::size_t t = 0; t < n; ++t) {
      auto row = [t](const Tensor& x) -> Tensor {
        return xt::view(x, xt::all(), xt::all(), xt::range(t, t + 1), xt::all());
      };
      CHECK(decoder->tokens() == t);
      xt::view(stepped, xt::all(), xt::all(), xt::range(t, t + 1), xt::all()) =
          decoder->step(row(q), row(k), row(v));
    }
    // Same sums in another order (chunked products against per-token updates): equal to
    // float rounding, not bitwise.
    require_close(stepped, xt::cast<double>(batch), 1e-4, 1e-5);
  }
  const auto decoder = make_attention("linear")->start_decoding({1, 2, 4, 4});
  const Tensor x = random_tensor(1, 2, 1, 4, 1);
  require_error<Error>([&] { decoder->step(x, x, random_tensor(1, 2, 2, 4, 1)); },
                       {"v", "[1, 2, 2, 4]", "[1, 2, 1, 4]"});
}

TEST_CASE("linear: FAVOR+ error against softmax falls as m grows", "[linear]") {
  // Dk = 16, N = 256, q and k N(0, 0.5^2) (logits q·k/4 of std 0.25: the regime where positive
  // random features have modest variance), fixed seed 5; rel_fro measured:
  //   non-causal  m = 16: 0.523   64: 0.301   256: 0.166   1024: 0.070   (about 2/sqrt(m))
  //   causal      m = 16: 0.360   64: 0.230   256: 0.111   1024: 0.058
  // With N(0, 1) inputs the estimator's variance grows like exp(|q'|^2 + |k'|^2) and the error
  // stays above 0.5 even at m = 4096 (measured), as the Performer paper's analysis predicts.
  const Tensor q = random_tensor(1, 2, 256, 16, 11, 0.5f),
               k = random_tensor(1, 2, 256, 16, 12, 0.5f), v = random_tensor(1, 2, 256, 16, 13);
  for (Causal c : {Causal::none, Causal::top_left}) {
    Mask mask;
    mask.causal = c;
    const Tensor64 exact = reference_attention(q, k, v, mask);
    double previous = 1e9;
    for (int m : {16, 64, 256, 1024}) {
      const auto a = make_attention("linear:feature=favor,seed=5,m=" + std::to_string(m));
      const double err = compare(a->forward(q, k, v, mask), exact).rel_fro;
      INFO("causal=" << causal_name(c) << " m=" << m << " rel_fro=" << err);
      CHECK(err < previous);
      previous = err;
    }
    CHECK(previous < 0.09);
  }
}

TEST_CASE("linear: FAVOR+ features estimate exp(q·k·scale) without bias", "[linear]") {
  // The mean of phi(q)·phi(k) over 400 independent projections (seeds), m = 8 each, against
  // exp(q·k·scale). Each estimate has relative std ~0.5 here, so the mean of 400 is within ~3%
  // (5 sigma allowed below); a wrong row-norm distribution would be off by far more.
  const std::size_t dk = 8;
  const Tensor x = random_tensor(1, 1, 2, dk, 3, 0.7f);
  const float* q = &x(0, 0, 0, 0);
  const float* k = &x(0, 0, 1, 0);
  const double scale = 1.0 / std::sqrt(double(dk));
  double exact = 0;
  for (std::size_t a = 0; a < dk; ++a) exact += double(q[a]) * k[a] * scale;
  exact = std::exp(exact);
  double mean = 0;
  const int draws = 400;
  for (int s = 0; s < draws; ++s) {
    const FeatureMap map(Feature::favor, dk, 8, 1, s, scale);
    std::vector<float> fq(8), fk(8);
    map.map(q, 1, fq.data());
    map.map(k, 1, fk.data());
    double est = 0;
    for (std::size_t r = 0; r < 8; ++r) est += std::exp(double(fq[r]) + fk[r]);
    mean += est / draws;
  }
  CHECK(mean == Approx(exact).epsilon(0.08));
}

TEST_CASE("linear: the delta rule stores, retrieves and overwrites exactly", "[linear]") {
  // One-hot keys are orthogonal, and relu then sum-normalisation keep them one-hot: each
  // write lands in its own column of W, so reads return the stored values with no error.
  const std::size_t n = 8, dv = 6;
  Tensor keys = xt::zeros<float>({1ul, 1ul, n + 1, n});
  for (std::size_t j = 0; j < n; ++j) keys(0, 0, j, j) = 1.0f;
  keys(0, 0, n, 2) = 1.0f;  // token n writes key 2 again, with a new value
  Tensor values = random_tensor(1, 1, n + 1, dv, 21);
  for (double beta : {1.0, 0.5}) {
    INFO("beta=" << beta);
    const auto a = make_attention("linear:feature=relu,rule=delta,beta=" + std::to_string(beta));
    Mask causal;
    causal.causal = Causal::top_left;
    const Tensor out = a->forward(keys, keys, values, causal);
    for (std::size_t t = 0; t < n; ++t)  // query t = key t reads what was written just now
      for (std::size_t c = 0; c < dv; ++c)
        CHECK(out(0, 0, t, c) == Approx(beta * values(0, 0, t, c)).margin(1e-7));
    // Non-causal: every query reads the final memory, where key 2 holds
    // W e2 = beta v2 + beta (v8 - beta v2) (= v8 for beta = 1: overwritten).
    const Tensor last = a->forward(keys, keys, values);
    for (std::size_t c = 0; c < dv; ++c) {
      const double v2 = values(0, 0, 2, c), v8 = values(0, 0, n, c);
      CHECK(last(0, 0, 2, c) == Approx(beta * v2 + beta * (v8 - beta * v2)).margin(1e-6));
      CHECK(last(0, 0, n, c) == Approx(last(0, 0, 2, c)).margin(0));  // same key, same read
      CHECK(last(0, 0, 5, c) == Approx(beta * values(0, 0, 5, c)).margin(1e-7));  // untouched
    }
    if (beta == 1.0)  // v2 + (v8 - v2) rounds once or twice in float: equal to ~1 ulp
      for (std::size_t c = 0; c < dv; ++c)
        CHECK(last(0, 0, 2, c) == Approx(values(0, 0, n, c)).margin(1e-6));
  }
}

TEST_CASE("linear: bad parameters and unsupported masks name the problem", "[linear]") {
  require_error<Error>([] { make_attention("linear:m=0"); }, {"m=0", "at least 1"});
  require_error<Error>([] { make_attention("linear:nu=0"); }, {"nu=0", "nu >= 1"});
  require_error<Error>([] { make_attention("linear:beta=0"); }, {"beta=0", "0 < beta <= 1"});
  require_error<Error>([] { make_attention("linear:beta=1.5"); }, {"beta=1.5", "0 < beta <= 1"});
  require_error<Error>([] { make_attention("linear:beta=nan"); }, {"beta=nan", "0 < beta <= 1"});
  require_error<Error>([] { make_attention("linear:eps=-1"); }, {"eps=-1", ">= 0"});
  require_error<Error>([] { make_attention("linear:feature=softmax"); },
                       {"feature=softmax", "elu1|relu|favor|dpfp|taylor"});
  require_error<Error>([] { make_attention("linear:feature=taylor,taylor_dim=-1"); },
                       {"taylor_dim=-1", ">= 0"});
  require_error<Error>([] { make_attention("linear:feature=taylor,rule=delta"); },
                       {"rule=delta", "feature=taylor takes the sum rule only"});
  require_error<Error>([] { make_attention("linear:taylor_dim=4"); },
                       {"taylor_dim=4", "only feature=taylor"});
  require_error<Error>([] { make_attention("linear:feature=relu,taylor_dim=0"); },
                       {"taylor_dim=0", "only feature=taylor"});
  require_error<Error>([] { make_attention("linear:rule=hebb"); }, {"rule=hebb", "sum|delta"});
  require_error<Error>([] { make_attention("linear:window=3"); }, {"window=3", "unknown key"});
  const Tensor x = random_tensor(1, 1, 10, 4, 1);
  // nu >= 2·Dk is only known once Dk is: refused at forward time.
  require_error<Error>([&] { make_attention("linear:feature=dpfp,nu=8")->forward(x, x, x); },
                       {"nu=8", "nu < 2·Dk = 8", "Dk = 4"});
  CHECK_NOTHROW(make_attention("linear:feature=dpfp,nu=7")->forward(x, x, x));
  // A Taylor projection larger than the head: known at forward time, like nu.
  require_error<Error>(
      [&] { make_attention("linear:feature=taylor,taylor_dim=5")->forward(x, x, x); },
      {"taylor_dim=5", "Dk = 4", "d' <= Dk"});
  CHECK_NOTHROW(make_attention("linear:feature=taylor,taylor_dim=4")->forward(x, x, x));
  require_error<Error>(
      [] {
        LinearConfig c;
        c.beta = -1;
        LinearAttention a(c);
      },
      {"beta=-1"});
  Mask boolean;
  boolean.allow(xt::ones<bool>({10ul, 10ul}));
  require_error<Unsupported>([&] { make_attention("linear")->forward(x, x, x, boolean); },
                             {"linear", "boolean"});
  Mask causal;
  causal.causal = Causal::bottom_right;
  require_error<Unsupported>(
      [&] { make_attention("linear")->forward(random_tensor(1, 1, 3, 4, 1), x, x, causal); },
      {"linear", "Nq != Nk"});
}

TEST_CASE("linear: specs print every key in order and round-trip", "[linear]") {
  CHECK(make_attention("linear")->spec() ==
        "linear:feature=elu1,m=256,nu=1,rule=sum,beta=1,eps=1e-06,seed=1");
  for (const char* spec : kSpecs) {
    const auto a = make_attention(spec);
    CHECK(make_attention(a->spec())->spec() == a->spec());
  }
  CHECK(make_attention("linear:seed=4,rule=delta,feature=favor,beta=0.25,m=8")->spec() ==
        "linear:feature=favor,m=8,nu=1,rule=delta,beta=0.25,eps=1e-06,seed=4");
  // taylor_dim only with the map that reads it.
  CHECK(make_attention("linear:taylor_dim=16,feature=taylor")->spec() ==
        "linear:feature=taylor,m=256,nu=1,rule=sum,beta=1,eps=1e-06,seed=1,taylor_dim=16");
}

TEST_CASE("linear: the Taylor map's kernel is 1 + t + t^2/2", "[linear]") {
  // phi(x)·phi(y) = 1 + t + t^2 / 2 with t = x'·y', x' = P x / d'^(1/4): without a projection
  // t = x·y / sqrt(Dk); with one, t = (Px)·(Py) / sqrt(d'), P the fixed orthonormal rows.
  const Tensor x = random_tensor(1, 1, 6, 8, 3);
  for (const std::size_t dim : {8, 3}) {
    INFO("d' = " << dim);
    const FeatureMap map(Feature::taylor, 8, dim, 1, 5, 1.0);
    const xt::xtensor<float, 2> p = taylor_projection(dim, 8, 5);
    if (dim < 8)  // the rows are orthonormal
      for (std::size_t a = 0; a < dim; ++a)
        for (std::size_t b = 0; b < dim; ++b) {
          double dot = 0;
          for (std::size_t c = 0; c < 8; ++c) dot += double(p(a, c)) * p(b, c);
          CHECK(dot == Approx(a == b ? 1.0 : 0.0).margin(1e-6));
        }
    std::vector<float> phi(6 * map.dim());
    map.map(x.data(), 6, phi.data());
    for (std::size_t i = 0; i < 6; ++i)
      for (std::size_t j = 0; j < 6; ++j) {
        double t = 0;
        if (dim == 8) {
          for (std::size_t c = 0; c < 8; ++c) t += double(x(0, 0, i, c)) * x(0, 0, j, c);
        } else {
          for (std::size_t a = 0; a < dim; ++a) {
            double pi = 0, pj = 0;
            for (std::size_t c = 0; c < 8; ++c) {
              pi += double(p(a, c)) * x(0, 0, i, c);
              pj += double(p(a, c)) * x(0, 0, j, c);
            }
            t += pi * pj;
          }
        }
        t /= std::sqrt(double(dim));
        double kernel = 0;
        for (std::size_t r = 0; r < map.dim(); ++r)
          kernel += double(phi[i * map.dim() + r]) * phi[j * map.dim() + r];
        // float32 features of size ~1, up to 65 of them summed: ~1e-6 relative.
        CHECK(kernel == Approx(1 + t + t * t / 2).epsilon(1e-5));
      }
  }
}

TEST_CASE("linear: flops() counts the recurrent form's memory writes and reads", "[linear]") {
  const Dims d{2, 3, 10, 12, 8, 4};  // B, H, Nq, Nk, Dk, Dv
  Mask padded;
  padded.key_lengths = {12, 5};  // 17 keys write
  // sum, elu1: Dphi = Dk = 8; write and read 2·8·(4 + 1) = 80 each; 17 keys, 20 queries, 3 heads.
  CHECK(make_attention("linear")->flops(d, padded) == 3.0 * (17 * 80 + 20 * 80));
  // delta, dpfp nu=2: Dphi = 2·8·2 = 32; write 4·32·4 = 512, read 2·32·4 = 256; 24 keys.
  CHECK(make_attention("linear:feature=dpfp,nu=2,rule=delta")->flops(d, {}) ==
        3.0 * (24 * 512 + 20 * 256));
  // favor m=16: Dphi = 16, plus 2·8·16 = 256 per q and k row for the projection.
  CHECK(make_attention("linear:feature=favor,m=16")->flops(d, {}) ==
        3.0 * (24 * (2 * 16 * 5 + 256) + 20 * (2 * 16 * 5 + 256)));
  // taylor d' = 2 < Dk: Dphi = 1 + 2 + 4 = 7, plus 2·8·2 = 32 per row for the projection.
  CHECK(make_attention("linear:feature=taylor,taylor_dim=2")->flops(d, {}) ==
        3.0 * (24 * (2 * 7 * 5 + 32) + 20 * (2 * 7 * 5 + 32)));
}
