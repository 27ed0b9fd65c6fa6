// Model layers against a direct float64 computation (tests/model_helpers.hpp), the exact
// reductions (full = wide sliding), tied projections, seeded initialisation, the weights folder
// and bad configurations. PyTorch equality is in test_models_torch.cpp.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>

#include <xtensor/xview.hpp>

#include "attnlab/npy.hpp"
#include "helpers.hpp"
#include "model_helpers.hpp"
#include "models/transformer.hpp"
#include "npy_helpers.hpp"

using namespace attnlab;
using namespace attnlab::models;
using namespace attnlab::test;

namespace {

// float32 GEMMs and softmax against float64: rounding of sums over d_model (16) and the keys,
// amplified at most a few times by LayerNorm's division by the row's standard deviation.
constexpr double kRtol = 1e-4, kAtol = 2e-5;

LayerConfig small_config(const std::string& switches = "") {
  LayerConfig c;
  c.d_model = 16;
  c.heads = 4;
  c.ffn = 24;
  apply_switches(c, switches);
  return c;
}

template <class Layer>
Layer initialised(const LayerConfig& c, std::uint64_t seed) {
  Layer layer(c);
  layer.initialize(seed, "");
  Parameters p;
  layer.parameters("", p);
  perturb(p, seed + 100);
  retie(layer.self_attn);
  if constexpr (std::is_same_v<Layer, DecoderLayer>) retie(layer.multihead_attn);
  return layer;
}

Tokens some_tokens(std::size_t b, std::size_t n, std::size_t vocab) {
  Tokens t = Tokens::from_shape({b, n});
  for (std::size_t i = 0; i < t.size(); ++i) t.data()[i] = std::int64_t((i * 7 + 3) % vocab);
  return t;
}

}  // namespace

TEST_CASE("Linear, LayerNorm, FeedForward and Embedding equal a direct fp64 computation",
          "[models]") {
  const Activations x = random_activations(2, 5, 16, 1);
  FeedForward f(16, 24);
  f.initialize(3, "");
  Parameters p;
  f.parameters("", p);
  perturb(p, 4);
  require_close(f.linear1.forward(x), linear64(to64(x), f.linear1), kRtol, kAtol);
  require_close(f.forward(x), ffn64(to64(x), f), kRtol, kAtol);

  LayerNorm n(16);
  Parameters np;
  n.parameters("", np);
  perturb(np, 5);
  require_close(n.forward(x), layer_norm64(to64(x), n), kRtol, kAtol);

  Embedding e(10, 4);
  e.initialize(6, "embedding.");
  const Tokens t = some_tokens(2, 3, 10);
  const Activations y = e.forward(t);
  for (std::size_t b = 0; b < 2; ++b)
    for (std::size_t i = 0; i < 3; ++i)
      for (std::size_t c = 0; c < 4; ++c) CHECK(y(b, i, c) == e.weight(std::size_t(t(b, i)), c));
  require_error([&] { e.forward(Tokens{{1, 10}}); }, {"token 10", "position 1", "[0, 10)"});
  require_error([&] { f.forward(random_activations(1, 2, 15, 1)); },
                {"15 features", "expected 16"});
}

TEST_CASE("sinusoidal positions follow Vaswani et al.'s formula", "[models]") {
  const Matrix pe = sinusoidal_positions(50, 8);
  for (std::size_t p : {0ul, 1ul, 17ul, 49ul})
    for (std::size_t i = 0; i < 4; ++i) {
      const double angle = double(p) / std::pow(10000.0, 2.0 * double(i) / 8.0);
      CHECK(pe(p, 2 * i) == Approx(std::sin(angle)).margin(1e-6));
      CHECK(pe(p, 2 * i + 1) == Approx(std::cos(angle)).margin(1e-6));
    }
}

