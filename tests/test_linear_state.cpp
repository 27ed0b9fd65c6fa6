// State passing in the linear family (linear under both rules, delta, retnet, gla, gated-delta):
// a forward from TokenInputs::initial_state returning Saved::final_state, and a backward from
// d_final_state returning AllGradients::d_initial_state. Checked against the float64 recurrences
// and definitions (tests/linear_reference.hpp) from a given state, against central differences
// of them for the state's gradient, and by cutting one sequence into 2 to 16 segments, each
// started from the last one's final state: outputs, final state and every gradient equal one
// call's. Bad input: states of the wrong shape, with NaN, on variants without one.
#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <string>

#include <xtensor/xadapt.hpp>
#include <xtensor/xview.hpp>

#include "grad_helpers.hpp"
#include "helpers.hpp"
#include "linear_reference.hpp"
#include "variants/linear.hpp"
#include "variants/linear_scan.hpp"

using namespace attnlab;
using attnlab::test::Arrays64;
using attnlab::test::random_tensor;
using attnlab::test::require_close;
using attnlab::test::require_close_grad;
using attnlab::test::require_error;
using attnlab::test::uniform_tokens;

namespace {

// The scan engine's clients and linear attention's forms that have a state (favor's sum rule
// has none: Unsupported, tested below). The sum rule with eps = 1e-3, as in
// test_backward_linear.cpp: its gradient near den = 0 is otherwise too ill-conditioned for
// float32 against float64 differences.
const char* kSpecs[] = {"delta:beta=0.7",
                        "retnet",
                        "gla",
                        "gated-delta",
                        "linear:eps=0.001",
                        "linear:feature=dpfp,nu=2,eps=0.001",
                        "linear:rule=delta",
                        "linear:feature=favor,m=12,rule=delta,beta=0.7"};

bool is_linear(const Attention& a) {
  return a.name() == "linear";
}

// One sequence's inputs (g in [-1.5, 0), beta in [0.05, 1)).
using Inputs = test::SequenceInputs;

// A random state of `a` for sizes d: S normal, z (where the state has one) uniform in [0.5, 2)
// (a key sum of non-negative features is non-negative).
RecurrentState random_state(const Attention& a, const Dims& d, std::uint64_t seed) {
  const StateDims sd = a.state_dims(d);
  RecurrentState s;
  s.memory = random_tensor(d.batch, d.heads, sd.rows, sd.columns, seed, 0.5f);
  if (sd.key_sum) s.key_sum = uniform_tokens(d.batch, d.heads, sd.rows, 0.5, 2.0, seed + 1);
  return s;
}

Dims dims_of(const Inputs& x) {
  return {x.q.shape()[0], x.q.shape()[1], x.q.shape()[2],
          x.k.shape()[2], x.q.shape()[3], x.v.shape()[3]};
}

// `s` as the next call's input (nothing when empty).
std::optional<StateRef> as_input(const RecurrentState& s) {
  if (s.empty()) return std::nullopt;
  return s.ref();
}

// The float64 reference of `a` from `initial`: the output and the final state.
std::pair<Tensor64, test::State64> reference(const Attention& a, const Inputs& x, const Mask& mask,
                                             const RecurrentState& initial) {
  if (is_linear(a)) {
    const LinearConfig c = dynamic_cast<const LinearAttention&>(a).config();
    test::State64 start{xt::cast<double>(initial.memory), xt::cast<double>(initial.key_sum)}, end;
    const Tensor64 out = test::linear_reference(c, x.q, x.k, x.v, mask, &start, &end);
    return {out, end};
  }
  const auto& scan = dynamic_cast<const ScanAttention&>(a);
  const test::Recurrence ref = test::recurrence_of(scan, mask, x.q.shape()[3], x.q.shape()[1]);
  TokenInputs in = x.tokens();
  in.initial_state = initial.ref();
  test::State64 end;
  const xt::xarray<double> out =
      ref(test::recurrence_inputs(x.q, x.k, x.v, in), x.with_g, x.with_beta, true, &end.memory);
  return {Tensor64(out), end};
}

// fp32 chunked kernels against fp64: sums of up to ~200 products of O(1) terms and the delta
// rule's triangular solve (the bounds of tests/test_linear_family.cpp and, for linear's
// feature maps, tests/test_backward_linear.cpp).
constexpr double kRtol = 1e-4, kAtol = 2e-5;
constexpr double kLinearRtol = 2e-4, kLinearAtol = 1e-4;

}  // namespace

