// Per-channel gates on the scan engine (TokenInputs::channel_log_decay [B, H, Nk, Dk]): gla with
// them is GLA as published, gated-delta and kda Kimi Delta Attention. Each against the float64
// recurrence written out from the equations (tests/linear_reference.hpp) over chunk edges,
// padding, non-causal cross-attention, an initial state and packed documents, with strong
// decay down to -1e4 per step; the exact reductions (equal channels == the scalar gate; KDA with
// zero decay == delta); the backward against finite differences of that recurrence and PyTorch
// autograd; and the validation of the new input.
#include <cmath>
#include <random>
#include <string>

#include <xtensor/xview.hpp>

#include "grad_helpers.hpp"
#include "helpers.hpp"
#include "linear_reference.hpp"
#include "variants/linear_scan.hpp"

using namespace attnlab;
using attnlab::test::Arrays64;
using attnlab::test::make_scan;
using attnlab::test::random_tensor;
using attnlab::test::Recurrence;
using attnlab::test::recurrence_inputs;
using attnlab::test::recurrence_of;
using attnlab::test::require_close;
using attnlab::test::require_close_grad;
using attnlab::test::require_error;
using attnlab::test::uniform_tokens;

namespace {

// fp32 recurrence against the fp64 one: the same sums of up to ~130 O(1) products as the
// scalar-gated engine's tests (measured worst a few 1e-6).
constexpr double kRtol = 1e-4, kAtol = 2e-5;

// A per-channel log-decay in [lo, hi), with every 9th (token, channel) at -1e4 when `strong`.
Tensor channel_gates(std::size_t b, std::size_t h, std::size_t n, std::size_t dk, double lo,
                     double hi, bool strong, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  Tensor g = Tensor::from_shape({b, h, n, dk});
  std::size_t i = 0;
  for (float& x : g) x = strong && i++ % 9 == 4 ? -1e4f : static_cast<float>(dist(rng));
  return g;
}

TokenInputs channel_inputs(const Tensor& g, const TokenTensor* beta) {
  TokenInputs in;
  in.channel_log_decay = TensorRef(g);
  if (beta) in.beta = *beta;
  return in;
}

}  // namespace

TEST_CASE("per-channel gates equal their float64 recurrence", "[linear-family]") {
  for (const char* spec : {"gla", "gated-delta", "kda", "kda:beta=0.5"}) {
    const auto a = make_scan(spec);
    for (const std::size_t n : {1, 5, 64, 65, 130}) {
      for (const int kind : {0, 1, 2, 3}) {  // causal, causal padded, non-causal, causal + S_0
        const bool causal = kind != 2, padded = kind == 1, with_state = kind == 3;
        const bool with_beta = std::string(spec) == "kda" || std::string(spec) == "gated-delta";
        INFO(spec << " N=" << n << " case " << kind);
        const std::size_t B = 2, H = 2, dk = 8, dv = 6, nq = causal ? n : 7;
        const Tensor q = random_tensor(B, H, nq, dk, n), k = random_tensor(B, H, n, dk, n + 1),
                     v = random_tensor(B, H, n, dv, n + 2);
        const Tensor g = channel_gates(B, H, n, dk, -3, 0, true, n + 3);
        const TokenTensor beta = uniform_tokens(B, H, n, 0, 1, n + 4);
        const Tensor s0 = random_tensor(B, H, dk, dv, n + 5);
        Mask mask;
        if (causal) mask.causal = Causal::top_left;
        if (padded) mask.key_lengths = {std::int64_t(n), std::int64_t(n / 2)};
        TokenInputs in = channel_inputs(g, with_beta ? &beta : nullptr);
        if (with_state) in.initial_state = StateRef{TensorRef(s0), std::nullopt};
        const Tensor out = a->forward(q, k, v, mask, in);
        REQUIRE(xt::all(xt::isfinite(out)));
        const Recurrence ref = recurrence_of(*a, mask, dk, H);
        require_close(out,
                      Tensor64(ref(recurrence_inputs(q, k, v, in), true, with_beta, with_state)),
                      kRtol, kAtol);
      }
    }
  }
}

