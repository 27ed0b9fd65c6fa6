// The Llama block's layers and model (models/llama.hpp): RMSNorm, rotary embeddings, SwiGLU,
// Llama's attention, the block and the model, each forward against a float64 computation written
// here from the definitions (Hugging Face's LlamaRMSNorm, rotate_half, LlamaMLP), and each
// backward against float64 central differences of it; the weights folder's names; bad input.
// The PyTorch twin's comparison (outputs and 200 training steps) is tests/torch_train.py.
#include <cmath>
#include <filesystem>
#include <map>
#include <random>
#include <string>

#include <xtensor/xview.hpp>

#include "attnlab/npy.hpp"
#include "grad_helpers.hpp"
#include "helpers.hpp"
#include "models/llama.hpp"

using namespace attnlab;
using namespace attnlab::models;
using attnlab::test::Arrays64;
using attnlab::test::require_close_grad;
using attnlab::test::require_error;

namespace {

using A64 = xt::xarray<double>;

// float32 layers against fp64 references: products over up to 16 terms, the norms' scaling and
// the softmax round at ~1e-7 relative each, so a few 1e-6 on outputs of size 1 and gradients
// of size 10; the bounds keep a margin of about 10x over what the cases below measured.
constexpr double kRtol = 1e-4, kAtol = 3e-5;

A64 to64(const Activations& a) {
  return xt::cast<double>(a);
}

A64 to64(const Tensor& a) {
  return xt::cast<double>(a);
}

Activations random_activations(std::size_t b, std::size_t n, std::size_t d, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Activations x = Activations::from_shape({b, n, d});
  for (float& v : x) v = normal(rng);
  return x;
}

template <class Layer>
Arrays64 values_of(Layer& layer) {
  Parameters params;
  layer.parameters("", params);
  Arrays64 out;
  for (const ParameterRef& p : params) {
    A64 a = xt::zeros<double>(p.shape);
    std::copy_n(p.data, p.size(), a.begin());
    out.push_back(a);
  }
  return out;
}

// Gains away from 1 and weights larger than Llama's 0.02, so that every term of a gradient is
// exercised at the sizes of these tests.
template <class Layer>
void perturb(Layer& layer, std::uint64_t seed) {
  Parameters params;
  layer.parameters("", params);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.3f);
  for (const ParameterRef& p : params)
    for (std::size_t i = 0; i < p.size(); ++i) p.data[i] += normal(rng);
}

// Each gradient params[i] against fd[first + i].
void require_grads(const Parameters& params, const Arrays64& fd, std::size_t first,
                   const std::string& what) {
  REQUIRE(fd.size() == first + params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    A64 got = xt::zeros<double>(params[i].shape);
    std::copy_n(params[i].data, params[i].size(), got.begin());
    require_close_grad(got, fd[first + i], kRtol, kAtol, what + ": " + params[i].name);
  }
}

// The same for a layer's gradients (its parameters() in order).
template <class Layer>
void require_parameter_grads(Layer& grad, const Arrays64& fd, std::size_t first,
                             const std::string& what) {
  Parameters params;
  grad.parameters("", params);
  require_grads(params, fd, first, what);
}

// ---- float64 forwards from the definitions ----

// y = x W^T over the last axis.
A64 linear64(const A64& x, const A64& w) {
  const std::size_t rows = x.size() / x.shape()[2], in = w.shape()[1], out = w.shape()[0];
  A64 y = xt::zeros<double>({x.shape()[0], x.shape()[1], out});
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t o = 0; o < out; ++o) {
      double s = 0;
      for (std::size_t i = 0; i < in; ++i) s += x.data()[r * in + i] * w(o, i);
      y.data()[r * out + o] = s;
    }
  return y;
}

