// bfloat16 inputs (issue 47's converted path, bf16-via-f32): the rounding against a scalar
// reference written from the definition (ties to even, NaN, infinities, subnormals, overflow);
// full under every mask and modifier, forward and backward, bf16 or float32 results, against
// float64 attention of the bf16-rounded inputs within the bound that rounding implies; every
// engine layout and every registered variant bit for bit its float32 computation of the widened
// inputs; determinism across threads; the kernel path's selection; bad input.
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>

#include <xtensor/xadapt.hpp>
#include <xtensor/xmath.hpp>

#include "attnlab/bf16.hpp"
#include "attnlab/kernels.hpp"
#include "grad_helpers.hpp"
#include "helpers.hpp"

using namespace attnlab;
using attnlab::test::random_tensor;
using attnlab::test::require_close_grad;
using attnlab::test::require_error;

namespace {

// bf16's unit roundoff: 8 significant bits, so rounding to nearest moves x by at most 2^-8 |x|.
constexpr double kU = 1.0 / 256.0;
// The float32 engine's error on inputs it holds exactly, as tests/test_modifiers.cpp states it
// (products over a few hundred terms rounded at ~1e-7; exp2 and tanh polynomials): forward
// rtol 1e-4, atol 2e-5; backward rtol 1e-4, atol 3e-5, the sums over rows and keys (d_sinks,
// d_alibi_slopes, d_log_decay, a broadcast d_bias) scaled by their largest value.
constexpr double kRtol32 = 1e-4, kAtol32 = 2e-5, kGradRtol32 = 1e-4, kGradAtol32 = 3e-5;

// --- The rounding ----------------------------------------------------------------------------

// The bf16 nearest to x, ties to even, from the definition and in float64 (not bit tricks):
// the two bf16 neighbours of x are its float32 bits with the low 16 cleared and that plus one
// unit in the last place; the nearer wins, a tie goes to the even mantissa. NaN: a quiet NaN of
// the same sign; overflow past the largest bf16 goes to infinity as IEEE rounding does.
std::uint16_t reference_round(float x) {
  const auto bits = std::bit_cast<std::uint32_t>(x);
  if (std::isnan(x)) return static_cast<std::uint16_t>((bits >> 16) | 0x40);
  if (std::isinf(x)) return static_cast<std::uint16_t>(bits >> 16);
  const auto down = static_cast<std::uint16_t>(bits >> 16);  // toward zero
  const auto up = static_cast<std::uint16_t>(down + 1);      // away from zero (may be inf)
  const auto value = [](std::uint16_t b) {
    return static_cast<double>(std::bit_cast<float>(std::uint32_t{b} << 16));
  };
  const double ax = std::abs(static_cast<double>(x));
  const double d_down = ax - std::abs(value(down));
  // Past the largest finite bf16 the upper neighbour is infinity: IEEE rounds there when x is
  // at least halfway to 2^128 (the next power of the format).
  const double d_up =
      (up & 0x7FFF) == 0x7F80 ? std::ldexp(1.0, 128) - ax : std::abs(value(up)) - ax;
  if (d_down < d_up) return down;
  if (d_up < d_down) return up;
  return (down & 1) ? up : down;
}

std::vector<float> rounding_cases() {
  std::vector<float> xs = {0.0f,
                           -0.0f,
                           1.0f,
                           -1.5f,
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN(),
                           -std::numeric_limits<float>::quiet_NaN(),
                           std::bit_cast<float>(0x7F800001u),  // signalling NaN: stays NaN
                           std::bit_cast<float>(0xFF810000u),  // a NaN whose top bits look like inf
                           std::numeric_limits<float>::max(),  // overflows to inf
                           std::numeric_limits<float>::denorm_min(),
                           -std::numeric_limits<float>::denorm_min(),
                           std::numeric_limits<float>::min(),
                           std::bit_cast<float>(0x7F7F7FFFu),   // just below the overflow tie
                           std::bit_cast<float>(0x7F7F8000u)};  // the overflow tie: to inf
  // Ties and near-ties, even and odd kept parts, normal and subnormal.
  for (std::uint32_t top : {0x3F80u, 0x3F81u, 0x0001u, 0x0002u, 0x007Fu, 0x0080u, 0xBF81u})
    for (std::uint32_t low : {0x0000u, 0x0001u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu})
      xs.push_back(std::bit_cast<float>(top << 16 | low));
  std::mt19937 rng(7);
  for (int i = 0; i < 4000; ++i)
    xs.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(rng())));
  return xs;
}

