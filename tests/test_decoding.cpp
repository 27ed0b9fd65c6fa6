// Decoding (lib/attnlab/decoder.hpp) for every causal variant: prefill of N0 tokens followed by
// N - N0 steps gives the rows of the causal forward of all N tokens, for several N0, with a
// second prefill (a continuation), with items of different prompt lengths (padding), and one
// sequence's long cache split over the cores (flash-decoding). The memory each decoder holds
// (a KV cache grows, a window's ring and a recurrent state do not), and bad input.
#include <algorithm>
#include <string>
#include <tuple>

#include <xtensor/xview.hpp>

#include "helpers.hpp"
#include "variants/delta_product.hpp"

using namespace attnlab;
using attnlab::test::random_tensor;
using attnlab::test::require_close;
using attnlab::test::require_error;
using attnlab::test::uniform_tokens;

namespace {

// Every causal variant in settings that exercise its pattern at N = 70 (bigbird decodes the
// pattern of max_tokens = N tokens; delta-product's k, v, g and beta have steps rows per token).
const char* kSpecs[] = {"full",
                        "sliding:left=5,right=2,global=2",
                        "sliding:left=3,dilation=3,global=0",
                        "sliding:left=100,right=0,global=0",
                        "bigbird:block=8,window=3,global=2,random=2,seed=3",
                        "linear",
                        "linear:feature=favor,m=8",
                        "linear:feature=dpfp,rule=delta",
                        "linear:feature=taylor",
                        "delta:beta=0.7",
                        "retnet",
                        "gla",
                        "gated-delta",
                        "delta-product:steps=2",
                        "delta-product:steps=3,beta=0.8"};

// Rows of k, v, g and beta per token: delta-product's steps, else 1.
std::size_t rows_per_token(const Attention& a) {
  const auto* product = dynamic_cast<const DeltaProductAttention*>(&a);
  return product ? static_cast<std::size_t>(product->steps()) : 1;
}

// Sequences' inputs: q, k, v and g in [-1, 0), beta in [0, 1) where the variant takes them;
// k, v, g and beta with delta-product's steps rows per token.
using Inputs = test::SequenceInputs;

Inputs inputs(const Attention& a, std::size_t B, std::size_t H, std::size_t n, std::size_t dk,
              std::size_t dv, std::uint64_t seed) {
  return Inputs(a, B, H, n, dk, dv, seed, -1, 0, rows_per_token(a));
}

DecodeConfig config_of(const Attention& a, const Inputs& x, std::size_t n) {
  DecodeConfig c{x.q.shape()[0], x.q.shape()[1], x.q.shape()[3], x.v.shape()[3]};
  if (a.name() == "bigbird") c.max_tokens = n;
  return c;
}

// The decoder's outputs for tokens [0, n): prefills of [0, cuts[0]), [cuts[0], cuts[1]), ...
// (item b's first lengths[b] tokens of the first one real), then one step per token.
Tensor decode(TokenDecoder& decoder, const Inputs& x, const std::vector<std::size_t>& cuts,
              const std::vector<std::int64_t>& lengths = {}) {
  const std::size_t n = x.q.shape()[2];
  Tensor out = Tensor::from_shape({x.q.shape()[0], x.q.shape()[1], n, x.v.shape()[3]});
  auto into = [&](std::size_t t0, std::size_t t1, const Tensor& rows) {
    xt::view(out, xt::all(), xt::all(), xt::range(t0, t1), xt::all()) = rows;
  };
  std::size_t t = 0;
  for (std::size_t i = 0; i < cuts.size(); ++i) {
    const Inputs p = x.slice(t, cuts[i]);
    into(
        t, cuts[i],
        decoder.prefill(p.q, p.k, p.v, p.tokens(), i == 0 ? lengths : std::vector<std::int64_t>{}));
    t = cuts[i];
  }
  for (; t < n; ++t) {
    const Inputs s = x.slice(t, t + 1);
    into(t, t + 1, decoder.step(s.q, s.k, s.v, s.tokens()));
  }
  return out;
}

Mask causal() {
  Mask m;
  m.causal = Causal::top_left;
  return m;
}

// The step's online softmax (and the recurrent step) against the forward's tiles (chunks):
// the same sums in another order, float32: within 1e-4 relative, 2e-5 absolute (measured
// worst: see the comment where it is checked).
constexpr double kRtol = 1e-4, kAtol = 2e-5;

}  // namespace