TEST_CASE("multi-head attention equals a direct fp64 computation", "[models]") {
  for (std::size_t heads : {1ul, 2ul, 4ul}) {
    INFO("heads " << heads);
    MultiHeadAttention m(16, heads);
    m.initialize(7, "");
    Parameters p;
    m.parameters("", p);
    perturb(p, 8);
    const Activations x = random_activations(2, 9, 16, 9), mem = random_activations(2, 6, 16, 10);
    require_close(m.forward(x), mha64(to64(x), to64(x), m, {}), kRtol, kAtol);

    Mask padded;  // cross-attention with key padding: item 1 sees 4 of its 6 keys
    padded.key_lengths = {6, 4};
    require_close(m.forward(x, mem, padded), mha64(to64(x), to64(mem), m, padded), kRtol, kAtol);

    Mask causal;
    causal.causal = Causal::bottom_right;
    causal.scale = 0.3;
    require_close(m.forward(x, mem, causal), mha64(to64(x), to64(mem), m, causal), kRtol, kAtol);

    Mask boolean;
    xt::xtensor<bool, 2> allowed = xt::ones<bool>({9ul, 9ul});
    for (std::size_t i = 0; i < 9; ++i) allowed(i, (i * 5) % 9) = false;
    boolean.allow(allowed);
    require_close(m.forward(x, boolean), mha64(to64(x), to64(x), m, boolean), kRtol, kAtol);
  }
}

TEST_CASE("per-channel gates follow GLA's and KDA's forms in fp64", "[models]") {
  for (const std::string spec : {"gla", "kda"}) {
    INFO(spec);
    AttentionOptions o;
    o.channel_gate = true;
    MultiHeadAttention m(16, 2, spec, o);
    m.initialize(3, "");
    Parameters p;
    m.parameters("", p);
    perturb(p, 4);
    const ChannelGate& c = *m.channel_gate;
    REQUIRE(c.kda() == (spec == "kda"));
    CHECK(c.down.weight.shape()[0] == (spec == "kda" ? 8 : ChannelGate::kGlaRank));
    CHECK_FALSE(m.gate_proj);
    const Activations x = random_activations(2, 5, 16, 5);
    const Gates g = m.gates(x);
    REQUIRE(g.channel_g.shape() == std::array<std::size_t, 4>{2, 2, 5, 8});
    CHECK(g.g.size() == 0);
    const std::size_t rank = c.down.weight.shape()[0];
    for (std::size_t b = 0; b < 2; ++b)
      for (std::size_t j = 0; j < 5; ++j)
        for (std::size_t h = 0; h < 2; ++h)
          for (std::size_t i = 0; i < 8; ++i) {
            double pre = c.up.bias(h * 8 + i);  // x W_down^T W_up^T + b_up
            for (std::size_t r = 0; r < rank; ++r) {
              double hidden = 0;
              for (std::size_t e = 0; e < 16; ++e)
                hidden += double(c.down.weight(r, e)) * x(b, j, e);
              pre += double(c.up.weight(h * 8 + i, r)) * hidden;
            }
            const double softplus = std::log1p(std::exp(pre));
            const double want = c.kda() ? -std::exp(double((*c.a_log)(h))) * softplus
                                        : (pre - softplus) / MultiHeadAttention::kGateTau;
            // float32 products over 16 and rank terms: a few ulps of |pre|
            CHECK(g.channel_g(b, h, j, i) == Approx(want).epsilon(1e-5).margin(1e-6));
          }
  }
}

TEST_CASE("DeltaProduct's rows per token: with the second steps' beta 0 it is gated-delta",
          "[models]") {
  // The layer's layout (key j of token t from rows j·kv_dim.. of W_K, beta column j·H + h, the
  // short convolution over both keys' channels) checked by a reduction: a gated-delta layer
  // holding the first key's rows equals the two-step layer whose second steps write nothing
  // (beta = sigmoid(-40), 4e-18) and whose gate sits on the first rows.
  AttentionOptions o;
  o.short_conv = true;
  o.head_norm = true;
  MultiHeadAttention two(16, 2, "delta-product:steps=2", o), one(16, 2, "gated-delta", o);
  REQUIRE(two.key_rows() == 2);
  two.initialize(5, "");
  Parameters p;
  two.parameters("", p);
  perturb(p, 6);
  const std::size_t d = 16, kv = 16;
  // one's rows: Q block, then the first kv rows of two's K and V blocks
  const std::size_t from[] = {0, d, d + 2 * kv}, to[] = {0, d, d + kv};
  for (std::size_t block = 0; block < 3; ++block)
    for (std::size_t r = 0; r < (block == 0 ? d : kv); ++r) {
      for (std::size_t e = 0; e < d; ++e)
        one.in_proj_weight(to[block] + r, e) = two.in_proj_weight(from[block] + r, e);
      one.in_proj_bias(to[block] + r) = two.in_proj_bias(from[block] + r);
      for (std::size_t t = 0; t < MultiHeadAttention::kConvWidth; ++t)
        (*one.conv_weight)(to[block] + r, t) = (*two.conv_weight)(from[block] + r, t);
    }
  one.out_proj = two.out_proj;
  *one.head_norm_weight = *two.head_norm_weight;
  *one.gate_proj = *two.gate_proj;
  for (std::size_t h = 0; h < 2; ++h) {
    for (std::size_t e = 0; e < d; ++e) {
      one.beta_proj->weight(h, e) = two.beta_proj->weight(h, e);
      two.beta_proj->weight(2 + h, e) = 0;
    }
    one.beta_proj->bias(h) = two.beta_proj->bias(h);
    two.beta_proj->bias(2 + h) = -40;
  }
  const Activations x = random_activations(2, 7, 16, 7);
  Mask causal;
  causal.causal = Causal::top_left;
  // float32: the same products in another order (the core runs 14 rows instead of 7)
  require_close(to64(two.forward(x, causal)), to64(one.forward(x, causal)), 1e-5, 1e-6);
}

