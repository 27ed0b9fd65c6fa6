// Grouped KV heads (issue 43) in the linear family: linear (every feature map, sum and delta
// rule) and the scan engine's clients, with H = 4 query heads over Hkv = 2 and 1 KV heads. Each
// call against the same call with k and v repeated to H heads (outputs, final states, dq, dg,
// dbeta and the initial state's gradient bitwise; dk and dv the sums, in head order, of the
// repeated call's), against the float64 definitions (variants/recurrence_reference.hpp), whose
// grouped heads read k and v through h / (H / Hkv), and against central differences of them;
// decoding; and a head count that does not divide.
#include <cmath>
#include <string>
#include <vector>

#include <omp.h>

#include <xtensor/xview.hpp>

#include "grad_helpers.hpp"
#include "helpers.hpp"
#include "linear_reference.hpp"

using namespace attnlab;
using attnlab::test::Arrays64;
using attnlab::test::random_tensor;
using attnlab::test::require_close;
using attnlab::test::require_close_grad;
using attnlab::test::require_error;
using attnlab::test::uniform_tokens;

namespace {

bool is_linear(const Attention& a) {
  return dynamic_cast<const LinearAttention*>(&a) != nullptr;
}

// Every registered client of the scan engine at its defaults (a new one is tested here without
// an edit), and linear with each feature map under both rules (taylor: the sum rule only).
std::vector<std::string> specs() {
  std::vector<std::string> out;
  for (const std::string& name : attention_names()) {
    const auto a = make_attention(name);
    if (dynamic_cast<const ScanAttention*>(a.get())) out.push_back(a->spec());
  }
  for (const char* spec :
       {"linear", "linear:feature=relu", "linear:feature=favor,m=16", "linear:feature=dpfp",
        "linear:feature=taylor", "linear:rule=delta", "linear:feature=favor,m=16,rule=delta",
        "linear:feature=dpfp,nu=2,rule=delta", "gated-delta:beta=0.5"})
    out.push_back(spec);
  return out;
}

// k or v [B, Hkv, N, D] with each head repeated for the H / Hkv query heads that read it.
Tensor repeat_kv(const Tensor& t, std::size_t heads) {
  const std::size_t group = heads / t.shape(1), rows = t.shape(2) * t.shape(3);
  Tensor out = Tensor::from_shape({t.shape(0), heads, t.shape(2), t.shape(3)});
  for (std::size_t b = 0; b < t.shape(0); ++b)
    for (std::size_t h = 0; h < heads; ++h)
      std::copy_n(&t(b, h / group, 0, 0), rows, &out(b, h, 0, 0));
  return out;
}

// A gradient of repeated k or v [B, H, N, D] summed over each group's query heads, in head
// order (as the backward sums them): [B, Hkv, N, D].
Tensor group_sum(const Tensor& t, std::size_t kv_heads) {
  const std::size_t group = t.shape(1) / kv_heads, rows = t.shape(2) * t.shape(3);
  Tensor out = xt::zeros<float>({t.shape(0), kv_heads, t.shape(2), t.shape(3)});
  for (std::size_t b = 0; b < t.shape(0); ++b)
    for (std::size_t h = 0; h < t.shape(1); ++h) {
      float* to = &out(b, h / group, 0, 0);
      const float* from = &t(b, h, 0, 0);
      for (std::size_t i = 0; i < rows; ++i) to[i] = h % group == 0 ? from[i] : to[i] + from[i];
    }
  return out;
}

// A random state for `a` at sizes d (z > 0: the sum rule's denominators stay away from 0).
RecurrentState random_state(const Attention& a, const Dims& d, std::size_t sequences,
                            std::uint64_t seed) {
  const StateDims sd = a.state_dims(d);
  RecurrentState s;
  s.memory = random_tensor(sequences, d.heads, sd.rows, sd.columns, seed, 0.5f);
  if (sd.key_sum) s.key_sum = uniform_tokens(sequences, d.heads, sd.rows, 0.5, 2.0, seed + 1);
  return s;
}

// One case's inputs: q [B, H, Nq, Dk], k and v [B, Hkv, N, D], g and beta [B, H, N] where the
// variant takes them, and an initial state where it has one.
struct Case {
  Tensor q, k, v;
  TokenTensor g, beta;
  RecurrentState initial;
  Mask mask;
  TokenInputs in() const {
    TokenInputs t = TokenInputs::of(g.size() ? &g : nullptr, beta.size() ? &beta : nullptr);
    if (!initial.empty()) t.initial_state = initial.ref();
    return t;
  }
};

// fp32 chunked kernels against the fp64 definitions: the bounds of tests/test_linear_family.cpp
// (scan clients) and tests/test_linear_state.cpp (linear's feature maps), the same sums here.
constexpr double kRtol = 1e-4, kAtol = 2e-5;
constexpr double kLinearRtol = 2e-4, kLinearAtol = 1e-4;

}  // namespace

