// Backward passes of the model layers and the Adam optimizer: every layer's gradients (input and
// parameters) against central finite differences of an fp64 forward written here from the
// definitions, and the Transformer layers, stacks and embedding model against their PyTorch
// twins' autograd (tests/torch_model_grads.py, float64) with the twins' weights loaded; AdamW
// with warm-up against torch.optim.AdamW.
#include <sys/wait.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <random>
#include <string>

#include <xtensor/xview.hpp>

#include "attnlab/npy.hpp"
#include "grad_helpers.hpp"
#include "helpers.hpp"
#include "models/optimizer.hpp"
#include "models/transformer.hpp"
#include "npy_helpers.hpp"

using namespace attnlab;
using namespace attnlab::models;
using attnlab::test::Arrays64;
using attnlab::test::require_close_grad;
using attnlab::test::require_error;

namespace {

using A64 = xt::xarray<double>;

// float32 layers against fp64 references: products over up to 24 terms and LayerNorm's
// normalisation round at ~1e-7 relative; the attention core adds its own ~1e-6. Measured worst
// over every case here: 5.7e-5 on a gradient of size 48 (1.2e-6 relative: in_proj_weight of a
// two-layer model), 5e-6 absolute on gradients below 10; the bounds keep a margin of about 6x.
constexpr double kRtol = 1e-4, kAtol = 3e-5;

A64 to64(const Activations& a) {
  return xt::cast<double>(a);
}

A64 array_of(const ParameterRef& p) {
  A64 a = xt::zeros<double>(p.shape);
  std::copy_n(p.data, p.size(), a.begin());
  return a;
}

Activations random_activations(std::size_t b, std::size_t n, std::size_t d, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Activations x = Activations::from_shape({b, n, d});
  for (float& v : x) v = normal(rng);
  return x;
}

// Biases and LayerNorms away from 0 and 1, so that their gradients are exercised in general.
template <class Layer>
void perturb(Layer& layer, std::uint64_t seed) {
  Parameters params;
  layer.parameters("", params);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.2f);
  for (const ParameterRef& p : params)
    if (p.name.find("bias") != std::string::npos || p.shape.size() == 1)
      for (std::size_t i = 0; i < p.size(); ++i) p.data[i] += normal(rng);
}

// Each parameter's gradient against `want` (name -> array), and the names cover each other.
template <class Layer>
void require_parameter_grads(Layer& grad, const std::map<std::string, A64>& want,
                             const std::string& what) {
  Parameters params;
  grad.parameters("", params);
  REQUIRE(params.size() == want.size());
  for (const ParameterRef& p : params) {
    INFO(what << ": " << p.name);
    REQUIRE(want.count(p.name) == 1);
    require_close_grad(array_of(p), want.at(p.name), kRtol, kAtol, what + ": " + p.name);
  }
}

// ---- fp64 forwards, written from the definitions, for finite differences ----

// y = x W^T + b over the last axis.
A64 linear64(const A64& x, const A64& w, const A64& b) {
  const std::size_t rows = x.shape()[0] * x.shape()[1], in = w.shape()[1], out = w.shape()[0];
  A64 y = xt::zeros<double>({x.shape()[0], x.shape()[1], out});
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t o = 0; o < out; ++o) {
      double s = b(o);
      for (std::size_t i = 0; i < in; ++i) s += x.data()[r * in + i] * w(o, i);
      y.data()[r * out + o] = s;
    }
  return y;
}

A64 layer_norm64(const A64& x, const A64& gamma, const A64& beta, double eps) {
  const std::size_t d = gamma.size(), rows = x.size() / d;
  A64 y = xt::zeros<double>(x.shape());
  for (std::size_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (std::size_t c = 0; c < d; ++c) mean += x.data()[r * d + c] / double(d);
    for (std::size_t c = 0; c < d; ++c) var += std::pow(x.data()[r * d + c] - mean, 2) / double(d);
    for (std::size_t c = 0; c < d; ++c)
      y.data()[r * d + c] =
          (x.data()[r * d + c] - mean) / std::sqrt(var + eps) * gamma(c) + beta(c);
  }
  return y;
}

A64 ffn64(const A64& x, const Arrays64& p) {  // p: linear1.weight, .bias, linear2.weight, .bias
  A64 h = linear64(x, p[0], p[1]);
  for (double& v : h) v = std::max(v, 0.0);
  return linear64(h, p[2], p[3]);
}