TEST_CASE("head mask: all ones is the plain forward, zeros remove heads, traced and backward agree",
          "[models]") {
  const LayerConfig c = small_config("pre-ln");
  EncoderLayer layer = initialised<EncoderLayer>(c, 21);
  const Activations x = random_activations(2, 7, 16, 22);
  Mask causal;
  causal.causal = Causal::top_left;
  const Activations plain = layer.forward(x, causal);

  // Multiplying by 1.0f changes no bit.
  layer.self_attn.head_mask.assign(4, 1.0f);
  const Activations ones = layer.forward(x, causal);
  CHECK(std::equal(ones.begin(), ones.end(), plain.begin(), plain.end()));

  // Every head removed: the attention sublayer returns b_O, so the layer is x + b_O and the FFN
  // sublayer, with no attention at all (the same float operations: bitwise).
  layer.self_attn.head_mask.assign(4, 0.0f);
  const Activations none = layer.forward(x, causal);
  Activations h = x;
  for (std::size_t i = 0; i < h.size(); ++i) h.data()[i] += layer.self_attn.out_proj.bias(i % 16);
  Activations expected = layer.ffn->forward(layer.norm2->forward(h));
  for (std::size_t i = 0; i < h.size(); ++i) expected.data()[i] += h.data()[i];
  CHECK(std::equal(none.begin(), none.end(), expected.begin(), expected.end()));
  CHECK_FALSE(std::equal(none.begin(), none.end(), plain.begin(), plain.end()));

  // One head removed: the traced forward of the training step is the same; its backward sends
  // nothing into that head's rows of W_Q, W_K, W_V (rows 4..7 of each block, d_k = 4).
  layer.self_attn.head_mask = {1.0f, 0.0f, 1.0f, 1.0f};
  const Activations one = layer.forward(x, causal);
  EncoderLayerTrace trace;
  const Activations& traced = forward(layer, x, causal, trace);
  CHECK(std::equal(traced.begin(), traced.end(), one.begin(), one.end()));
  EncoderLayer grad = zero_like(layer);
  backward(layer, trace, random_activations(2, 7, 16, 23), grad);
  const Matrix& dw = grad.self_attn.in_proj_weight;
  for (std::size_t block = 0; block < 3; ++block)
    for (std::size_t r = 0; r < 16; ++r) {
      const std::size_t row = block * 16 + r;
      const bool masked = r >= 4 && r < 8;
      double norm = 0;
      for (std::size_t col = 0; col < 16; ++col) norm += std::abs(dw(row, col));
      INFO("in_proj_weight row " << row);
      CHECK((masked ? norm == 0 : norm > 0));
    }

  layer.self_attn.head_mask = {1.0f, 0.0f};
  require_error([&] { layer.forward(x, causal); }, {"head_mask has 2 entries", "one per head (4)"});
}

