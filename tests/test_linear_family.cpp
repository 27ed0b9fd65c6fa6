// The scan engine's clients (delta, retnet, gla, gated-delta; variants/linear_scan.hpp) against
// their recurrences written out here in float64 from the papers' equations, token by token: odd
// N, N below, at and across the 64-token chunk, key padding, strong and weak decay, beta 0 and 1.
// Exact reductions (retnet gamma = 1 == gla without g; gated-delta g = 0 == delta; chunked ==
// recurrent step loop), backward against central differences of the float64 recurrence and
// PyTorch autograd for q, k, v, g and beta, extreme inputs, and the token inputs' validation.
#include <cmath>
#include <random>
#include <string>

#include "grad_helpers.hpp"
#include "helpers.hpp"
#include "linear_reference.hpp"
#include "variants/linear_scan.hpp"
#include "variants/retnet.hpp"

using namespace attnlab;
using attnlab::test::Arrays64;
using attnlab::test::make_scan;
using attnlab::test::random_tensor;
using attnlab::test::Recurrence;
using attnlab::test::recurrence_inputs;
using attnlab::test::recurrence_of;
using attnlab::test::require_close;
using attnlab::test::require_close_grad;
using attnlab::test::require_error;
using attnlab::test::uniform_tokens;

namespace {

// The default spec of every registered client of the scan engine (a new one is tested here
// without an edit), then the `extra` settings.
std::vector<std::string> scan_specs(std::initializer_list<const char*> extra = {}) {
  std::vector<std::string> specs;
  for (const std::string& name : attention_names()) {
    const auto a = make_attention(name);
    if (dynamic_cast<const ScanAttention*>(a.get())) specs.push_back(a->spec());
  }
  for (const char* spec : extra) specs.push_back(spec);
  return specs;
}

// The gradients of a backward (q, k, v, then g and beta where `in` gives them) and their names,
// each required close to central differences of the float64 recurrence: fp32 gradients against
// fp64 differences (truncation ~1e-10), rounding of up to ~130 terms per entry.
std::pair<std::vector<xt::xarray<double>>, std::vector<std::string>> require_grads_match(
    const ScanAttention& a, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& d_out,
    const Mask& mask, const TokenInputs& in, const AllGradients& grads, const std::string& what) {
  const bool with_g = in.log_decay.has_value(), with_beta = in.beta.has_value();
  std::vector<xt::xarray<double>> ours = {xt::cast<double>(grads.qkv.dq),
                                          xt::cast<double>(grads.qkv.dk),
                                          xt::cast<double>(grads.qkv.dv)};
  std::vector<std::string> names = {"q", "k", "v"};
  if (with_g) ours.push_back(xt::cast<double>(grads.d_log_decay)), names.push_back("g");
  if (with_beta) ours.push_back(xt::cast<double>(grads.d_beta)), names.push_back("beta");
  const Recurrence ref = recurrence_of(a, mask, q.shape()[3], q.shape()[1]);
  const Arrays64 fd =
      test::central_differences([&](const Arrays64& x) { return ref(x, with_g, with_beta); },
                                recurrence_inputs(q, k, v, in), xt::cast<double>(d_out));
  for (std::size_t i = 0; i < ours.size(); ++i)
    require_close_grad(ours[i], fd[i], 1e-4, 2e-5, what + " d" + names[i]);
  return {ours, names};
}

// fp32 chunked kernels against the fp64 recurrence: sums of up to ~130 products of O(1) terms
// rounded at 6e-8, and the delta rule's triangular solve; worst measured over the cases below
// is in the comment of each REQUIRE's tolerance.
constexpr double kRtol = 1e-4, kAtol = 2e-5;

struct GateCase {
  const char* name;
  double g_lo, g_hi;        // log-decay range (g not given when both are 0 and !force_g)
  double beta_lo, beta_hi;  // per-token beta range (not given when both are -1)
};

const GateCase kGates[] = {
    {"no gates", 0, 0, -1, -1},
    {"weak decay, random beta", -1e-3, 0, 0, 1},
    {"strong decay (gamma near 0)", -8, -4, 0.2, 0.9},
    {"mixed decay, beta 1", -3, 0, 1, 1},
    {"beta 0", -0.5, 0, 0, 0},
};

}  // namespace