// Multi-head attention: the three projections (each through the short convolution and SiLU
// with conv_weight), exact attention in fp64 under the mask, the heads (normalised with
// head_norm.weight) merged, the output projection. p: in_proj_weight, in_proj_bias,
// out_proj.{weight,bias}; conv and norm: null without.
A64 mha64(const A64& query, const A64& memory, const Arrays64& p, std::size_t heads,
          const Mask& mask, const A64* conv = nullptr, const A64* norm = nullptr) {
  const std::size_t d = p[2].shape()[0], dk = d / heads, batch = query.shape()[0];
  const std::size_t nq = query.shape()[1], nk = memory.shape()[1];
  const auto block = [&](const A64& x, std::size_t which) {
    A64 w = xt::view(p[0], xt::range(which * d, (which + 1) * d), xt::all());
    A64 b = xt::view(p[1], xt::range(which * d, (which + 1) * d));
    A64 y = linear64(x, w, b);
    if (conv) {  // y[i, c] <- silu(sum_t conv[c, t] y[i - width + 1 + t, c])
      const std::size_t width = conv->shape()[1];
      const A64 u = y;
      for (std::size_t bb = 0; bb < batch; ++bb)
        for (std::size_t i = 0; i < x.shape()[1]; ++i)
          for (std::size_t c = 0; c < d; ++c) {
            double pre = 0;
            for (std::size_t t = 0; t < width; ++t)
              if (i + t + 1 >= width)
                pre += (*conv)(which * d + c, t) * u(bb, i + t + 1 - width, c);
            y(bb, i, c) = pre / (1 + std::exp(-pre));
          }
    }
    Tensor64 t = xt::zeros<double>({batch, heads, x.shape()[1], dk});
    for (std::size_t bb = 0; bb < batch; ++bb)
      for (std::size_t h = 0; h < heads; ++h)
        for (std::size_t i = 0; i < x.shape()[1]; ++i)
          for (std::size_t c = 0; c < dk; ++c) t(bb, h, i, c) = y(bb, i, h * dk + c);
    return t;
  };
  const Dims dims{batch, heads, nq, nk, dk, dk};
  Tensor64 heads_out = reference_attention(
      block(query, 0), block(memory, 1), block(memory, 2), mask.softmax_scale(dk),
      [&](std::size_t b, std::size_t h, std::size_t i, std::size_t j) {
        return mask.may_attend(b, h, i, j, dims);
      });
  A64 merged = xt::zeros<double>({batch, nq, d});
  for (std::size_t bb = 0; bb < batch; ++bb)
    for (std::size_t h = 0; h < heads; ++h)
      for (std::size_t i = 0; i < nq; ++i) {
        double mean_square = 0;  // the head norm: row / rms(row) times the gain
        for (std::size_t c = 0; c < dk; ++c)
          mean_square += std::pow(heads_out(bb, h, i, c), 2) / double(dk);
        const double inv = norm ? 1 / std::sqrt(mean_square + MultiHeadAttention::kHeadNormEps) : 1;
        for (std::size_t c = 0; c < dk; ++c)
          merged(bb, i, h * dk + c) = heads_out(bb, h, i, c) * (norm ? inv * (*norm)(c) : 1.0);
      }
  return linear64(merged, p[2], p[3]);
}

// d/dt loss(t) at 0 from the float32 forward along a direction: central differences at h and
// h/2 combined by Richardson extrapolation, (4 D(h/2) - D(h)) / 3, which cancels the h² term
// (with h = 1e-2 alone, LayerNorm's and softmax's curvature leave 0.3% errors); float32
// rounding of the loss (~1e-6) over h/2 = 5e-3 adds ~2e-4 absolute, so the checks allow 2e-3
// relative. Measured: 4e-6 (attention) and 2e-4 (decoder stack) relative.
template <class Loss>
double directional_difference(const Loss& loss, double h = 1e-2) {
  const auto central = [&](double s) { return (loss(s) - loss(-s)) / (2 * s); };
  return (4 * central(h / 2) - central(h)) / 3;
}

// The layer's gradient of sum(forward() · dy) along a random direction of its parameters from
// index `first` on (parameters() order; `grads` the gradient layer's) against
// directional_difference of that float32 loss (step h). Returns the analytic value.
template <class Layer, class Forward>
double check_parameter_direction(Layer& layer, Layer& grad, std::size_t first,
                                 const Forward& forward, const Activations& dy, double h = 1e-2) {
  Parameters params, grads;
  layer.parameters("", params);
  grad.parameters("", grads);
  std::mt19937_64 rng(19);
  std::normal_distribution<float> normal;
  std::vector<std::vector<float>> dirs, base;
  double analytic = 0;
  for (std::size_t i = first; i < params.size(); ++i) {
    dirs.emplace_back(params[i].size());
    base.emplace_back(params[i].data, params[i].data + params[i].size());
    for (std::size_t e = 0; e < params[i].size(); ++e) {
      dirs.back()[e] = normal(rng);
      analytic += double(dirs.back()[e]) * grads[i].data[e];
    }
  }
  const auto loss = [&](double t) {
    for (std::size_t i = first; i < params.size(); ++i)
      for (std::size_t e = 0; e < params[i].size(); ++e)
        params[i].data[e] = float(base[i - first][e] + t * dirs[i - first][e]);
    const double l = xt::sum(xt::cast<double>(forward()) * to64(dy))();
    for (std::size_t i = first; i < params.size(); ++i)
      std::copy(base[i - first].begin(), base[i - first].end(), params[i].data);
    return l;
  };
  CHECK(analytic == Approx(directional_difference(loss, h)).epsilon(2e-3));
  return analytic;
}