TEST_CASE("encoder layers equal a direct fp64 computation under every switch", "[models]") {
  const Activations x = random_activations(2, 7, 16, 11);
  Mask padded;
  padded.key_lengths = {7, 5};
  for (const std::string switches :
       {"", "pre-ln", "no-skip", "no-ffn", "no-norm", "tied-qk", "pre-ln,no-skip",
        "pre-ln,no-norm,no-ffn", "no-skip,no-ffn,no-norm"}) {
    INFO("switches '" << switches << "'");
    const auto layer = initialised<EncoderLayer>(small_config(switches), 12);
    require_close(layer.forward(x, padded), encoder_layer64(layer, to64(x), padded), kRtol, kAtol);
  }
}

TEST_CASE("decoder layers equal a direct fp64 computation", "[models]") {
  const Activations x = random_activations(2, 6, 16, 13), memory = random_activations(2, 9, 16, 14);
  Mask source_padding;
  source_padding.key_lengths = {9, 3};
  for (const std::string switches : {"", "pre-ln", "no-ffn,tied-qk", "no-skip,no-norm"}) {
    INFO("switches '" << switches << "'");
    const auto layer = initialised<DecoderLayer>(small_config(switches), 15);
    require_close(layer.forward(x, memory, {}, source_padding),
                  decoder_layer64(layer, to64(x), to64(memory), source_padding), kRtol, kAtol);
  }
}

TEST_CASE("stacks run their layers in turn; the model embeds, scales and adds positions",
          "[models]") {
  for (const std::string switches : {"", "pre-ln", "pre-ln,no-final-norm"}) {
    INFO("switches '" << switches << "'");
    ModelConfig c;
    c.layer = small_config(switches);
    c.layers = 3;
    c.vocab = 20;
    EncoderModel model(c);
    perturb(model.parameters(), 16);
    const Tokens t = some_tokens(2, 8, 20);

    const Activations e = model.embed(t);
    const Matrix pe = sinusoidal_positions(8, 16);
    for (std::size_t i = 0; i < 8; ++i)
      CHECK(e(1, i, 3) ==
            Approx(model.embedding.weight(std::size_t(t(1, i)), 3) * 4.0f + pe(i, 3)));

    Act64 h = to64(e);
    std::vector<std::size_t> seen;
    const Activations out =
        model.forward(t, {}, [&](std::size_t i, const Activations& in, const Activations& o) {
          seen.push_back(i);
          require_close(in, h, kRtol, kAtol);
          h = encoder_layer64(model.encoder.layers[i], h, {});
          require_close(o, h, kRtol, kAtol);
        });
    CHECK(seen == std::vector<std::size_t>{0, 1, 2});
    CHECK(model.encoder.norm.has_value() == (switches == "pre-ln"));
    if (model.encoder.norm) h = layer_norm64(h, *model.encoder.norm);
    require_close(out, h, kRtol, kAtol);
  }
}

TEST_CASE("a model's spec 'A;B' alternates its layers' cores (Based's layers)", "[models]") {
  ModelConfig c;
  c.layer = small_config("pre-ln");
  c.layer.spec = "linear:feature=taylor;sliding:left=3,right=0";
  c.layers = 3;
  c.vocab = 20;
  const EncoderModel model(c);
  const char* expected[] = {"linear", "sliding", "linear"};
  for (std::size_t i = 0; i < 3; ++i)
    CHECK(model.encoder.layers[i].self_attn.spec().starts_with(expected[i]));
  CHECK(layer_specs("full") == std::vector<std::string>{"full"});
  // Swapping the cores follows the same rule; one spec gives every layer the same.
  const EncoderModel swapped = model.with_attention("full;sliding:left=2,right=0");
  CHECK(swapped.encoder.layers[2].self_attn.spec() == "full");
  CHECK(swapped.encoder.layers[1].self_attn.spec().starts_with("sliding"));
  for (const std::string bad : {"full;", ";full", "full;;linear"}) {
    INFO(bad);
    require_error([&] { (void)layer_specs(bad); }, {"'" + bad + "'", "empty layer spec"});
  }
  c.layer.spec = "full;fulll";
  require_error([&] { c.layer.validate(); }, {"'fulll'"});
}

