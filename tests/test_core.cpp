// The common interface: factory strings, masks, validation, error metrics, and the contract
// every registered variant must keep (driven through the one Attention pointer, hnswlib-style).
#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "attnlab/seed.hpp"
#include "attnlab/stats.hpp"
#include "helpers.hpp"
#include "variants/recurrence_reference.hpp"

using namespace attnlab;
using attnlab::test::random_tensor;
using attnlab::test::require_error;

namespace {

// A backend that honours nothing beyond plain self-attention, to test the refusals.
class Plain final : public Attention {
 public:
  std::string spec() const override { return "plain"; }
  Support support() const override { return {false, false, false, false, false, false}; }

 protected:
  void compute(TensorRef q, TensorRef, TensorRef, const Mask&, const TokenInputs&, const Dims&,
               Tensor& out, Saved*) const override {
    std::copy_n(q.data(), q.size(), out.data());
  }
};

}  // namespace

TEST_CASE("factory strings parse, and errors quote the token", "[core]") {
  Params p("demo: a=3, b=0.25 ,c=sum");
  CHECK(p.name() == "demo");
  CHECK(p.integer("a", 0) == 3);
  CHECK(p.number("b", 0) == 0.25);
  CHECK(p.choice("c", "x", {"sum", "delta"}) == "sum");
  CHECK(p.integer("missing", 42) == 42);
  p.check_all_used();

  require_error<Error>([] { Params("demo:a=1.5").integer("a", 0); }, {"a=1.5", "integer"});
  require_error<Error>([] { Params("demo:a=x").number("a", 0); }, {"a=x", "number"});
  require_error<Error>(
      [] {
        Params("demo:c=mul").choice("c", "sum", {"sum", "delta"});
      },
      {"c=mul", "sum|delta"});
  require_error<Error>([] { Params("demo:a"); }, {"'a'", "key=value"});
  require_error<Error>([] { Params("demo:a=1,a=2"); }, {"'a'", "twice"});
  require_error<Error>([] { Params(":a=1"); }, {"missing variant name"});
  require_error<Error>(
      [] {
        Params p("demo:zz=1");
        p.check_all_used();
      },
      {"zz=1", "unknown key"});
  // The messages name what is parsed (SpecKind) and the keys the getters asked for, in order.
  require_error<Error>(
      [] {
        Params(":a=1", SpecKind{"widget", "gadget"});
      },
      {"widget ':a=1'", "missing gadget name"});
  require_error<Error>(
      [] {
        Params p("demo:b=1,zz=2", SpecKind{"widget", "gadget"});
        p.integer("b", 0);
        p.number("a", 0);
        p.check_all_used();
      },
      {"widget 'demo:b=1,zz=2': unknown key 'zz' (known: b, a)"});
}

TEST_CASE("make_attention rejects unknown names and keys", "[core]") {
  require_error<Error>([] { make_attention("fulll"); }, {"'fulll'", "unknown variant", "full"});
  require_error<Error>([] { make_attention("full:window=3"); }, {"window=3", "unknown key"});
}

TEST_CASE("the registry lists every variant in its fixed order and refuses duplicates", "[core]") {
  // Each plugin registers itself from its own .cpp, in an order C++ leaves unspecified: the
  // positions fix the listing order. A registry of its own, filled out of order, shows it.
  Registry<int> widgets("widget");
  widgets.add("c", 3, 30);
  widgets.add("a", 1, 10);
  widgets.add("b", 2, 20);
  widgets.add("b2", 4, 20);  // the same position: after the one added first
  CHECK(widgets.names() == std::vector<std::string>{"a", "b", "b2", "c"});
  CHECK(*widgets.find("b2") == 4);
  CHECK(widgets.find("d") == nullptr);
  require_error([&] { widgets.at("d", "widget spec 'd'"); }, {"'d'", "unknown widget", "a, b"});
  // The variants: exact `full` first, every name once, and each builds from its name.
  const std::vector<std::string> names = attention_names();
  REQUIRE(!names.empty());
  CHECK(names.front() == "full");
  CHECK(std::set<std::string>(names.begin(), names.end()).size() == names.size());
  for (const std::string& name : names) CHECK(make_attention(name)->name() == name);
  const AttentionMaker full_maker = [](Params&) { return make_attention("full"); };
  require_error([&] { register_attention(names.back(), full_maker, 99); },
                {"'" + names.back() + "'", "registered twice"});
  require_error([&] { register_attention("", full_maker, 99); }, {"name"});
  CHECK(attention_names() == names);  // nothing was added by the refused registrations
}