// LlamaRMSNorm: x / sqrt(mean(x²) + eps) * weight.
A64 rms64(const A64& x, const A64& w, double eps) {
  const std::size_t d = w.size(), rows = x.size() / d;
  A64 y = x;
  for (std::size_t r = 0; r < rows; ++r) {
    double ms = 0;
    for (std::size_t c = 0; c < d; ++c) ms += x.data()[r * d + c] * x.data()[r * d + c] / double(d);
    for (std::size_t c = 0; c < d; ++c)
      y.data()[r * d + c] = x.data()[r * d + c] / std::sqrt(ms + eps) * w(c);
  }
  return y;
}

double silu(double z) {
  return z / (1 + std::exp(-z));
}

// LlamaMLP: down(silu(gate(x)) * up(x)).
A64 swiglu64(const A64& x, const A64& gate, const A64& up, const A64& down) {
  const A64 g = linear64(x, gate), u = linear64(x, up);
  A64 h = g;
  for (std::size_t i = 0; i < h.size(); ++i) h.data()[i] = silu(g.data()[i]) * u.data()[i];
  return linear64(h, down);
}

// Hugging Face's apply_rotary_pos_emb on one head's rows t [B, H, N, dk]:
// t * cos + rotate_half(t) * sin, rotate_half(t) = cat(-t2, t1), cos = cat(cos(p θ), cos(p θ)).
Tensor64 rope64(const Tensor64& t, double base) {
  const std::size_t n = t.shape()[2], dk = t.shape()[3], half = dk / 2;
  Tensor64 out = t;
  for (std::size_t b = 0; b < t.shape()[0]; ++b)
    for (std::size_t h = 0; h < t.shape()[1]; ++h)
      for (std::size_t p = 0; p < n; ++p)
        for (std::size_t c = 0; c < dk; ++c) {
          const std::size_t j = c % half;
          const double angle = double(p) * std::pow(base, -2.0 * double(j) / double(dk));
          const double rotated = c < half ? -t(b, h, p, c + half) : t(b, h, p, c - half);
          out(b, h, p, c) = t(b, h, p, c) * std::cos(angle) + rotated * std::sin(angle);
        }
  return out;
}

// Rows [B, N, H·dk] as heads [B, H, N, dk] and back.
Tensor64 heads64(const A64& y, std::size_t heads) {
  const std::size_t batch = y.shape()[0], n = y.shape()[1], dk = y.shape()[2] / heads;
  Tensor64 t = xt::zeros<double>({batch, heads, n, dk});
  for (std::size_t b = 0; b < batch; ++b)
    for (std::size_t h = 0; h < heads; ++h)
      for (std::size_t i = 0; i < n; ++i)
        for (std::size_t c = 0; c < dk; ++c) t(b, h, i, c) = y(b, i, h * dk + c);
  return t;
}

A64 merge64(const Tensor64& t) {
  const std::size_t batch = t.shape()[0], heads = t.shape()[1], n = t.shape()[2], dk = t.shape()[3];
  A64 y = xt::zeros<double>({batch, n, heads * dk});
  for (std::size_t b = 0; b < batch; ++b)
    for (std::size_t h = 0; h < heads; ++h)
      for (std::size_t i = 0; i < n; ++i)
        for (std::size_t c = 0; c < dk; ++c) y(b, i, h * dk + c) = t(b, h, i, c);
  return y;
}

// Key or value heads [B, Hkv, N, dk] repeated for `heads` query heads, as Hugging Face's
// repeat_kv: query head h reads head h / (heads / Hkv).
Tensor64 repeat_kv64(const Tensor64& t, std::size_t heads) {
  const std::size_t group = heads / t.shape()[1];
  Tensor64 out = xt::zeros<double>({t.shape()[0], heads, t.shape()[2], t.shape()[3]});
  for (std::size_t b = 0; b < t.shape()[0]; ++b)
    for (std::size_t h = 0; h < heads; ++h) xt::view(out, b, h) = xt::view(t, b, h / group);
  return out;
}