// The parameters' values as fp64 arrays, in parameters() order.
template <class Layer>
Arrays64 values_of(Layer& layer) {
  Parameters params;
  layer.parameters("", params);
  Arrays64 out;
  for (const ParameterRef& p : params) out.push_back(array_of(p));
  return out;
}

template <class Layer>
std::map<std::string, A64> named(Layer& layer, const Arrays64& grads, std::size_t first) {
  Parameters params;
  layer.parameters("", params);
  std::map<std::string, A64> out;
  for (std::size_t i = 0; i < params.size(); ++i) out[params[i].name] = grads[first + i];
  return out;
}

}  // namespace

TEST_CASE("model layers: gradients equal fp64 finite differences", "[models][backward]") {
  const Activations x = random_activations(2, 4, 6, 1), dy6 = random_activations(2, 4, 6, 2);
  SECTION("Linear") {
    Linear layer(6, 5);
    layer.initialize(3, "");
    perturb(layer, 4);
    const Activations dy = random_activations(2, 4, 5, 5);
    Linear grad = zero_like(layer);
    const Activations dx = backward(layer, x, dy, grad);
    Arrays64 in = values_of(layer);
    in.insert(in.begin(), to64(x));
    const Arrays64 fd = test::central_differences(
        [](const Arrays64& a) { return linear64(a[0], a[1], a[2]); }, in, to64(dy));
    require_close_grad(to64(dx), fd[0], kRtol, kAtol, "dx");
    require_parameter_grads(grad, named(layer, fd, 1), "Linear");
  }
  SECTION("LayerNorm") {
    LayerNorm layer(6);
    perturb(layer, 6);
    LayerNorm grad = zero_like(layer);
    const Activations dx = backward(layer, x, dy6, grad);
    Arrays64 in = values_of(layer);
    in.insert(in.begin(), to64(x));
    const Arrays64 fd = test::central_differences(
        [&](const Arrays64& a) { return layer_norm64(a[0], a[1], a[2], layer.eps); }, in,
        to64(dy6));
    require_close_grad(to64(dx), fd[0], kRtol, kAtol, "dx");
    require_parameter_grads(grad, named(layer, fd, 1), "LayerNorm");
  }
  SECTION("FeedForward") {
    FeedForward ffn(6, 9);
    ffn.initialize(7, "");
    perturb(ffn, 8);
    FeedForwardTrace trace;
    const Activations y = forward(ffn, x, trace);
    CHECK((y == ffn.forward(x)));
    FeedForward grad = zero_like(ffn);
    const Activations dx = backward(ffn, trace, dy6, grad);
    Arrays64 in = values_of(ffn);
    in.insert(in.begin(), to64(x));
    const Arrays64 fd = test::central_differences(
        [](const Arrays64& a) {
          return ffn64(a[0], {a[1], a[2], a[3], a[4]});
        },
        in, to64(dy6));
    require_close_grad(to64(dx), fd[0], kRtol, kAtol, "dx");
    require_parameter_grads(grad, named(ffn, fd, 1), "FeedForward");
  }
}