TEST_CASE("the seeded generator is SplitMix64", "[core]") {
  // The reference outputs of SplitMix64 from state 0 (Vigna's splitmix64.c): every seeded
  // draw of the library (inputs, weights, tasks, bigbird's blocks) depends on them.
  std::uint64_t state = 0;
  CHECK(splitmix64_next(state) == 0xe220a8397b1dcdafull);
  CHECK(splitmix64_next(state) == 0x6e789e6aa1b965f4ull);
  CHECK(splitmix64_next(state) == 0x06c45d188009454full);
  CHECK(splitmix64(0) == 0xe220a8397b1dcdafull);
  // stream_seed folds the coordinates in turn (the value computed by hand in Python).
  CHECK(stream_seed(7, {3, 5}) == 0xf647de43e60ec467ull);
  CHECK(stream_seed(7) == splitmix64(7));
}

TEST_CASE("median and quantile: the usual definitions", "[core]") {
  // An even count takes the mean of the middle two (the trainer once took the upper one).
  CHECK(median({4, 1, 3, 2}) == 2.5);
  CHECK(median({3, 1, 2}) == 2);
  CHECK(quantile({1, 2, 3, 4, 5}, 0.25) == 2);  // numpy's linear interpolation
  CHECK(quantile({1, 2}, 0.75) == 1.75);
  require_error<Error>([] { median({}); }, {"median", "no samples"});
}

TEST_CASE("SpecWriter prints values that parse back exactly", "[core]") {
  const std::string s =
      SpecWriter("x").add("a", std::int64_t{7}).add("b", 0.1).add("c", "sum").str();
  CHECK(s == "x:a=7,b=0.1,c=sum");
  Params p(s);
  CHECK(p.number("b", 0) == 0.1);
}

TEST_CASE("shapes are validated with messages that name the mismatch", "[core]") {
  const auto full = make_attention("full");
  const Tensor q = random_tensor(1, 2, 5, 8, 1);
  require_error<Error>([&] { full->forward(q, random_tensor(2, 2, 5, 8, 2), q); }, {"batch"});
  require_error<Error>([&] { full->forward(q, random_tensor(1, 3, 5, 8, 2), q); }, {"head counts"});
  require_error<Error>([&] { full->forward(q, random_tensor(1, 2, 5, 4, 2), q); }, {"Dk"});
  require_error<Error>([&] { full->forward(q, q, random_tensor(1, 2, 6, 8, 2)); },
                       {"sequence lengths"});
  require_error<Error>([&] { full->forward(random_tensor(1, 2, 0, 8, 1), q, q); }, {"at least 1"});
}

TEST_CASE("masks are validated against the problem", "[core]") {
  const auto full = make_attention("full");
  const Tensor x = random_tensor(2, 1, 5, 8, 1);
  Mask m;
  m.key_lengths = {5};
  require_error<Error>([&] { full->forward(x, x, x, m); }, {"key_lengths", "one per batch item"});
  m.key_lengths = {5, 6};
  require_error<Error>([&] { full->forward(x, x, x, m); }, {"key_lengths[1] = 6", "Nk = 5"});
  m = {};
  m.allow(xt::xtensor<bool, 2>::from_shape({5, 4}));
  require_error<Error>([&] { full->forward(x, x, x, m); }, {"boolean mask", "[5, 5]"});
  m = {};
  m.scale = -1.0;
  require_error<Error>([&] { full->forward(x, x, x, m); }, {"scale"});
  require_error<Error>([] { parse_causal("diagonal"); }, {"'diagonal'", "top-left"});
  CHECK(parse_causal("bottom-right") == Causal::bottom_right);
}