// LlamaAttention (no biases, rotary q and k, causal exact softmax): p = q, k, v, o weights;
// k and v have wk's rows / d_k heads (grouped heads when fewer than `heads`), repeated.
A64 attention64(const A64& x, const A64& wq, const A64& wk, const A64& wv, const A64& wo,
                std::size_t heads, double base) {
  const std::size_t kv_heads = wk.shape()[0] / (wq.shape()[0] / heads);
  const Tensor64 q = rope64(heads64(linear64(x, wq), heads), base);
  const Tensor64 k = repeat_kv64(rope64(heads64(linear64(x, wk), kv_heads), base), heads);
  const Tensor64 v = repeat_kv64(heads64(linear64(x, wv), kv_heads), heads);
  const double scale = 1.0 / std::sqrt(double(q.shape()[3]));
  const Tensor64 out = reference_attention(
      q, k, v, scale,
      [](std::size_t, std::size_t, std::size_t i, std::size_t j) { return j <= i; });
  return linear64(merge64(out), wo);
}

// LlamaDecoderLayer: h = x + attn(rms1(x)); y = h + mlp(rms2(h)). p in parameters() order:
// q, k, v, o, gate, up, down, input_layernorm, post_attention_layernorm.
A64 block64(const A64& x, const Arrays64& p, std::size_t heads, double base, double eps) {
  const A64 h = x + attention64(rms64(x, p[7], eps), p[0], p[1], p[2], p[3], heads, base);
  return h + swiglu64(rms64(h, p[8], eps), p[4], p[5], p[6]);
}

// The model: embedding rows, blocks, the final norm. p: embed_tokens, then 9 per block, then
// norm.
A64 model64(const Tokens& tokens, const Arrays64& p, std::size_t layers, std::size_t heads,
            double base, double eps) {
  const std::size_t d = p[0].shape()[1];
  A64 x = xt::zeros<double>({tokens.shape()[0], tokens.shape()[1], d});
  for (std::size_t i = 0; i < tokens.size(); ++i)
    for (std::size_t c = 0; c < d; ++c) x.data()[i * d + c] = p[0](tokens.data()[i], c);
  for (std::size_t l = 0; l < layers; ++l)
    x = block64(x, Arrays64(p.begin() + 1 + 9 * l, p.begin() + 10 + 9 * l), heads, base, eps);
  return rms64(x, p.back(), eps);
}

template <class Array>
std::vector<std::size_t> shape_of(const Array& a) {
  return {a.shape().begin(), a.shape().end()};
}

LayerConfig llama_layer(std::size_t d = 8, std::size_t heads = 2, std::size_t ffn = 12) {
  LayerConfig c;
  c.d_model = d;
  c.heads = heads;
  c.ffn = ffn;
  c.pre_ln = true;
  return c;
}

// A directional derivative of `loss` at 0: central differences at h and h/2 combined by
// Richardson extrapolation, which cancels the h² term (as tests/test_model_backward.cpp's).
template <class Loss>
double directional_difference(const Loss& loss, double h = 1e-2) {
  const auto central = [&](double s) { return (loss(s) - loss(-s)) / (2 * s); };
  return (4 * central(h / 2) - central(h)) / 3;
}

}  // namespace