TEST_CASE("per-channel gates: packed documents run each document alone", "[linear-family]") {
  for (const char* spec : {"gla", "kda"}) {  // the sum and the delta rule
    INFO(spec);
    const auto a = make_scan(spec);
    const std::size_t n = 90, dk = 4, dv = 5;
    const Tensor q = random_tensor(1, 2, n, dk, 1), k = random_tensor(1, 2, n, dk, 2),
                 v = random_tensor(1, 2, n, dv, 3), g = channel_gates(1, 2, n, dk, -2, 0, false, 4);
    Mask packed;
    packed.causal = Causal::top_left;
    packed.documents = {0, 20, 90};
    const Tensor out = a->forward(q, k, v, packed, channel_inputs(g, nullptr));
    for (const auto& [lo, hi] : {std::pair<std::size_t, std::size_t>{0, 20}, {20, 90}}) {
      const auto part = [&](const Tensor& t) -> Tensor {
        return xt::view(t, xt::all(), xt::all(), xt::range(lo, hi), xt::all());
      };
      Mask causal;
      causal.causal = Causal::top_left;
      const Tensor gd = part(g);
      const Tensor alone =
          a->forward(part(q), part(k), part(v), causal, channel_inputs(gd, nullptr));
      CHECK((part(out) == alone));  // bitwise: the same computation from the same zero state
    }
  }
}