TEST_CASE("grouped heads equal the call with k and v repeated, and the float64 definition",
          "[linear][grouped]") {
  const std::size_t H = 4, dk = 8, dv = 6;
  enum class Layout { plain, padded, documents };
  for (const std::string& spec : specs()) {
    const auto a = make_attention(spec);
    const Support s = a->support();
    REQUIRE(s.grouped_heads);
    for (const std::size_t kv : {2, 1})
      for (const std::size_t n : {5, 70})
        for (const bool causal : {true, false})
          for (const Layout layout : {Layout::plain, Layout::padded, Layout::documents}) {
            const bool docs = layout == Layout::documents;
            INFO(spec << ", Hkv = " << kv << ", N = " << n << (causal ? " causal" : "")
                      << (layout == Layout::padded ? " padded"
                          : docs                   ? " documents"
                                                   : ""));
            const std::size_t B = docs ? 1 : 2, nq = causal ? n : n + 3;
            const std::uint64_t seed = 10 * n + kv + (causal ? 1000 : 0);
            Case c;
            c.q = random_tensor(B, H, nq, dk, seed);
            c.k = random_tensor(B, kv, n, dk, seed + 1);
            c.v = random_tensor(B, kv, n, dv, seed + 2);
            if (causal) c.mask.causal = Causal::top_left;
            if (layout == Layout::padded)
              c.mask.key_lengths = {std::int64_t(n), std::int64_t(n / 2)};
            if (docs) {  // two documents; non-causal: cross-attention, keys split apart
              c.mask.documents = {0, std::int64_t(nq / 3), std::int64_t(nq)};
              if (!causal) c.mask.key_documents = {0, std::int64_t(n / 2), std::int64_t(n)};
            }
            if (s.log_decay) c.g = uniform_tokens(B, H, n, -1, 0, seed + 3);
            if (s.beta) c.beta = uniform_tokens(B, H, n, 0, 1, seed + 4);
            const Dims d{B, H, nq, n, dk, dv, kv};
            // The float64 reference models an initial state without packed documents only.
            if (s.state && !docs) c.initial = random_state(*a, d, c.mask.sequences(B), seed + 5);
            const Tensor k_rep = repeat_kv(c.k, H), v_rep = repeat_kv(c.v, H);

            Tensor out, out_rep;
            Saved saved, saved_rep;
            a->forward(c.q, c.k, c.v, c.mask, c.in(), out, saved);
            a->forward(c.q, k_rep, v_rep, c.mask, c.in(), out_rep, saved_rep);
            CHECK((out == out_rep));
            CHECK((saved.final_state.memory == saved_rep.final_state.memory));
            CHECK((saved.final_state.key_sum == saved_rep.final_state.key_sum));
            const double rtol = is_linear(*a) ? kLinearRtol : kRtol;
            const double atol = is_linear(*a) ? kLinearAtol : kAtol;
            require_close(out, own_reference(*a, c.q, c.k, c.v, c.mask, c.in()), rtol, atol);

            const Tensor d_out = random_tensor(B, H, nq, dv, seed + 6);
            TokenInputs in = c.in();
            RecurrentState d_final;
            if (s.state) {
              d_final = random_state(*a, d, c.mask.sequences(B), seed + 7);
              in.d_final_state = d_final.ref();
            }
            const AllGradients g = a->backward(c.q, c.k, c.v, c.mask, in, out, d_out, saved);
            const AllGradients r =
                a->backward(c.q, k_rep, v_rep, c.mask, in, out_rep, d_out, saved_rep);
            REQUIRE(g.qkv.dk.shape(1) == kv);
            CHECK((g.qkv.dq == r.qkv.dq));
            CHECK((g.qkv.dk == group_sum(r.qkv.dk, kv)));
            CHECK((g.qkv.dv == group_sum(r.qkv.dv, kv)));
            CHECK((g.d_log_decay == r.d_log_decay));
            CHECK((g.d_beta == r.d_beta));
            CHECK((g.d_initial_state.memory == r.d_initial_state.memory));
            CHECK((g.d_initial_state.key_sum == r.d_initial_state.key_sum));
          }
  }
}