TEST_CASE("a forward from an initial state equals the float64 recurrence, final state included",
          "[linear-state]") {
  for (const char* spec : kSpecs) {
    const auto a = make_attention(spec);
    REQUIRE(a->support().state);
    for (std::size_t n : {1, 63, 130}) {
      for (const bool causal : {true, false}) {
        for (const bool padded : {false, true}) {
          INFO(spec << " N=" << n << (causal ? " causal" : " non-causal")
                    << (padded ? " padded" : ""));
          const std::size_t B = 2, H = 2, dk = 6, dv = 5;
          const Inputs x(*a, B, H, n, dk, dv, 100 + n);
          Mask mask;
          if (causal) mask.causal = Causal::top_left;
          if (padded) mask.key_lengths = {std::int64_t(n), std::int64_t(n / 2)};
          const RecurrentState initial = random_state(*a, dims_of(x), 7 + n);
          TokenInputs in = x.tokens();
          in.initial_state = initial.ref();
          Tensor out;
          Saved saved;
          a->forward(x.q, x.k, x.v, mask, in, out, saved);
          const auto [want, end] = reference(*a, x, mask, initial);
          const double rtol = is_linear(*a) ? kLinearRtol : kRtol;
          const double atol = is_linear(*a) ? kLinearAtol : kAtol;
          require_close(out, want, rtol, atol);
          require_close(saved.final_state.memory, Tensor64(end.memory), rtol, atol);
          if (a->state_dims(dims_of(x)).key_sum) {
            REQUIRE(saved.final_state.key_sum.size() == end.key_sum.size());
            for (std::size_t i = 0; i < end.key_sum.size(); ++i)
              REQUIRE(saved.final_state.key_sum.data()[i] ==
                      Approx(end.key_sum.data()[i]).epsilon(rtol).margin(atol));
          }
          // The forward that keeps nothing for a backward computes the same output, bitwise.
          Tensor plain;
          a->forward(x.q, x.k, x.v, mask, in, plain);
          CHECK((plain == out));
        }
      }
    }
  }
}