TEST_CASE("multi-head attention: gradients equal fp64 finite differences", "[models][backward]") {
  struct Case {
    std::string name, spec;
    bool tied, cross;
    Mask mask;
    bool conv = false;     // the short convolution
    bool norm = false;     // the head norm
    bool channel = false;  // the per-channel gate (GLA's with gla, KDA's with kda)
  };
  Mask causal;
  causal.causal = Causal::top_left;
  Mask padded;
  padded.key_lengths = {5, 2};
  const Case cases[] = {
      {"self, causal", "full", false, false, causal},
      {"self, tied W_Q = W_K", "full", true, false, {}},
      {"cross, key padding", "full", false, true, padded},
      {"cross, linear core", "linear:eps=0.001", false, true, padded},
      {"self, sliding core, causal", "sliding:left=1,right=1", false, false, causal},
      {"self, gated-delta core (learned g and beta), causal", "gated-delta", false, false, causal},
      {"cross, gla core (learned g), key padding", "gla", false, true, padded},
      {"self, short convolution, causal", "full", false, false, causal, true},
      {"cross, short convolution, key padding", "full", false, true, padded, true},
      {"self, gated-delta core, short convolution, causal", "gated-delta", false, false, causal,
       true},
      {"self, head norm, causal", "full", false, false, causal, false, true},
      {"cross, short convolution and head norm, key padding", "full", false, true, padded, true,
       true},
      {"self, gated-delta core, short convolution and head norm, causal", "gated-delta", false,
       false, causal, true, true},
      {"self, gla core, GLA's per-channel gate, causal", "gla", false, false, causal, false, false,
       true},
      {"self, kda core, KDA's per-channel gate, short convolution and head norm, causal", "kda",
       false, false, causal, true, true, true},
      {"self, delta-product core (2 keys, values, betas per token), short convolution and head "
       "norm, causal",
       "delta-product:steps=2", false, false, causal, true, true},
      {"cross, delta-product core (2 rows per token), key padding", "delta-product:steps=2", false,
       true, padded}};
  for (const Case& c : cases) {
    INFO(c.name);
    AttentionOptions options;
    options.tied_qk = c.tied;
    options.short_conv = c.conv;
    options.head_norm = c.norm;
    options.channel_gate = c.channel;
    MultiHeadAttention mha(8, 2, c.spec, options);
    mha.initialize(11, "");
    perturb(mha, 12);
    if (c.tied)  // keep the tie: the K block equals the Q block
      std::copy_n(mha.in_proj_bias.data(), 8, mha.in_proj_bias.data() + 8);
    const Activations query = random_activations(2, 4, 8, 13);
    const Activations memory = c.cross ? random_activations(2, 5, 8, 14) : query;
    const Activations dy = random_activations(2, 4, 8, 15);
    AttentionTrace trace;
    const Activations y = forward(mha, query, memory, c.mask, trace);
    CHECK((y == mha.forward(query, memory, c.mask)));
    MultiHeadAttention grad = zero_like(mha);
    const AttentionInputGrads g = backward(mha, trace, dy, grad);
    // Cores: full and sliding (a window is a boolean mask for the fp64 reference) against fp64
    // finite differences; linear, whose fp64 definition is tested in test_backward_linear,
    // through a directional difference of the float forward itself.
    const bool gated = c.spec.starts_with("gated-delta") || c.spec.starts_with("gla") ||
                       c.spec.starts_with("kda") || c.spec.starts_with("delta-product");
    if (c.spec.starts_with("delta-product")) {  // W_K, W_V and W_beta: two rows per token
      CHECK(mha.in_proj_weight.shape()[0] == 8 + 2 * 2 * 8);
      CHECK(mha.beta_proj->weight.shape()[0] == 2 * 2);
    }
    if (gated) {  // the gates exist exactly for a core that takes them, named in parameters()
      Parameters names;
      mha.parameters("", names);
      const std::size_t gate = 4 + c.conv + c.norm;  // after conv_weight and head_norm.weight
      CHECK(bool(mha.gate_proj) == !c.channel);
      CHECK(bool(mha.channel_gate) == c.channel);
      CHECK(bool(mha.beta_proj) == !c.spec.starts_with("gla"));
      if (c.channel) {  // rank 16 (GLA) or dk = 4 (KDA), then W_up [H·dk, rank] and b_up
        const std::size_t rank = c.spec == "kda" ? 4 : 16;
        CHECK(names[gate].name == "channel_gate.down.weight");
        CHECK(names[gate].shape == std::vector<std::size_t>{rank, 8});
        CHECK(names[gate + 1].name == "channel_gate.up.weight");
        CHECK(names[gate + 1].shape == std::vector<std::size_t>{8, rank});
        CHECK(names[gate + 2].name == "channel_gate.up.bias");
        if (c.spec == "kda") CHECK(names[gate + 3].name == "channel_gate.a_log");
      } else {
        CHECK(names[gate].name == "gate_proj.weight");
        CHECK(names[gate].shape == std::vector<std::size_t>{2, 8});
      }
    }
    if (c.spec.starts_with("linear") || gated) {
      // The filters', the head norm's and the gate projections' gradients (after the first
      // four). The head norm of a row with a small RMS curves fast: at step 1e-2 the difference
      // is 1.5% off, at 3e-3 and below it agrees to 1e-4 (measured). GLA's channel gate moves
      // the loss little (a derivative of 0.013): at 1e-2 float32 rounding left it 0.27% off,
      // at 4e-2 it is within 2e-3 (measured).
      if (gated)
        check_parameter_direction(
            mha, grad, 4, [&] { return mha.forward(query, memory, c.mask); }, dy,
            c.norm ? 3e-3 : (c.channel ? 4e-2 : 1e-2));
      // Directional check of the whole layer through its float32 forward.
      Activations uq = random_activations(2, 4, 8, 17),
                  um = random_activations(2, memory.shape()[1], 8, 18);
      const auto loss = [&](double t) {
        Activations q2 = query, m2 = memory;
        for (std::size_t i = 0; i < q2.size(); ++i) q2.data()[i] += float(t * uq.data()[i]);
        for (std::size_t i = 0; i < m2.size(); ++i) m2.data()[i] += float(t * um.data()[i]);
        return double(xt::sum(xt::cast<double>(mha.forward(q2, m2, c.mask)) * to64(dy))());
      };
      const double fd = directional_difference(loss);
      const double analytic =
          xt::sum(to64(g.query) * to64(uq))() + xt::sum(to64(g.memory) * to64(um))();
      CHECK(analytic == Approx(fd).epsilon(2e-3));
      continue;
    }
    Arrays64 in = values_of(mha);
    in.insert(in.begin(), {to64(query), to64(memory)});
    const std::size_t heads = 2;
    Mask mask = c.mask;
    if (c.spec.starts_with("sliding")) {  // the window as a boolean mask for the reference
      xt::xtensor<bool, 2> window = xt::zeros<bool>({std::size_t(4), std::size_t(4)});
      for (std::size_t i = 0; i < 4; ++i)
        for (std::size_t j = 0; j < 4; ++j) window(i, j) = j + 1 >= i && j <= i + 1;
      mask.allow(window);
    }
    const auto f = [&](const Arrays64& a) -> A64 {
      // A tie: the K block is the Q block, so perturbing one moves both.
      Arrays64 p = {a[2], a[3], a[4], a[5]};
      if (c.tied) {
        xt::view(p[0], xt::range(8, 16), xt::all()) = xt::view(p[0], xt::range(0, 8), xt::all());
        xt::view(p[1], xt::range(8, 16)) = xt::view(p[1], xt::range(0, 8));
      }
      // then conv_weight and head_norm.weight, where present, in parameters() order
      const A64* conv = c.conv ? &a[6] : nullptr;
      const A64* norm = c.norm ? &a[6 + c.conv] : nullptr;
      return mha64(a[0], c.cross ? a[1] : a[0], p, heads, mask, conv, norm);
    };
    Arrays64 fd = test::central_differences(f, in, to64(dy));  // self: f reads only a[0]
    Activations dx = g.query;
    if (!c.cross)
      for (std::size_t i = 0; i < dx.size(); ++i) dx.data()[i] += g.memory.data()[i];
    require_close_grad(to64(dx), fd[0], kRtol, kAtol, "dquery");
    if (c.cross) require_close_grad(to64(g.memory), fd[1], kRtol, kAtol, "dmemory");
    if (c.tied) {  // both blocks hold the one matrix's gradient, which fd finds on the Q block
      A64 qk = xt::view(fd[2], xt::range(0, 8), xt::all());
      xt::view(fd[2], xt::range(8, 16), xt::all()) = qk;
      A64 bq = xt::view(fd[3], xt::range(0, 8));
      xt::view(fd[3], xt::range(8, 16)) = bq;
    }
    require_parameter_grads(grad, named(mha, fd, 2), c.name);
  }
}