TEST_CASE("grouped heads with a per-channel decay equal the call with k and v repeated",
          "[linear][grouped]") {
  // gla's chunked form and kda's recurrence under channel_log_decay [B, H, N, Dk], one per
  // query head: outputs, dq and dg bitwise, dk and dv the group sums, and the float64 definition.
  const std::size_t H = 4, kv = 2, dk = 5, dv = 3;
  for (const char* spec : {"gla", "kda"})
    for (const int layout : {0, 1, 2}) {  // causal padded, non-causal cross, causal documents
      INFO(spec << " layout " << layout);
      const bool causal = layout != 1, docs = layout == 2;
      const std::size_t B = docs ? 1 : 2, n = 70, nq = causal ? n : 11;
      const auto a = make_attention(spec);
      Case c;
      c.q = random_tensor(B, H, nq, dk, 700 + layout);
      c.k = random_tensor(B, kv, n, dk, 701);
      c.v = random_tensor(B, kv, n, dv, 702);
      if (a->support().beta) c.beta = uniform_tokens(B, H, n, 0, 1, 703);
      if (causal) c.mask.causal = Causal::top_left;
      if (layout == 0) c.mask.key_lengths = {std::int64_t(n), std::int64_t(n - 9)};
      if (docs) c.mask.documents = {0, 23, std::int64_t(n)};
      Tensor g = random_tensor(B, H, n, dk, 704);
      for (float& x : g) x = -std::abs(x);
      TokenInputs in = c.in();
      in.channel_log_decay = TensorRef(g);
      const Tensor k_rep = repeat_kv(c.k, H), v_rep = repeat_kv(c.v, H);
      Tensor out, out_rep;
      Saved saved, saved_rep;
      a->forward(c.q, c.k, c.v, c.mask, in, out, saved);
      a->forward(c.q, k_rep, v_rep, c.mask, in, out_rep, saved_rep);
      CHECK((out == out_rep));
      require_close(out, own_reference(*a, c.q, c.k, c.v, c.mask, in), kRtol, kAtol);
      const Tensor d_out = random_tensor(B, H, nq, dv, 705);
      const AllGradients gr = a->backward(c.q, c.k, c.v, c.mask, in, out, d_out, saved);
      const AllGradients r = a->backward(c.q, k_rep, v_rep, c.mask, in, out_rep, d_out, saved_rep);
      CHECK((gr.qkv.dq == r.qkv.dq));
      CHECK((gr.qkv.dk == group_sum(r.qkv.dk, kv)));
      CHECK((gr.qkv.dv == group_sum(r.qkv.dv, kv)));
      CHECK((gr.d_channel_log_decay == r.d_channel_log_decay));
      CHECK((gr.d_beta == r.d_beta));
    }
}