TEST_CASE("RMSNorm, SwiGLU, Linear without bias: forward and gradients against fp64",
          "[models][llama][backward]") {
  const Activations x = random_activations(2, 4, 6, 1), dy = random_activations(2, 4, 6, 2);
  SECTION("RMSNorm") {
    RMSNorm norm(6, 1e-5);
    perturb(norm, 3);
    require_close_grad(to64(norm.forward(x)), rms64(to64(x), values_of(norm)[0], 1e-5), kRtol,
                       kAtol, "forward");
    RMSNorm grad = zero_like(norm);
    Activations dx;
    backward(norm, x, dy, grad, dx);
    Arrays64 in = values_of(norm);
    in.insert(in.begin(), to64(x));
    const Arrays64 fd = test::central_differences(
        [](const Arrays64& a) { return rms64(a[0], a[1], 1e-5); }, in, to64(dy));
    require_close_grad(to64(dx), fd[0], kRtol, kAtol, "dx");
    require_parameter_grads(grad, fd, 1, "RMSNorm");
  }
  SECTION("SwiGLU") {
    SwiGLU mlp(6, 10);
    mlp.initialize(4, "", 0.3);
    Parameters names;
    mlp.parameters("", names);
    REQUIRE(names.size() == 3);
    CHECK(names[0].name == "gate_proj.weight");
    CHECK(names[1].name == "up_proj.weight");
    CHECK(names[2].name == "down_proj.weight");
    const Arrays64 p = values_of(mlp);
    require_close_grad(to64(mlp.forward(x)), swiglu64(to64(x), p[0], p[1], p[2]), kRtol, kAtol,
                       "forward");
    SwiGLUTrace trace;
    const Activations y = forward(mlp, x, trace);
    CHECK((y == mlp.forward(x)));  // one forward: keeping the trace changes nothing
    SwiGLU grad = zero_like(mlp);
    const Activations dx = backward(mlp, trace, dy, grad);
    Arrays64 in = p;
    in.insert(in.begin(), to64(x));
    const Arrays64 fd = test::central_differences(
        [](const Arrays64& a) { return swiglu64(a[0], a[1], a[2], a[3]); }, in, to64(dy));
    require_close_grad(to64(dx), fd[0], kRtol, kAtol, "dx");
    require_parameter_grads(grad, fd, 1, "SwiGLU");
  }
  SECTION("Linear without bias") {
    Linear layer(6, 5, false);
    layer.initialize(5, "");
    Parameters names;
    layer.parameters("", names);
    REQUIRE(names.size() == 1);
    CHECK(names[0].name == "weight");
    const Activations d5 = random_activations(2, 4, 5, 6);
    Linear grad = zero_like(layer);
    const Activations dx = backward(layer, x, d5, grad);
    Arrays64 in = values_of(layer);
    in.insert(in.begin(), to64(x));
    const Arrays64 fd = test::central_differences(
        [](const Arrays64& a) { return linear64(a[0], a[1]); }, in, to64(d5));
    require_close_grad(to64(dx), fd[0], kRtol, kAtol, "dx");
    require_parameter_grads(grad, fd, 1, "Linear");
  }
}

TEST_CASE("rotary embeddings: Hugging Face's rotate_half, relative positions, inverse",
          "[models][llama]") {
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal;
  Tensor t = Tensor::from_shape({2, 3, 9, 8});
  for (float& v : t) v = normal(rng);
  const Rotary rotary(8, 100.0);  // a small base: every channel pair turns visibly over 9 tokens
  Tensor rotated = t;
  rotary.apply(rotated);
  // Angles up to 8 rad, cos and sin rounded to float: ~1e-6 of the entries' size.
  const Tensor64 want = rope64(xt::cast<double>(t), 100.0);
  for (std::size_t i = 0; i < t.size(); ++i)
    REQUIRE(rotated.data()[i] == Approx(want.data()[i]).margin(2e-6));
  // Position 0 is not turned; a rotation keeps the norm of each pair of channels.
  for (std::size_t c = 0; c < 8; ++c) CHECK(rotated(1, 2, 0, c) == t(1, 2, 0, c));
  // q_i · k_j depends on i - j alone: the same vectors at (i, j) = (5, 2) and (7, 4).
  Tensor q = Tensor::from_shape({1, 1, 9, 8}), k = q;
  for (std::size_t c = 0; c < 8; ++c) {
    q(0, 0, 5, c) = q(0, 0, 7, c) = normal(rng);
    k(0, 0, 2, c) = k(0, 0, 4, c) = normal(rng);
  }
  rotary.apply(q);
  rotary.apply(k);
  double s1 = 0, s2 = 0;
  for (std::size_t c = 0; c < 8; ++c) {
    s1 += double(q(0, 0, 5, c)) * k(0, 0, 2, c);
    s2 += double(q(0, 0, 7, c)) * k(0, 0, 4, c);
  }
  CHECK(s1 == Approx(s2).margin(1e-5));
  // The backward is the inverse rotation.
  rotary.apply(rotated, true);
  for (std::size_t i = 0; i < t.size(); ++i)
    REQUIRE(rotated.data()[i] == Approx(t.data()[i]).margin(1e-5));
}