namespace {

// The case folders written by tests/torch_model_grads.py, run once per test binary, and its
// exit status (3: torch cannot be imported).
struct TorchCases {
  test::TempDir dir{"torch-model-grads"};
  int status = -1;
  TorchCases() {
    const std::string cmd = "/usr/bin/python3 '" + std::string(ATTNLAB_SOURCE_DIR) +
                            "/tests/torch_model_grads.py' '" + dir.path().string() + "' > '" +
                            dir.file("log.txt") + "' 2>&1";
    const int raw = std::system(cmd.c_str());
    status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  }
};

const TorchCases& torch_run() {
  static const TorchCases cases;
  return cases;
}

std::string torch_cases() {
  return torch_run().dir.path().string();
}

// True when the cases are there; a missing torch skips (with a warning), any other failure of
// the script fails the test with its log.
bool have_torch() {
  const TorchCases& run = torch_run();
  if (run.status == 3) {
    WARN("torch cannot be imported: the torch comparisons are skipped");
    return false;
  }
  INFO(test::read_text(run.dir.file("log.txt")));
  REQUIRE(run.status == 0);
  return true;
}

A64 load64(const std::string& path) {
  return xt::cast<double>(load_npy_float(path, {1, 2, 3}));
}

Activations load_activations(const std::string& path) {
  const xt::xarray<float> a = load_npy_float(path, {3});
  Activations x = Activations::from_shape({a.shape()[0], a.shape()[1], a.shape()[2]});
  std::copy(a.begin(), a.end(), x.begin());
  return x;
}

// Every gradient file of a case, by parameter name.
std::map<std::string, A64> torch_grads(const std::string& dir, Parameters& params) {
  std::map<std::string, A64> out;
  for (const ParameterRef& p : params) out[p.name] = load64(dir + "/grads/" + p.name + ".npy");
  return out;
}

Mask padding(std::int64_t a, std::int64_t b) {
  Mask m;
  m.key_lengths = {a, b};
  return m;
}

}  // namespace

