// Backward passes of linear attention: every feature map (elu1, relu, favor, dpfp, taylor) under
// the sum rule (non-causal, causal in chunks) and the delta rule (non-causal, causal by
// recomputation), against central finite differences of the fp64 definitions
// (variants/recurrence_reference.hpp) on small shapes and against PyTorch autograd on shapes that
// cross the kernels' chunk and checkpoint edges; key padding, Nq != Nk where the form allows it.
#include <cmath>
#include <string>

#include "grad_helpers.hpp"
#include "helpers.hpp"
#include "variants/linear.hpp"
#include "variants/recurrence_reference.hpp"

using namespace attnlab;
using attnlab::test::Arrays64;
using attnlab::test::random_tensor;
using attnlab::test::require_close_grad;

namespace {

// fp32 kernels against fp64. Gradients sum up to ~100 products rounded at ~1e-7 relative;
// the sum rule divides by denominators down to ~1e-3 (relu, dpfp features with few positive
// entries), which makes some gradients large (up to ~200) and their errors with them, and
// favor's features carry float exp2 and log-features of size ~10 (~1e-6 absolute). Measured
// worst over every case here: 8.7e-4 on a gradient of size 203 (4e-6 relative, dpfp causal),
// 1.6e-5 absolute on gradients below 10; the bounds keep a margin of about 6x.
constexpr double kRtol = 2e-4, kAtol = 1e-4;

Tensor64 to64(const Tensor& t) {
  return xt::cast<double>(t);
}

LinearConfig config_of(const std::string& spec) {
  const auto a = make_attention(spec);
  return dynamic_cast<const LinearAttention&>(*a).config();
}

// Every feature map under both rules. favor's sum rule with eps = 0: its stabilisers then cancel
// exactly, so the fp64 definition's derivative is the backward's (with eps > 0 they cancel up to
// eps, and the backward holds them constant, as the torch comparison below does too). The other
// sum-rule maps with eps = 1e-3: a row that sees one key has out = v·den / (den + eps), whose
// gradient is proportional to eps and comes out of S g - z (g·out), a difference of numbers
// (den + eps) / eps times larger: with eps = 1e-6 float32 keeps only ~2 digits of it there.
const char* kSpecs[] = {
    "linear:eps=0.001",
    "linear:feature=relu,eps=0.001",
    "linear:feature=favor,m=16,seed=3,eps=0",
    "linear:feature=dpfp,nu=2,eps=0.001",
    "linear:rule=delta",
    "linear:feature=relu,rule=delta,beta=0.6",
    "linear:feature=favor,m=12,rule=delta,beta=0.7",
    "linear:feature=dpfp,nu=3,rule=delta,beta=0.5",
    "linear:feature=taylor,eps=0.001",
    "linear:feature=taylor,taylor_dim=2,eps=0.001",
};

struct MaskCase {
  std::string name;
  Mask mask;
};

std::vector<MaskCase> masks(std::size_t nk, bool causal) {
  std::vector<MaskCase> cases = {{"none", {}}};
  Mask padded;
  padded.key_lengths = {static_cast<std::int64_t>(nk) - 2, 0};  // one item padded to nothing
  cases.push_back({"key padding", padded});
  if (causal) {
    Mask m;
    m.causal = Causal::top_left;
    cases.push_back({"causal", m});
    m.key_lengths = {static_cast<std::int64_t>(nk) - 3, 1};
    m.scale = 0.7;
    cases.push_back({"causal, padding, scale 0.7", m});
  }
  return cases;
}

struct Run {
  Tensor q, k, v, out, d_out;
  Gradients g;
};

Run run(const Attention& a, std::size_t nq, std::size_t nk, std::size_t dk, std::size_t dv,
        const Mask& mask, std::uint64_t seed) {
  Run r{random_tensor(2, 2, nq, dk, seed),     random_tensor(2, 2, nk, dk, seed + 1),
        random_tensor(2, 2, nk, dv, seed + 2), {},
        random_tensor(2, 2, nq, dv, seed + 3), {}};
  r.out = a.forward(r.q, r.k, r.v, mask);
  r.g = a.backward(r.q, r.k, r.v, mask, {}, r.out, r.d_out).qkv;
  return r;
}

void require_grads(const Gradients& g, const Arrays64& want, const std::string& what) {
  require_close_grad(to64(g.dq), want[0], kRtol, kAtol, what + ": dq");
  require_close_grad(to64(g.dk), want[1], kRtol, kAtol, what + ": dk");
  require_close_grad(to64(g.dv), want[2], kRtol, kAtol, what + ": dv");
}

}  // namespace