TEST_CASE("a sequence cut into 2 to 16 segments, the state handed on, equals one call",
          "[linear-state]") {
  // Outputs, the final state and every gradient (q, k, v, g, beta, the initial state): the
  // segments' backward runs last to first, each taking the next one's d_initial_state as its
  // d_final_state (truncated backpropagation through time, untruncated). Cuts fall inside
  // and on the 64-token chunks; item 1 is padded from token 111 on, so later segments hold
  // only padding for it (key length 0). Both sides are float32 with chunks starting at
  // different tokens: they differ by rounding only.
  const std::size_t B = 2, H = 2, n = 200, dk = 6, dv = 5;
  const std::int64_t lengths[] = {200, 111};
  for (const char* spec : kSpecs) {
    const auto a = make_attention(spec);
    const Inputs x(*a, B, H, n, dk, dv, 300);
    const Dims d = dims_of(x);
    const RecurrentState initial = random_state(*a, d, 301);
    const Tensor d_out = random_tensor(B, H, n, dv, 302);
    const RecurrentState d_final = random_state(*a, d, 303);
    Mask mask;
    mask.causal = Causal::top_left;
    mask.key_lengths.assign(std::begin(lengths), std::end(lengths));
    TokenInputs in = x.tokens();
    in.initial_state = initial.ref();
    Tensor out;
    Saved saved;
    a->forward(x.q, x.k, x.v, mask, in, out, saved);
    in.d_final_state = d_final.ref();
    AllGradients whole;
    a->backward(x.q, x.k, x.v, mask, in, out, d_out, saved, whole);
    std::mt19937_64 rng(304);
    for (std::size_t segments : {2, 3, 5, 16}) {
      INFO(spec << ", " << segments << " segments");
      std::set<std::size_t> cuts = {0, n};
      if (segments == 3) cuts.insert({64, 128});  // on chunk edges
      while (cuts.size() < segments + 1) cuts.insert(1 + rng() % (n - 1));
      const std::vector<std::size_t> at(cuts.begin(), cuts.end());
      std::vector<Inputs> parts;
      std::vector<Mask> masks;
      std::vector<Saved> saves(segments);
      std::vector<Tensor> outs(segments);
      for (std::size_t s = 0; s < segments; ++s) {
        parts.push_back(x.slice(at[s], at[s + 1]));
        Mask m;
        m.causal = Causal::top_left;
        for (std::int64_t len : lengths)
          m.key_lengths.push_back(std::clamp<std::int64_t>(len - std::int64_t(at[s]), 0,
                                                           std::int64_t(at[s + 1] - at[s])));
        masks.push_back(m);
        TokenInputs tin = parts[s].tokens();
        tin.initial_state = s == 0 ? initial.ref() : saves[s - 1].final_state.ref();
        a->forward(parts[s].q, parts[s].k, parts[s].v, m, tin, outs[s], saves[s]);
        const Tensor want = xt::view(out, xt::all(), xt::all(), xt::range(at[s], at[s + 1]));
        require_close(outs[s], xt::cast<double>(want), 1e-5, 1e-5);
      }
      require_close(saves.back().final_state.memory, xt::cast<double>(saved.final_state.memory),
                    1e-5, 1e-5);
      if (saved.final_state.key_sum.size() != 0)
        REQUIRE(
            xt::allclose(saves.back().final_state.key_sum, saved.final_state.key_sum, 1e-5, 1e-5));
      std::vector<AllGradients> grads(segments);
      for (std::size_t s = segments; s-- > 0;) {
        TokenInputs tin = parts[s].tokens();
        tin.initial_state = s == 0 ? initial.ref() : saves[s - 1].final_state.ref();
        tin.d_final_state = s + 1 == segments ? d_final.ref() : grads[s + 1].d_initial_state.ref();
        const Tensor d_part = xt::view(d_out, xt::all(), xt::all(), xt::range(at[s], at[s + 1]));
        a->backward(parts[s].q, parts[s].k, parts[s].v, masks[s], tin, outs[s], d_part, saves[s],
                    grads[s]);
      }
      // Gradients up to ~20 in size; rounding of sums of ~200 terms in both: 1e-4 relative.
      const auto stitched = [&](auto member) {
        xt::xarray<double> all = xt::cast<double>(member(whole));
        for (std::size_t s = 0; s < segments; ++s) {
          const auto part = xt::cast<double>(member(grads[s]));
          if (all.dimension() == 4)
            xt::view(all, xt::all(), xt::all(), xt::range(at[s], at[s + 1]), xt::all()) = part;
          else
            xt::view(all, xt::all(), xt::all(), xt::range(at[s], at[s + 1])) = part;
        }
        return all;
      };
      const auto check = [&](auto member, const char* what) {
        require_close_grad(stitched(member), xt::cast<double>(member(whole)), 1e-4, 1e-5, what);
      };
      check([](const AllGradients& g) -> const Tensor& { return g.qkv.dq; }, "dq");
      check([](const AllGradients& g) -> const Tensor& { return g.qkv.dk; }, "dk");
      check([](const AllGradients& g) -> const Tensor& { return g.qkv.dv; }, "dv");
      if (x.with_g)
        check([](const AllGradients& g) -> const TokenTensor& { return g.d_log_decay; }, "dg");
      if (x.with_beta)
        check([](const AllGradients& g) -> const TokenTensor& { return g.d_beta; }, "dbeta");
      require_close_grad(xt::cast<double>(grads[0].d_initial_state.memory),
                         xt::cast<double>(whole.d_initial_state.memory), 1e-4, 1e-5, "d initial S");
      if (whole.d_initial_state.key_sum.size() != 0)
        require_close_grad(xt::cast<double>(grads[0].d_initial_state.key_sum),
                           xt::cast<double>(whole.d_initial_state.key_sum), 1e-4, 1e-5,
                           "d initial z");
    }
  }
}

