// The softmax engine's mask and score modifiers and grouped KV heads (issue 43): documents,
// prefix-LM, windows, custom masks, softcap, ALiBi, additive bias, sinks and the forgetting gate,
// alone and combined, forward and backward, against the float64 reference (itself checked
// against finite differences), finite differences and PyTorch; the exact reductions; rows that
// see no key; determinism; bad input.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <thread>

#include <xtensor/xadapt.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xview.hpp>

#include "attnlab/softmax_engine.hpp"
#include "grad_helpers.hpp"
#include "helpers.hpp"
#include "patterns.hpp"
#include "variants/bigbird.hpp"
#include "variants/sliding.hpp"

using namespace attnlab;
using attnlab::test::Arrays64;
using attnlab::test::random_tensor;
using attnlab::test::require_close;
using attnlab::test::require_close_grad;
using attnlab::test::require_error;

namespace {

// fp32 engine against fp64, forward: as tests/test_full.cpp (products and sums over a few
// hundred keys rounded at ~1e-7, exp2 and tanh polynomials at ~1e-7): a few 1e-6 measured.
constexpr double kRtol = 1e-4, kAtol = 2e-5;
// Backward: as tests/test_backward.cpp (dS subtracts numbers of size |dO|·|v|); the sums over
// rows (d_sinks, d_alibi_slopes) and over keys and rows (d_log_decay, a broadcast d_bias) add
// hundreds of such terms, so their bound scales with the largest gradient (grad_atol).
constexpr double kGradRtol = 1e-4, kGradAtol = 3e-5;
// The fp64 reference backward against fp64 central differences (h = 1e-5): both exact up to
// ~1e-10 (tests/grad_helpers.hpp).
constexpr double kRtol64 = 1e-7, kAtol64 = 1e-8;

Tensor64 to64(const Tensor& t) {
  return xt::cast<double>(t);
}

// What one case gives on top of q, k, v.
struct Spec {
  std::string name;
  Mask mask;
  bool bias = false;
  std::array<std::size_t, 4> bias_shape{};  // zeros: [B, H, Nq, Nk]
  bool sinks = false, alibi = false, fox = false;
};

// One call's tensors, owned.
struct Call {
  Dims d;
  Tensor q, k, v, d_out, bias;
  std::vector<float> sinks, slopes;
  TokenTensor g;
  const Spec* spec = nullptr;