TEST_CASE("per-channel gates under weak, strong and overwhelming decay, final-state gradients",
          "[linear-family]") {
  // The chunked form (sub-chunk factors, pair weights in sub-chunks) under the sum rule (gla)
  // and the delta rule (kda), against the float64 recurrence: forward over two chunks and a
  // ragged end, backward (an initial state and the final state's gradient in the loss) against
  // central differences.
  enum class Decay { weak, mixed, overwhelming };
  for (const char* spec : {"gla", "kda"}) {
    const auto a = make_scan(spec);
    const bool with_beta = a->rule().delta;
    for (const Decay decay : {Decay::weak, Decay::mixed, Decay::overwhelming}) {
      INFO(spec << " decay " << int(decay));
      const auto gates = [&](std::size_t n, std::size_t dk, std::uint64_t seed) {
        if (decay == Decay::weak) return channel_gates(1, 2, n, dk, -1e-3, 0, false, seed);
        if (decay == Decay::mixed) return channel_gates(1, 2, n, dk, -20, 0, true, seed);
        Tensor all = Tensor::from_shape({std::size_t(1), std::size_t(2), n, dk});
        all.fill(-1e4f);  // every step forgets all but its own write: e^-1e4 is 0
        return all;
      };
      Mask causal;
      causal.causal = Causal::top_left;
      {  // forward, dk = 8: products over full sub-chunks
        const std::size_t n = 141, dk = 8, dv = 6;
        const Tensor q = random_tensor(1, 2, n, dk, 51), k = random_tensor(1, 2, n, dk, 52),
                     v = random_tensor(1, 2, n, dv, 53), s0 = random_tensor(1, 2, dk, dv, 54);
        const Tensor g = gates(n, dk, 55);
        const TokenTensor beta = uniform_tokens(1, 2, n, 0, 1, 56);
        TokenInputs in = channel_inputs(g, with_beta ? &beta : nullptr);
        in.initial_state = StateRef{TensorRef(s0), std::nullopt};
        Tensor out;
        Saved saved;
        a->forward(q, k, v, causal, in, out, saved);
        REQUIRE(xt::all(xt::isfinite(out)));
        const Recurrence ref = recurrence_of(*a, causal, dk, 2);
        xt::xarray<double> final64;
        require_close(
            out, Tensor64(ref(recurrence_inputs(q, k, v, in), true, with_beta, true, &final64)),
            kRtol, kAtol);
        require_close(saved.final_state.memory, Tensor64(final64), kRtol, kAtol);
      }
      // backward: dk = 3 and N = 70, across a chunk edge and four sub-chunk edges
      const std::size_t n = 70, dk = 3, dv = 2;
      const Tensor q = random_tensor(1, 2, n, dk, 61), k = random_tensor(1, 2, n, dk, 62),
                   v = random_tensor(1, 2, n, dv, 63), s0 = random_tensor(1, 2, dk, dv, 64),
                   d_out = random_tensor(1, 2, n, dv, 65),
                   d_final = random_tensor(1, 2, dk, dv, 66);
      const Tensor g = gates(n, dk, 67);
      const TokenTensor beta = uniform_tokens(1, 2, n, 0.05, 1, 68);
      TokenInputs in = channel_inputs(g, with_beta ? &beta : nullptr);
      in.initial_state = StateRef{TensorRef(s0), std::nullopt};
      Tensor out;
      Saved saved;
      a->forward(q, k, v, causal, in, out, saved);
      in.d_final_state = StateRef{TensorRef(d_final), std::nullopt};
      AllGradients grads;
      a->backward(q, k, v, causal, in, out, d_out, saved, grads);
      std::vector<xt::xarray<double>> ours = {
          xt::cast<double>(grads.qkv.dq), xt::cast<double>(grads.qkv.dk),
          xt::cast<double>(grads.qkv.dv), xt::cast<double>(grads.d_channel_log_decay)};
      std::vector<std::string> names = {"q", "k", "v", "g"};
      if (with_beta) ours.push_back(xt::cast<double>(grads.d_beta)), names.push_back("beta");
      ours.push_back(xt::cast<double>(grads.d_initial_state.memory)), names.push_back("S0");
      for (const auto& x : ours) REQUIRE(xt::all(xt::isfinite(x)));
      // The loss out·d_out + S_N·d_final: both flattened into one array.
      const Recurrence ref = recurrence_of(*a, causal, dk, 2);
      const auto joined = [](const auto& a, const auto& b) {
        xt::xarray<double> x = xt::zeros<double>({a.size() + b.size()});
        std::copy(a.begin(), a.end(), x.begin());
        std::copy(b.begin(), b.end(), x.begin() + std::ptrdiff_t(a.size()));
        return x;
      };
      const auto both = [&](const Arrays64& x) -> xt::xarray<double> {
        xt::xarray<double> final64;
        const xt::xarray<double> o = ref(x, true, with_beta, true, &final64);
        return joined(o, final64);
      };
      const xt::xarray<double> weights = joined(d_out, d_final);
      const Arrays64 fd = test::central_differences(both, recurrence_inputs(q, k, v, in), weights);
      // fp32 gradients against fp64 differences: the engine's bound for its scalar gates.
      for (std::size_t i = 0; i < ours.size(); ++i)
        require_close_grad(ours[i], fd[i], 1e-4, 2e-5, std::string(spec) + " d" + names[i]);
    }
  }
}