TEST_CASE("the state's gradients against central differences of the float64 recurrence",
          "[linear-state]") {
  // L = sum(out ∘ d_out) + sum(S_final ∘ dS_final) (+ z's): the backward's dq, dk, dv, dg,
  // dbeta and d_initial_state against differences of the fp64 reference in every input and
  // the initial state. Causal across a chunk edge, and non-causal; item padded.
  for (const char* spec : kSpecs) {
    for (const bool causal : {true, false}) {
      const auto a = make_attention(spec);
      INFO(spec << (causal ? " causal" : " non-causal"));
      const bool linear = is_linear(*a);
      const std::size_t B = 1, H = 2, n = causal ? 70 : 9, dk = 3, dv = 2;
      const Inputs x(*a, B, H, n, dk, dv, 500);
      const Dims d = dims_of(x);
      const StateDims sd = a->state_dims(d);
      const RecurrentState initial = random_state(*a, d, 501), d_final = random_state(*a, d, 502);
      const Tensor d_out = random_tensor(B, H, n, dv, 503);
      Mask mask;
      if (causal) mask.causal = Causal::top_left;
      mask.key_lengths = {std::int64_t(n - 4)};
      TokenInputs in = x.tokens();
      in.initial_state = initial.ref();
      Tensor out;
      Saved saved;
      a->forward(x.q, x.k, x.v, mask, in, out, saved);
      in.d_final_state = d_final.ref();
      AllGradients g;
      a->backward(x.q, x.k, x.v, mask, in, out, d_out, saved, g);

      // Inputs: q, k, v, [g], [beta], S_0, [z_0]; f returns out and the final state, flat.
      Arrays64 x64 = test::recurrence_inputs(x.q, x.k, x.v, in);
      const std::size_t state_at = x64.size() - 1;  // S_0, last
      if (sd.key_sum) x64.push_back(xt::cast<double>(initial.key_sum));
      const auto flat = [](std::initializer_list<xt::xarray<double>> parts) {
        std::vector<double> all;
        for (const auto& p : parts) all.insert(all.end(), p.begin(), p.end());
        return xt::xarray<double>(xt::adapt(all, {all.size()}));
      };
      const auto f = [&](const Arrays64& in64) -> xt::xarray<double> {
        if (linear) {
          const LinearConfig c = dynamic_cast<const LinearAttention&>(*a).config();
          const xt::xtensor<double, 4> q = in64[0], k = in64[1], v = in64[2];
          test::State64 start{in64[state_at],
                              sd.key_sum ? in64[state_at + 1] : xt::xarray<double>()},
              end;
          const Tensor64 o = test::linear_reference(c, q, k, v, mask, &start, &end);
          return sd.key_sum ? flat({o, end.memory, end.key_sum}) : flat({o, end.memory});
        }
        const auto& scan = dynamic_cast<const ScanAttention&>(*a);
        xt::xarray<double> end;
        const xt::xarray<double> o =
            test::recurrence_of(scan, mask, dk, H)(in64, x.with_g, x.with_beta, true, &end);
        return flat({o, end});
      };
      const xt::xarray<double> weights =
          sd.key_sum ? flat({xt::cast<double>(d_out), xt::cast<double>(d_final.memory),
                             xt::cast<double>(d_final.key_sum)})
                     : flat({xt::cast<double>(d_out), xt::cast<double>(d_final.memory)});
      const Arrays64 fd = test::central_differences(f, x64, weights);
      std::vector<std::pair<xt::xarray<double>, std::string>> ours = {
          {xt::cast<double>(g.qkv.dq), "dq"},
          {xt::cast<double>(g.qkv.dk), "dk"},
          {xt::cast<double>(g.qkv.dv), "dv"}};
      if (x.with_g) ours.push_back({xt::cast<double>(g.d_log_decay), "dg"});
      if (x.with_beta) ours.push_back({xt::cast<double>(g.d_beta), "dbeta"});
      ours.push_back({xt::cast<double>(g.d_initial_state.memory), "d initial S"});
      if (sd.key_sum) ours.push_back({xt::cast<double>(g.d_initial_state.key_sum), "d initial z"});
      const double rtol = linear ? kLinearRtol : kRtol, atol = linear ? kLinearAtol : kAtol;
      for (std::size_t i = 0; i < ours.size(); ++i)
        require_close_grad(ours[i].first, fd[i], rtol, atol, ours[i].second);
    }
  }
}