TEST_CASE("a model with full attention equals the same model with sliding wide enough",
          "[models]") {
  ModelConfig c;
  c.layer = small_config();
  c.layers = 2;
  c.vocab = 30;
  const EncoderModel full(c);
  const Tokens t = some_tokens(2, 40, 30);
  const Activations expected = full.forward(t);
  // The window covers every key (left, right >= N - 1): the same set of keys, summed in another
  // order by another kernel, hence float tolerance rather than bitwise equality.
  for (const std::string spec : {"sliding:left=39,right=39", "sliding:left=64,right=64,global=1"}) {
    INFO(spec);
    const EncoderModel sliding = full.with_attention(spec);
    CHECK(sliding.encoder.layers[0].self_attn.spec().rfind("sliding", 0) == 0);
    require_close(sliding.forward(t), to64(expected), 1e-5, 1e-5);
  }
  // A narrow window is not exact: the comparison above can fail.
  const Activations narrow = full.with_attention("sliding:left=2,right=2").forward(t);
  CHECK(xt::amax(xt::abs(narrow - expected))() > 1e-2);
}

TEST_CASE("tied W_Q = W_K makes self-attention scores symmetric, untied does not", "[models]") {
  const Activations x = random_activations(1, 12, 16, 17);
  for (const bool tied : {true, false}) {
    INFO((tied ? "tied" : "untied"));
    MultiHeadAttention m(16, 2, "full", tied);
    m.initialize(18, "");
    const QKV in = m.project(x, x);
    CHECK((in.q == in.k) == tied);  // tied: the very same projection of the same input
    const Tensor p = m.attention_probabilities(x, x);
    double asymmetry = 0;
    for (std::size_t h = 0; h < 2; ++h)
      for (std::size_t i = 0; i < 12; ++i) {
        double row = 0;
        for (std::size_t j = 0; j < 12; ++j) {
          double s_ij = 0, s_ji = 0;
          for (std::size_t c = 0; c < 8; ++c) {
            s_ij += double(in.q(0, h, i, c)) * in.k(0, h, j, c);
            s_ji += double(in.q(0, h, j, c)) * in.k(0, h, i, c);
          }
          asymmetry = std::max(asymmetry, std::abs(s_ij - s_ji));
          row += p(0, h, i, j);
        }
        CHECK(row == Approx(1.0).epsilon(1e-5));
      }
    if (tied)
      CHECK(asymmetry == 0.0);
    else
      CHECK(asymmetry > 0.1);  // measured 1.7 with these weights
  }
}

TEST_CASE("attention probabilities are the softmax the exact core weighs values with", "[models]") {
  MultiHeadAttention m(16, 4);
  m.initialize(19, "");
  const Activations x = random_activations(2, 5, 16, 20), mem = random_activations(2, 7, 16, 21);
  Mask mask;
  mask.key_lengths = {7, 3};
  const Tensor p = m.attention_probabilities(x, mem, mask);
  const QKV in = m.project(x, mem);
  // P v per head equals the core's output before the output projection.
  const Tensor expected = make_attention("full")->forward(in.q, in.k, in.v, mask);
  for (std::size_t b = 0; b < 2; ++b)
    for (std::size_t h = 0; h < 4; ++h)
      for (std::size_t i = 0; i < 5; ++i)
        for (std::size_t c = 0; c < 4; ++c) {
          double o = 0;
          for (std::size_t j = 0; j < 7; ++j) o += double(p(b, h, i, j)) * in.v(b, h, j, c);
          CHECK(o == Approx(expected(b, h, i, c)).margin(1e-5));
        }
  CHECK(p(1, 0, 0, 5) == 0.0f);  // padding
}