TEST_CASE("causal alignments follow the FlashAttention convention", "[core]") {
  const Dims d{1, 1, 2, 5, 4, 4};  // Nq = 2, Nk = 5
  Mask top, bottom;
  top.causal = Causal::top_left;
  bottom.causal = Causal::bottom_right;
  CHECK(top.visible_keys(0, 0, d) == 1);     // 1 0 0 0 0
  CHECK(top.visible_keys(0, 1, d) == 2);     // 1 1 0 0 0
  CHECK(bottom.visible_keys(0, 0, d) == 4);  // 1 1 1 1 0
  CHECK(bottom.visible_keys(0, 1, d) == 5);  // 1 1 1 1 1
  const Dims tall{1, 1, 5, 2, 4, 4};         // Nq = 5, Nk = 2
  CHECK(bottom.visible_keys(0, 0, tall) == 0);
  CHECK(bottom.visible_keys(0, 3, tall) == 1);
  CHECK(top.visible_keys(0, 4, tall) == 2);
}

TEST_CASE("packed documents: a query sees its own document's keys, causal within it", "[core]") {
  // Queries in documents [0, 2), [2, 2) (empty), [2, 5); keys in [0, 3), [3, 3), [3, 4).
  const Dims d{1, 1, 5, 4, 4, 4};
  Mask m;
  m.documents = {0, 2, 2, 5};
  m.key_documents = {0, 3, 3, 4};
  m.validate(d);
  CHECK(m.sequences(1) == 3);
  CHECK(m.document_queries(2) == std::pair<std::size_t, std::size_t>{2, 5});
  CHECK(m.document_keys(2) == std::pair<std::size_t, std::size_t>{3, 4});
  const auto row = [&](std::size_t i) {
    std::string r;
    for (std::size_t j = 0; j < d.nk; ++j) r += m.may_attend(0, 0, i, j, d) ? '1' : '0';
    return r;
  };
  CHECK(row(1) == "1110");
  CHECK(row(2) == "0001");
  m.causal = Causal::top_left;  // the documents' first query and first key aligned
  CHECK(row(0) == "1000");
  CHECK(row(1) == "1100");
  CHECK(row(2) == "0001");
  CHECK(row(4) == "0001");
  m.causal = Causal::bottom_right;  // their last ones aligned: [0, 2) x [0, 3) sees 110, 111
  CHECK(row(0) == "1100");
  CHECK(row(1) == "1110");
  CHECK(row(2) == "0000");  // 3 queries, 1 key: only the last query sees it
  CHECK(row(4) == "0001");
  m.key_lengths = {2};  // padding on the packed positions
  CHECK(row(1) == "1100");
}

TEST_CASE("a backend refuses what it cannot honour, naming itself and the feature", "[core]") {
  Plain plain;
  const Tensor x = random_tensor(1, 1, 4, 8, 1);
  Mask m;
  m.causal = Causal::top_left;
  require_error<Unsupported>([&] { plain.forward(x, x, x, m); }, {"plain", "causal"});
  m = {};
  m.key_lengths = {2};
  require_error<Unsupported>([&] { plain.forward(x, x, x, m); }, {"plain", "key padding"});
  m = {};
  m.allow(xt::ones<bool>({4, 4}));
  require_error<Unsupported>([&] { plain.forward(x, x, x, m); }, {"plain", "boolean"});
  require_error<Unsupported>([&] { plain.forward(random_tensor(1, 1, 3, 8, 1), x, x); },
                             {"plain", "cross-attention"});
  require_error<Unsupported>([&] { plain.forward(x, x, random_tensor(1, 1, 4, 5, 1)); },
                             {"plain", "Dv != Dk"});
  CHECK((plain.forward(x, x, x) == x));
  CHECK(Support{}.describe().find("boolean mask") != std::string::npos);
}