TEST_CASE("recurrent states: bad input names the argument", "[linear-state]") {
  const Tensor q = random_tensor(1, 2, 6, 4, 1), k = random_tensor(1, 2, 6, 4, 2),
               v = random_tensor(1, 2, 6, 3, 3);
  const Dims d{1, 2, 6, 6, 4, 3};
  Mask causal;
  causal.causal = Causal::top_left;
  Tensor out;
  Saved saved;
  const auto gla = make_attention("gla");
  const auto linear = make_attention("linear");
  const auto run = [&](const Attention& a, const RecurrentState& s) {
    TokenInputs in;
    in.initial_state = s.ref();
    a.forward(q, k, v, causal, in, out, saved);
  };
  RecurrentState good = random_state(*gla, d, 9);
  run(*gla, good);
  CHECK(TensorRef(saved.final_state.memory).shape() == TensorRef::Shape{1, 2, 4, 3});

  RecurrentState wrong;
  wrong.memory = random_tensor(1, 2, 3, 4, 1);
  require_error([&] { run(*gla, wrong); },
                {"gla", "initial_state", "[1, 2, 3, 4]", "[B, H, rows, Dv] = [1, 2, 4, 3]"});
  RecurrentState nan = good;
  nan.memory(0, 1, 2, 1) = std::nanf("");
  require_error([&] { run(*gla, nan); }, {"initial_state", "NaN", "[0, 1, 2, 1]"});
  // linear's sum rule: S and z; z missing, with Inf, or given where there is none.
  RecurrentState with_z = random_state(*linear, d, 10);
  run(*linear, with_z);
  RecurrentState no_z = with_z;
  no_z.key_sum = TokenTensor();
  require_error([&] { run(*linear, no_z); }, {"linear", "initial_state", "no key sum"});
  RecurrentState inf_z = with_z;
  inf_z.key_sum(0, 1, 3) = INFINITY;
  require_error([&] { run(*linear, inf_z); }, {"initial_state", "key sum", "Inf", "[0, 1, 3]"});
  RecurrentState extra_z = good;
  extra_z.key_sum = uniform_tokens(1, 2, 4, 0, 1, 3);
  require_error([&] { run(*gla, extra_z); }, {"gla", "initial_state", "has a key sum"});
  // Variants without a state.
  require_error<Unsupported>([&] { run(*make_attention("full"), good); },
                             {"full", "recurrent state", "initial_state"});
  require_error<Unsupported>([&] { run(*make_attention("linear:feature=favor,m=4"), good); },
                             {"linear", "recurrent state", "stabiliser"});
  // d_final_state is a backward input.
  require_error(
      [&] {
        TokenInputs in;
        in.d_final_state = good.ref();
        gla->forward(q, k, v, causal, in, out, saved);
      },
      {"gla", "d_final_state", "backward"});
  // Storage shared with what the call writes.
  gla->forward(q, k, v, causal, {}, out, saved);
  require_error(
      [&] {
        TokenInputs in;
        in.initial_state = saved.final_state.ref();
        gla->forward(q, k, v, causal, in, out, saved);
      },
      {"gla", "initial_state", "share storage"});
  require_error(
      [&] {
        TokenInputs in;
        in.initial_state = good.ref();
        AllGradients g;
        g.d_initial_state = good;
        gla->forward(q, k, v, causal, in, out, saved);
        in.d_final_state = g.d_initial_state.ref();
        gla->backward(q, k, v, causal, in, out, out, saved, g);
      },
      {"gla", "d_initial_state", "share storage"});
}