TEST_CASE("initialisation is seeded per tensor name", "[models]") {
  ModelConfig c;
  c.layer = small_config();
  c.layers = 2;
  c.vocab = 12;
  EncoderModel a(c), b(c);
  c.seed = 2;
  EncoderModel other(c);
  const auto pa = a.parameters(), pb = b.parameters(), po = other.parameters();
  REQUIRE(pa.size() == po.size());
  for (std::size_t i = 0; i < pa.size(); ++i) {
    INFO(pa[i].name);
    CHECK(std::equal(pa[i].data, pa[i].data + pa[i].size(), pb[i].data));
    // PyTorch starts these at 0 (attention biases) or 1 and 0 (LayerNorm), whatever the seed.
    const bool constant = pa[i].name.find("proj_bias") != std::string::npos ||
                          pa[i].name.find("out_proj.bias") != std::string::npos ||
                          pa[i].name.find("norm") != std::string::npos;
    CHECK(std::equal(pa[i].data, pa[i].data + pa[i].size(), po[i].data) == constant);
  }
  // Same seed, another switch: the tensors both models have are the same.
  ModelConfig tied = c;
  apply_switches(tied.layer, "tied-qk,no-ffn");
  EncoderModel t(tied);
  const Matrix& w_untied = other.encoder.layers[1].self_attn.in_proj_weight;
  const Matrix& w_tied = t.encoder.layers[1].self_attn.in_proj_weight;
  auto rows = [](const Matrix& w, std::size_t r0) {
    return Matrix(xt::view(w, xt::range(r0, r0 + 16), xt::all()));
  };
  CHECK((rows(w_tied, 32) == rows(w_untied, 32)));  // W_V
  CHECK((rows(w_tied, 0) == rows(w_untied, 0)));    // W_Q
  CHECK((rows(w_tied, 16) == rows(w_tied, 0)));     // W_K = W_Q
  // Xavier-uniform bound sqrt(6 / (16 + 48)) for in_proj_weight; embedding N(0, 1/16).
  const double largest = xt::amax(xt::abs(w_untied))();
  CHECK(largest <= std::sqrt(6.0 / 64.0));
  CHECK(largest > 0.9 * std::sqrt(6.0 / 64.0));
  const double spread = xt::stddev(a.embedding.weight)();
  CHECK(spread == Approx(0.25).epsilon(0.15));
}

TEST_CASE("the weights folder round-trips and names every tensor as PyTorch does", "[models]") {
  ModelConfig c;
  c.layer = small_config("pre-ln");
  c.layers = 1;
  c.vocab = 12;
  EncoderModel model(c);
  std::vector<std::string> names;
  for (const auto& p : model.parameters()) names.push_back(p.name);
  CHECK(names == std::vector<std::string>{
                     "embedding.weight", "encoder.layers.0.self_attn.in_proj_weight",
                     "encoder.layers.0.self_attn.in_proj_bias",
                     "encoder.layers.0.self_attn.out_proj.weight",
                     "encoder.layers.0.self_attn.out_proj.bias", "encoder.layers.0.linear1.weight",
                     "encoder.layers.0.linear1.bias", "encoder.layers.0.linear2.weight",
                     "encoder.layers.0.linear2.bias", "encoder.layers.0.norm1.weight",
                     "encoder.layers.0.norm1.bias", "encoder.layers.0.norm2.weight",
                     "encoder.layers.0.norm2.bias", "encoder.norm.weight", "encoder.norm.bias"});
  TempDir dir("weights");
  perturb(model.parameters(), 22);
  model.save(dir.file("w"));
  CHECK(to_bhnd(load_npy_float(dir.file("w/encoder.layers.0.linear1.weight.npy")), "").shape()[2] ==
        24);

  c.seed = 5;
  EncoderModel loaded(c);
  const Tokens t = some_tokens(1, 6, 12);
  CHECK_FALSE((loaded.forward(t) == model.forward(t)));
  save_npy(dir.file("w/classifier.weight.npy"), xt::zeros<float>({2ul, 16ul}));
  CHECK(loaded.load(dir.file("w")) == std::vector<std::string>{"classifier.weight.npy"});
  CHECK((loaded.forward(t) == model.forward(t)));  // bitwise: the same float32 weights
}

TEST_CASE("bad weights folders are refused, naming the file, and change nothing", "[models]") {
  ModelConfig c;
  c.layer = small_config("tied-qk");
  c.layers = 1;
  c.vocab = 12;
  EncoderModel model(c);
  TempDir dir("badweights");
  const std::string w = dir.file("w");
  model.save(w);
  c.seed = 9;
  EncoderModel target(c);
  const Tokens t = some_tokens(1, 5, 12);
  const Activations before = target.forward(t);

  std::filesystem::remove(w + "/encoder.layers.0.linear2.bias.npy");
  require_error([&] { target.load(w); }, {"encoder.layers.0.linear2.bias.npy", "missing", "(16,)"});
  save_npy(w + "/encoder.layers.0.linear2.bias.npy", xt::zeros<float>({15ul}));
  require_error([&] { target.load(w); }, {"linear2.bias.npy", "shape (15,)", "expected (16,)"});
  save_npy(w + "/encoder.layers.0.linear2.bias.npy", xt::zeros<float>({16ul}));
  auto tied = load_npy_float(w + "/encoder.layers.0.self_attn.in_proj_weight.npy");
  tied(20, 3) += 1.0f;  // the K block no longer equals the Q block
  save_npy(w + "/encoder.layers.0.self_attn.in_proj_weight.npy", tied);
  require_error([&] { target.load(w); },
                {"layers.0.self_attn.in_proj_weight", "tied", "rows 16..31"});
  require_error([&] { target.load(dir.file("nope")); }, {"nope", "not a directory"});
  CHECK((target.forward(t) == before));  // every failure left the model as it was
}