TEST_CASE("every scan variant equals its float64 recurrence", "[linear-family]") {
  for (const std::string& spec :
       scan_specs({"delta:beta=0.6", "retnet:schedule=fixed,gamma=0.9", "gated-delta:beta=0.3"})) {
    const auto a = make_scan(spec);
    const Support s = a->support();
    for (std::size_t n : {1, 5, 64, 65, 130}) {
      for (const bool causal : {true, false}) {
        for (const bool padded : {false, true}) {
          for (const GateCase& gate : kGates) {
            const bool with_g = s.log_decay && (gate.g_lo != 0 || gate.g_hi != 0);
            const bool with_beta = s.beta && gate.beta_lo >= 0;
            if (!with_g && !with_beta && &gate != &kGates[0]) continue;
            INFO(spec << " N=" << n << (causal ? " causal" : " non-causal")
                      << (padded ? " padded" : "") << " " << gate.name);
            const std::size_t B = 2, H = 2, dk = 8, dv = 5;
            const std::size_t nq = causal ? n : n + 2;
            const Tensor q = random_tensor(B, H, nq, dk, 11 + n);
            const Tensor k = random_tensor(B, H, n, dk, 12 + n);
            const Tensor v = random_tensor(B, H, n, dv, 13 + n);
            const TokenTensor g = uniform_tokens(B, H, n, gate.g_lo, gate.g_hi, 14 + n);
            const TokenTensor beta = uniform_tokens(B, H, n, gate.beta_lo, gate.beta_hi, 15 + n);
            Mask mask;
            if (causal) mask.causal = Causal::top_left;
            if (padded) mask.key_lengths = {std::int64_t(n), std::int64_t(n / 2)};
            const TokenInputs in =
                TokenInputs::of(with_g ? &g : nullptr, with_beta ? &beta : nullptr);
            Tensor out;
            Saved saved;
            a->forward(q, k, v, mask, in, out, saved);
            const Recurrence ref = recurrence_of(*a, mask, dk, H);
            const xt::xarray<double> want = ref(recurrence_inputs(q, k, v, in), with_g, with_beta);
            require_close(out, Tensor64(want), kRtol, kAtol);
            // The forward that keeps nothing for a backward computes the same output, bitwise.
            Tensor plain;
            a->forward(q, k, v, mask, in, plain);
            CHECK((plain == out));
          }
        }
      }
    }
  }
}