TEST_CASE("Llama attention and block: forward and gradients against fp64", "[models][llama]") {
  const double base = 50.0;  // turns every pair of channels visibly over 5 tokens
  // As many key and value heads as query heads, MQA (one), GQA (two for four).
  const auto [heads, kv_heads] =
      GENERATE(table<std::size_t, std::size_t>({{2, 0}, {2, 1}, {4, 2}}));
  INFO("heads " << heads << ", kv_heads " << kv_heads);
  LayerConfig c = llama_layer(8, heads);
  c.kv_heads = kv_heads;
  c.rope_base = base;
  c.eps = 1e-5;
  Mask causal;
  causal.causal = Causal::top_left;
  const Activations x = random_activations(2, 5, 8, 11), dy = random_activations(2, 5, 8, 12);
  LlamaBlock block(c);
  block.initialize(13, "");
  perturb(block, 14);
  const Arrays64 p = values_of(block);
  REQUIRE(p.size() == 9);
  // W_K and W_V project to the key and value heads only: the layer never repeats them.
  const std::size_t kv_rows = (kv_heads ? kv_heads : heads) * (8 / heads);
  CHECK(shape_of(p[1]) == std::vector<std::size_t>{kv_rows, 8});
  CHECK(shape_of(p[2]) == std::vector<std::size_t>{kv_rows, 8});
  SECTION("attention") {
    const MultiHeadAttention& mha = block.self_attn;
    CHECK(!mha.bias());
    const QKV projected = mha.project(x, x);
    CHECK(projected.k.shape()[1] == kv_rows / (8 / heads));
    CHECK(projected.v.shape()[1] == kv_rows / (8 / heads));
    require_close_grad(to64(mha.forward(x, causal)),
                       attention64(to64(x), p[0], p[1], p[2], p[3], heads, base), kRtol, kAtol,
                       "forward");
    AttentionTrace trace;
    const Activations& y = forward(mha, x, x, causal, trace);
    CHECK((y == mha.forward(x, causal)));
    MultiHeadAttention grad = zero_like(mha);
    const AttentionInputGrads g = backward(mha, trace, dy, grad);
    Arrays64 in(p.begin(), p.begin() + 4);
    in.insert(in.begin(), to64(x));
    const Arrays64 fd = test::central_differences(
        [&](const Arrays64& a) { return attention64(a[0], a[1], a[2], a[3], a[4], heads, base); },
        in, to64(dy));
    require_close_grad(to64(g.query) + to64(g.memory), fd[0], kRtol, kAtol, "dx");
    require_parameter_grads(grad, fd, 1, "attention");
  }
  SECTION("block") {
    require_close_grad(to64(block.forward(x, causal)), block64(to64(x), p, heads, base, 1e-5),
                       kRtol, kAtol, "forward");
    LlamaBlockTrace trace;
    const Activations& y = forward(block, x, causal, trace);
    CHECK((y == block.forward(x, causal)));
    LlamaBlock grad = zero_like(block);
    const Activations dx = backward(block, trace, dy, grad);
    Arrays64 in = p;
    in.insert(in.begin(), to64(x));
    const Arrays64 fd = test::central_differences(
        [&](const Arrays64& a) {
          return block64(a[0], Arrays64(a.begin() + 1, a.end()), heads, base, 1e-5);
        },
        in, to64(dy));
    require_close_grad(to64(dx), fd[0], kRtol, kAtol, "dx");
    require_parameter_grads(grad, fd, 1, "block");
  }
}