namespace {

// Offsets 0, l_0, l_0 + l_1, ... of documents of lengths `lengths`.
std::vector<std::int64_t> offsets_of(const std::vector<std::int64_t>& lengths) {
  std::vector<std::int64_t> o = {0};
  for (std::int64_t n : lengths) o.push_back(o.back() + n);
  return o;
}

// Rows [t0, t1) of a [1, H, N, D] tensor.
Tensor rows_of(const Tensor& x, std::size_t t0, std::size_t t1) {
  return xt::view(x, xt::all(), xt::all(), xt::range(t0, t1), xt::all());
}

// Document s of a [S, H, ...] state as a [1, H, ...] one.
RecurrentState document_state(const RecurrentState& s, std::size_t doc) {
  RecurrentState one;
  one.memory = xt::view(s.memory, xt::range(doc, doc + 1), xt::all(), xt::all(), xt::all());
  if (s.key_sum.size() != 0)
    one.key_sum = xt::view(s.key_sum, xt::range(doc, doc + 1), xt::all(), xt::all());
  return one;
}

}  // namespace

TEST_CASE("packed documents equal each document run alone, forward and backward",
          "[linear-state][documents]") {
  // Documents of 1, 63, 0 (empty), 64, 65, 7 and 130 tokens: shorter than, at and across the
  // 64-token chunk. Each document runs from its own initial state to its own final state; its
  // chunks start at its first token, so each equals its call alone bitwise (the same
  // arithmetic). Causal with key padding in the last document; non-causal with key documents
  // of other lengths (cross-attention, one with no key: its queries read the initial state).
  const std::vector<std::int64_t> lengths = {1, 63, 0, 64, 65, 7, 130};
  const std::vector<std::int64_t> key_lengths = {3, 60, 2, 64, 0, 9, 129};
  const std::vector<std::int64_t> docs = offsets_of(lengths);
  const std::size_t H = 2, dk = 6, dv = 5, n = std::size_t(docs.back());
  std::vector<const char*> specs(std::begin(kSpecs), std::end(kSpecs));
  specs.push_back("linear:feature=favor,m=8");  // documents, no state
  for (const char* spec : specs) {
    for (const bool causal : {true, false}) {
      INFO(spec << (causal ? " causal" : " non-causal, key documents"));
      const auto a = make_attention(spec);
      const bool state = a->support().state;
      Mask mask;
      mask.documents = docs;
      if (causal) {
        mask.causal = Causal::top_left;
        mask.key_lengths = {std::int64_t(n) - 50};  // the last document half padding
      } else {
        mask.key_documents = offsets_of(key_lengths);
      }
      const std::size_t nk =
          std::size_t(mask.key_documents.empty() ? docs.back() : mask.key_documents.back());
      Inputs x(*a, 1, H, nk, dk, dv, 700);
      x.q = random_tensor(1, H, n, dk, 701);
      const Dims d{1, H, n, nk, dk, dv};
      const std::size_t D = lengths.size();
      Dims per_doc = d;
      per_doc.batch = D;
      const RecurrentState initial = state ? random_state(*a, per_doc, 702) : RecurrentState();
      const RecurrentState d_final = state ? random_state(*a, per_doc, 703) : RecurrentState();
      const Tensor d_out = random_tensor(1, H, n, dv, 704);
      TokenInputs in = x.tokens();
      in.initial_state = as_input(initial);
      Tensor out;
      Saved saved;
      a->forward(x.q, x.k, x.v, mask, in, out, saved);
      in.d_final_state = as_input(d_final);
      AllGradients g;
      a->backward(x.q, x.k, x.v, mask, in, out, d_out, saved, g);
      if (state) {
        REQUIRE(saved.final_state.memory.shape()[0] == D);
        REQUIRE(g.d_initial_state.memory.shape()[0] == D);
      }
      for (std::size_t doc = 0; doc < D; ++doc) {
        INFO("document " << doc);
        const auto [q0, q1] = mask.document_queries(doc);
        const auto [k0, k1] = mask.document_keys(doc);
        const RecurrentState start = state ? document_state(initial, doc) : RecurrentState();
        const RecurrentState end_grad = state ? document_state(d_final, doc) : RecurrentState();
        // A call alone needs a token: an empty side gets one zero row, its key padded out and
        // its query's d_out zero, which changes nothing the comparison reads.
        const std::size_t nq1 = std::max<std::size_t>(q1 - q0, 1);
        const std::size_t nk1 = std::max<std::size_t>(k1 - k0, 1);
        Inputs alone(*a, 1, H, nk1, dk, dv, 0);
        alone.q = xt::zeros<float>({std::size_t(1), H, nq1, dk});
        alone.k = xt::zeros<float>({std::size_t(1), H, nk1, dk});
        alone.v = xt::zeros<float>({std::size_t(1), H, nk1, dv});
        alone.g = xt::zeros<float>({std::size_t(1), H, nk1});
        alone.beta = xt::zeros<float>({std::size_t(1), H, nk1});
        Tensor d_alone = xt::zeros<float>({std::size_t(1), H, nq1, dv});
        const auto first = [](auto& t, std::size_t count) {
          return xt::view(t, xt::all(), xt::all(), xt::range(0, count));
        };
        first(alone.q, q1 - q0) = rows_of(x.q, q0, q1);
        first(alone.k, k1 - k0) = rows_of(x.k, k0, k1);
        first(alone.v, k1 - k0) = rows_of(x.v, k0, k1);
        first(alone.g, k1 - k0) = xt::view(x.g, xt::all(), xt::all(), xt::range(k0, k1));
        first(alone.beta, k1 - k0) = xt::view(x.beta, xt::all(), xt::all(), xt::range(k0, k1));
        first(d_alone, q1 - q0) = rows_of(d_out, q0, q1);
        Mask m;
        m.causal = mask.causal;
        m.key_lengths = {std::clamp<std::int64_t>(
            std::int64_t(mask.valid_keys(0, nk)) - std::int64_t(k0), 0, std::int64_t(k1 - k0))};
        TokenInputs tin = alone.tokens();
        tin.initial_state = as_input(start);
        Tensor o;
        Saved s;
        a->forward(alone.q, alone.k, alone.v, m, tin, o, s);
        CHECK((rows_of(o, 0, q1 - q0) == rows_of(out, q0, q1)));
        tin.d_final_state = as_input(end_grad);
        AllGradients ga;
        a->backward(alone.q, alone.k, alone.v, m, tin, o, d_alone, s, ga);
        CHECK((rows_of(ga.qkv.dq, 0, q1 - q0) == rows_of(g.qkv.dq, q0, q1)));
        CHECK((rows_of(ga.qkv.dk, 0, k1 - k0) == rows_of(g.qkv.dk, k0, k1)));
        CHECK((rows_of(ga.qkv.dv, 0, k1 - k0) == rows_of(g.qkv.dv, k0, k1)));
        const auto keys = [&](const TokenTensor& t, std::size_t from, std::size_t to) {
          return TokenTensor(xt::view(t, xt::all(), xt::all(), xt::range(from, to)));
        };
        if (x.with_g) CHECK((keys(ga.d_log_decay, 0, k1 - k0) == keys(g.d_log_decay, k0, k1)));
        if (x.with_beta) CHECK((keys(ga.d_beta, 0, k1 - k0) == keys(g.d_beta, k0, k1)));
        if (!state) continue;
        CHECK((s.final_state.memory == document_state(saved.final_state, doc).memory));
        CHECK((s.final_state.key_sum == document_state(saved.final_state, doc).key_sum));
        CHECK((ga.d_initial_state.memory == document_state(g.d_initial_state, doc).memory));
        CHECK((ga.d_initial_state.key_sum == document_state(g.d_initial_state, doc).key_sum));
      }
    }
  }
}