TEST_CASE("scan variants' exact reductions", "[linear-family]") {
  const std::size_t B = 1, H = 4, n = 131, dk = 16, dv = 16;
  const Tensor q = random_tensor(B, H, n, dk, 1), k = random_tensor(B, H, n, dk, 2),
               v = random_tensor(B, H, n, dv, 3);
  Mask causal;
  causal.causal = Causal::top_left;
  SECTION("retnet with gamma = 1 equals gla without g (unnormalised linear attention)") {
    const Tensor a = make_attention("retnet:schedule=fixed,gamma=1")->forward(q, k, v, causal);
    const Tensor b = make_attention("gla")->forward(q, k, v, causal);
    REQUIRE(static_cast<bool>(
        a == b));  // the same engine call: g = log 1 = 0 skips nothing but multiplies by 1
  }
  SECTION("gated-delta with g = 0 equals delta") {
    const TokenTensor zero = xt::zeros<float>({B, H, n});
    const TokenTensor beta = uniform_tokens(B, H, n, 0, 1, 4);
    Tensor a, b;
    Saved sa, sb;
    make_attention("gated-delta")->forward(q, k, v, causal, TokenInputs::of(&zero, &beta), a, sa);
    make_attention("delta")->forward(q, k, v, causal, TokenInputs::of(nullptr, &beta), b, sb);
    REQUIRE(static_cast<bool>(a == b));  // exp(0) = 1 exactly and the cumulative g stays 0
  }
  SECTION("retnet's default schedule is gamma_h = 1 - 2^(-5-h)") {
    const RetNetAttention r(0.0);
    for (std::size_t h = 0; h < 4; ++h)
      CHECK(std::exp(r.head_log_decay(h, 4)) == Approx(1.0 - std::exp2(-5.0 - double(h))));
  }
  SECTION("chunked causal equals the recurrent step loop") {
    for (const std::string& spec : scan_specs({"delta:beta=0.7"})) {
      INFO(spec);
      const auto a = make_scan(spec);
      const TokenTensor g = uniform_tokens(B, H, n, -2, 0, 5);
      const TokenTensor beta = uniform_tokens(B, H, n, 0, 1, 6);
      const TokenInputs in = TokenInputs::of(a->support().log_decay ? &g : nullptr,
                                             a->support().beta ? &beta : nullptr);
      Tensor out;
      Saved saved;
      a->forward(q, k, v, causal, in, out, saved);
      const auto state = a->start_decoding({B, H, dk, dv});
      for (std::size_t t = 0; t < n; ++t) {
        const auto slice = [t](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          T s = T::from_shape({x.shape()[0], x.shape()[1], 1});
          for (std::size_t h = 0; h < x.shape()[1]; ++h) s(0, h, 0) = x(0, h, t);
          return s;
        };
        const auto row = [t](const Tensor& x) {
          Tensor r = Tensor::from_shape({B, H, 1, x.shape()[3]});
          for (std::size_t h = 0; h < H; ++h)
            for (std::size_t c = 0; c < x.shape()[3]; ++c) r(0, h, 0, c) = x(0, h, t, c);
          return r;
        };
        const TokenTensor gt = slice(g), bt = slice(beta);
        const Tensor o =
            state->step(row(q), row(k), row(v),
                        TokenInputs::of(in.log_decay ? &gt : nullptr, in.beta ? &bt : nullptr));
        for (std::size_t h = 0; h < H; ++h)
          for (std::size_t c = 0; c < dv; ++c)
            REQUIRE(o(0, h, 0, c) == Approx(out(0, h, t, c)).margin(1e-5).epsilon(1e-4));
      }
      CHECK(state->tokens() == n);
    }
  }
}

TEST_CASE("scan variants' backward against finite differences and torch", "[linear-family]") {
  test::TorchGrads torch;
  std::vector<test::TorchExpected> expected;
  for (const std::string& spec : scan_specs({"delta:beta=0.8"})) {
    for (const bool causal : {true, false}) {
      for (const bool padded : {false, true}) {
        const auto a = make_scan(spec);
        const std::size_t B = 1, H = 2, n = causal ? 70 : 9, dk = 3, dv = 2;
        const std::size_t nq = causal ? n : 4;
        INFO(spec << (causal ? " causal" : " non-causal") << (padded ? " padded" : ""));
        const Tensor q = random_tensor(B, H, nq, dk, 21), k = random_tensor(B, H, n, dk, 22),
                     v = random_tensor(B, H, n, dv, 23), d_out = random_tensor(B, H, nq, dv, 24);
        const TokenTensor g = uniform_tokens(B, H, n, -1.5, 0, 25);
        const TokenTensor beta = uniform_tokens(B, H, n, 0.05, 1, 26);
        const bool with_g = a->support().log_decay, with_beta = a->support().beta;
        const TokenInputs in = TokenInputs::of(with_g ? &g : nullptr, with_beta ? &beta : nullptr);
        Mask mask;
        if (causal) mask.causal = Causal::top_left;
        if (padded) mask.key_lengths = {std::int64_t(n - 5)};
        Tensor out;
        Saved saved;
        a->forward(q, k, v, mask, in, out, saved);
        AllGradients grads, recomputed;
        a->backward(q, k, v, mask, in, out, d_out, saved, grads);
        a->backward(q, k, v, mask, in, out, d_out, Saved(), recomputed);
        REQUIRE(static_cast<bool>(grads.qkv.dk ==
                                  recomputed.qkv.dk));  // saved chunk states == recomputed ones
        const auto [ours, names] = require_grads_match(*a, q, k, v, d_out, mask, in, grads, spec);
        const nlohmann::json j =
            test::scan_torch_case(*a, recurrence_of(*a, mask, dk, H), causal, padded ? n - 5 : n,
                                  mask.softmax_scale(dk), with_g, with_beta);
        std::vector<std::pair<std::string, xt::xarray<float>>> files = {
            {"q", q}, {"k", k}, {"v", v}, {"d_out", d_out}};
        if (with_g) files.push_back({"g", g});
        if (with_beta) files.push_back({"beta", beta});
        expected.push_back(
            {torch.add(j, files), ours, names,
             std::string(spec) + (causal ? " causal" : "") + (padded ? " padded" : "")});
      }
    }
  }
  test::require_close_to_torch(torch, expected, 1e-4, 2e-5);
}