TEST_CASE("per-channel gates' exact reductions", "[linear-family]") {
  const std::size_t B = 1, H = 2, n = 100, dk = 8, dv = 4;
  const Tensor q = random_tensor(B, H, n, dk, 31), k = random_tensor(B, H, n, dk, 32),
               v = random_tensor(B, H, n, dv, 33);
  const TokenTensor scalar = uniform_tokens(B, H, n, -2, 0, 34);
  const TokenTensor beta = uniform_tokens(B, H, n, 0, 1, 35);
  Tensor equal = Tensor::from_shape({B, H, n, dk});  // every channel the scalar gate
  for (std::size_t h = 0; h < H; ++h)
    for (std::size_t t = 0; t < n; ++t)
      for (std::size_t c = 0; c < dk; ++c) equal(0, h, t, c) = scalar(0, h, t);
  Mask causal;
  causal.causal = Causal::top_left;
  for (const char* spec : {"gla", "gated-delta", "kda"}) {
    INFO(spec);
    const auto a = make_attention(spec);
    const bool delta = std::string(spec) != "gla";
    TokenInputs per_token = TokenInputs::of(&scalar, delta ? &beta : nullptr);
    // The recurrence against the chunked form: equal up to float rounding, not bitwise.
    require_close(a->forward(q, k, v, causal, channel_inputs(equal, delta ? &beta : nullptr)),
                  xt::cast<double>(a->forward(q, k, v, causal, per_token)), kRtol, kAtol);
  }
  // KDA with zero decay is delta (the same beta per token).
  const Tensor zero = xt::zeros<float>({B, H, n, dk});
  TokenInputs only_beta;
  only_beta.beta = beta;
  require_close(make_attention("kda")->forward(q, k, v, causal, channel_inputs(zero, &beta)),
                xt::cast<double>(make_attention("delta")->forward(q, k, v, causal, only_beta)),
                kRtol, kAtol);
}

TEST_CASE("per-channel gates' backward against finite differences and torch", "[linear-family]") {
  test::TorchGrads torch;
  std::vector<test::TorchExpected> expected;
  for (const char* spec : {"gla", "kda"}) {
    for (const int kind : {0, 1, 2}) {  // causal across a chunk edge, padded; non-causal; S_0
      const auto a = make_scan(spec);
      const bool causal = kind != 1, with_state = kind == 2;
      const bool with_beta = a->rule().delta;
      const std::size_t B = 1, H = 2, n = causal ? 70 : 9, dk = 3, dv = 2, nq = causal ? n : 4;
      INFO(spec << " case " << kind);
      const Tensor q = random_tensor(B, H, nq, dk, 41), k = random_tensor(B, H, n, dk, 42),
                   v = random_tensor(B, H, n, dv, 43), d_out = random_tensor(B, H, nq, dv, 44);
      // Strong decay too (-1e4 underflows to an exact 0: its gradient is 0, not NaN).
      const Tensor g = channel_gates(B, H, n, dk, -1.5, 0, kind == 0, 45);
      const TokenTensor beta = uniform_tokens(B, H, n, 0.05, 1, 46);
      const Tensor s0 = random_tensor(B, H, dk, dv, 47);
      Mask mask;
      if (causal) mask.causal = Causal::top_left;
      if (kind == 0) mask.key_lengths = {std::int64_t(n - 5)};
      TokenInputs in = channel_inputs(g, with_beta ? &beta : nullptr);
      if (with_state) in.initial_state = StateRef{TensorRef(s0), std::nullopt};
      Tensor out;
      Saved saved;
      a->forward(q, k, v, mask, in, out, saved);
      AllGradients grads, recomputed;
      a->backward(q, k, v, mask, in, out, d_out, saved, grads);
      a->backward(q, k, v, mask, in, out, d_out, Saved(), recomputed);
      CHECK((grads.qkv.dk == recomputed.qkv.dk));  // saved chunk states == recomputed ones
      std::vector<xt::xarray<double>> ours = {
          xt::cast<double>(grads.qkv.dq), xt::cast<double>(grads.qkv.dk),
          xt::cast<double>(grads.qkv.dv), xt::cast<double>(grads.d_channel_log_decay)};
      std::vector<std::string> names = {"q", "k", "v", "g"};
      if (with_beta) ours.push_back(xt::cast<double>(grads.d_beta)), names.push_back("beta");
      if (with_state)
        ours.push_back(xt::cast<double>(grads.d_initial_state.memory)), names.push_back("S0");
      REQUIRE(xt::all(xt::isfinite(grads.d_channel_log_decay)));
      const Recurrence ref = recurrence_of(*a, mask, dk, H);
      const Arrays64 fd = test::central_differences(
          [&](const Arrays64& x) { return ref(x, true, with_beta, with_state); },
          recurrence_inputs(q, k, v, in), xt::cast<double>(d_out));
      // fp32 gradients against fp64 differences: the engine's bound for its scalar gates.
      for (std::size_t i = 0; i < ours.size(); ++i)
        require_close_grad(ours[i], fd[i], 1e-4, 2e-5, std::string(spec) + " d" + names[i]);
      if (with_state) continue;  // torch_grads.py's scan starts from zeros
      const nlohmann::json j = test::scan_torch_case(*a, ref, causal, kind == 0 ? n - 5 : n,
                                                     mask.softmax_scale(dk), true, with_beta);
      std::vector<std::pair<std::string, xt::xarray<float>>> files = {
          {"q", q}, {"k", k}, {"v", v}, {"d_out", d_out}, {"g", g}};
      if (with_beta) files.push_back({"beta", beta});
      expected.push_back({torch.add(j, files), ours, names, std::string(spec)});
    }
  }
  test::require_close_to_torch(torch, expected, 1e-4, 2e-5);
}