TEST_CASE("multi-head attention: gradients equal PyTorch autograd", "[models][backward]") {
  if (!have_torch()) return;
  for (const std::string name : {"mha_self", "mha_cross"}) {
    INFO(name);
    const std::string dir = torch_cases() + "/" + name;
    MultiHeadAttention mha(16, 4);
    Parameters params;
    mha.parameters("", params);
    load_weights(dir + "/weights", params);
    const bool cross = name == "mha_cross";
    const Activations x = load_activations(dir + "/x.npy");
    const Activations memory = cross ? load_activations(dir + "/memory.npy") : x;
    const Mask mask = cross ? padding(9, 5) : Mask{};
    AttentionTrace trace;
    const Activations y = forward(mha, x, memory, mask, trace);
    require_close_grad(to64(y), load64(dir + "/out.npy"), kRtol, kAtol, "out");
    MultiHeadAttention grad = zero_like(mha);
    AttentionInputGrads g = backward(mha, trace, load_activations(dir + "/d_out.npy"), grad);
    if (!cross)
      for (std::size_t i = 0; i < g.query.size(); ++i) g.query.data()[i] += g.memory.data()[i];
    require_close_grad(to64(g.query), load64(dir + "/grads/x.npy"), kRtol, kAtol, "dx");
    if (cross)
      require_close_grad(to64(g.memory), load64(dir + "/grads/memory.npy"), kRtol, kAtol,
                         "dmemory");
    Parameters grads;
    grad.parameters("", grads);
    require_parameter_grads(grad, torch_grads(dir, grads), name);
  }
}

TEST_CASE("encoder layers, post- and pre-LN: gradients equal PyTorch autograd",
          "[models][backward]") {
  if (!have_torch()) return;
  for (const bool pre_ln : {false, true}) {
    // The twin is full attention; a sliding window wider than the sequence is the same.
    for (const std::string spec : {"full", "sliding:left=8,right=8"}) {
      INFO((pre_ln ? "pre-LN " : "post-LN ") << spec);
      const std::string dir =
          torch_cases() + (pre_ln ? "/encoder_layer_pre" : "/encoder_layer_post");
      LayerConfig config;
      config.d_model = 16;
      config.heads = 4;
      config.ffn = 24;
      config.spec = spec;
      config.pre_ln = pre_ln;
      EncoderLayer layer(config);
      Parameters params;
      layer.parameters("", params);
      load_weights(dir + "/weights", params);
      EncoderLayerTrace trace;
      const Activations y = forward(layer, load_activations(dir + "/x.npy"), padding(7, 4), trace);
      require_close_grad(to64(y), load64(dir + "/out.npy"), kRtol, kAtol, "out");
      EncoderLayer grad = zero_like(layer);
      const Activations dx = backward(layer, trace, load_activations(dir + "/d_out.npy"), grad);
      require_close_grad(to64(dx), load64(dir + "/grads/x.npy"), kRtol, kAtol, "dx");
      Parameters grads;
      grad.parameters("", grads);
      require_parameter_grads(grad, torch_grads(dir, grads), "encoder layer");
    }
  }
}

TEST_CASE("decoder layers, post- and pre-LN: gradients equal PyTorch autograd",
          "[models][backward]") {
  if (!have_torch()) return;
  for (const bool pre_ln : {false, true}) {
    INFO((pre_ln ? "pre-LN" : "post-LN"));
    const std::string dir = torch_cases() + (pre_ln ? "/decoder_layer_pre" : "/decoder_layer_post");
    LayerConfig config;
    config.d_model = 16;
    config.heads = 4;
    config.ffn = 24;
    config.pre_ln = pre_ln;
    DecoderLayer layer(config);
    Parameters params;
    layer.parameters("", params);
    load_weights(dir + "/weights", params);
    DecoderLayerTrace trace;
    const Activations y = forward(layer, load_activations(dir + "/x.npy"),
                                  load_activations(dir + "/memory.npy"), {}, padding(9, 5), trace);
    require_close_grad(to64(y), load64(dir + "/out.npy"), kRtol, kAtol, "out");
    DecoderLayer grad = zero_like(layer);
    const DecoderInputGrads g = backward(layer, trace, load_activations(dir + "/d_out.npy"), grad);
    require_close_grad(to64(g.x), load64(dir + "/grads/x.npy"), kRtol, kAtol, "dx");
    require_close_grad(to64(g.memory), load64(dir + "/grads/memory.npy"), kRtol, kAtol, "dmemory");
    Parameters grads;
    grad.parameters("", grads);
    require_parameter_grads(grad, torch_grads(dir, grads), "decoder layer");
  }
}