TEST_CASE("the chunked backward across chunk edges, padding, strong decay and beta 0 and 1",
          "[linear-family]") {
  // The backward runs per chunk as matrix products (linear_scan.cpp chunk_backward, and
  // delta_backward for the delta rule's WY form): N below, at, one past and across chunks of
  // 64, odd N, key lengths that end inside a chunk or leave whole chunks of padding, decay from
  // none to strong, beta with exact 0s and 1s, against central differences of the fp64
  // recurrence.
  struct Case {
    std::size_t n, length;
    double g_lo, g_hi;
  };
  const Case cases[] = {{1, 1, -1, 0},     {63, 63, -0.5, 0},  {64, 64, -1, 0},
                        {65, 65, -8, -4},  {129, 129, -2, 0},  {131, 70, -0.3, 0},
                        {130, 60, -8, -4}, {128, 64, -1e-3, 0}};
  for (const std::string& spec : scan_specs({"delta:beta=0.8"})) {
    for (const Case& c : cases) {
      for (const bool causal : {true, false}) {
        const auto a = make_scan(spec);
        INFO(spec << " N=" << c.n << " length " << c.length << " g in [" << c.g_lo << ", " << c.g_hi
                  << "]" << (causal ? " causal" : " non-causal"));
        const std::size_t B = 1, H = 1, dk = 3, dv = 2, nq = causal ? c.n : 3;
        const Tensor q = random_tensor(B, H, nq, dk, 41 + c.n),
                     k = random_tensor(B, H, c.n, dk, 42 + c.n),
                     v = random_tensor(B, H, c.n, dv, 43 + c.n),
                     d_out = random_tensor(B, H, nq, dv, 44 + c.n);
        const TokenTensor g = uniform_tokens(B, H, c.n, c.g_lo, c.g_hi, 45 + c.n);
        TokenTensor beta = uniform_tokens(B, H, c.n, 0, 1, 46 + c.n);
        for (std::size_t t = 0; t < c.n; t += 5) beta(0, 0, t) = float(t % 10 == 0);
        const bool with_g = a->support().log_decay, with_beta = a->support().beta;
        const TokenInputs in = TokenInputs::of(with_g ? &g : nullptr, with_beta ? &beta : nullptr);
        Mask mask;
        if (causal) mask.causal = Causal::top_left;
        mask.key_lengths = {std::int64_t(c.length)};
        Tensor out;
        Saved saved;
        a->forward(q, k, v, mask, in, out, saved);
        AllGradients grads;
        a->backward(q, k, v, mask, in, out, d_out, saved, grads);
        require_grads_match(*a, q, k, v, d_out, mask, in, grads, spec);
      }
    }
  }
}

TEST_CASE("scan variants stay finite on extreme inputs", "[linear-family][numerics]") {
  // log-decay down to -1e4 per step (every exponent the kernels take is a difference <= 0),
  // beta at 0 and 1, keys of norm ~1e3 (normalised as DeltaNet does; retnet and gla do not
  // normalise, so their outputs are large but finite).
  const std::size_t B = 1, H = 2, n = 150, dk = 16, dv = 8;
  const Tensor q = random_tensor(B, H, n, dk, 31), v = random_tensor(B, H, n, dv, 33);
  const Tensor k = random_tensor(B, H, n, dk, 32, 250.0f);  // |k| ~ 1e3
  const Tensor d_out = random_tensor(B, H, n, dv, 34);
  Mask causal;
  causal.causal = Causal::top_left;
  TokenTensor g = uniform_tokens(B, H, n, -1e4, 0, 35);
  for (std::size_t t = 0; t < n; t += 3) g(0, 0, t) = -1e4f;
  TokenTensor beta = uniform_tokens(B, H, n, 0, 1, 36);
  for (std::size_t t = 0; t < n; ++t) beta(0, t % 2, t) = float(t % 3 == 0);
  for (const std::string& spec : scan_specs()) {
    INFO(spec);
    const auto a = make_scan(spec);
    const TokenInputs in =
        TokenInputs::of(a->support().log_decay ? &g : nullptr, a->support().beta ? &beta : nullptr);
    Tensor out;
    Saved saved;
    a->forward(q, k, v, causal, in, out, saved);
    AllGradients grads;
    a->backward(q, k, v, causal, in, out, d_out, saved, grads);
    const auto finite = [](const auto& t) {
      return std::all_of(t.begin(), t.end(), [](float x) { return std::isfinite(x); });
    };
    CHECK(finite(out));
    CHECK(finite(grads.qkv.dq));
    CHECK(finite(grads.qkv.dk));
    CHECK(finite(grads.qkv.dv));
    CHECK(finite(grads.d_log_decay));
    CHECK(finite(grads.d_beta));
    if (a->rule().normalise) {  // normalised delta-rule memories stay bounded: |out| small
      const float top = *std::max_element(out.begin(), out.end());
      CHECK(top < 100.0f);
    }
  }
}

