// DeltaProduct (variants/delta_product.hpp) against its definition written out here in float64
// from the paper's equations (n_h delta-rule steps per token, each with its own key, value,
// beta and gate): chunk edges, padding in rows, non-causal, an initial state; n_h = 1 equals
// gated-delta bitwise; the backward against finite differences of that definition and PyTorch
// autograd; and the messages for bad input.
#include <cmath>
#include <string>

#include "grad_helpers.hpp"
#include "helpers.hpp"
#include "variants/delta_product.hpp"
#include "variants/recurrence_reference.hpp"

using namespace attnlab;
using attnlab::test::Arrays64;
using attnlab::test::random_tensor;
using attnlab::test::require_close;
using attnlab::test::require_close_grad;
using attnlab::test::require_error;
using attnlab::test::uniform_tokens;

namespace {

// fp32 chunked engine against the fp64 definition: the scan engine's tolerance (sums of up to
// ~130 O(1) products and the delta rule's triangular solve; measured worst a few 1e-6).
constexpr double kRtol = 1e-4, kAtol = 2e-5;

// The definition: x = {q [B,H,N,Dk], k [B,H,nN,Dk], v [B,H,nN,Dv], g [B,H,nN], beta [B,H,nN]
// [, S_0]}; per token t and step j (row r = t n + j, if r < the item's length): S <- exp(g_r) S,
// then S += beta_r k_r (v_r - S^T k_r)^T with k L2-normalised; causal out_t = S^T q_t
// (q normalised, times scale) after the token's steps, else every query reads the last S.
xt::xarray<double> product_reference(const Arrays64& x, std::size_t steps, bool causal,
                                     double scale, const std::vector<std::int64_t>& lengths) {
  const auto& q = x[0];
  const auto& k = x[1];
  const auto& v = x[2];
  const auto& g = x[3];
  const auto& beta = x[4];
  const std::size_t B = q.shape()[0], H = q.shape()[1], n = q.shape()[2], dk = q.shape()[3];
  const std::size_t rows = k.shape()[2], dv = v.shape()[3];
  xt::xarray<double> out = xt::zeros<double>({B, H, n, dv});
  const auto unit = [&](const xt::xarray<double>& t, std::size_t b, std::size_t h, std::size_t i) {
    double sq = 0;
    for (std::size_t c = 0; c < dk; ++c) sq += t(b, h, i, c) * t(b, h, i, c);
    std::vector<double> r(dk);
    for (std::size_t c = 0; c < dk; ++c) r[c] = t(b, h, i, c) / std::sqrt(sq + 1e-6);
    return r;
  };
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t h = 0; h < H; ++h) {
      std::vector<double> s(dk * dv, 0.0);
      if (x.size() > 5)
        for (std::size_t i = 0; i < dk * dv; ++i) s[i] = x[5](b, h, i / dv, i % dv);
      const std::size_t len = lengths.empty() ? rows : std::size_t(lengths[b]);
      const auto read = [&](std::size_t t) {
        const auto qt = unit(q, b, h, t);
        for (std::size_t c = 0; c < dv; ++c) {
          double acc = 0;
          for (std::size_t r = 0; r < dk; ++r) acc += s[r * dv + c] * qt[r] * scale;
          out(b, h, t, c) = acc;
        }
      };
      for (std::size_t t = 0; t < n; ++t) {
        for (std::size_t j = 0; j < steps; ++j) {
          const std::size_t r = t * steps + j;
          if (r >= len) continue;
          for (double& e : s) e *= std::exp(g(b, h, r));
          const auto kr = unit(k, b, h, r);
          for (std::size_t c = 0; c < dv; ++c) {
            double pred = 0;
            for (std::size_t a = 0; a < dk; ++a) pred += s[a * dv + c] * kr[a];
            const double u = beta(b, h, r) * (v(b, h, r, c) - pred);
            for (std::size_t a = 0; a < dk; ++a) s[a * dv + c] += kr[a] * u;
          }
        }
        if (causal) read(t);
      }
      if (!causal)
        for (std::size_t t = 0; t < n; ++t) read(t);
    }
  return out;
}

// The paper's gate: a log-decay on each token's first row, 0 on the others.
TokenTensor first_row_gate(std::size_t B, std::size_t H, std::size_t rows, std::size_t steps,
                           std::uint64_t seed) {
  TokenTensor g = uniform_tokens(B, H, rows, -2, 0, seed);
  for (std::size_t i = 0; i < g.size(); ++i)
    if (i % rows % steps != 0) g.data()[i] = 0.0f;
  return g;
}

Arrays64 inputs64(const Tensor& q, const Tensor& k, const Tensor& v, const TokenTensor& g,
                  const TokenTensor& beta) {
  return {xt::cast<double>(q), xt::cast<double>(k), xt::cast<double>(v), xt::cast<double>(g),
          xt::cast<double>(beta)};
}

}  // namespace