TEST_CASE("prefill then steps equal the causal forward, for every causal variant", "[decoding]") {
  const std::size_t B = 2, H = 2, n = 70, dk = 8, dv = 6;
  for (const char* spec : kSpecs) {
    const auto a = make_attention(spec);
    const Inputs x = inputs(*a, B, H, n, dk, dv, 10);
    Tensor want;
    a->forward(x.q, x.k, x.v, causal(), x.tokens(), want);
    for (const std::vector<std::size_t>& cuts :
         std::vector<std::vector<std::size_t>>{{}, {1}, {17}, {64}, {70}, {17, 40}, {0, 33}}) {
      INFO(spec << ", prefills ending at " << (cuts.empty() ? 0 : cuts.back()) << " ("
                << cuts.size() << ")");
      const auto decoder = a->start_decoding(config_of(*a, x, n));
      const Tensor got = decode(*decoder, x, cuts);
      require_close(got, xt::cast<double>(want), kRtol, kAtol);
      CHECK(decoder->tokens(0) == n);
      CHECK(decoder->tokens(1) == n);
    }
  }
}

TEST_CASE("decoding items of different prompt lengths (padding) equals each one's forward",
          "[decoding]") {
  // Item 0's prompt has N0 tokens, item 1's N0 - 9 (the rest of its prefill is padding, not
  // kept, output zeros); each then steps on from its own length. Item b's rows are those of the
  // causal forward of its own tokens (laid out over N tokens, zeros after them).
  const std::size_t B = 2, H = 2, n = 60, dk = 8, dv = 6, n0 = 25;
  const std::vector<std::int64_t> lengths = {std::int64_t(n0), std::int64_t(n0 - 9)};
  for (const char* spec : kSpecs) {
    INFO(spec);
    const auto a = make_attention(spec);
    const Inputs x = inputs(*a, B, H, n, dk, dv, 20);
    for (const std::size_t continued : {0, 1}) {  // a second prefill continues the first
      const auto decoder = a->start_decoding(config_of(*a, x, n));
      std::vector<std::size_t> cuts = {n0};
      if (continued) cuts.push_back(n0 + 10);
      const Tensor got = decode(*decoder, x, cuts, lengths);
      for (std::size_t b = 0; b < B; ++b) {
        const std::size_t real = std::size_t(lengths[b]), after = n - n0;
        Inputs one = inputs(*a, 1, H, n, dk, dv, 0);
        for (auto* t : {&one.q, &one.k, &one.v}) *t = xt::zeros<float>(t->shape());
        one.g = xt::zeros<float>(one.g.shape());
        one.beta = xt::zeros<float>(one.beta.shape());
        const Inputs item = x.slice(0, n);
        // Tokens [t0, t1) to tokens from `at` on, of `per` rows each.
        const auto copy = [&](auto& to, const auto& from, std::size_t t0, std::size_t t1,
                              std::size_t at, std::size_t per) {
          xt::view(to, 0, xt::all(), xt::range(at * per, (at + t1 - t0) * per)) =
              xt::view(from, b, xt::all(), xt::range(t0 * per, t1 * per));
        };
        for (const auto& [t0, t1, at] :
             {std::tuple{std::size_t(0), real, std::size_t(0)}, std::tuple{n0, n, real}}) {
          copy(one.q, item.q, t0, t1, at, 1);
          copy(one.k, item.k, t0, t1, at, x.per);
          copy(one.v, item.v, t0, t1, at, x.per);
          copy(one.g, item.g, t0, t1, at, x.per);
          copy(one.beta, item.beta, t0, t1, at, x.per);
        }
        Tensor want;
        a->forward(one.q, one.k, one.v, causal(), one.tokens(), want);
        const auto rows = [&](const Tensor& t, std::size_t bb, std::size_t t0, std::size_t t1) {
          return Tensor(
              xt::view(t, xt::range(bb, bb + 1), xt::all(), xt::range(t0, t1), xt::all()));
        };
        INFO("item " << b << (continued ? ", two prefills" : ""));
        require_close(rows(got, b, 0, real), xt::cast<double>(rows(want, 0, 0, real)), kRtol,
                      kAtol);
        // Padding rows (none for the item whose prompt fills the prefill: xtensor's iterators
        // over an empty view offset a null pointer, which UBSan rightly refuses).
        if (real < n0) CHECK(xt::all(xt::equal(rows(got, b, real, n0), 0.0f)));
        require_close(rows(got, b, n0, n), xt::cast<double>(rows(want, 0, real, real + after)),
                      kRtol, kAtol);
        CHECK(decoder->tokens(b) == real + after);
      }
    }
  }
}