TEST_CASE("token inputs are validated and refused where not taken", "[linear-family]") {
  const Tensor q = random_tensor(1, 2, 6, 4, 1), k = random_tensor(1, 2, 6, 4, 2),
               v = random_tensor(1, 2, 6, 4, 3);
  const TokenTensor good = xt::zeros<float>({1, 2, 6});
  const TokenTensor wrong = xt::zeros<float>({1, 2, 5});
  TokenTensor positive = good;
  positive(0, 1, 3) = 0.5f;
  TokenTensor nan = good;
  nan(0, 0, 2) = std::nanf("");
  TokenTensor big = good;
  big(0, 0, 1) = 1.5f;
  Tensor out;
  Saved saved;
  const auto gla = make_attention("gla");
  const auto delta = make_attention("delta");
  require_error<Unsupported>(
      [&] {
        make_attention("linear")->forward(q, k, v, {}, TokenInputs::of(&good, nullptr), out, saved);
      },
      {"linear", "log-decay g"});
  require_error<Unsupported>(
      [&] { gla->forward(q, k, v, {}, TokenInputs::of(nullptr, &good), out, saved); },
      {"gla", "beta"});
  require_error<Unsupported>(
      [&] { delta->forward(q, k, v, {}, TokenInputs::of(&good, nullptr), out, saved); },
      {"delta", "log-decay g"});
  require_error([&] { gla->forward(q, k, v, {}, TokenInputs::of(&wrong, nullptr), out, saved); },
                {"gla", "log-decay g", "[1, 2, 5]", "[B, H, Nk] = [1, 2, 6]"});
  require_error([&] { gla->forward(q, k, v, {}, TokenInputs::of(&positive, nullptr), out, saved); },
                {"log-decay g", "[0, 1, 3]", "<= 0"});
  require_error([&] { gla->forward(q, k, v, {}, TokenInputs::of(&nan, nullptr), out, saved); },
                {"log-decay g", "nan", "[0, 0, 2]"});
  require_error([&] { delta->forward(q, k, v, {}, TokenInputs::of(nullptr, &big), out, saved); },
                {"beta", "1.5", "[0, 0, 1]", "[0, 1]"});
  // A view of a caller's buffer: a null one is refused where the view is made.
  require_error([] { TokenRef(nullptr, {1, 2, 3}); }, {"[1, 2, 3]", "null pointer"});
  CHECK(TokenRef(nullptr, {1, 0, 3}).shape()[1] == 0);
  Mask padded;
  padded.key_lengths = {3};
  positive(0, 1, 3) = 0.5f;  // in the padding: never read, so accepted
  gla->forward(q, k, v, padded, TokenInputs::of(&positive, nullptr), out, saved);
  require_error([&] { make_attention("retnet:schedule=fixed,gamma=1.5"); }, {"gamma", "(0, 1]"});
  require_error([&] { make_attention("delta:beta=2"); }, {"beta", "[0, 1]"});
  require_error<Unsupported>(
      [&] {
        Mask m;
        m.allowed = xt::ones<bool>({1, 2, 6, 6});
        gla->forward(q, k, v, m);
      },
      {"gla", "boolean masks"});
}