  TokenInputs inputs() const {
    TokenInputs in;
    if (spec->bias) in.bias = TensorRef(bias);
    if (spec->sinks) in.sinks = std::span<const float>(sinks);
    if (spec->alibi) in.alibi_slopes = std::span<const float>(slopes);
    if (spec->fox) in.log_decay = TokenRef(g);
    return in;
  }
};

Call make_call(const Spec& s, std::size_t batch, std::size_t heads, std::size_t kv_heads,
               std::size_t nq, std::size_t nk, std::size_t dk, std::size_t dv, std::uint64_t seed) {
  Call c;
  c.spec = &s;
  c.d = Dims{batch, heads, nq, nk, dk, dv, kv_heads};
  c.q = random_tensor(batch, heads, nq, dk, seed);
  c.k = random_tensor(batch, kv_heads, nk, dk, seed + 1);
  c.v = random_tensor(batch, kv_heads, nk, dv, seed + 2);
  c.d_out = random_tensor(batch, heads, nq, dv, seed + 3);
  std::mt19937_64 rng(seed + 4);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  if (s.bias) {
    auto shape = s.bias_shape;
    if (shape[0] == 0) shape = {batch, heads, nq, nk};
    c.bias = random_tensor(shape[0], shape[1], shape[2], shape[3], seed + 5, 0.7f);
  }
  for (std::size_t h = 0; h < heads; ++h) {
    c.sinks.push_back(2.0f * unit(rng) - 0.5f);
    c.slopes.push_back(0.3f * unit(rng));
  }
  c.g = TokenTensor::from_shape({batch, heads, nk});
  for (float& x : c.g) x = -0.4f * unit(rng);
  return c;
}

// The engine's variants, through the one interface, and the pattern each adds to the mask.
struct Variant {
  std::unique_ptr<Attention> attention;
  std::function<Pattern(const Dims&, const Mask&)> pattern;  // null: none (full)
};

std::vector<Variant> variants() {
  std::vector<Variant> out;
  out.push_back({make_attention("full"), nullptr});
  const SlidingConfig sc{5, 3, 2, 2};
  // sliding's pattern reads the mask's causal alignment (and applies the mask again); the
  // mask outlives the pattern.
  out.push_back({std::make_unique<SlidingAttention>(sc),
                 [sc](const Dims& d, const Mask& m) { return test::sliding_pattern(sc, m, d); }});
  const BigBirdConfig bc{8, 3, 1, 1, 4};
  // bigbird's pattern: each item's layout under the mask (prefix-LM moves its causal cut).
  out.push_back({std::make_unique<BigBirdAttention>(bc),
                 [bc](const Dims& d, const Mask& m) { return test::bigbird_pattern(bc, m, d); }});
  return out;
}

// The offsets (cu_seqlens) of documents of the given lengths.
std::vector<std::int64_t> documents(std::initializer_list<std::int64_t> lengths) {
  std::vector<std::int64_t> offsets = {0};
  for (std::int64_t n : lengths) offsets.push_back(offsets.back() + n);
  return offsets;
}

// Packed documents take a batch of one; every other case runs two items.
std::size_t batch_for(const Spec& s) {
  return s.mask.has_documents() ? 1 : 2;
}

// The modifier cases at (nq, nk); causal ones and documents only where they fit (self-attention
// for documents without key offsets).
std::vector<Spec> specs(std::size_t nq, std::size_t nk) {
  std::vector<Spec> out;
  const bool self = nq == nk;
  out.push_back({"plain", {}});
  {
    Spec s{"window (7, 3)", {}};
    s.mask.window = Window{7, 3};
    out.push_back(s);
  }
  {
    Spec s{"causal bottom-right, window (20, -1)", {}};
    s.mask.causal = Causal::bottom_right;
    s.mask.window = Window{20, -1};
    out.push_back(s);
  }
  {
    Spec s{"documents", {}};
    if (self) {
      const auto n = static_cast<std::int64_t>(nq);
      s.mask.documents = documents({n / 3, 0, n - n / 3 - n / 4, n / 4});
    } else {  // cross: key offsets of their own
      s.mask.documents = {0, static_cast<std::int64_t>(nq / 2), static_cast<std::int64_t>(nq)};
      s.mask.key_documents = {0, static_cast<std::int64_t>(nk / 3), static_cast<std::int64_t>(nk)};
    }
    out.push_back(s);
  }
  {
    Spec s{"prefix-LM, key padding", {}};
    s.mask.causal = Causal::top_left;
    s.mask.prefix_lengths = {static_cast<std::int64_t>(nk / 4), 0};
    s.mask.key_lengths = {static_cast<std::int64_t>(nk), static_cast<std::int64_t>(nk - 3)};
    out.push_back(s);
  }
  {
    Spec s{"softcap 2", {}};
    s.mask.softcap = 2.0;
    out.push_back(s);
  }
  {
    Spec s{"ALiBi, causal", {}};
    s.mask.causal = Causal::top_left;
    s.alibi = true;
    out.push_back(s);
  }
  {
    Spec s{"ALiBi both sides", {}};
    s.alibi = true;
    out.push_back(s);
  }
  {
    Spec s{"bias [B, H, Nq, Nk]", {}};
    s.bias = true;
    out.push_back(s);
  }
  {
    Spec s{"bias [1, H, 1, Nk] with a boolean mask", {}};
    s.bias = true;
    s.bias_shape = {1, 4, 1, nk};
    xt::xtensor<bool, 2> allowed = xt::ones<bool>({nq, nk});
    for (std::size_t i = 0; i < nq; ++i) allowed(i, (i * 7) % nk) = false;
    s.mask.allow(allowed);
    out.push_back(s);
  }
  {
    Spec s{"sinks, one item padded to nothing", {}};
    s.sinks = true;
    s.mask.key_lengths = {static_cast<std::int64_t>(nk), 0};
    out.push_back(s);
  }
  {
    Spec s{"forgetting gate, causal", {}};
    s.mask.causal = Causal::top_left;
    s.fox = true;
    out.push_back(s);
  }
  if (self) {
    Spec s{"documents + causal + window + ALiBi + softcap + sinks + bias + forgetting gate", {}};
    s.mask.documents = documents(
        {static_cast<std::int64_t>(nq / 2), 1, static_cast<std::int64_t>(nq - nq / 2 - 1)});
    s.mask.causal = Causal::bottom_right;
    s.mask.window = Window{9, 0};
    s.mask.softcap = 3.0;
    s.mask.scale = 0.4;
    s.alibi = s.sinks = s.bias = s.fox = true;
    s.bias_shape = {1, 1, nq, nk};
    out.push_back(s);
  }
  return out;
}

AllGradients run_backward(const Attention& a, const Call& c, const Mask& mask, Tensor& out) {
  Saved saved;
  a.forward(c.q, c.k, c.v, mask, c.inputs(), out, saved);
  AllGradients g = a.backward(c.q, c.k, c.v, mask, c.inputs(), out, c.d_out, saved);
  // The backward without the saved log-sum-exp recomputes it: bitwise the same gradients.
  const AllGradients again = a.backward(c.q, c.k, c.v, mask, c.inputs(), out, c.d_out);
  CHECK((again.qkv.dq == g.qkv.dq));
  CHECK((again.qkv.dk == g.qkv.dk));
  return g;
}

double grad_atol(const xt::xarray<double>& want) {
  return kGradAtol * std::max(1.0, xt::amax(xt::abs(want))());
}

void require_all_grads(const AllGradients& g, const Gradients64& want, const Spec& s,
                       const std::string& what, double rtol, double atol) {
  require_close_grad(to64(g.qkv.dq), want.dq, rtol, atol, what + ": dq");
  require_close_grad(to64(g.qkv.dk), want.dk, rtol, atol, what + ": dk");
  require_close_grad(to64(g.qkv.dv), want.dv, rtol, atol, what + ": dv");
  if (s.bias)
    require_close_grad(xt::cast<double>(g.d_bias), want.d_bias, rtol,
                       std::max(atol, grad_atol(want.d_bias)), what + ": d_bias");
  if (s.sinks) {
    const xt::xarray<double> w = xt::adapt(want.d_sinks, {want.d_sinks.size()});
    require_close_grad(xt::cast<double>(xt::adapt(g.d_sinks, {g.d_sinks.size()})), w, rtol,
                       std::max(atol, grad_atol(w)), what + ": d_sinks");
  }
  if (s.alibi) {
    const xt::xarray<double> w = xt::adapt(want.d_alibi_slopes, {want.d_alibi_slopes.size()});
    require_close_grad(xt::cast<double>(xt::adapt(g.d_alibi_slopes, {g.d_alibi_slopes.size()})), w,
                       rtol, std::max(atol, grad_atol(w)), what + ": d_alibi_slopes");
  }
  if (s.fox)
    require_close_grad(xt::cast<double>(g.d_log_decay), want.d_log_decay, rtol,
                       std::max(atol, grad_atol(want.d_log_decay)), what + ": d_log_decay");
}

// The inputs of a call in float64, in the order central_differences perturbs them.
Arrays64 inputs64(const Call& c) {
  Arrays64 x = {to64(c.q), to64(c.k), to64(c.v)};
  const Modifiers64 m = Modifiers64::of(c.inputs());
  x.push_back(m.bias.dimension() ? m.bias : xt::xarray<double>(xt::zeros<double>({1})));
  x.push_back(xt::adapt(m.sinks.empty() ? std::vector<double>{0.0} : m.sinks));
  x.push_back(xt::adapt(m.alibi_slopes.empty() ? std::vector<double>{0.0} : m.alibi_slopes));
  x.push_back(m.log_decay.dimension() ? m.log_decay : xt::xarray<double>(xt::zeros<double>({1})));
  return x;
}

Modifiers64 modifiers_of(const Spec& s, const Arrays64& x) {
  Modifiers64 m;
  if (s.bias) m.bias = x[3];
  if (s.sinks) m.sinks.assign(x[4].begin(), x[4].end());
  if (s.alibi) m.alibi_slopes.assign(x[5].begin(), x[5].end());
  if (s.fox) m.log_decay = x[6];
  return m;
}

bool bitwise_equal(const float* a, const float* b, std::size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

template <class T>
bool bitwise_equal(const T& a, const T& b) {
  return a.shape() == b.shape() && bitwise_equal(a.data(), b.data(), a.size());
}

}  // namespace

TEST_CASE("the fp64 reference's gradients of every modifier equal finite differences",
          "[modifiers]") {
  for (const auto& [nq, nk] : {std::pair<std::size_t, std::size_t>{6, 6}, {5, 7}}) {
    for (const Spec& s : specs(nq, nk)) {
      INFO(s.name << " Nq=" << nq << " Nk=" << nk);
      const Call c = make_call(s, batch_for(s), 4, 2, nq, nk, 3, 2, nq * 13 + nk);
      const Arrays64 x = inputs64(c);
      const Arrays64 fd = test::central_differences(
          [&](const Arrays64& y) -> xt::xarray<double> {
            return reference_attention(Tensor64(y[0]), Tensor64(y[1]), Tensor64(y[2]), s.mask,
                                       modifiers_of(s, y));
          },
          x, to64(c.d_out));
      const Gradients64 g =
          reference_attention_backward(Tensor64(x[0]), Tensor64(x[1]), Tensor64(x[2]), s.mask,
                                       modifiers_of(s, x), to64(c.d_out));
      require_close_grad(g.dq, fd[0], kRtol64, kAtol64, "dq");
      require_close_grad(g.dk, fd[1], kRtol64, kAtol64, "dk");
      require_close_grad(g.dv, fd[2], kRtol64, kAtol64, "dv");
      if (s.bias) require_close_grad(g.d_bias, fd[3], kRtol64, kAtol64, "d_bias");
      if (s.sinks) require_close_grad(xt::adapt(g.d_sinks), fd[4], kRtol64, kAtol64, "d_sinks");
      if (s.alibi)
        require_close_grad(xt::adapt(g.d_alibi_slopes), fd[5], kRtol64, kAtol64, "d_slopes");
      if (s.fox) require_close_grad(g.d_log_decay, fd[6], kRtol64, kAtol64, "d_log_decay");
    }
  }
}

TEST_CASE("the engine's variants equal the fp64 reference under every modifier, grouped heads",
          "[modifiers]") {
  // Across the 48-query, 96-query and 128-key tile edges; MHA, GQA and MQA.
  struct Lengths {
    std::size_t nq, nk, kv_heads;
  };
  const Lengths lengths[] = {{130, 130, 1}, {97, 200, 4}, {150, 61, 2}};
  for (const Variant& variant : variants()) {
    const Attention& a = *variant.attention;
    for (const auto& [nq, nk, kv_heads] : lengths)
      for (const Spec& s : specs(nq, nk)) {
        if (a.name() == "bigbird" && s.mask.causal != Causal::none && nq != nk) continue;
        INFO(a.spec() << " Nq=" << nq << " Nk=" << nk << " Hkv=" << kv_heads << ": " << s.name);
        const Call c =
            make_call(s, batch_for(s), 4, kv_heads, nq, nk, 16, 12, nq + 3 * nk + kv_heads);
        Tensor out;
        const AllGradients g = run_backward(a, c, s.mask, out);
        const Pattern also = variant.pattern ? variant.pattern(c.d, s.mask) : nullptr;
        const Modifiers64 m = Modifiers64::of(c.inputs());
        require_close(out, reference_attention(to64(c.q), to64(c.k), to64(c.v), s.mask, m, also),
                      kRtol, kAtol);
        const Gradients64 want = reference_attention_backward(to64(c.q), to64(c.k), to64(c.v),
                                                              s.mask, m, to64(c.d_out), also);
        require_all_grads(g, want, s, a.spec() + " vs fp64 reference", kGradRtol, kGradAtol);
      }
  }
}

TEST_CASE("the engine's backward equals finite differences under every modifier", "[modifiers]") {
  for (const Variant& variant : variants())
    for (const Spec& s : specs(9, 9)) {
      const Attention& a = *variant.attention;
      INFO(a.spec() << ": " << s.name);
      const Call c = make_call(s, batch_for(s), 4, 2, 9, 9, 3, 4, 91);
      Tensor out;
      const AllGradients g = run_backward(a, c, s.mask, out);
      const Pattern also = variant.pattern ? variant.pattern(c.d, s.mask) : nullptr;
      const Arrays64 fd = test::central_differences(
          [&](const Arrays64& y) -> xt::xarray<double> {
            return reference_attention(Tensor64(y[0]), Tensor64(y[1]), Tensor64(y[2]), s.mask,
                                       modifiers_of(s, y), also);
          },
          inputs64(c), to64(c.d_out));
      Gradients64 want{fd[0], fd[1], fd[2], fd[3], {}, {}, fd[6]};
      want.d_sinks.assign(fd[4].begin(), fd[4].end());
      want.d_alibi_slopes.assign(fd[5].begin(), fd[5].end());
      require_all_grads(g, want, s, a.spec() + " vs finite differences", kGradRtol, kGradAtol);
    }
}

TEST_CASE("the engine's variants equal PyTorch's explicit softmax with the same dense bias",
          "[modifiers]") {
  struct Expected {
    std::size_t index;
    std::string what;
    Spec spec;
    Tensor out;
    AllGradients g;
  };
  test::TorchGrads torch;
  std::vector<Expected> expected;
  std::vector<Call> calls;
  for (const Variant& variant : variants())
    for (const auto& [nq, nk] : {std::pair<std::size_t, std::size_t>{40, 40}, {33, 50}})
      for (const Spec& s : specs(nq, nk)) {
        const Attention& a = *variant.attention;
        if (nq != nk && a.name() != "full") continue;  // cross-attention: full's alone
        if (a.name() == "bigbird" && s.mask.causal != Causal::none && nq != nk) continue;
        Expected e{0, a.spec() + " Nq=" + std::to_string(nq) + ": " + s.name, s, {}, {}};
        const Call c = make_call(e.spec, batch_for(s), 4, 2, nq, nk, 8, 6, nq * 5 + nk);
        e.g = run_backward(a, c, s.mask, e.out);
        // The dense pattern (the mask and the variant's layout) and every query's key position.
        const Pattern layout = variant.pattern ? variant.pattern(c.d, s.mask) : nullptr;
        const Mask& m = s.mask;
        const Dims d = c.d;
        const Pattern visible = [&](std::size_t b, std::size_t h, std::size_t i, std::size_t j) {
          return m.may_attend(b, h, i, j, d) && (!layout || layout(b, h, i, j));
        };
        xt::xarray<float> pos = xt::zeros<float>({nq});
        for (std::size_t i = 0; i < nq; ++i) pos(i) = static_cast<float>(m.position(i, d));
        std::vector<std::size_t> lengths;
        for (std::size_t b = 0; b < d.batch; ++b) lengths.push_back(m.valid_keys(b, nk));
        nlohmann::json spec = {{"kind", "modified"},
                               {"scale", m.softmax_scale(8)},
                               {"lengths", lengths},
                               {"inputs", nlohmann::json::array()}};
        if (m.softcap) spec["softcap"] = *m.softcap;
        std::vector<std::pair<std::string, xt::xarray<float>>> inputs = {
            {"q", c.q},
            {"k", c.k},
            {"v", c.v},
            {"d_out", c.d_out},
            {"allowed", test::dense_pattern(visible, d)},
            {"pos", pos}};
        if (s.bias) spec["inputs"].push_back("bias"), inputs.push_back({"bias", c.bias});
        if (s.sinks)
          spec["inputs"].push_back("sinks"), inputs.push_back({"sinks", xt::adapt(c.sinks)});
        if (s.alibi)
          spec["inputs"].push_back("slopes"), inputs.push_back({"slopes", xt::adapt(c.slopes)});
        if (s.fox) spec["inputs"].push_back("g"), inputs.push_back({"g", c.g});
        e.index = torch.add(spec, inputs);
        expected.push_back(std::move(e));
      }
  if (!torch.run()) return;
  for (const Expected& e : expected) {
    INFO(e.what);
    Gradients64 want;
    want.dq = torch.grad(e.index, "q");
    want.dk = torch.grad(e.index, "k");
    want.dv = torch.grad(e.index, "v");
    if (e.spec.bias) want.d_bias = torch.grad(e.index, "bias");
    if (e.spec.sinks) {
      const auto w = torch.grad(e.index, "sinks");
      want.d_sinks.assign(w.begin(), w.end());
    }
    if (e.spec.alibi) {
      const auto w = torch.grad(e.index, "slopes");
      want.d_alibi_slopes.assign(w.begin(), w.end());
    }
    if (e.spec.fox) want.d_log_decay = torch.grad(e.index, "g");
    require_all_grads(e.g, want, e.spec, e.what + " vs torch", kGradRtol, kGradAtol);
  }
}

TEST_CASE("exact reductions: each modifier at its neutral setting is plain full", "[modifiers]") {
  const auto full = make_attention("full");
  const std::size_t n = 150;
  const Spec plain{"plain", {}};
  const Call c = make_call(plain, 1, 4, 2, n, n, 16, 16, 5);
  Mask causal;
  causal.causal = Causal::top_left;
  Tensor want, want_causal;
  const AllGradients g0 = run_backward(*full, c, {}, want);
  const AllGradients g0_causal = run_backward(*full, c, causal, want_causal);
  const auto same = [&](const Mask& m, const TokenInputs& in, const Tensor& out0,
                        const AllGradients& grads0, const std::string& what) {
    INFO(what);
    Tensor out;
    Saved saved;
    full->forward(c.q, c.k, c.v, m, in, out, saved);
    CHECK(bitwise_equal(out, out0));
    const AllGradients g = full->backward(c.q, c.k, c.v, m, in, out, c.d_out, saved);
    CHECK(bitwise_equal(g.qkv.dq, grads0.qkv.dq));
    CHECK(bitwise_equal(g.qkv.dk, grads0.qkv.dk));
    CHECK(bitwise_equal(g.qkv.dv, grads0.qkv.dv));
  };
  Mask window;  // a window covering every key is no window
  window.window = Window{static_cast<std::int64_t>(n), static_cast<std::int64_t>(n)};
  same(window, {}, want, g0, "window covering N");
  Mask one_document;
  one_document.documents = {0, static_cast<std::int64_t>(n)};
  same(one_document, {}, want, g0, "one document");
  const std::vector<float> zeros(4, 0.0f), no_sinks(4, -std::numeric_limits<float>::infinity());
  TokenInputs zero_slopes;
  zero_slopes.alibi_slopes = std::span<const float>(zeros);
  same({}, zero_slopes, want, g0, "zero ALiBi slopes");
  TokenInputs sinks;
  sinks.sinks = std::span<const float>(no_sinks);
  same({}, sinks, want, g0, "sinks at -infinity");
  const TokenTensor no_decay = xt::zeros<float>({std::size_t{1}, std::size_t{4}, n});
  same(causal, TokenInputs::of(&no_decay, nullptr), want_causal, g0_causal,
       "zero forget gates (causal)");
  const Tensor zero_bias = xt::zeros<float>({std::size_t{1}, std::size_t{1}, std::size_t{1}, n});
  TokenInputs bias;
  bias.bias = TensorRef(zero_bias);
  same({}, bias, want, g0, "a zero bias");
  Mask prefix = causal;  // an empty prefix is plain causal
  prefix.prefix_lengths = {0};
  same(prefix, {}, want_causal, g0_causal, "an empty prefix");
  Mask all_prefix = causal;  // a prefix of every key is no causal mask
  all_prefix.prefix_lengths = {static_cast<std::int64_t>(n)};
  same(all_prefix, {}, want, g0, "a prefix of every key");
  // cap -> infinity: cap · tanh(s / cap) -> s, to float rounding.
  Mask capped;
  capped.softcap = 1e6;
  Tensor out;
  full->forward(c.q, c.k, c.v, capped, {}, out);
  require_close(out, to64(want), 1e-5, 1e-6);
  // Grouped heads equal every KV head repeated for its query heads: the forward bitwise, dq
  // bitwise, dk and dv summed over the group.
  Tensor k4 = Tensor::from_shape({1, 4, n, 16}), v4 = k4;
  for (std::size_t b = 0; b < 1; ++b)
    for (std::size_t h = 0; h < 4; ++h) {
      xt::view(k4, b, h) = xt::view(c.k, b, h / 2);
      xt::view(v4, b, h) = xt::view(c.v, b, h / 2);
    }
  for (const Mask& m : {Mask{}, causal}) {
    Tensor out4, out2;
    Saved saved4, saved2;
    full->forward(c.q, k4, v4, m, {}, out4, saved4);
    full->forward(c.q, c.k, c.v, m, {}, out2, saved2);
    CHECK(bitwise_equal(out4, out2));
    const AllGradients g4 = full->backward(c.q, k4, v4, m, {}, out4, c.d_out, saved4);
    const AllGradients g2 = full->backward(c.q, c.k, c.v, m, {}, out2, c.d_out, saved2);
    CHECK(bitwise_equal(g4.qkv.dq, g2.qkv.dq));
    REQUIRE(g2.qkv.dk.shape() == c.k.shape());
    Tensor dk_sum = xt::zeros<float>(c.k.shape()), dv_sum = dk_sum;
    for (std::size_t b = 0; b < 1; ++b)
      for (std::size_t h = 0; h < 4; ++h) {
        xt::view(dk_sum, b, h / 2) += xt::view(g4.qkv.dk, b, h);
        xt::view(dv_sum, b, h / 2) += xt::view(g4.qkv.dv, b, h);
      }
    require_close(g2.qkv.dk, to64(dk_sum), 1e-6, 1e-6);
    require_close(g2.qkv.dv, to64(dv_sum), 1e-6, 1e-6);
  }
}

TEST_CASE("rows that see no key give zeros and no gradient, with a sink too", "[modifiers]") {
  Spec s{"item 1 padded to nothing, sinks", {}};
  s.mask.key_lengths = {40, 0};
  s.sinks = true;
  for (const bool with_sinks : {false, true}) {
    s.sinks = with_sinks;
    const Call c = make_call(s, 2, 2, 1, 30, 40, 8, 8, 3);
    const auto full = make_attention("full");
    Tensor out;
    const AllGradients g = run_backward(*full, c, s.mask, out);
    CHECK(xt::amax(xt::abs(xt::view(out, 1)))() == 0.0f);
    CHECK(xt::amax(xt::abs(xt::view(g.qkv.dq, 1)))() == 0.0f);
    CHECK(xt::amax(xt::abs(xt::view(g.qkv.dk, 1)))() == 0.0f);
    CHECK(xt::all(xt::isfinite(out)));
    if (with_sinks) {  // the sink takes all the weight of item 1's rows: no gradient from them
      const Gradients64 want = reference_attention_backward(
          to64(c.q), to64(c.k), to64(c.v), s.mask, Modifiers64::of(c.inputs()), to64(c.d_out));
      for (std::size_t h = 0; h < 2; ++h)
        CHECK(g.d_sinks[h] == Approx(want.d_sinks[h]).epsilon(1e-4).margin(1e-5));
    }
  }
}

TEST_CASE("a custom mask runs only where its tiles are partial and equals its dense form",
          "[modifiers]") {
  // A causal mask written as a callable: above-diagonal tiles declared empty, tiles below the
  // diagonal full, only the diagonal tiles partial.
  const std::size_t n = 600;
  std::atomic<std::size_t> calls{0};
  MaskMod causal_mod;
  causal_mod.allows = [&calls](std::size_t, std::size_t, std::size_t i, std::size_t j) {
    calls.fetch_add(1, std::memory_order_relaxed);
    return j <= i;
  };
  causal_mod.classify = [](std::size_t, std::size_t, std::size_t i0, std::size_t i1, std::size_t j0,
                           std::size_t j1) {
    if (j0 > i1 - 1) return TileClass::empty;
    if (j1 - 1 <= i0) return TileClass::full;
    return TileClass::partial;
  };
  Mask custom;
  custom.custom.emplace(causal_mod);
  Mask causal;
  causal.causal = Causal::top_left;
  const auto full = make_attention("full");
  const Tensor q = random_tensor(1, 2, n, 16, 1), k = random_tensor(1, 2, n, 16, 2),
               v = random_tensor(1, 2, n, 16, 3);
  const Tensor want = full->forward(q, k, v, causal);
  require_close(full->forward(q, k, v, custom), to64(want), 1e-6, 1e-7);
  // Partial tiles: at most two 128-key chunks per 48-row tile on the diagonal, so at most
  // 2 heads x 13 tiles x 48 x 256 calls, about a fifth of the 2 x 600² pairs.
  CHECK(calls.load() <= 2 * 13 * 48 * 256);
  CHECK(calls.load() > 0);
  // Without a classification every tile is partial: the same result, every pair evaluated.
  Mask unclassified;
  unclassified.custom = MaskMod{causal_mod.allows, nullptr};
  calls = 0;
  require_close(full->forward(q, k, v, unclassified), to64(want), 1e-6, 1e-7);
  CHECK(calls.load() == 2 * n * n);
  // The dense reference calls allows alone.
  require_close(full->forward(q, k, v, custom), reference_attention(q, k, v, custom), kRtol, kAtol);
}

TEST_CASE("the engine's gradients are bitwise equal across runs and thread counts, modifiers on",
          "[modifiers]") {
  const int threads_before = omp_get_max_threads();
  Spec s{"everything", {}};
  s.mask.causal = Causal::top_left;
  s.mask.documents = documents({100, 160, 40});
  s.mask.window = Window{90, -1};
  s.mask.softcap = 5.0;
  s.bias = s.sinks = s.alibi = s.fox = true;
  s.bias_shape = {1, 1, 300, 300};
  for (const std::size_t kv_heads : {1, 2}) {
    const Call c = make_call(s, 1, 2, kv_heads, 300, 300, 32, 32, 11);
    for (const std::string& spec : test::engine_clients()) {
      INFO(spec << " Hkv=" << kv_heads);
      const auto a = make_attention(spec);
      omp_set_num_threads(1);
      Tensor out1;
      const AllGradients g1 = run_backward(*a, c, s.mask, out1);
      for (int threads : {2, 3}) {
        omp_set_num_threads(threads);
        Tensor out;
        const AllGradients g = run_backward(*a, c, s.mask, out);
        CHECK(bitwise_equal(out, out1));
        CHECK(bitwise_equal(g.qkv.dq, g1.qkv.dq));
        CHECK(bitwise_equal(g.qkv.dk, g1.qkv.dk));
        CHECK(bitwise_equal(g.qkv.dv, g1.qkv.dv));
        CHECK(bitwise_equal(g.d_bias, g1.d_bias));
        CHECK(bitwise_equal(g.d_log_decay, g1.d_log_decay));
        CHECK(g.d_sinks == g1.d_sinks);
        CHECK(g.d_alibi_slopes == g1.d_alibi_slopes);
      }
    }
  }
  omp_set_num_threads(threads_before);
}

// The engine keeps its key and value layouts per calling thread from call to call (their padding
// columns left as the last call wrote them): a call after a larger one, of other sizes, must be
// bitwise the call on a fresh thread.
TEST_CASE("the engine's kept scratch: a call after a larger one is a fresh thread's, bitwise",
          "[modifiers]") {
  Spec s{"window and softcap", {}};
  s.mask.causal = Causal::top_left;
  s.mask.window = Window{70, -1};
  s.mask.softcap = 5.0;
  Spec big{"plain", {}};
  for (const std::size_t kv_heads : {1, 2}) {
    const Call c = make_call(s, 1, 2, kv_heads, 300, 300, 24, 20, 13);
    const Call larger = make_call(big, 2, 4, 4, 520, 520, 40, 36, 14);
    for (const std::string& spec : test::engine_clients()) {
      INFO(spec << " Hkv=" << kv_heads);
      const auto a = make_attention(spec);
      Tensor fresh_out;
      AllGradients fresh;
      std::thread([&] { fresh = run_backward(*a, c, s.mask, fresh_out); }).join();
      Tensor larger_out, out;
      run_backward(*a, larger, big.mask, larger_out);
      const AllGradients g = run_backward(*a, c, s.mask, out);
      CHECK(bitwise_equal(out, fresh_out));
      CHECK(bitwise_equal(g.qkv.dq, fresh.qkv.dq));
      CHECK(bitwise_equal(g.qkv.dk, fresh.qkv.dk));
      CHECK(bitwise_equal(g.qkv.dv, fresh.qkv.dv));
    }
  }
}

TEST_CASE("bad modifiers and grouped heads name what is wrong", "[modifiers]") {
  const auto full = make_attention("full");
  const Tensor q = random_tensor(2, 4, 6, 8, 1), k = random_tensor(2, 2, 6, 8, 2),
               v = random_tensor(2, 2, 6, 8, 3);
  const auto fails = [&](const Mask& m, const TokenInputs& in,
                         std::initializer_list<std::string> words) {
    require_error([&] { full->forward(q, k, v, m, in); }, words);
  };
  // Grouped heads: H a multiple of Hkv.
  require_error(
      [&] { full->forward(q, random_tensor(2, 3, 6, 8, 2), random_tensor(2, 3, 6, 8, 3)); },
      {"head counts", "H = 4", "Hkv = 3", "multiple"});
  require_error([&] { full->forward(q, k, random_tensor(2, 4, 6, 8, 3)); },
                {"head counts differ", "k has 2 heads, v 4"});
  Mask m;
  m.window = Window{-2, 3};
  fails(m, {}, {"window.left = -2", "-1 (unbounded)"});
  // Documents: offsets from 0 that never decrease and end at Nq; a batch of one; a prefix per
  // document.
  m = {};
  m.documents = {0, 2, 6};
  fails(m, {}, {"documents (cu_seqlens)", "batch of one", "B = 2"});
  const Tensor q1 = random_tensor(1, 4, 6, 8, 1), k1 = random_tensor(1, 2, 6, 8, 2);
  for (const auto& [offsets, words] :
       {std::pair<std::vector<std::int64_t>, std::vector<std::string>>{
            {1, 6}, {"documents (cu_seqlens)", "offset 0 is 1", "start at 0"}},
        {{0, 4, 3, 6}, {"offset 2 is 3", "must not decrease"}},
        {{0, 4}, {"documents (cu_seqlens) ends at 4", "Nq = 6"}}}) {
    m.documents = offsets;
    try {
      full->forward(q1, k1, k1, m);
      FAIL("documents " << offsets.size() << " offsets: no error");
    } catch (const Error& e) {
      for (const std::string& w : words) CHECK(std::string(e.what()).find(w) != std::string::npos);
    }
  }
  m.documents = {0, 2, 6};
  m.causal = Causal::top_left;
  m.prefix_lengths = {1};
  require_error([&] { full->forward(q1, k1, k1, m); },
                {"prefix_lengths has 1 entries", "one per document (2)"});
  m.prefix_lengths = {1, 5};
  require_error([&] { full->forward(q1, k1, k1, m); },
                {"prefix_lengths[1] = 5", "the document's keys = 4"});
  m = {};
  m.prefix_lengths = {1, 2};
  fails(m, {}, {"prefix_lengths", "needs a causal mask"});
  m.causal = Causal::top_left;
  m.prefix_lengths = {1};
  fails(m, {}, {"prefix_lengths has 1 entries", "one per batch item (2)"});
  m.prefix_lengths = {1, 7};
  fails(m, {}, {"prefix_lengths[1] = 7", "Nk = 6"});
  m = {};
  m.softcap = 0.0;
  fails(m, {}, {"softcap = 0", "finite number > 0"});
  m.softcap = std::nan("");
  fails(m, {}, {"softcap", "finite number > 0"});
  m = {};
  m.custom = MaskMod{};
  fails(m, {}, {"custom mask", "allows"});
  // Inputs.
  const Tensor bias_bad_shape = random_tensor(2, 3, 6, 6, 4);
  TokenInputs in;
  in.bias = TensorRef(bias_bad_shape);
  fails({}, in, {"bias has shape [2, 3, 6, 6]", "[B, H, Nq, Nk] = [2, 4, 6, 6]"});
  Tensor bias_nan = random_tensor(1, 1, 6, 6, 4);
  bias_nan(0, 0, 2, 3) = std::nanf("");
  in.bias = TensorRef(bias_nan);
  fails({}, in, {"bias is NaN", "flat index 15"});
  bias_nan(0, 0, 2, 3) = std::numeric_limits<float>::infinity();
  fails({}, in, {"bias is +inf"});
  const std::vector<float> three = {0.1f, 0.2f, 0.3f}, nan4 = {0.1f, std::nanf(""), 0.2f, 0.3f},
                           negative4 = {0.1f, -0.2f, 0.2f, 0.3f};
  in = {};
  in.sinks = std::span<const float>(three);
  fails({}, in, {"sinks has 3 entries", "H = 4"});
  in.sinks = std::span<const float>(nan4);
  fails({}, in, {"sinks[1]", "not NaN"});
  in = {};
  in.alibi_slopes = std::span<const float>(negative4);
  fails({}, in, {"alibi_slopes[1] = -0.2", "finite slope >= 0"});
  in.alibi_slopes = std::span<const float>(nan4);
  fails({}, in, {"alibi_slopes[1]", "finite slope >= 0"});
  TokenTensor gates = xt::zeros<float>({2, 4, 6});
  require_error<Unsupported>([&] { full->forward(q, k, v, {}, TokenInputs::of(&gates, nullptr)); },
                             {"full does not support the forgetting gate (log_decay)", "causal"});
  Mask causal;
  causal.causal = Causal::top_left;
  gates(1, 2, 3) = 0.5f;
  fails(causal, TokenInputs::of(&gates, nullptr), {"log-decay g is 0.5", "[1, 2, 3]", "<= 0"});
  // A variant outside the engine refuses what it cannot honour, naming it.
  const Tensor q2 = random_tensor(2, 2, 6, 8, 1);
  const auto linear = make_attention("linear");
  Mask w;
  w.window = Window{2, 2};
  require_error<Unsupported>([&] { linear->forward(q2, q2, q2, w); },
                             {"linear does not support a window"});
  in = {};
  const std::vector<float> two = {0.1f, 0.2f};
  in.sinks = std::span<const float>(two);
  require_error<Unsupported>([&] { linear->forward(q2, q2, q2, {}, in); },
                             {"linear does not support attention sinks"});
  const auto linformer = make_attention("linformer:k=3,max_len=8");
  require_error<Unsupported>([&] { linformer->forward(q, k, v); },
                             {"linformer does not support grouped heads", "Hkv = 2"});
  Mask capped;
  capped.softcap = 2.0;
  require_error<Unsupported>([&] { make_attention("gla")->forward(q2, q2, q2, capped); },
                             {"gla does not support softcap"});
}

TEST_CASE("every registered variant honours each modifier or refuses it as Unsupported",
          "[modifiers]") {
  const Tensor q = random_tensor(1, 4, 40, 8, 1), k = random_tensor(1, 4, 40, 8, 2),
               v = random_tensor(1, 4, 40, 8, 3);
  const Tensor k1 = random_tensor(1, 1, 40, 8, 4), v1 = random_tensor(1, 1, 40, 8, 5);
  const std::vector<float> per_head(4, 0.25f);
  const Tensor bias = random_tensor(1, 1, 40, 40, 6);
  Mask window, prefix, custom, capped, documents;
  window.window = Window{3, 3};
  prefix.causal = Causal::top_left;
  prefix.prefix_lengths = {10};
  custom.custom = MaskMod{
      [](std::size_t, std::size_t, std::size_t i, std::size_t j) { return (i + j) % 3 != 0; },
      nullptr};
  capped.softcap = 4.0;
  documents.documents = {0, 15, 40};
  TokenInputs sinks, alibi, additive;
  sinks.sinks = std::span<const float>(per_head);
  alibi.alibi_slopes = std::span<const float>(per_head);
  additive.bias = TensorRef(bias);
  for (const std::string& name : attention_names()) {
    INFO("variant " << name);
    const auto a = make_attention(name);
    const Support s = a->support();
    const auto honours = [&](bool supported, auto&& call) {
      if (supported)
        CHECK_NOTHROW(call());
      else
        CHECK_THROWS_AS(call(), Unsupported);
    };
    honours(s.grouped_heads, [&] { a->forward(q, k1, v1); });
    honours(s.window, [&] { a->forward(q, k, v, window); });
    honours(s.prefix && s.causal, [&] { a->forward(q, k, v, prefix); });
    honours(s.custom, [&] { a->forward(q, k, v, custom); });
    honours(s.softcap, [&] { a->forward(q, k, v, capped); });
    honours(s.documents, [&] { a->forward(q, k, v, documents); });
    honours(s.sinks, [&] { a->forward(q, k, v, {}, sinks); });
    honours(s.alibi, [&] { a->forward(q, k, v, {}, alibi); });
    honours(s.bias, [&] { a->forward(q, k, v, {}, additive); });
  }
  // The engine's clients (the variants that declare all of it) are exactly the ones tested
  // against their dense patterns above: a new client fails here until variants() has its pattern.
  std::vector<std::string> tested;
  for (const Variant& variant : variants()) tested.push_back(variant.attention->name());
  std::vector<std::string> clients = test::engine_clients();
  std::sort(tested.begin(), tested.end());
  std::sort(clients.begin(), clients.end());
  CHECK(tested == clients);
  // No memory to decay: model layers learn no gate for them.
  for (const std::string& name : tested) CHECK_FALSE(make_attention(name)->support().log_decay);
}