TEST_CASE("one sequence's long cache is split over the cores (flash-decoding)", "[decoding]") {
  // B = 1, H = 1: the step's keys are split into parts (at least 256 keys each) merged
  // afterwards. Against the forward's last rows.
  const std::size_t n = 3000, dk = 16, dv = 8;
  for (const char* spec : {"full", "bigbird:block=64,window=3,global=2,random=3"}) {
    INFO(spec);
    const auto a = make_attention(spec);
    const Inputs x = inputs(*a, 1, 1, n, dk, dv, 30);
    Tensor want;
    a->forward(x.q, x.k, x.v, causal(), {}, want);
    const auto decoder = a->start_decoding(config_of(*a, x, n));
    const Tensor got = decode(*decoder, x, {n - 5});
    require_close(got, xt::cast<double>(want), kRtol, kAtol);
  }
}

TEST_CASE("bigbird's prompt into an empty cache runs its chunked forward", "[decoding]") {
  // The prompt runs the softmax engine over the max_tokens pattern (its steps attend token by
  // token): a prompt of all max_tokens tokens gives the forward's rows bitwise (the same tiles,
  // chunks and sums; token by token sums in other pieces and differs in the last bits), with
  // grouped heads.
  const std::size_t B = 2, H = 4, kv = 2, n = 150, dk = 8, dv = 6;
  const auto a = make_attention("bigbird:block=16,window=3,global=2,random=2,seed=5");
  const Tensor q = random_tensor(B, H, n, dk, 60), k = random_tensor(B, kv, n, dk, 61),
               v = random_tensor(B, kv, n, dv, 62);
  DecodeConfig c{B, H, dk, dv};
  c.kv_heads = kv;
  c.max_tokens = n;
  const Tensor want = a->forward(q, k, v, causal());
  CHECK(xt::all(xt::equal(a->start_decoding(c)->prefill(q, k, v), want)));
}

TEST_CASE("the memory a decoder holds: a cache grows, a window and a state do not", "[decoding]") {
  const std::size_t H = 2, dk = 8, dv = 8;
  const auto held = [&](const char* spec, std::size_t tokens) {
    const auto a = make_attention(spec);
    const Inputs x = inputs(*a, 1, H, tokens, dk, dv, 40);
    DecodeConfig c{1, H, dk, dv};
    const auto decoder = a->start_decoding(c);
    decode(*decoder, x, {tokens - 1});
    return decoder->bytes();
  };
  CHECK(held("full", 1000) >= 1000 * H * (dk + dv) * sizeof(float));  // every key and value
  CHECK(held("full", 1000) > held("full", 100));
  // The ring of left + 1 positions after the global ones: the same at 100 and 1000 tokens.
  CHECK(held("sliding:left=16,global=2", 1000) == held("sliding:left=16,global=2", 100));
  CHECK(held("sliding:left=16,global=2", 1000) == (2 + 17) * H * (dk + dv) * sizeof(float));
  for (const char* spec : {"gla", "delta", "retnet", "linear:rule=delta", "delta-product:steps=3"})
    CHECK(held(spec, 1000) == H * dk * dv * sizeof(float));
  CHECK(held("linear", 1000) == H * (dk * dv + dk) * sizeof(float));  // S and z
  CHECK(held("linear:feature=favor,m=8", 1000) == H * (8 * dv + 8 + 1) * sizeof(float));
}