TEST_CASE("grouped heads' key and value gradients against central differences",
          "[linear][grouped]") {
  // L = sum(out ∘ d_out): dk and dv [B, Hkv, N, D], each a sum over the query heads that read
  // the KV head, against differences of the fp64 definition in k and v (dq, dg and dbeta are
  // those of the repeated call, bitwise, above, whose differences the other tests take). Causal
  // across a chunk edge with the item padded, and non-causal; MQA (Hkv = 1) and Hkv = 2 of H = 4.
  for (const char* spec : {"delta", "retnet", "gla", "gated-delta", "linear", "linear:rule=delta",
                           "linear:feature=taylor"})
    for (const std::size_t kv : {2, 1})
      for (const bool causal : {true, false}) {
        const auto a = make_attention(spec);
        INFO(spec << ", Hkv = " << kv << (causal ? " causal" : " non-causal"));
        const Support s = a->support();
        const std::size_t B = 1, H = 4, n = causal ? 67 : 9, dk = 3, dv = 2;
        const Tensor q = random_tensor(B, H, n, dk, 600 + kv), k = random_tensor(B, kv, n, dk, 601),
                     v = random_tensor(B, kv, n, dv, 602), d_out = random_tensor(B, H, n, dv, 603);
        const TokenTensor g = uniform_tokens(B, H, n, -1, 0, 604),
                          beta = uniform_tokens(B, H, n, 0, 1, 605);
        Mask mask;
        if (causal) mask.causal = Causal::top_left;
        mask.key_lengths = {std::int64_t(n - 4)};
        const TokenInputs in =
            TokenInputs::of(s.log_decay ? &g : nullptr, s.beta ? &beta : nullptr);
        Tensor out;
        Saved saved;
        a->forward(q, k, v, mask, in, out, saved);
        const AllGradients grads = a->backward(q, k, v, mask, in, out, d_out, saved);

        const auto f = [&](const Arrays64& kv64) -> xt::xarray<double> {
          const xt::xtensor<double, 4> q64 = xt::cast<double>(q);
          if (const auto* linear = dynamic_cast<const LinearAttention*>(a.get()))
            return test::linear_reference(linear->config(), q64, xt::xtensor<double, 4>(kv64[0]),
                                          xt::xtensor<double, 4>(kv64[1]), mask);
          Arrays64 x = {q64, kv64[0], kv64[1]};
          if (s.log_decay) x.push_back(xt::cast<double>(g));
          if (s.beta) x.push_back(xt::cast<double>(beta));
          const auto& scan = dynamic_cast<const ScanAttention&>(*a);
          return test::recurrence_of(scan, mask, dk, H)(x, s.log_decay, s.beta);
        };
        // One thread: at these sizes the reference's parallel region per call costs more than
        // its work (20x the time on a loaded machine).
        const int threads = omp_get_max_threads();
        omp_set_num_threads(1);
        const Arrays64 fd = test::central_differences(f, {xt::cast<double>(k), xt::cast<double>(v)},
                                                      xt::cast<double>(d_out));
        omp_set_num_threads(threads);
        // fp32 gradients against fp64 differences (truncation ~1e-10): the bounds of
        // tests/test_linear_state.cpp, dk and dv now sums over up to 4 query heads.
        const bool linear = is_linear(*a);
        const double rtol = linear ? kLinearRtol : kRtol, atol = linear ? kLinearAtol : kAtol;
        require_close_grad(xt::cast<double>(grads.qkv.dk), fd[0], rtol, atol, "dk");
        require_close_grad(xt::cast<double>(grads.qkv.dv), fd[1], rtol, atol, "dv");
      }
}

TEST_CASE("grouped heads' gradients are bitwise the same with any number of threads",
          "[linear][grouped]") {
  // dk and dv are sums over each group's query heads, computed per query head by whichever
  // thread takes it and then added in head order: the thread count must not show.
  const std::size_t B = 1, H = 4, n = 70, dk = 8, dv = 6;
  const int threads_before = omp_get_max_threads();
  for (const std::string& spec : specs()) {
    const auto a = make_attention(spec);
    const Support s = a->support();
    const Tensor q = random_tensor(B, H, n, dk, 80), k = random_tensor(B, 1, n, dk, 81),
                 v = random_tensor(B, 1, n, dv, 82), d_out = random_tensor(B, H, n, dv, 83);
    const TokenTensor g = uniform_tokens(B, H, n, -1, 0, 84),
                      beta = uniform_tokens(B, H, n, 0, 1, 85);
    const TokenInputs in = TokenInputs::of(s.log_decay ? &g : nullptr, s.beta ? &beta : nullptr);
    Mask mask;
    mask.causal = Causal::top_left;
    std::vector<AllGradients> runs;
    for (const int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      Tensor out;
      Saved saved;
      a->forward(q, k, v, mask, in, out, saved);
      runs.push_back(a->backward(q, k, v, mask, in, out, d_out, saved));
    }
    omp_set_num_threads(threads_before);
    for (std::size_t r = 1; r < runs.size(); ++r) {
      INFO(spec << ", run " << r);
      CHECK((runs[r].qkv.dk == runs[0].qkv.dk));
      CHECK((runs[r].qkv.dv == runs[0].qkv.dv));
      CHECK((runs[r].qkv.dq == runs[0].qkv.dq));
    }
  }
}