TEST_CASE("a decoder stack's input gradients match a directional difference of its forward",
          "[models][backward]") {
  // Two pre-LN layers and the final LayerNorm; both layers read the memory, so its gradient is
  // their sum: checked along a random direction (u, w) of (x, memory).
  LayerConfig config;
  config.d_model = 8;
  config.heads = 2;
  config.ffn = 12;
  config.pre_ln = true;
  Decoder decoder(config, 2);
  decoder.initialize(3, "");
  const Activations x = random_activations(2, 5, 8, 4), memory = random_activations(2, 6, 8, 5);
  const Activations dy = random_activations(2, 5, 8, 6), u = random_activations(2, 5, 8, 7),
                    w = random_activations(2, 6, 8, 8);
  const Mask memory_mask = padding(6, 3);
  DecoderTrace trace;
  forward(decoder, x, memory, {}, memory_mask, trace);
  Decoder grad = zero_like(decoder);
  const DecoderInputGrads g = backward(decoder, trace, dy, grad);
  const auto loss = [&](double t) {
    Activations x2 = x, m2 = memory;
    for (std::size_t i = 0; i < x2.size(); ++i) x2.data()[i] += float(t * u.data()[i]);
    for (std::size_t i = 0; i < m2.size(); ++i) m2.data()[i] += float(t * w.data()[i]);
    return double(xt::sum(to64(decoder.forward(x2, m2, {}, memory_mask)) * to64(dy))());
  };
  const double fd = directional_difference(loss);
  CHECK(xt::sum(to64(g.x) * to64(u))() + xt::sum(to64(g.memory) * to64(w))() ==
        Approx(fd).epsilon(2e-3));
}

TEST_CASE("embedding + positions + encoder stack: gradients equal PyTorch autograd",
          "[models][backward]") {
  if (!have_torch()) return;
  for (const bool pre_ln : {false, true}) {
    INFO((pre_ln ? "pre-LN (final LayerNorm)" : "post-LN"));
    const std::string dir = torch_cases() + (pre_ln ? "/model_pre" : "/model_post");
    ModelConfig config;
    config.layer.d_model = 16;
    config.layer.heads = 4;
    config.layer.ffn = 24;
    config.layer.pre_ln = pre_ln;
    config.layers = 2;
    config.vocab = 11;
    EncoderModel model(config);
    CHECK(model.load(dir + "/weights").empty());
    const xt::xarray<float> ids = load_npy_float(dir + "/tokens.npy", {2});
    Tokens tokens = Tokens::from_shape({ids.shape()[0], ids.shape()[1]});
    std::transform(ids.begin(), ids.end(), tokens.begin(),
                   [](float t) { return static_cast<std::int64_t>(t); });
    ModelTrace trace;
    const Activations y = forward(model, tokens, padding(7, 4), trace);
    require_close_grad(to64(y), load64(dir + "/out.npy"), kRtol, kAtol, "out");
    EncoderModel grad = zero_like(model);
    backward(model, trace, load_activations(dir + "/d_out.npy"), grad);
    std::map<std::string, A64> want;
    for (const ParameterRef& p : grad.parameters())
      want[p.name] = load64(dir + "/grads/" + p.name + ".npy");
    for (const ParameterRef& p : grad.parameters()) {
      INFO(p.name);
      require_close_grad(array_of(p), want.at(p.name), kRtol, kAtol, p.name);
    }
  }
}

TEST_CASE("multi-head attention: a core's own tensors (linformer's E and F) are learned weights",
          "[models][backward]") {
  const Activations query = random_activations(2, 5, 8, 13), dy = random_activations(2, 5, 8, 15);
  Mask padded;
  padded.key_lengths = {5, 3};
  for (const std::string share : {"none", "kv", "layer"}) {
    INFO("share=" << share);
    MultiHeadAttention mha(8, 2, "linformer:k=3,max_len=6,share=" + share);
    mha.initialize(11, "");
    Parameters params;
    mha.parameters("", params);
    std::vector<std::string> names;
    std::size_t first = params.size();
    for (std::size_t i = 0; i < params.size(); ++i)
      if (params[i].name.starts_with("attention_")) {
        first = std::min(first, i);
        names.push_back(params[i].name);
        CHECK(params[i].shape == (share == "layer" ? std::vector<std::size_t>{3, 6}
                                                   : std::vector<std::size_t>{2, 3, 6}));
      }
    CHECK(names == (share == "none" ? std::vector<std::string>{"attention_E", "attention_F"}
                                    : std::vector<std::string>{"attention_E"}));
    // Their gradients (summed over uses where share ties them) along a random direction of
    // every one, against a directional difference of the float32 forward.
    AttentionTrace trace;
    forward(mha, query, query, padded, trace);
    MultiHeadAttention grad = zero_like(mha);
    backward(mha, trace, dy, grad);
    const double analytic = check_parameter_direction(
        mha, grad, first, [&] { return mha.forward(query, query, padded); }, dy);
    CHECK(std::abs(analytic) > 1e-3);  // the direction meets a gradient that is not zero
    // A copy holds its own: changing its E changes its output, not the original's.
    const Activations before = mha.forward(query, query, padded);
    MultiHeadAttention copy = mha;
    for (float& x : copy.attention_parameters[0].values) x *= 2.0f;
    CHECK_FALSE((copy.forward(query, query, padded) == before));
    CHECK((mha.forward(query, query, padded) == before));
    // The layer's variant stays the factory's spec once the core holds changed tensors.
    CHECK(copy.spec() == mha.spec());
    CHECK(copy.spec().find("init=gaussian") != std::string::npos);
    // A tensor that no longer fits the core is refused by name.
    copy.attention_parameters[0].values.pop_back();
    CHECK_THROWS_WITH(copy.forward(query, query, padded), Catch::Contains("parameter E"));
  }
}