TEST_CASE("decoding: bad input names what was wrong", "[decoding]") {
  const Tensor x = random_tensor(1, 2, 1, 4, 1);
  require_error<Unsupported>(
      [] {
        make_attention("linformer:k=4")->start_decoding({1, 2, 4, 4});
      },
      {"linformer", "decoding"});
  require_error(
      [] {
        make_attention("bigbird")->start_decoding({1, 2, 4, 4});
      },
      {"bigbird", "max_tokens"});
  require_error(
      [] {
        make_attention("full")->start_decoding({1, 0, 4, 4});
      },
      {"full", "heads", ">= 1"});
  DecodeConfig capped{1, 2, 4, 4};
  capped.max_tokens = 3;
  const auto full = make_attention("full")->start_decoding(capped);
  require_error([&] { full->step(random_tensor(1, 2, 1, 5, 1), x, x); },
                {"full", "q", "[1, 2, 1, 5]", "[1, 2, 1, 4]"});
  require_error(
      [&] {
        full->prefill(random_tensor(1, 2, 4, 4, 1), random_tensor(1, 2, 4, 4, 2),
                      random_tensor(1, 2, 4, 4, 3));
      },
      {"full", "4 tokens", "max_tokens = 3"});
  full->prefill(random_tensor(1, 2, 3, 4, 1), random_tensor(1, 2, 3, 4, 2),
                random_tensor(1, 2, 3, 4, 3));
  require_error([&] { full->step(x, x, x); }, {"full", "max_tokens = 3"});
  Tensor nan = x;
  nan(0, 1, 0, 2) = std::nanf("");
  const auto gla = make_attention("gla")->start_decoding({1, 2, 4, 4});
  require_error([&] { gla->step(x, nan, x); }, {"gla", "k", "not finite", "[0, 1, 0, 2]"});
  require_error([&] { gla->prefill(x, x, x, {}, {2}); }, {"lengths[0] = 2", "N = 1"});
  require_error([&] { gla->prefill(x, x, x, {}, {1, 1}); }, {"lengths", "one per batch item"});
  const TokenTensor positive = xt::ones<float>({std::size_t(1), std::size_t(2), std::size_t(1)});
  require_error([&] { gla->step(x, x, x, TokenInputs::of(&positive, nullptr)); },
                {"log-decay g", "<= 0"});
  require_error<Unsupported>([&] { gla->step(x, x, x, TokenInputs::of(nullptr, &positive)); },
                             {"gla", "beta"});
}