TEST_CASE("the per-channel log-decay is validated and refused where not taken", "[linear-family]") {
  const Tensor x = random_tensor(1, 2, 6, 4, 1);
  const Tensor g = channel_gates(1, 2, 6, 4, -1, 0, false, 2);
  const TokenTensor scalar = uniform_tokens(1, 2, 6, -1, 0, 3);
  const auto kda = make_attention("kda");
  CHECK(kda->support().channel_decay);
  Tensor wrong = xt::zeros<float>({std::size_t(1), std::size_t(2), std::size_t(6), std::size_t(3)});
  require_error(
      [&] { kda->forward(x, x, x, {}, channel_inputs(wrong, nullptr)); },
      {"kda", "channel_log_decay has shape [1, 2, 6, 3]", "[B, H, Nk, Dk] = [1, 2, 6, 4]"});
  Tensor positive = g;
  positive(0, 1, 3, 2) = 0.5f;
  require_error([&] { kda->forward(x, x, x, {}, channel_inputs(positive, nullptr)); },
                {"channel_log_decay is 0.5", "[0, 1, 3, 2]", "finite and <= 0"});
  Tensor nan = g;
  nan(0, 0, 5, 0) = std::nanf("");
  require_error([&] { kda->forward(x, x, x, {}, channel_inputs(nan, nullptr)); },
                {"channel_log_decay is", "nan", "[0, 0, 5, 0]"});
  Mask padded;  // padded tokens are never read: any value there
  padded.key_lengths = {5};
  CHECK_NOTHROW(kda->forward(x, x, x, padded, channel_inputs(nan, nullptr)));
  TokenInputs both = channel_inputs(g, nullptr);
  both.log_decay = scalar;
  require_error([&] { make_attention("gla")->forward(x, x, x, {}, both); },
                {"log_decay and channel_log_decay are both given"});
  for (const char* spec : {"full", "linear", "delta", "retnet", "moba:block=2"}) {
    INFO(spec);
    CHECK_FALSE(make_attention(spec)->support().channel_decay);
    require_error<Unsupported>(
        [&] { make_attention(spec)->forward(x, x, x, {}, channel_inputs(g, nullptr)); },
        {"per-channel log-decay"});
  }
  // Decoding token by token does not take it (the batch forward and backward do).
  const auto decoder = make_attention("kda")->start_decoding(DecodeConfig(1, 2, 4, 4));
  const Tensor row = random_tensor(1, 2, 1, 4, 4);
  const Tensor g1 = channel_gates(1, 2, 1, 4, -1, 0, false, 5);
  require_error<Unsupported>([&] { decoder->step(row, row, row, channel_inputs(g1, nullptr)); },
                             {"kda", "per-channel log-decay", "token-by-token decoding"});
  require_error([] { make_attention("kda:beta=2"); }, {"beta=2", "[0, 1]"});
  CHECK(make_attention("kda")->spec() == "kda:beta=1");
}