TEST_CASE("delta-product equals its float64 definition", "[linear-family]") {
  for (const std::size_t steps : {2, 3})
    for (const std::size_t n : {1, 5, 33, 70})
      for (const int kind : {0, 1, 2, 3}) {  // causal; padded; non-causal; initial state
        INFO("steps " << steps << " N=" << n << " case " << kind);
        const DeltaProductAttention a(std::int64_t(steps), 1.0);
        const std::size_t B = 2, H = 2, dk = 8, dv = 6, rows = steps * n;
        const Tensor q = random_tensor(B, H, n, dk, n), k = random_tensor(B, H, rows, dk, n + 1),
                     v = random_tensor(B, H, rows, dv, n + 2);
        const TokenTensor g = kind == 1 ? uniform_tokens(B, H, rows, -1, 0, n + 3)
                                        : first_row_gate(B, H, rows, steps, n + 3);
        const TokenTensor beta = uniform_tokens(B, H, rows, 0, 1, n + 4);
        const Tensor s0 = random_tensor(B, H, dk, dv, n + 5);
        Mask mask;
        if (kind != 2) mask.causal = kind == 3 ? Causal::bottom_right : Causal::top_left;
        // Padding in rows, cutting a token between its steps.
        if (kind == 1) mask.key_lengths = {std::int64_t(rows), std::int64_t(rows / 2 + 1)};
        TokenInputs in = TokenInputs::of(&g, &beta);
        Arrays64 x = inputs64(q, k, v, g, beta);
        if (kind == 3) {
          in.initial_state = StateRef{TensorRef(s0), std::nullopt};
          x.push_back(xt::cast<double>(s0));
        }
        const Tensor64 want(
            product_reference(x, steps, kind != 2, mask.softmax_scale(dk), mask.key_lengths));
        require_close(a.forward(q, k, v, mask, in), want, kRtol, kAtol);
        // The definition the sweep and `attnlab demo` measure against is this one.
        const Tensor64 own = own_reference(a, q, k, v, mask, in);
        CHECK(xt::allclose(own, want, 1e-12, 1e-12));
      }
}

TEST_CASE("delta-product with one step is gated-delta, bitwise", "[linear-family]") {
  const Tensor q = random_tensor(2, 2, 70, 8, 1), k = random_tensor(2, 2, 70, 8, 2),
               v = random_tensor(2, 2, 70, 4, 3);
  const TokenTensor g = uniform_tokens(2, 2, 70, -1, 0, 4),
                    beta = uniform_tokens(2, 2, 70, 0, 1, 5);
  const TokenInputs in = TokenInputs::of(&g, &beta);
  Mask causal;
  causal.causal = Causal::top_left;
  for (const Mask& m : {causal, Mask{}}) {
    const Tensor one = make_attention("delta-product:beta=0.5")->forward(q, k, v, m, in);
    CHECK((one == make_attention("gated-delta:beta=0.5")->forward(q, k, v, m, in)));
  }
  CHECK(make_attention("delta-product")->spec() == "delta-product:steps=1,beta=1");
}