TEST_CASE("grouped KV heads and the engine's modifiers in decoding equal the causal forward",
          "[decoding]") {
  // H = 4 query heads over Hkv = 2 or 1 KV heads, with each modifier alone and all together:
  // a window of 9, softcap 2 (scores of these inputs reach beyond it), sinks, ALiBi's slopes,
  // the forgetting gate. Decoded rows against the variant's causal forward of all N tokens with
  // the same modifiers, and full's against the float64 reference too.
  const std::size_t B = 2, H = 4, n = 70, dk = 8, dv = 6;
  const std::vector<float> sinks = {0.5f, -1.0f, 2.0f, -10.0f}, slopes = alibi_slopes(H);
  const TokenTensor gate = uniform_tokens(B, H, n, -0.3, 0, 54);
  struct Setting {
    const char* name;
    bool window, softcap, sinks, alibi, gate;
  };
  const Setting settings[] = {
      {"none", false, false, false, false, false},   {"window", true, false, false, false, false},
      {"softcap", false, true, false, false, false}, {"sinks", false, false, true, false, false},
      {"alibi", false, false, false, true, false},   {"gate", false, false, false, false, true},
      {"all", true, true, true, true, true}};
  for (const char* spec :
       {"full", "sliding:left=5,right=2,global=2", "sliding:left=3,dilation=3,global=1",
        "bigbird:block=8,global=2,random=2"})
    for (const std::size_t kv : {2, 1})
      for (const Setting& s : settings) {
        const auto a = make_attention(spec);
        const Tensor q = 3.0f * random_tensor(B, H, n, dk, 50), k = random_tensor(B, kv, n, dk, 51),
                     v = random_tensor(B, kv, n, dv, 52);
        DecodeConfig c{B, H, dk, dv};
        c.kv_heads = kv;
        if (a->name() == "bigbird") c.max_tokens = n;
        Mask mask = causal();
        TokenInputs in;
        if (s.window) c.window = mask.window = Window{9, 0};
        if (s.softcap) c.softcap = mask.softcap = 2.0;
        if (s.sinks) c.sinks = sinks, in.sinks = std::span<const float>(sinks);
        if (s.alibi) c.alibi_slopes = slopes, in.alibi_slopes = std::span<const float>(slopes);
        if (s.gate) in.log_decay = gate;
        const Tensor want = a->forward(q, k, v, mask, in);
        for (const std::vector<std::size_t>& cuts :
             std::vector<std::vector<std::size_t>>{{}, {17}, {0, 33}, {70}}) {
          INFO(spec << ", Hkv = " << kv << ", " << s.name << ", prefills ending at "
                    << (cuts.empty() ? 0 : cuts.back()));
          const auto decoder = a->start_decoding(c);
          Tensor got = Tensor::from_shape({B, H, n, dv});
          std::size_t t = 0;
          const auto rows = [](const auto& x, std::size_t t0, std::size_t t1) {
            using T = std::decay_t<decltype(x)>;
            if constexpr (T::rank == 4) {
              return T(xt::view(x, xt::all(), xt::all(), xt::range(t0, t1), xt::all()));
            } else {
              return T(xt::view(x, xt::all(), xt::all(), xt::range(t0, t1)));
            }
          };
          const auto call = [&](std::size_t t0, std::size_t t1, bool step) {
            const TokenTensor g = rows(gate, t0, t1);
            TokenInputs tin;
            if (s.gate) tin.log_decay = g;
            const Tensor qr = rows(q, t0, t1), kr = rows(k, t0, t1), vr = rows(v, t0, t1);
            xt::view(got, xt::all(), xt::all(), xt::range(t0, t1), xt::all()) =
                step ? decoder->step(qr, kr, vr, tin) : decoder->prefill(qr, kr, vr, tin);
          };
          for (const std::size_t cut : cuts) call(t, cut, false), t = cut;
          for (; t < n; ++t) call(t, t + 1, true);
          require_close(got, xt::cast<double>(want), kRtol, kAtol);
          if (a->name() == "full")
            require_close(got, reference_attention(q, k, v, mask, in), kRtol, kAtol);
        }
      }
}

TEST_CASE("a KV cache holds Hkv heads, and a window's ring only the window", "[decoding]") {
  const std::size_t H = 4, dk = 8, dv = 8, n = 300;
  const auto held = [&](std::size_t kv, std::optional<Window> window) {
    DecodeConfig c{1, H, dk, dv};
    c.kv_heads = kv;
    c.max_tokens = n;
    c.window = window;
    const auto decoder = make_attention("full")->start_decoding(c);
    const Tensor q = random_tensor(1, H, n, dk, 1), k = random_tensor(1, kv, n, dk, 2),
                 v = random_tensor(1, kv, n, dv, 3);
    decoder->prefill(q, k, v);
    return decoder->bytes();
  };
  CHECK(held(4, {}) == n * 4 * (dk + dv) * sizeof(float));
  CHECK(held(1, {}) == n * 1 * (dk + dv) * sizeof(float));  // grouped heads: never repeated
  CHECK(held(2, Window{31, 0}) == 32 * 2 * (dk + dv) * sizeof(float));
}