TEST_CASE("gradients accumulate over backward calls", "[models][backward]") {
  LayerConfig config;
  config.d_model = 8;
  config.heads = 2;
  config.ffn = 12;
  EncoderLayer layer(config);
  layer.initialize(1, "");
  const Activations x = random_activations(2, 5, 8, 2), dy = random_activations(2, 5, 8, 3);
  EncoderLayerTrace trace;
  forward(layer, x, {}, trace);
  EncoderLayer once = zero_like(layer), twice = zero_like(layer);
  backward(layer, trace, dy, once);
  backward(layer, trace, dy, twice);
  backward(layer, trace, dy, twice);
  Parameters a, b;
  once.parameters("", a);
  twice.parameters("", b);
  for (std::size_t i = 0; i < a.size(); ++i)
    for (std::size_t j = 0; j < a[i].size(); ++j) CHECK(b[i].data[j] == Approx(2 * a[i].data[j]));
  zero_gradients(b);
  for (const ParameterRef& p : b)
    for (std::size_t j = 0; j < p.size(); ++j) CHECK(p.data[j] == 0.0f);
}

TEST_CASE("Adam with weight decay and warm-up equals torch.optim.AdamW", "[models][backward]") {
  if (!have_torch()) return;
  const std::string dir = torch_cases() + "/adamw";
  const A64 initial = load64(dir + "/initial.npy");
  const xt::xarray<float> grads = load_npy_float(dir + "/grads.npy", {3});
  const A64 steps = load64(dir + "/steps.npy");
  Matrix w = Matrix::from_shape({5, 3}), g = Matrix::from_shape({5, 3});
  std::copy(initial.begin(), initial.end(), w.begin());
  const Parameters params = {parameter("w", w)}, grad = {parameter("w", g)};
  AdamConfig config;
  config.lr = 0.05;
  config.beta1 = 0.8;
  config.beta2 = 0.95;
  config.eps = 1e-6;
  config.weight_decay = 0.1;
  config.warmup = 3;
  Adam adam(config);
  CHECK(adam.learning_rate(1) == Approx(0.05 / 3));
  CHECK(adam.learning_rate(3) == Approx(0.05));
  CHECK(adam.learning_rate(10) == Approx(0.05));
  for (std::size_t t = 0; t < grads.shape()[0]; ++t) {
    std::copy_n(grads.data() + t * 15, 15, g.data());
    adam.step(params, grad);
    // float32 state against torch's float64: ~1e-7 relative per step.
    require_close_grad(xt::cast<double>(w), xt::view(steps, t), 1e-5, 1e-6,
                       "step " + std::to_string(t + 1));
  }
  CHECK(adam.steps() == grads.shape()[0]);
}

TEST_CASE("Adam refuses bad settings and mismatched gradients, naming them", "[models]") {
  AdamConfig bad;
  bad.beta2 = 1.0;
  require_error([&] { Adam a(bad); }, {"beta2", "[0, 1)"});
  bad = AdamConfig();
  bad.lr = 0;
  require_error([&] { Adam a(bad); }, {"lr=0"});
  Matrix w = xt::zeros<float>({2, 2}), g = xt::zeros<float>({2, 2}), h = xt::zeros<float>({2, 3});
  Adam adam(AdamConfig{});
  require_error([&] { adam.step({parameter("w", w)}, {parameter("v", g)}); }, {"'w'", "'v'"});
  require_error([&] { adam.step({parameter("w", w)}, {parameter("w", h)}); }, {"'w'"});
  g(0, 1) = std::numeric_limits<float>::quiet_NaN();
  require_error([&] { adam.step({parameter("w", w)}, {parameter("w", g)}); },
                {"non-finite", "'w'"});
  CHECK(adam.steps() == 0);
  CHECK(w(0, 0) == 0.0f);  // nothing changed
}