TEST_CASE("Llama model: forward and gradients against fp64, Hugging Face's names",
          "[models][llama]") {
  ModelConfig m;
  m.arch = Arch::llama;
  m.layer = llama_layer();
  m.layer.rope_base = 50.0;
  m.layers = 2;
  m.vocab = 11;
  m.seed = 3;
  LlamaModel model(m);
  Parameters params = model.parameters();
  const std::vector<std::string> block = {
      "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
      "self_attn.o_proj.weight", "mlp.gate_proj.weight",    "mlp.up_proj.weight",
      "mlp.down_proj.weight",    "input_layernorm.weight",  "post_attention_layernorm.weight"};
  std::vector<std::string> want = {"model.embed_tokens.weight"};
  for (std::size_t l = 0; l < 2; ++l)
    for (const std::string& name : block)
      want.push_back("model.layers." + std::to_string(l) + "." + name);
  want.push_back("model.norm.weight");
  REQUIRE(params.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) CHECK(params[i].name == want[i]);

  // Hugging Face's initialisation: N(0, 0.02²) matrices, gains 1.
  double squares = 0;
  for (std::size_t i = 0; i < params[1].size(); ++i) squares += std::pow(params[1].data[i], 2);
  CHECK(std::sqrt(squares / double(params[1].size())) == Approx(0.02).epsilon(0.3));
  CHECK(params.back().data[0] == 1.0f);

  perturb(model.layers[0], 4);
  perturb(model.layers[1], 5);
  for (std::size_t i = 0; i < params[0].size(); ++i) params[0].data[i] *= 20;  // unit rows
  const Tokens tokens = random_tokens(2, 6, 11, 6);
  const Activations dy = random_activations(2, 6, 8, 7);
  Arrays64 p;
  for (const ParameterRef& r : params) {
    A64 a = xt::zeros<double>(r.shape);
    std::copy_n(r.data, r.size(), a.begin());
    p.push_back(a);
  }
  // The model is causal whatever mask it is given (top-left).
  const Activations y = model.forward(tokens);
  require_close_grad(to64(y), model64(tokens, p, 2, 2, 50.0, 1e-5), kRtol, kAtol, "forward");
  LlamaTrace trace;
  CHECK((forward(model, tokens, {}, trace) == y));
  LlamaModel grad = zero_like(model);
  backward(model, trace, dy, grad);
  const Arrays64 fd = test::central_differences(
      [&](const Arrays64& a) { return model64(tokens, a, 2, 2, 50.0, 1e-5); }, p, to64(dy));
  require_grads(grad.parameters(), fd, 0, "model");

  // A folder saved by one model loads into another, the same forward.
  test::TempDir dir("llama-weights");
  model.save(dir.path().string());
  ModelConfig other = m;
  other.seed = 99;
  LlamaModel loaded(other);
  CHECK(loaded.load(dir.path().string()).empty());
  CHECK((loaded.forward(tokens) == y));
}