TEST_CASE("bf16 rounding: nearest, ties to even, NaN, infinities, subnormals, on every path",
          "[bf16]") {
  const std::vector<float> xs = rounding_cases();
  for (const kernels::Isa isa : kernels::supported_isas()) {
    kernels::use_isa(isa);
    INFO("kernel path " << kernels::isa_name(isa));
    std::vector<bf16> bulk(xs.size());
    round_to_bf16(xs.data(), bulk.data(), xs.size());  // 8-wide with a tail where vectorised
    for (std::size_t i = 0; i < xs.size(); ++i) {
      INFO("x = " << xs[i] << " (bits 0x" << std::hex << std::bit_cast<std::uint32_t>(xs[i])
                  << ")");
      REQUIRE(bulk[i].bits == reference_round(xs[i]));
      REQUIRE(to_bf16(xs[i]).bits == bulk[i].bits);
    }
    // Widening is exact: every one of the 65536 bf16 values comes back bit for bit.
    std::vector<bf16> all(65536);
    for (std::uint32_t b = 0; b < 65536; ++b) all[b].bits = static_cast<std::uint16_t>(b);
    std::vector<float> wide(all.size());
    widen_bf16(all.data(), wide.data(), all.size());
    for (std::uint32_t b = 0; b < 65536; ++b) {
      REQUIRE(std::bit_cast<std::uint32_t>(wide[b]) == b << 16);
      REQUIRE(std::bit_cast<std::uint32_t>(to_float(all[b])) == b << 16);
    }
  }
  kernels::use_isa(kernels::supported_isas().back());
}

// --- Attention against float64 ---------------------------------------------------------------

// One mask and modifier case (the modifiers' tensors are float32, as in float32 calls).
struct Case {
  std::string name;
  Mask mask;
  bool bias = false, sinks = false, alibi = false, fox = false;
};

std::vector<Case> cases(std::size_t nq, std::size_t nk) {
  std::vector<Case> out;
  out.push_back({"plain", {}});
  Case c{"causal bottom-right, window (9, 0), key padding", {}};
  c.mask.causal = Causal::bottom_right;
  c.mask.window = Window{9, 0};
  c.mask.key_lengths = {static_cast<std::int64_t>(nk), static_cast<std::int64_t>(nk - 5)};
  out.push_back(c);
  c = {"prefix-LM, softcap 2, ALiBi", {}};
  c.mask.causal = Causal::top_left;
  c.mask.prefix_lengths = {static_cast<std::int64_t>(nk / 4), 0};
  c.mask.softcap = 2.0;
  c.alibi = true;
  out.push_back(c);
  c = {"bias, sinks, boolean mask", {}};
  c.bias = c.sinks = true;
  xt::xtensor<bool, 2> allowed = xt::ones<bool>({nq, nk});
  for (std::size_t i = 0; i < nq; ++i) allowed(i, (i * 7) % nk) = false;
  c.mask.allow(allowed);
  out.push_back(c);
  c = {"forgetting gate, causal, scale 0.3", {}};
  c.mask.causal = Causal::top_left;
  c.mask.scale = 0.3;
  c.fox = true;
  out.push_back(c);
  if (nq == nk) {
    c = {"documents", {}};
    const auto n = static_cast<std::int64_t>(nq);
    c.mask.documents = {0, n / 3, n / 3, n - 4, n};  // one empty, one of four tokens
    out.push_back(c);
  }
  return out;
}

// The inputs of one call: q, k, v, d_out rounded to bf16 (and those values widened, what the
// float64 reference reads), the modifiers in float32.
struct Call {
  Dims d;
  TensorBf16 q, k, v, d_out;
  Tensor q32, k32, v32, d_out32, bias;
  std::vector<float> sinks, slopes;
  TokenTensor g;
  const Case* c = nullptr;

  TokenInputs inputs() const {
    TokenInputs in;
    if (c->bias) in.bias = TensorRef(bias);
    if (c->sinks) in.sinks = std::span<const float>(sinks);
    if (c->alibi) in.alibi_slopes = std::span<const float>(slopes);
    if (c->fox) in.log_decay = TokenRef(g);
    return in;
  }
};