TEST_CASE("linear: every form's backward equals finite differences of its fp64 definition",
          "[backward]") {
  for (const char* spec : kSpecs) {
    const auto a = make_attention(spec);
    const LinearConfig c = config_of(spec);
    // Nq != Nk for the non-causal forms; causal ones need Nq == Nk.
    for (const auto& [nq, nk] : {std::pair<std::size_t, std::size_t>{5, 7}, {6, 6}}) {
      for (const MaskCase& m : masks(nk, nq == nk)) {
        INFO(spec << " Nq=" << nq << " Nk=" << nk << " mask: " << m.name);
        const Run r = run(*a, nq, nk, 3, 4, m.mask, nq * 10 + nk);
        const Arrays64 fd = test::central_differences(
            [&](const Arrays64& x) -> xt::xarray<double> {
              return linear_reference(c, Tensor64(x[0]), Tensor64(x[1]), Tensor64(x[2]), m.mask);
            },
            {to64(r.q), to64(r.k), to64(r.v)}, to64(r.d_out));
        require_grads(r.g, fd, std::string(spec) + " " + m.name + " vs finite differences");
      }
    }
  }
}

TEST_CASE("linear: backward equals PyTorch autograd across chunks and checkpoints", "[backward]") {
  struct Expected {
    std::size_t index;
    std::string what;
    Gradients g;
  };
  test::TorchGrads torch;
  std::vector<Expected> expected;
  // 100 positions: one full 64-token chunk of the scan engine and a partial one (the backward
  // restarts from the second chunk's saved state). favor with eps > 0 too (stabilisers held
  // constant on both sides), and keys whose norms differ widely (the running stabiliser jumps
  // inside a chunk).
  const char* specs[] = {"linear:eps=0.001",
                         "linear:feature=relu,eps=0.001",
                         "linear:feature=favor,m=32,seed=5",
                         "linear:feature=dpfp,nu=2,eps=0.001",
                         "linear:rule=delta,beta=0.8",
                         "linear:feature=favor,m=24,rule=delta",
                         "linear:feature=dpfp,nu=1,rule=delta,beta=0.5",
                         "linear:feature=relu,rule=delta",
                         "linear:feature=taylor,eps=0.001",
                         "linear:feature=taylor,taylor_dim=3,seed=4,eps=0.001",
                         "linear:feature=taylor,taylor_dim=5,eps=0.001"};
  for (const char* spec : specs) {
    const auto a = make_attention(spec);
    const LinearConfig c = config_of(spec);
    for (const auto& [nq, nk] : {std::pair<std::size_t, std::size_t>{100, 100}, {70, 130}}) {
      for (const MaskCase& m : masks(nk, nq == nk)) {
        Run r = run(*a, nq, nk, 8, 6, m.mask, nq + nk);
        if (c.feature == Feature::favor) {  // wildly different key norms
          for (std::size_t j = 0; j < nk; j += 7)
            for (std::size_t col = 0; col < 8; ++col) r.k(0, 0, j, col) *= 3.0f;
          r.out = a->forward(r.q, r.k, r.v, m.mask);
          r.g = a->backward(r.q, r.k, r.v, m.mask, {}, r.out, r.d_out).qkv;
        }
        std::vector<std::size_t> lengths(2, nk);
        for (std::size_t b = 0; b < m.mask.key_lengths.size(); ++b)
          lengths[b] = static_cast<std::size_t>(m.mask.key_lengths[b]);
        nlohmann::json j = {{"kind", "linear"},
                            {"feature", feature_name(c.feature)},
                            {"rule", c.rule == LinearRule::sum ? "sum" : "delta"},
                            {"causal", m.mask.causal != Causal::none},
                            {"eps", c.eps},
                            {"beta", c.beta},
                            {"nu", c.nu},
                            {"scale", m.mask.softmax_scale(8)},
                            {"lengths", lengths}};
        std::vector<std::pair<std::string, xt::xarray<float>>> inputs = {
            {"q", r.q}, {"k", r.k}, {"v", r.v}, {"d_out", r.d_out}};
        if (const auto w = feature_projection(c, 8); w.size()) inputs.emplace_back("W", w);
        expected.push_back({torch.add(j, inputs),
                            std::string(spec) + " Nq=" + std::to_string(nq) +
                                " Nk=" + std::to_string(nk) + " mask: " + m.name,
                            r.g});
      }
    }
  }
  if (!torch.run()) return;
  for (const Expected& e : expected)
    require_grads(e.g,
                  {torch.grad(e.index, "q"), torch.grad(e.index, "k"), torch.grad(e.index, "v")},
                  e.what + " vs torch");
}