TEST_CASE("delta-product's backward against finite differences and torch", "[linear-family]") {
  test::TorchGrads torch;
  struct Expected {
    std::size_t index;
    AllGradients g;
    std::string what;
  };
  std::vector<Expected> expected;
  const std::size_t steps = 2, B = 1, H = 2, n = 35, dk = 3, dv = 2, rows = steps * n;
  for (const bool causal : {true, false}) {
    INFO((causal ? "causal" : "non-causal"));
    const DeltaProductAttention a(std::int64_t(steps), 1.0);
    const Tensor q = random_tensor(B, H, n, dk, 51), k = random_tensor(B, H, rows, dk, 52),
                 v = random_tensor(B, H, rows, dv, 53), d_out = random_tensor(B, H, n, dv, 54);
    const TokenTensor g = uniform_tokens(B, H, rows, -1.5, 0, 55);
    const TokenTensor beta = uniform_tokens(B, H, rows, 0.05, 1, 56);
    Mask mask;
    if (causal) mask.causal = Causal::top_left;
    mask.key_lengths = {std::int64_t(rows - 3)};
    const TokenInputs in = TokenInputs::of(&g, &beta);
    Tensor out;
    Saved saved;
    a.forward(q, k, v, mask, in, out, saved);
    AllGradients grads, recomputed;
    a.backward(q, k, v, mask, in, out, d_out, saved, grads);
    a.backward(q, k, v, mask, in, out, d_out, Saved(), recomputed);
    CHECK((grads.qkv.dq == recomputed.qkv.dq));  // the saved rows == recomputed ones
    const Arrays64 fd = test::central_differences(
        [&](const Arrays64& x) {
          return product_reference(x, steps, causal, mask.softmax_scale(dk), mask.key_lengths);
        },
        inputs64(q, k, v, g, beta), xt::cast<double>(d_out));
    const std::vector<xt::xarray<double>> ours = {
        xt::cast<double>(grads.qkv.dq), xt::cast<double>(grads.qkv.dk),
        xt::cast<double>(grads.qkv.dv), xt::cast<double>(grads.d_log_decay),
        xt::cast<double>(grads.d_beta)};
    const char* names[] = {"q", "k", "v", "g", "beta"};
    // fp32 gradients against fp64 differences: the scan engine's bound (test_linear_family).
    for (std::size_t i = 0; i < ours.size(); ++i)
      require_close_grad(ours[i], fd[i], 1e-4, 2e-5, std::string("d") + names[i]);
    if (!causal) continue;
    // torch_grads.py's scan over the rows, the queries spread to each token's last row.
    Tensor wide_q = xt::zeros<float>({B, H, rows, dk}), wide_d = xt::zeros<float>({B, H, rows, dv});
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t t = 0; t < n; ++t) {
        for (std::size_t c = 0; c < dk; ++c) wide_q(0, h, 2 * t + 1, c) = q(0, h, t, c);
        for (std::size_t c = 0; c < dv; ++c) wide_d(0, h, 2 * t + 1, c) = d_out(0, h, t, c);
      }
    nlohmann::json j = {{"kind", "scan"},
                        {"delta", true},
                        {"normalise", true},
                        {"causal", true},
                        {"lengths", std::vector<std::size_t>{rows - 3}},
                        {"scale", mask.softmax_scale(dk)},
                        {"g", true},
                        {"beta", true},
                        {"head_g", std::vector<double>(H, 0.0)},
                        {"beta_value", 1.0}};
    expected.push_back(
        {torch.add(
             j, {{"q", wide_q}, {"k", k}, {"v", v}, {"d_out", wide_d}, {"g", g}, {"beta", beta}}),
         grads, "causal"});
  }
  if (!torch.run()) return;
  for (const Expected& e : expected) {
    const xt::xarray<double> wide_dq = torch.grad(e.index, "q");
    xt::xarray<double> dq = xt::zeros<double>(e.g.qkv.dq.shape());
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t t = 0; t < n; ++t)
        for (std::size_t c = 0; c < dk; ++c) dq(0, h, t, c) = wide_dq(0, h, 2 * t + 1, c);
    require_close_grad(xt::cast<double>(e.g.qkv.dq), dq, 1e-4, 2e-5, "dq vs torch");
    require_close_grad(xt::cast<double>(e.g.qkv.dk), torch.grad(e.index, "k"), 1e-4, 2e-5,
                       "dk vs torch");
    require_close_grad(xt::cast<double>(e.g.qkv.dv), torch.grad(e.index, "v"), 1e-4, 2e-5,
                       "dv vs torch");
    require_close_grad(xt::cast<double>(e.g.d_log_decay), torch.grad(e.index, "g"), 1e-4, 2e-5,
                       "dg vs torch");
    require_close_grad(xt::cast<double>(e.g.d_beta), torch.grad(e.index, "beta"), 1e-4, 2e-5,
                       "dbeta vs torch");
  }
}

TEST_CASE("delta-product's bad input names the problem", "[linear-family]") {
  require_error([] { make_attention("delta-product:steps=0"); },
                {"steps=0", "expected an integer >= 1"});
  require_error([] { make_attention("delta-product:beta=1.5"); }, {"beta=1.5", "[0, 1]"});
  require_error([] { DeltaProductAttention(-1, 1.0); }, {"delta-product", "steps=-1"});
  const auto a = make_attention("delta-product:steps=2");
  const Tensor q = random_tensor(1, 2, 6, 4, 1), k = random_tensor(1, 2, 11, 4, 2);
  Mask causal;
  causal.causal = Causal::top_left;
  require_error([&] { a->forward(q, k, k, causal); },
                {"delta-product:steps=2,beta=1", "Nk = 11 rows", "steps · Nq = 2 · 6 = 12"});
  require_error([&] { a->forward(q, k, k); }, {"Nk = 11 rows", "a multiple of steps = 2"});
  const Tensor k10 = random_tensor(1, 2, 10, 4, 4);  // non-causal: any whole number of tokens
  CHECK_NOTHROW(a->forward(q, k10, k10));
  require_error([&] { a->forward(q, k10, k10, causal); }, {"Nk = 10 rows", "= 12"});
  Mask documents;
  documents.documents = {0, 3, 6};
  documents.key_documents = {0, 6, 12};
  const Tensor k12 = random_tensor(1, 2, 12, 4, 3);
  require_error<Unsupported>([&] { a->forward(q, k12, k12, documents); },
                             {"delta-product", "packed documents"});
}