TEST_CASE("decoding options: bad input names what was wrong", "[decoding]") {
  DecodeConfig c{1, 4, 8, 8};
  c.kv_heads = 3;
  require_error([&] { make_attention("full")->start_decoding(c); }, {"kv_heads = 3", "heads = 4"});
  require_error([&] { make_attention("gla")->start_decoding(c); }, {"kv_heads = 3", "heads = 4"});
  DecodeConfig o{1, 2, 8, 8};
  o.softcap = -1.0;
  require_error([&] { make_attention("full")->start_decoding(o); }, {"softcap", "> 0"});
  o.softcap = 2.0;
  require_error<Unsupported>([&] { make_attention("retnet")->start_decoding(o); },
                             {"retnet", "softcap"});
  o = DecodeConfig{1, 2, 8, 8};
  o.sinks = {1.0f};
  require_error([&] { make_attention("full")->start_decoding(o); },
                {"sinks", "one per query head"});
  o = DecodeConfig{1, 2, 8, 8};
  o.alibi_slopes = {1.0f, -1.0f};
  require_error([&] { make_attention("sliding")->start_decoding(o); },
                {"alibi_slopes[1]", "finite slope >= 0"});
  o = DecodeConfig{1, 2, 8, 8};
  o.window = Window{-4, 0};
  require_error([&] { make_attention("full")->start_decoding(o); }, {"window.left = -4"});
  o.window = Window{4, 0};
  require_error<Unsupported>([&] { make_attention("linear")->start_decoding(o); },
                             {"linear", "window"});
  const auto full = make_attention("full")->start_decoding({1, 2, 4, 4});
  const Tensor x = random_tensor(1, 2, 1, 4, 1);
  const std::vector<float> sinks = {0.0f, 0.0f};
  TokenInputs with_sinks;
  with_sinks.sinks = std::span<const float>(sinks);
  require_error([&] { full->step(x, x, x, with_sinks); }, {"sinks", "DecodeConfig"});
  const Tensor bias =
      xt::zeros<float>({std::size_t(1), std::size_t(1), std::size_t(1), std::size_t(1)});
  TokenInputs with_bias;
  with_bias.bias = bias;
  require_error<Unsupported>([&] { full->step(x, x, x, with_bias); }, {"full", "bias"});
  DecodeConfig g{1, 4, 4, 4};
  g.kv_heads = 2;
  const auto grouped = make_attention("full")->start_decoding(g);
  require_error(
      [&] {
        grouped->step(random_tensor(1, 4, 1, 4, 1), random_tensor(1, 4, 1, 4, 1),
                      random_tensor(1, 2, 1, 4, 1));
      },
      {"k", "[1, 4, 1, 4]", "[1, 2, 1, 4]"});
}

TEST_CASE("extend appends a context without its outputs; steps after it are the forward's rows",
          "[decoding]") {
  const std::size_t B = 2, H = 2, n = 70, n0 = 41, dk = 8, dv = 6;
  for (const char* spec : kSpecs) {
    INFO(spec);
    const auto a = make_attention(spec);
    const Inputs x = inputs(*a, B, H, n, dk, dv, 60);
    Tensor want;
    a->forward(x.q, x.k, x.v, causal(), x.tokens(), want);
    const auto decoder = a->start_decoding(config_of(*a, x, n));
    const Inputs first = x.slice(0, 30), second = x.slice(30, n0);
    decoder->extend(first.k, first.v, first.tokens());
    decoder->extend(second.k, second.v, second.tokens());
    CHECK(decoder->tokens(1) == n0);
    const Tensor got = decode(*decoder, x.slice(n0, n), {});
    require_close(
        got, xt::cast<double>(xt::view(want, xt::all(), xt::all(), xt::range(n0, n), xt::all())),
        kRtol, kAtol);
  }
}