TEST_CASE("Llama model: switches, cores and every forward equal to the traced one",
          "[models][llama]") {
  struct Case {
    std::string spec, switches;
    std::size_t heads = 2, kv_heads = 0;
  };
  const Case cases[] = {{"full", "no-final-norm"},
                        {"sliding:left=2,right=0", "head-norm"},
                        {"gated-delta", "short-conv,head-norm"},
                        {"linear", "short-conv"},
                        {"full", "tied-qk,no-ffn"},
                        {"full", "no-skip,no-norm"},
                        // Grouped heads: the short convolution over the narrower k and v blocks.
                        {"full", "short-conv,head-norm", 2, 1},
                        {"sliding:left=2,right=0", "short-conv", 4, 2}};
  for (const Case& c : cases) {
    INFO(c.spec << " " << c.switches << " heads " << c.heads << " kv_heads " << c.kv_heads);
    ModelConfig m;
    m.arch = Arch::llama;
    m.layer = llama_layer(16, c.heads, 24);
    m.layer.kv_heads = c.kv_heads;
    m.layer.spec = c.spec;
    apply_switches(m.layer, c.switches);
    m.layers = 2;
    m.vocab = 13;
    LlamaModel model(m);
    for (LlamaBlock& block : model.layers) perturb(block, 11);  // away from the 0.02 start
    const Tokens tokens = random_tokens(2, 7, 13, 8);
    const Activations dy = random_activations(2, 7, 16, 9);
    LlamaTrace trace;
    const Activations& y = forward(model, tokens, {}, trace);
    CHECK((y == model.forward(tokens)));
    LlamaModel grad = zero_like(model);
    backward(model, trace, dy, grad);
    // The gradient along a random direction of every parameter (each tensor's entries scaled by
    // its root mean square, so that a step t moves every tensor by t of its size) against a
    // directional difference of the float32 forward. Its float32 rounding over h = 3e-3 is the
    // error: without a final norm the outputs, and so the loss, grow to ~1e3 while the derivative
    // is ~10, and a 1e-7 relative rounding of the loss becomes 0.3% of it (measured worst: 0.2%
    // off); 1e-2 allowed. Tied W_Q = W_K: one matrix, moved as one (the K block takes the Q
    // block's direction), whose gradient both blocks hold (counted once).
    Parameters params = model.parameters(), grads = grad.parameters();
    std::mt19937_64 rng(10);
    std::normal_distribution<float> normal;
    std::vector<std::vector<float>> base, dirs;
    double analytic = 0;
    for (std::size_t i = 0; i < params.size(); ++i) {
      base.emplace_back(params[i].data, params[i].data + params[i].size());
      dirs.emplace_back(params[i].size());
      const bool tied_k = m.layer.tied_qk && params[i].name.ends_with("k_proj.weight");
      double squares = 0;
      for (std::size_t e = 0; e < params[i].size(); ++e) squares += std::pow(params[i].data[e], 2);
      const double rms = std::sqrt(squares / double(params[i].size()));
      for (std::size_t e = 0; e < params[i].size(); ++e) {
        dirs[i][e] = tied_k ? dirs[i - 1][e] : float(normal(rng) * rms);
        if (!tied_k) analytic += double(dirs[i][e]) * grads[i].data[e];
      }
    }
    const auto loss = [&](double t) {
      for (std::size_t i = 0; i < params.size(); ++i)
        for (std::size_t e = 0; e < params[i].size(); ++e)
          params[i].data[e] = float(base[i][e] + t * dirs[i][e]);
      const double l = xt::sum(to64(model.forward(tokens)) * to64(dy))();
      for (std::size_t i = 0; i < params.size(); ++i)
        std::copy(base[i].begin(), base[i].end(), params[i].data);
      return l;
    };
    CHECK(analytic == Approx(directional_difference(loss, 3e-3)).epsilon(1e-2));
  }
}