TEST_CASE("linear: feature maps' backward equals finite differences", "[backward]") {
  // d/dx of sum(phi(x) ∘ w) for each map; favor without a stabiliser (c = 0 in the backward's
  // terms: phi = exp(log phi)).
  const Tensor x = random_tensor(1, 1, 5, 4, 9), w = random_tensor(1, 1, 5, 32, 10);
  for (const Feature f : {Feature::elu1, Feature::relu, Feature::favor, Feature::dpfp}) {
    INFO(feature_name(f));
    const FeatureMap map(f, 4, 32, 3, 7, 0.6);
    const std::size_t p = map.dim();
    std::vector<float> phi(5 * p), weights(5 * p), dx(5 * 4);
    std::copy_n(w.data(), 5 * p, weights.begin());
    map.map(x.data(), 5, phi.data());
    if (map.logarithmic())
      for (float& y : phi) y = std::exp(y);
    map.backward(x.data(), 5, phi.data(), weights.data(), dx.data());
    LinearConfig c;
    c.feature = f;
    c.m = 32;
    c.nu = 3;
    c.seed = 7;
    const xt::xtensor<float, 2> proj = favor_projection(32, 4, 7);
    const auto features = [&](const Arrays64& in) -> xt::xarray<double> {
      xt::xarray<double> out = xt::zeros<double>({std::size_t(5), p});
      for (std::size_t i = 0; i < 5; ++i) {
        const std::vector<double> row = phi64(c, proj, &in[0](i, 0), 4, 0.6);
        for (std::size_t r = 0; r < p; ++r)
          out(i, r) = f == Feature::favor ? std::exp(row[r]) : row[r];
      }
      return out;
    };
    xt::xarray<double> x2 = xt::zeros<double>({std::size_t(5), std::size_t(4)});
    std::copy(x.begin(), x.end(), x2.begin());
    xt::xarray<double> w2 = xt::zeros<double>({std::size_t(5), p});
    std::copy(weights.begin(), weights.end(), w2.begin());
    const Arrays64 fd = test::central_differences(features, {x2}, w2);
    xt::xarray<double> got = xt::zeros<double>({std::size_t(5), std::size_t(4)});
    std::copy(dx.begin(), dx.end(), got.begin());
    require_close_grad(got, fd[0], 1e-4, 1e-5, feature_name(f));
  }
  // taylor, without a projection (d' = Dk = 4) and with one (d' = 3).
  for (const std::size_t dim : {4, 3}) {
    INFO("taylor d' = " << dim);
    const FeatureMap map(Feature::taylor, 4, dim, 1, 7, 0.6);
    const std::size_t p = map.dim();
    REQUIRE(p == 1 + dim + dim * dim);
    std::vector<float> phi(5 * p), weights(5 * p), dx(5 * 4);
    std::copy_n(w.data(), 5 * p, weights.begin());
    map.map(x.data(), 5, phi.data());
    map.backward(x.data(), 5, phi.data(), weights.data(), dx.data());
    LinearConfig c;
    c.feature = Feature::taylor;
    c.taylor_dim = dim == 4 ? 0 : std::int64_t(dim);
    c.seed = 7;
    const xt::xtensor<float, 2> proj = feature_projection(c, 4);
    const auto features = [&](const Arrays64& in) -> xt::xarray<double> {
      xt::xarray<double> out = xt::zeros<double>({std::size_t(5), p});
      for (std::size_t i = 0; i < 5; ++i) {
        const std::vector<double> row = phi64(c, proj, &in[0](i, 0), 4, 0.6);
        for (std::size_t r = 0; r < p; ++r) out(i, r) = row[r];
      }
      return out;
    };
    xt::xarray<double> x2 = xt::zeros<double>({std::size_t(5), std::size_t(4)});
    std::copy(x.begin(), x.end(), x2.begin());
    xt::xarray<double> w2 = xt::zeros<double>({std::size_t(5), p});
    std::copy(weights.begin(), weights.end(), w2.begin());
    const Arrays64 fd = test::central_differences(features, {x2}, w2);
    xt::xarray<double> got = xt::zeros<double>({std::size_t(5), std::size_t(4)});
    std::copy(dx.begin(), dx.end(), got.begin());
    require_close_grad(got, fd[0], 1e-4, 1e-5, "taylor");
  }
}