TEST_CASE("packed documents: bad offsets name the argument", "[linear-state][documents]") {
  const auto gla = make_attention("gla");
  const Tensor q = random_tensor(1, 2, 6, 4, 1), k = random_tensor(1, 2, 6, 4, 2),
               v = random_tensor(1, 2, 6, 3, 3);
  const auto run = [&](std::vector<std::int64_t> docs, std::vector<std::int64_t> key_docs,
                       const Tensor& qq) {
    Mask m;
    m.documents = std::move(docs);
    m.key_documents = std::move(key_docs);
    gla->forward(qq, k, v, m);
  };
  run({0, 2, 6}, {}, q);
  require_error(
      [&] {
        run({1, 6}, {}, q);
      },
      {"documents (cu_seqlens)", "offset 0 is 1", "start at 0"});
  require_error(
      [&] {
        run({0, 4, 3, 6}, {}, q);
      },
      {"cu_seqlens", "offset 2 is 3", "offset 1 = 4", "must not decrease"});
  require_error([&] { run({0, 2, 5}, {}, q); }, {"documents (cu_seqlens) ends at 5", "Nq = 6"});
  require_error([&] { run({0}, {}, q); }, {"documents", "at least 2"});
  require_error(
      [&] {
        run({0, 2, 6}, {0, 6}, q);
      },
      {"key_documents (cu_seqlens_k)", "1 documents", "2"});
  require_error(
      [&] {
        run({0, 2, 6}, {0, 3, 7}, q);
      },
      {"key_documents (cu_seqlens_k) ends at 7", "Nk = 6"});
  require_error(
      [&] {
        run({0, 2, 4}, {}, random_tensor(1, 2, 4, 4, 4));
      },
      {"Nk = 6", "key_documents"});
  require_error(
      [&] {
        Mask m;
        m.key_documents = {0, 6};
        gla->forward(q, k, v, m);
      },
      {"key_documents", "without documents"});
  require_error(
      [&] {
        Mask m;
        m.documents = {0, 3, 6};
        const Tensor q2 = random_tensor(2, 2, 6, 4, 5), k2 = random_tensor(2, 2, 6, 4, 6),
                     v2 = random_tensor(2, 2, 6, 3, 7);
        gla->forward(q2, k2, v2, m);
      },
      {"documents", "batch of one", "B = 2"});
  require_error<Unsupported>(
      [&] {
        Mask m;
        m.causal = Causal::top_left;
        m.documents = {0, 3, 6};
        m.key_documents = {0, 2, 6};
        gla->forward(q, k, v, m);
      },
      {"gla", "key_documents"});
  require_error<Unsupported>(
      [&] {
        Mask m;
        m.documents = {0, 3, 6};
        make_attention("linformer:k=4")->forward(q, k, v, m);
      },
      {"linformer", "packed documents"});
  // A state per document: [documents, H, rows, Dv].
  require_error(
      [&] {
        Mask m;
        m.causal = Causal::top_left;
        m.documents = {0, 3, 6};
        RecurrentState s;
        s.memory = random_tensor(1, 2, 4, 3, 8);
        TokenInputs in;
        in.initial_state = s.ref();
        Tensor out;
        gla->forward(q, k, v, m, in, out);
      },
      {"initial_state", "[documents, H, rows, Dv] = [2, 2, 4, 3]"});
}