TEST_CASE("Llama model: bad input names the field", "[models][llama]") {
  ModelConfig m;
  m.arch = Arch::llama;
  m.layer = llama_layer(8, 4, 8);
  m.layers = 1;
  m.vocab = 5;
  {
    ModelConfig c = m;
    c.layer.kv_heads = 3;
    require_error([&] { LlamaModel model(c); }, {"kv_heads=3", "heads=4"});
  }
  {
    ModelConfig c = m;
    c.layer.kv_heads = 2;  // divides heads: grouped heads, refused by a core without them
    c.layer.spec = "linformer:k=4";
    CHECK_THROWS_AS(LlamaModel(c), Unsupported);
    require_error([&] { LlamaModel model(c); }, {"linformer", "grouped heads", "kv_heads=2"});
    for (const char* spec : {"full", "gated-delta", "linear"}) {  // cores that take them
      c.layer.spec = spec;
      CHECK_NOTHROW(LlamaModel(c));
    }
    c.layer.spec = "full";
    MultiHeadAttention mha(8, 4, "full", [] {
      AttentionOptions o;
      o.kv_heads = 2;
      return o;
    }());
    require_error([&] { mha.set_attention("linformer"); }, {"linformer", "grouped heads"});
    c.layer.tied_qk = true;  // W_K would have fewer rows than W_Q
    require_error([&] { LlamaModel model(c); }, {"kv_heads=2", "tied-qk"});
  }
  {
    ModelConfig c = m;
    c.layer.d_model = 12;  // head dimension 3
    require_error([&] { LlamaModel model(c); }, {"head dimension", "odd"});
  }
  for (const double base : {0.0, -10.0}) {
    ModelConfig c = m;
    c.layer.rope_base = base;
    require_error([&] { LlamaModel model(c); }, {"rope_base", "> 0"});
  }
  {
    ModelConfig c = m;
    c.arch = Arch::transformer;
    c.layer.rope_base = 500;
    require_error([&] { c.validate(); }, {"rope_base=500", "sinusoidal"});
    c.layer.rope_base = 10000;
    c.layer.kv_heads = 2;
    require_error([&] { c.validate(); }, {"kv_heads=2", "arch llama"});
    require_error([&] { LlamaModel model(c); }, {"arch=transformer", "EncoderModel"});
  }
  require_error([] { parse_arch("gpt"); }, {"arch 'gpt'", "transformer, llama"});

  // The weights folder: a missing, an extra and a mis-shaped tensor, each named.
  LlamaModel model(m);
  test::TempDir dir("llama-bad-weights");
  const std::string folder = dir.path().string();
  model.save(folder);
  const Tokens tokens = random_tokens(1, 4, 5, 1);
  const Activations before = model.forward(tokens);
  std::filesystem::remove(folder + "/model.norm.weight.npy");
  require_error([&] { model.load(folder); }, {"model.norm.weight.npy"});
  model.save(folder);
  save_npy(folder + "/model.layers.0.mlp.up_proj.weight.npy",
           xt::xarray<float>::from_shape({8, 7}));
  require_error([&] { model.load(folder); }, {"model.layers.0.mlp.up_proj.weight.npy", "(8, 7)"});
  CHECK((model.forward(tokens) == before));  // unchanged after a failed load
  model.save(folder);
  save_npy(folder + "/lm_head.weight.npy", xt::xarray<float>::from_shape({5, 8}));
  CHECK(model.load(folder) == std::vector<std::string>{"lm_head.weight.npy"});

  // A grouped model's folder holds k_proj and v_proj [kv_heads·d_k, d_model]; either model
  // names the tensor whose shape the other's folder does not have.
  ModelConfig grouped_config = m;
  grouped_config.layer.kv_heads = 1;
  LlamaModel grouped(grouped_config);
  test::TempDir grouped_dir("llama-grouped-weights");
  const std::string grouped_folder = grouped_dir.path().string();
  grouped.save(grouped_folder);
  const std::string attn = grouped_folder + "/model.layers.0.self_attn.";
  CHECK(shape_of(load_npy_float(attn + "k_proj.weight.npy")) == std::vector<std::size_t>{2, 8});
  CHECK(shape_of(load_npy_float(attn + "v_proj.weight.npy")) == std::vector<std::size_t>{2, 8});
  CHECK(shape_of(load_npy_float(attn + "q_proj.weight.npy")) == std::vector<std::size_t>{8, 8});
  require_error([&] { grouped.load(folder); },
                {"model.layers.0.self_attn.k_proj.weight.npy", "(8, 8)", "(2, 8)"});
  require_error([&] { model.load(grouped_folder); },
                {"model.layers.0.self_attn.k_proj.weight.npy", "(2, 8)", "(8, 8)"});
  LlamaModel reloaded(grouped_config);
  reloaded.layers[0].self_attn.in_proj_weight.fill(0);
  CHECK(reloaded.load(grouped_folder).empty());
  CHECK((reloaded.forward(tokens) == grouped.forward(tokens)));
}