TEST_CASE("bad configurations and inputs are refused with the name of the problem", "[models]") {
  require_error([] { MultiHeadAttention(30, 4); }, {"d_model=30", "heads=4"});
  require_error([] { MultiHeadAttention(16, 4, "fulll"); }, {"'fulll'", "unknown variant"});
  LayerConfig c = small_config();
  require_error([&] { apply_switches(c, "pre-ln,no-skipp"); },
                {"'no-skipp'", "no-skip", "tied-qk"});
  CHECK(switches_text(c).empty());  // a refused list changes nothing
  c.ffn = 0;
  require_error([&] { EncoderLayer l(c); }, {"ffn=0"});
  apply_switches(c, "no-ffn");
  CHECK_NOTHROW(EncoderLayer(c));
  CHECK(switches_text(c) == "no-ffn");
  apply_switches(c, "no-final-norm");
  require_error([&] { EncoderLayer l(c); }, {"no-final-norm", "pre-ln"});
  c.final_norm = true;
  apply_switches(c, "short-conv,tied-qk");
  CHECK(switches_text(c) == "no-ffn,tied-qk,short-conv");
  require_error([&] { c.validate(); }, {"short-conv with tied-qk"});
  require_error([&] { EncoderLayer l(c); }, {"short convolution", "tied"});
  c.tied_qk = false;
  const EncoderLayer with_conv(c);
  CHECK(with_conv.self_attn.conv_weight->shape()[0] == 3 * c.d_model);
  CHECK(with_conv.self_attn.conv_weight->shape()[1] == MultiHeadAttention::kConvWidth);
  c.short_conv = false;
  ModelConfig m;
  m.layer = small_config();
  m.layers = 0;
  require_error([&] { EncoderModel e(m); }, {"layers=0"});

  // The channel gate needs a core that takes a per-channel decay, and one row per token.
  apply_switches(c, "channel-gate");
  CHECK(switches_text(c) == "no-ffn,channel-gate");
  require_error([&] { c.validate(); }, {"channel-gate", "'full'"});
  c.spec = "kda";
  CHECK_NOTHROW(c.validate());
  c.channel_gate = false;
  c.spec = "full";
  AttentionOptions channel;
  channel.channel_gate = true;
  require_error([&] { MultiHeadAttention(16, 4, "gated-delta-x", channel); }, {"gated-delta-x"});
  require_error([&] { MultiHeadAttention(16, 4, "full", channel); }, {"full", "channel-gate"});
  require_error([&] { MultiHeadAttention(16, 4, "delta-product:steps=2", channel); },
                {"delta-product", "channel-gate", "2 key rows"});
  // A layer's W_K and W_V are shaped for its core's rows per token.
  MultiHeadAttention product(16, 4, "delta-product:steps=2");
  require_error([&] { product.set_attention("gated-delta"); },
                {"'gated-delta", "1 key rows per token", "projects 2"});
  CHECK(product.spec().starts_with("delta-product"));  // refused: unchanged

  MultiHeadAttention mha(16, 4);
  require_error([&] { mha.forward(random_activations(1, 3, 8, 1)); }, {"query [1, 3, 8]", "16"});
  require_error(
      [&] { mha.forward(random_activations(1, 3, 16, 1), random_activations(2, 3, 16, 1), {}); },
      {"batch sizes"});
  // A core that cannot honour the mask refuses it: never silently ignored.
  DecoderLayer linformer_decoder(small_config());
  linformer_decoder.set_attention("linformer:k=4");
  require_error<Unsupported>(
      [&] {
        linformer_decoder.forward(random_activations(1, 6, 16, 1), random_activations(1, 6, 16, 2));
      },
      {"linformer", "causal"});
}