TEST_CASE("error metrics match hand-computed values", "[core]") {
  Tensor out = {{{{1, 0}, {0, 0}, {3, 4}}}};
  Tensor64 ref = {{{{1, 0}, {0, 0}, {3, 3}}}};
  const ErrorMetrics m = compare(out, ref);
  CHECK(m.max_abs == Approx(1.0));
  CHECK(m.rel_fro == Approx(1.0 / std::sqrt(1.0 + 18.0)));
  // cosines: 1, 1 (both zero), (9 + 12) / (5 * sqrt(18))
  CHECK(m.mean_cos == Approx((2.0 + 21.0 / (5.0 * std::sqrt(18.0))) / 3.0));
  CHECK(m.p99_row == Approx(1.0 / std::sqrt(18.0)));  // nearest rank: the worst of 3 rows
  CHECK(m.str().find("rel_fro=") != std::string::npos);
  require_error<Error>([&] { compare(out, Tensor64::from_shape({1, 1, 2, 2})); }, {"shapes"});
  // The row form against a float reference gives the same numbers (these values are exact).
  const Tensor ref32 = xt::cast<float>(ref);
  const ErrorMetrics rows = compare(out.data(), ref32.data(), 3, 2);
  CHECK(rows.max_abs == m.max_abs);
  CHECK(rows.rel_fro == m.rel_fro);
  CHECK(rows.mean_cos == m.mean_cos);
  CHECK(rows.p99_row == m.p99_row);
}

TEST_CASE("every registered variant keeps the common contract", "[core]") {
  const Tensor q = random_tensor(2, 2, 64, 16, 1), k = random_tensor(2, 2, 64, 16, 2),
               v = random_tensor(2, 2, 64, 16, 3);
  for (const std::string& name : attention_names()) {
    INFO("variant " << name);
    const auto a = make_attention(name);
    CHECK(a->name() == name);
    // The canonical spec round-trips, and so does the spec of a variant built from it.
    CHECK(make_attention(a->spec())->spec() == a->spec());
    // Same spec, bitwise-same output.
    const Tensor out = a->forward(q, k, v);
    CHECK((out == make_attention(a->spec())->forward(q, k, v)));
    CHECK(shape_string(out) == "[2, 2, 64, 16]");
    CHECK(xt::all(xt::isfinite(out)));
    // Each feature is either honoured or refused with Unsupported, never ignored.
    const Support s = a->support();
    Mask causal;
    causal.causal = Causal::top_left;
    Mask padded;
    padded.key_lengths = {64, 40};
    Mask boolean;
    boolean.allow(xt::ones<bool>({64ul, 64ul}));
    const std::pair<bool, Mask> cases[] = {
        {s.causal, causal}, {s.key_lengths, padded}, {s.allowed, boolean}};
    for (const auto& [supported, mask] : cases) {
      if (supported)
        CHECK_NOTHROW(a->forward(q, k, v, mask));
      else
        CHECK_THROWS_AS(a->forward(q, k, v, mask), Unsupported);
    }
  }
}