TEST_CASE("delta-product decodes as gated-delta's decoder over its steps' rows", "[decoding]") {
  const std::size_t B = 2, H = 4, n = 40, dk = 8, dv = 6;
  SECTION("steps=1 is gated-delta's decoder, bitwise") {
    const auto product = make_attention("delta-product:steps=1,beta=0.6");
    const auto gated = make_attention("gated-delta:beta=0.6");
    const Inputs x = inputs(*product, B, H, n, dk, dv, 70);
    for (const std::vector<std::size_t>& cuts :
         std::vector<std::vector<std::size_t>>{{}, {17}, {0, 33}}) {
      const auto a = product->start_decoding({B, H, dk, dv});
      const auto b = gated->start_decoding({B, H, dk, dv});
      const std::vector<std::int64_t> lengths =  // padding in the first prefill of 17
          cuts == std::vector<std::size_t>{17} ? std::vector<std::int64_t>{17, 9}
                                               : std::vector<std::int64_t>{};
      CHECK(xt::all(xt::equal(decode(*a, x, cuts, lengths), decode(*b, x, cuts, lengths))));
      CHECK(a->tokens(1) == b->tokens(1));
      CHECK(a->bytes() == b->bytes());
    }
  }
  SECTION("grouped KV heads, steps=2 and 3, equal the causal forward") {
    // H = 4 query heads over Hkv = 2 or 1; g and beta per query head and row.
    for (const std::size_t steps : {2, 3})
      for (const std::size_t kv : {2, 1}) {
        const auto a = make_attention("delta-product:steps=" + std::to_string(steps));
        const std::size_t rows = steps * n;
        Inputs x(*a, B, H, n, dk, dv, 71, -1, 0, steps);
        x.k = random_tensor(B, kv, rows, dk, 72);
        x.v = random_tensor(B, kv, rows, dv, 73);
        Tensor want;
        a->forward(x.q, x.k, x.v, causal(), x.tokens(), want);
        for (const std::vector<std::size_t>& cuts :
             std::vector<std::vector<std::size_t>>{{}, {1}, {17}, {0, 33}, {40}}) {
          INFO("steps = " << steps << ", Hkv = " << kv << ", prefills ending at "
                          << (cuts.empty() ? 0 : cuts.back()));
          DecodeConfig c{B, H, dk, dv};
          c.kv_heads = kv;
          c.max_tokens = n;  // in tokens: the rows' decoder holds steps·n rows
          const auto decoder = a->start_decoding(c);
          require_close(decode(*decoder, x, cuts), xt::cast<double>(want), kRtol, kAtol);
          CHECK(decoder->tokens(0) == n);
          CHECK(decoder->bytes() == B * H * dk * dv * sizeof(float));
        }
      }
  }
}

TEST_CASE("delta-product decoding: bad input names what was wrong", "[decoding]") {
  const auto a = make_attention("delta-product:steps=2");
  const auto decoder = a->start_decoding({1, 2, 4, 4});
  const Tensor q = random_tensor(1, 2, 1, 4, 1), one = random_tensor(1, 2, 1, 4, 2),
               two = random_tensor(1, 2, 2, 4, 3), three = random_tensor(1, 2, 3, 4, 4);
  require_error([&] { decoder->step(q, one, one); },
                {"delta-product", "k and v have 1 and 1 rows", "2 rows per token · 1 tokens = 2"});
  require_error([&] { decoder->step(q, two, one); },
                {"k and v have 2 and 1 rows", "2 rows per token · 1 tokens = 2"});
  require_error([&] { decoder->prefill(random_tensor(1, 2, 2, 4, 5), three, three); },
                {"k and v have 3 and 3 rows", "2 rows per token · 2 tokens = 4"});
  require_error([&] { decoder->extend(three, three); },
                {"delta-product", "k has 3 rows", "2 rows per token"});
  const TokenTensor per_token = uniform_tokens(1, 2, 1, -1, 0, 6);
  require_error([&] { decoder->step(q, two, two, TokenInputs::of(&per_token, nullptr)); },
                {"log-decay g", "[1, 2, 2]"});
  Tensor nan = two;
  nan(0, 1, 1, 3) = std::nanf("");
  require_error([&] { decoder->step(q, two, nan); }, {"v", "not finite", "[0, 1, 1, 3]"});
  const Tensor channel =
      xt::zeros<float>({std::size_t(1), std::size_t(2), std::size_t(2), std::size_t(4)});
  TokenInputs per_channel;
  per_channel.channel_log_decay = channel;
  require_error<Unsupported>([&] { decoder->step(q, two, two, per_channel); },
                             {"delta-product", "channel_log_decay"});
  CHECK(decoder->tokens(0) == 0);  // nothing was taken
}