Call make_call(const Case& c, const Dims& d, std::uint64_t seed) {
  Call call;
  call.c = &c;
  call.d = d;
  const std::size_t batch = c.mask.has_documents() ? 1 : d.batch;
  call.d.batch = batch;
  call.q = to_bf16(random_tensor(batch, d.heads, d.nq, d.dk, seed));
  call.k = to_bf16(random_tensor(batch, d.kv(), d.nk, d.dk, seed + 1));
  call.v = to_bf16(random_tensor(batch, d.kv(), d.nk, d.dv, seed + 2));
  call.d_out = to_bf16(random_tensor(batch, d.heads, d.nq, d.dv, seed + 3));
  call.q32 = to_float32(call.q);
  call.k32 = to_float32(call.k);
  call.v32 = to_float32(call.v);
  call.d_out32 = to_float32(call.d_out);
  if (c.bias) call.bias = random_tensor(batch, d.heads, d.nq, d.nk, seed + 4, 0.7f);
  std::mt19937_64 rng(seed + 5);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (std::size_t h = 0; h < d.heads; ++h) {
    call.sinks.push_back(2.0f * unit(rng) - 0.5f);
    call.slopes.push_back(0.3f * unit(rng));
  }
  call.g = TokenTensor::from_shape({batch, d.heads, d.nk});
  for (float& x : call.g) x = -0.4f * unit(rng);
  return call;
}

// The engine's clients in their default settings, and sliding, bigbird and moba in general
// (not exact) ones: on the converted path each is its own float32 forward and backward on the
// widened inputs, bit for bit, so full's float64 bound below carries over to every layout (each
// is checked against its dense pattern in float32 by its own tests).
std::vector<std::string> engine_specs() {
  std::vector<std::string> out = test::engine_clients();
  for (const char* general :
       {"sliding:left=6,right=2", "bigbird:block=8,window=3,global=1,random=1,seed=1",
        "moba:block=8,topk=2"})
    out.push_back(general);
  return out;
}

Tensor64 widened64(const TensorBf16& t) {
  return xt::cast<double>(to_float32(t));
}

// |got - want| <= rtol |want| + atol everywhere, for a bf16 result.
void require_within(const TensorBf16& got, const Tensor64& want, double rtol, double atol,
                    const std::string& what) {
  require_close_grad(widened64(got), want, rtol, atol, what);
}

double largest_abs(const xt::xarray<double>& t) {
  return t.size() == 0 ? 0.0 : xt::amax(xt::abs(t))();
}