TEST_CASE("a variant that is not softmax attention equals its own float64 definition", "[core]") {
  // What support() declares decides what `attnlab sweep` measures a variant's error against: a
  // variant that computes a function of its own must have that function in float64
  // (variants/recurrence_reference.hpp), given the token inputs it takes, or the sweep could
  // not measure it. fp32 chunked kernels against fp64 on 130 tokens (two chunk edges): the
  // tolerance of tests/test_linear_family.cpp.
  const std::size_t B = 1, H = 2, n = 130, d = 16;
  const Tensor q = random_tensor(B, H, n, d, 1), k = random_tensor(B, H, n, d, 2),
               v = random_tensor(B, H, n, d, 3);
  TokenTensor g = TokenTensor::from_shape({B, H, n}), beta = TokenTensor::from_shape({B, H, n});
  for (std::size_t j = 0; j < n; ++j)
    for (std::size_t h = 0; h < H; ++h)
      g(0, h, j) = -0.05f * float((j + h) % 7), beta(0, h, j) = 0.1f + 0.1f * float(j % 9);
  std::size_t others = 0;
  for (const std::string& name : attention_names()) {
    INFO("variant " << name);
    const auto a = make_attention(name);
    const Support s = a->support();
    if (s.approximates_softmax) continue;
    ++others;
    const TokenInputs in = TokenInputs::of(s.log_decay ? &g : nullptr, s.beta ? &beta : nullptr);
    for (const Causal causal : {Causal::none, Causal::top_left}) {
      Mask mask;
      mask.causal = causal;
      Tensor out;
      a->forward(q, k, v, mask, in, out);
      test::require_close(out, own_reference(*a, q, k, v, mask, in), 1e-4, 2e-5);
      // On sampled rows the same values as on all rows.
      const Tensor64 all = own_reference(*a, q, k, v, mask, in);
      const Tensor64 some = own_reference(*a, q, k, v, mask, in, {3, 64, 129});
      CHECK(some(0, 1, 1, 5) == all(0, 1, 64, 5));
      CHECK(some(0, 0, 2, 0) == all(0, 0, 129, 0));
      // Packed documents: each its own sequence, in the reference as in the variant (an empty
      // document included); sampled rows placed as asked, across documents.
      if (!s.documents) continue;
      Mask packed = mask;
      packed.documents = {0, 60, 60, 130};
      a->forward(q, k, v, packed, in, out);
      test::require_close(out, own_reference(*a, q, k, v, packed, in), 1e-4, 2e-5);
      const Tensor64 rows = own_reference(*a, q, k, v, packed, in, {70, 3});
      const Tensor64 whole = own_reference(*a, q, k, v, packed, in);
      CHECK(rows(0, 1, 0, 2) == whole(0, 1, 70, 2));
      CHECK(rows(0, 0, 1, 4) == whole(0, 0, 3, 4));
    }
  }
  CHECK(others >= 1);  // the registry holds such variants today (retnet, gla, ...)
  // A softmax variant has no float64 definition of its own there: Unsupported, naming it.
  require_error<Unsupported>([&] { own_reference(*make_attention("full"), q, k, v, {}, {}); },
                             {"full", "float64 reference"});
  Mask packed;
  packed.documents = {0, 60, 130};
  packed.key_lengths = {100};
  require_error<Unsupported>([&] { own_reference(*make_attention("gla"), q, k, v, packed, {}); },
                             {"gla", "key padding", "packed documents"});
  Mask windowed;
  windowed.window = Window{8, 8};
  require_error<Unsupported>([&] { own_reference(*make_attention("gla"), q, k, v, windowed, {}); },
                             {"gla", "window"});
  const std::vector<float> sinks(q.shape()[1], 0.5f);
  TokenInputs with_sinks;
  with_sinks.sinks = std::span<const float>(sinks);
  require_error<Unsupported>(
      [&] { own_reference(*make_attention("retnet"), q, k, v, {}, with_sinks); },
      {"retnet", "sinks"});
}

TEST_CASE("forward into an output reuses its storage and equals the returning form", "[core]") {
  const Tensor q = random_tensor(1, 2, 48, 16, 1), k = random_tensor(1, 2, 40, 16, 2),
               v = random_tensor(1, 2, 40, 8, 3);
  for (const std::string& name : attention_names()) {
    INFO("variant " << name);
    const auto a = make_attention(name);
    const Tensor expected = a->forward(q, k, v);
    Tensor out = xt::full_like(random_tensor(1, 1, 3, 3, 4), 7.0f);  // wrong shape: resized
    a->forward(q, k, v, {}, {}, out);
    CHECK((out == expected));
    // The right shape already: the same storage, every element overwritten.
    std::fill(out.begin(), out.end(), std::numeric_limits<float>::quiet_NaN());
    const float* storage = out.data();
    a->forward(q, k, v, {}, {}, out);
    CHECK(out.data() == storage);
    CHECK((out == expected));
    Tensor k_copy = k;
    require_error([&] { a->forward(q, k_copy, v, {}, {}, k_copy); },
                  {name, "must not share storage with q, k"});
    // A caller's own buffer is read in place through a TensorRef: the same bytes as the Tensor.
    const std::vector<float> buffer(q.begin(), q.end());
    CHECK((a->forward(TensorRef(buffer.data(), {1, 2, 48, 16}), k, v) == expected));
    // A null buffer is refused where the view is made; an empty shape needs none.
    require_error([] { TensorRef(nullptr, {1, 2, 48, 16}); }, {"[1, 2, 48, 16]", "null pointer"});
    CHECK(TensorRef(nullptr, {1, 2, 0, 16}).size() == 0);
    // A view into the output's storage is refused before the output is resized (which would
    // free what the view reads), whatever the view's shape.
    Tensor wide = q;  // [1, 2, 48, 16], not the output's [1, 2, 48, 8]
    require_error(
        [&] {
          a->forward(TensorRef(wide.data(), {1, 2, 48, 16}), k, v, {}, {}, wide);
        },
        {name, "must not share storage with q, k"});
  }
}