TEST_CASE("grouped heads in the linear family's decoders equal the causal forward",
          "[linear][grouped][decoding]") {
  // Prefill of N0 tokens, then a step per token, with the state per query head and k, v read
  // from the KV head: the rows of the causal forward of all N tokens (chunked, the same sums in
  // another order: the tolerance of tests/test_decoding.cpp).
  const std::size_t B = 2, H = 4, n = 70, dk = 8, dv = 6;
  for (const std::string& spec : specs())
    for (const std::size_t kv : {2, 1}) {
      const auto a = make_attention(spec);
      const Support s = a->support();
      const Tensor q = random_tensor(B, H, n, dk, 70), k = random_tensor(B, kv, n, dk, 71),
                   v = random_tensor(B, kv, n, dv, 72);
      const TokenTensor g = uniform_tokens(B, H, n, -1, 0, 73),
                        beta = uniform_tokens(B, H, n, 0, 1, 74);
      Mask mask;
      mask.causal = Causal::top_left;
      const auto tokens = [&](const TokenTensor& gg, const TokenTensor& bb) {
        return TokenInputs::of(s.log_decay ? &gg : nullptr, s.beta ? &bb : nullptr);
      };
      const Tensor want = a->forward(q, k, v, mask, tokens(g, beta));
      for (const std::size_t cut : {0, 17, 64}) {
        INFO(spec << ", Hkv = " << kv << ", prefill of " << cut);
        DecodeConfig c{B, H, dk, dv};
        c.kv_heads = kv;
        const auto decoder = a->start_decoding(c);
        Tensor got = Tensor::from_shape({B, H, n, dv});
        const auto call = [&](std::size_t t0, std::size_t t1, bool step) {
          const auto rows4 = [&](const Tensor& x) {
            return Tensor(xt::view(x, xt::all(), xt::all(), xt::range(t0, t1), xt::all()));
          };
          const auto rows3 = [&](const TokenTensor& x) {
            return TokenTensor(xt::view(x, xt::all(), xt::all(), xt::range(t0, t1)));
          };
          const TokenTensor gr = rows3(g), br = rows3(beta);
          const Tensor qr = rows4(q), kr = rows4(k), vr = rows4(v);
          xt::view(got, xt::all(), xt::all(), xt::range(t0, t1), xt::all()) =
              step ? decoder->step(qr, kr, vr, tokens(gr, br))
                   : decoder->prefill(qr, kr, vr, tokens(gr, br));
        };
        if (cut > 0) call(0, cut, false);
        for (std::size_t t = cut; t < n; ++t) call(t, t + 1, true);
        require_close(got, xt::cast<double>(want), 1e-4, 2e-5);
      }
    }
}

TEST_CASE("grouped heads: a head count that does not divide names the heads", "[linear][grouped]") {
  for (const std::string& spec : specs()) {
    INFO(spec);
    const auto a = make_attention(spec);
    const Tensor q = random_tensor(1, 4, 5, 8, 1), k = random_tensor(1, 3, 5, 8, 2),
                 v = random_tensor(1, 3, 5, 8, 3);
    require_error([&] { a->forward(q, k, v); }, {"H = 4 query heads", "Hkv = 3"});
    DecodeConfig c{1, 4, 8, 8};
    c.kv_heads = 3;
    require_error([&] { a->start_decoding(c); }, {"kv_heads = 3", "heads = 4"});
  }
}