// What `run` throws ("" when it returns): a layout that refuses a case must refuse it in bf16
// with the same message.
template <class Run>
std::string refusal(Run run) {
  try {
    run();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

template <class A, class B>
bool bitwise_equal(const A& a, const B& b) {
  return std::equal(a.shape().begin(), a.shape().end(), b.shape().begin(), b.shape().end()) &&
         std::equal(a.begin(), a.end(), b.begin(), [](float x, float y) {
           return std::bit_cast<std::uint32_t>(x) == std::bit_cast<std::uint32_t>(y);
         });
}

// The cases run at odd N, Dk != Dv, D = 64 and 128, grouped heads and cross-attention.
std::vector<Dims> sizes() {
  return {Dims{2, 2, 37, 37, 64, 48, 2}, Dims{2, 4, 29, 41, 128, 128, 2}};
}

std::string describe(const std::string& spec, const Case& c, const Dims& d) {
  return spec + ", " + c.name + ", Dk " + std::to_string(d.dk) + ", Dv " + std::to_string(d.dv) +
         ", Nq " + std::to_string(d.nq) + ", Nk " + std::to_string(d.nk);
}

// Forward. With out in float32 (on request) the only error is the float32 engine's on inputs it
// holds exactly: |o - r| <= 1e-4 |r| + 2e-5, r = float64 attention of the bf16 inputs. A bf16
// out is that result rounded once: |bf16(o) - o| <= u |o| with u = 2^-8, so
//   |bf16(o) - r| <= u |r| + (1 + u)(1e-4 |r| + 2e-5).
TEST_CASE("bf16 forward: float64 attention of the rounded inputs, within u |r| + float32's",
          "[bf16]") {
  const auto full = make_attention("full");
  for (const Dims& d : sizes())
    for (const Case& c : cases(d.nq, d.nk)) {
      const Call call = make_call(c, d, 11);
      const Tensor64 want =
          reference_attention(call.q32, call.k32, call.v32, c.mask, call.inputs());
      const std::string what = describe("full", c, d);
      INFO(what);
      Tensor out32;
      full->forward(call.q, call.k, call.v, c.mask, call.inputs(), out32);
      test::require_close(out32, want, kRtol32, kAtol32);
      const TensorBf16 out = full->forward(call.q, call.k, call.v, c.mask, call.inputs());
      require_within(out, want, kU + (1 + kU) * kRtol32, (1 + kU) * kAtol32, what);
      CHECK((out == to_bf16(out32)));  // rounded once, from float32: not a second computation
    }
}

TEST_CASE("bf16 forward of every engine layout: its float32 forward of the widened inputs",
          "[bf16]") {
  for (const Dims& d : sizes())
    for (const Case& c : cases(d.nq, d.nk)) {
      const Call call = make_call(c, d, 12);
      for (const std::string& spec : engine_specs()) {
        INFO(describe(spec, c, d));
        const auto a = make_attention(spec);
        Tensor want, out32;
        const std::string refused =
            refusal([&] { a->forward(call.q32, call.k32, call.v32, c.mask, call.inputs(), want); });
        CHECK(refusal([&] { a->forward(call.q, call.k, call.v, c.mask, call.inputs(), out32); }) ==
              refused);
        if (!refused.empty()) continue;
        CHECK(bitwise_equal(out32, want));
        CHECK((a->forward(call.q, call.k, call.v, c.mask, call.inputs()) == to_bf16(want)));
      }
    }
}

// Backward. Gradients in float32 (out, d_out, gradients float32 on request): the float32
// engine's bound. In bf16 (out and d_out bf16, as a bf16 model hands them over) three things
// add up against the float64 backward of the bf16 q, k, v, d_out with its own exact output r:
//  - the float32 engine's error e (above);
//  - out rounded to bf16 enters delta_i = sum_c dO_ic O_ic (FlashAttention-2 reads O, not
//    recomputes it): |delta_i error| <= eps_i = sum_c |dO_ic| (u |r_ic| + e_ic). dS_ij moves by
//    at most P_ij eps_i (a softcap's derivative is <= 1), so with sum_j P_ij <= 1,
//    |dq_ic| moves by <= scale eps_i max_j |k_jc|, |dk_jc| by <= scale sum_i eps_i |q_ic| (the
//    sum over the query heads of its group; P_ij <= 1), dv not at all; d_bias by <= eps_i,
//    d_sinks by <= sum_i eps_i, d_alibi by <= sum_i eps_i max |i - j|;
//  - the final rounding, u |g|.
// So |g_bf16 - g64| <= u |g64| + (1 + u)(float32's bound + the delta term), tested per tensor
// with the delta term's largest value.
TEST_CASE("bf16 backward: float64 gradients of the rounded inputs, within the stated bound",
          "[bf16]") {
  const auto full = make_attention("full");
  for (const Dims& d : sizes())
    for (const Case& c : cases(d.nq, d.nk)) {
      const Call call = make_call(c, d, 21);
      const TokenInputs in = call.inputs();
      const Tensor64 q64 = xt::cast<double>(call.q32), k64 = xt::cast<double>(call.k32),
                     v64 = xt::cast<double>(call.v32), d_out64 = xt::cast<double>(call.d_out32);
      const Modifiers64 mods = Modifiers64::of(in);
      const Tensor64 r = reference_attention(q64, k64, v64, c.mask, mods);
      const Gradients64 want = reference_attention_backward(q64, k64, v64, c.mask, mods, d_out64);
      const double scale = c.mask.softmax_scale(d.dk);
      // eps_i per (item, head, query), and the delta term's largest value per gradient.
      double eps_max = 0.0, eps_sum = 0.0;
      for (std::size_t row = 0; row < call.d.batch * d.heads * d.nq; ++row) {
        double eps = 0.0;
        for (std::size_t c2 = 0; c2 < d.dv; ++c2) {
          const double rr = r.data()[row * d.dv + c2];
          eps += std::abs(d_out64.data()[row * d.dv + c2]) *
                 (kU * std::abs(rr) + kRtol32 * std::abs(rr) + kAtol32);
        }
        eps_max = std::max(eps_max, eps);
        eps_sum += eps;
      }
      const double dq_term = scale * eps_max * largest_abs(k64);
      const double dk_term = scale * eps_sum * largest_abs(q64);
      const double n_max = static_cast<double>(std::max(d.nq, d.nk));
      const std::string what = describe("full", c, d);
      INFO(what);
      Saved saved;
      Tensor out32;
      full->forward(call.q, call.k, call.v, c.mask, in, out32, &saved);
      AllGradients g32;
      full->backward(call.q, call.k, call.v, c.mask, in, out32, call.d_out32, saved, g32);
      const auto grad_atol = [&](const xt::xarray<double>& w) {
        return kGradAtol32 * std::max(1.0, largest_abs(w));
      };
      require_close_grad(xt::cast<double>(g32.qkv.dq), want.dq, kGradRtol32, kGradAtol32,
                         what + ": float32 dq");
      require_close_grad(xt::cast<double>(g32.qkv.dk), want.dk, kGradRtol32, kGradAtol32,
                         what + ": float32 dk");
      require_close_grad(xt::cast<double>(g32.qkv.dv), want.dv, kGradRtol32, kGradAtol32,
                         what + ": float32 dv");
      if (c.bias)
        require_close_grad(xt::cast<double>(g32.d_bias), want.d_bias, kGradRtol32,
                           grad_atol(want.d_bias), what + ": float32 d_bias");
      if (c.sinks) {
        const xt::xarray<double> w = xt::adapt(want.d_sinks, {want.d_sinks.size()});
        require_close_grad(xt::cast<double>(xt::adapt(g32.d_sinks, {g32.d_sinks.size()})), w,
                           kGradRtol32, grad_atol(w), what + ": float32 d_sinks");
      }
      if (c.fox)
        require_close_grad(xt::cast<double>(g32.d_log_decay), want.d_log_decay, kGradRtol32,
                           grad_atol(want.d_log_decay), what + ": float32 d_log_decay");

      // The bf16 result: out rounded as a bf16 forward returns it.
      TensorBf16 out;
      full->forward(call.q, call.k, call.v, c.mask, in, out, &saved);
      AllGradientsBf16 g;
      full->backward(call.q, call.k, call.v, c.mask, in, out, call.d_out, saved, g);
      const double rtol = kU + (1 + kU) * kGradRtol32;
      require_within(g.dq, want.dq, rtol, (1 + kU) * (kGradAtol32 + dq_term), what + ": dq");
      require_within(g.dk, want.dk, rtol, (1 + kU) * (kGradAtol32 + dk_term), what + ": dk");
      require_within(g.dv, want.dv, rtol, (1 + kU) * kGradAtol32, what + ": dv");
      CHECK((g.dq == to_bf16(g.rest.qkv.dq)));  // rounded once, from float32
      if (c.bias)
        require_close_grad(xt::cast<double>(g.rest.d_bias), want.d_bias, kGradRtol32,
                           grad_atol(want.d_bias) + eps_max, what + ": d_bias");
      if (c.sinks) {
        const xt::xarray<double> w = xt::adapt(want.d_sinks, {want.d_sinks.size()});
        require_close_grad(xt::cast<double>(xt::adapt(g.rest.d_sinks, {g.rest.d_sinks.size()})), w,
                           kGradRtol32, grad_atol(w) + eps_sum, what + ": d_sinks");
      }
      if (c.alibi) {
        const xt::xarray<double> w = xt::adapt(want.d_alibi_slopes, {want.d_alibi_slopes.size()});
        require_close_grad(
            xt::cast<double>(xt::adapt(g.rest.d_alibi_slopes, {g.rest.d_alibi_slopes.size()})), w,
            kGradRtol32, grad_atol(w) + eps_sum * n_max, what + ": d_alibi");
      }
    }
}

TEST_CASE("bf16 backward of every engine layout: its float32 backward of the widened inputs",
          "[bf16]") {
  for (const Dims& d : sizes())
    for (const Case& c : cases(d.nq, d.nk)) {
      const Call call = make_call(c, d, 22);
      const TokenInputs in = call.inputs();
      for (const std::string& spec : engine_specs()) {
        INFO(describe(spec, c, d));
        const auto a = make_attention(spec);
        Tensor out32;
        Saved saved;
        if (!refusal([&] {
               a->forward(call.q32, call.k32, call.v32, c.mask, in, out32, saved);
             }).empty())
          continue;  // refused: the forward test checks bf16 refuses it too
        // Float32 out and d_out: the float32 backward's gradients, bit for bit.
        const AllGradients want =
            a->backward(call.q32, call.k32, call.v32, c.mask, in, out32, call.d_out32, saved);
        AllGradients g32;
        a->backward(call.q, call.k, call.v, c.mask, in, out32, call.d_out32, saved, g32);
        CHECK(bitwise_equal(g32.qkv.dq, want.qkv.dq));
        CHECK(bitwise_equal(g32.qkv.dk, want.qkv.dk));
        CHECK(bitwise_equal(g32.qkv.dv, want.qkv.dv));
        CHECK(g32.d_sinks == want.d_sinks);
        CHECK(g32.d_alibi_slopes == want.d_alibi_slopes);
        // bf16 out and d_out: the float32 backward of their widened values, dq, dk, dv rounded.
        TensorBf16 out;
        a->forward(call.q, call.k, call.v, c.mask, in, out, &saved);
        AllGradientsBf16 g;
        a->backward(call.q, call.k, call.v, c.mask, in, out, call.d_out, saved, g);
        const AllGradients want16 = a->backward(call.q32, call.k32, call.v32, c.mask, in,
                                                to_float32(out), call.d_out32, saved);
        CHECK(bitwise_equal(g.rest.qkv.dq, want16.qkv.dq));
        CHECK((g.dq == to_bf16(want16.qkv.dq)));
        CHECK((g.dk == to_bf16(want16.qkv.dk)));
        CHECK((g.dv == to_bf16(want16.qkv.dv)));
        CHECK(bitwise_equal(g.rest.d_bias, want16.d_bias));
        CHECK(bitwise_equal(g.rest.d_log_decay, want16.d_log_decay));
      }
    }
}

// Every registered variant (the linear family and linformer too) takes bf16 on the converted
// path: its float32 forward and backward of the widened inputs, bit for bit.
TEST_CASE("bf16 on every registered variant: its float32 computation of the widened inputs",
          "[bf16]") {
  const TensorBf16 q = to_bf16(random_tensor(2, 2, 33, 16, 1)),
                   k = to_bf16(random_tensor(2, 2, 33, 16, 2)),
                   v = to_bf16(random_tensor(2, 2, 33, 16, 3)),
                   d_out = to_bf16(random_tensor(2, 2, 33, 16, 4));
  const Tensor q32 = to_float32(q), k32 = to_float32(k), v32 = to_float32(v),
               d_out32 = to_float32(d_out);
  for (const std::string& name : attention_names()) {
    INFO("variant " << name);
    const auto a = make_attention(name);
    Saved saved32, saved;
    Tensor want;
    a->forward(q32, k32, v32, {}, {}, want, saved32);
    const TensorBf16 out = a->forward(q, k, v);
    CHECK((out == to_bf16(want)));
    Tensor out32;
    a->forward(q, k, v, {}, {}, out32, &saved);
    CHECK(bitwise_equal(out32, want));
    const AllGradients g32 = a->backward(q32, k32, v32, {}, {}, want, d_out32, saved32);
    AllGradients g;
    a->backward(q, k, v, {}, {}, out32, d_out32, saved, g);
    CHECK(bitwise_equal(g.qkv.dq, g32.qkv.dq));
    CHECK(bitwise_equal(g.qkv.dk, g32.qkv.dk));
    CHECK(bitwise_equal(g.qkv.dv, g32.qkv.dv));
    REQUIRE(g.parameters.size() == g32.parameters.size());
  }
}

// Deterministic as the float32 engine: the same bits on 1, 2 and 3 threads (the conversions are
// shared among threads in chunks; the engine's reductions have a fixed order).
TEST_CASE("bf16 forward and backward: bitwise the same on any number of threads", "[bf16]") {
  const int threads_before = omp_get_max_threads();
  Case c{"causal, sinks, ALiBi", {}};
  c.mask.causal = Causal::top_left;
  c.sinks = c.alibi = true;
  const Call call = make_call(c, Dims{1, 4, 300, 300, 64, 64, 2}, 31);
  for (const std::string& spec : test::engine_clients()) {
    INFO(spec);
    const auto a = make_attention(spec);
    const auto run = [&](TensorBf16& out, AllGradientsBf16& g) {
      Saved saved;
      a->forward(call.q, call.k, call.v, c.mask, call.inputs(), out, &saved);
      a->backward(call.q, call.k, call.v, c.mask, call.inputs(), out, call.d_out, saved, g);
    };
    omp_set_num_threads(1);
    TensorBf16 out1;
    AllGradientsBf16 g1;
    run(out1, g1);
    for (int threads : {2, 3}) {
      omp_set_num_threads(threads);
      TensorBf16 out;
      AllGradientsBf16 g;
      run(out, g);
      CHECK((out == out1));
      CHECK((g.dq == g1.dq));
      CHECK((g.dk == g1.dk));
      CHECK((g.dv == g1.dv));
      CHECK(g.rest.d_sinks == g1.rest.d_sinks);
      CHECK(g.rest.d_alibi_slopes == g1.rest.d_alibi_slopes);
    }
  }
  omp_set_num_threads(threads_before);
}

// --- The kernel path and bad input -----------------------------------------------------------

TEST_CASE("bf16 paths: the converted one runs here; amx and avx512bf16 are refused, named",
          "[bf16]") {
  CHECK(std::string(kernels::bf16_path_name(kernels::active_bf16_path())) == "bf16-via-f32");
  CHECK(kernels::bf16_path_supported(kernels::Bf16Path::via_f32));
  for (const auto path : {kernels::Bf16Path::amx, kernels::Bf16Path::avx512bf16}) {
    // No kernels for these in this build (issue 47): refused whatever the CPU, saying which of
    // the two lacks it.
    CHECK_FALSE(kernels::bf16_path_supported(path));
    const std::string lacks =
        kernels::cpu_has_bf16_path(path) ? "this build does not have it" : "this CPU cannot run it";
    require_error([&] { kernels::use_bf16_path(path); },
                  {kernels::bf16_path_name(path), lacks, "bf16-via-f32"});
  }
  kernels::Bf16Path parsed{};
  CHECK(kernels::parse_bf16_path("amx", parsed));
  CHECK(parsed == kernels::Bf16Path::amx);
  CHECK_FALSE(kernels::parse_bf16_path("avx2", parsed));
  require_error([] { kernels::parse_isa("bf17"); }, {"'bf17'", "bf16-via-f32, avx512bf16, amx"});
}

TEST_CASE("bf16 bad input: NaN and Inf refused as in float32, shapes named", "[bf16]") {
  const auto full = make_attention("full");
  TensorBf16 q = to_bf16(random_tensor(1, 2, 5, 8, 1)), k = to_bf16(random_tensor(1, 2, 6, 8, 2)),
             v = to_bf16(random_tensor(1, 2, 6, 8, 3));
  q(0, 1, 3, 2) = to_bf16(std::numeric_limits<float>::quiet_NaN());
  require_error([&] { full->forward(q, k, v); }, {"full", "q has NaN at [0, 1, 3, 2]", "finite"});
  q(0, 1, 3, 2) = to_bf16(1.0f);
  v(0, 0, 5, 7) = to_bf16(std::numeric_limits<float>::max());  // rounds to bf16's infinity
  require_error([&] { full->forward(q, k, v); }, {"v has Inf at [0, 0, 5, 7]"});
  Mask padded;
  padded.key_lengths = {5};  // a padded key's Inf is never read, as in float32
  CHECK_NOTHROW(full->forward(q, k, v, padded));
  v(0, 0, 5, 7) = to_bf16(0.0f);
  const TensorBf16 wrong = to_bf16(random_tensor(1, 2, 5, 8, 4));  // 5 values, 6 keys
  require_error([&] { full->forward(q, k, wrong); }, {"k", "v"});
  require_error([] { TensorRefBf16(nullptr, {1, 1, 2, 3}); }, {"bf16", "[1, 1, 2, 3]", "null"});
  // The backward names out and d_out in bf16 as in float32.
  Saved saved;
  TensorBf16 out;
  full->forward(q, k, v, {}, {}, out, &saved);
  AllGradientsBf16 g;
  const TensorBf16 bad_out = to_bf16(random_tensor(1, 2, 4, 8, 5));
  require_error([&] { full->backward(q, k, v, {}, {}, bad_out, out, saved, g); }, {"out"});
  require_error([&] { full->backward(q, k, v, {}, {}, out, bad_out, saved, g); }, {"d_out"});
}

}  // namespace
