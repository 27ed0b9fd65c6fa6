// Shared test helpers: seeded inputs and a tolerance check that says where it failed.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <xtensor/xview.hpp>

#include "attnlab/attnlab.hpp"

namespace attnlab::test {

/// Standard normal entries times `stddev`, reproducible from `seed`.
inline Tensor random_tensor(std::size_t b, std::size_t h, std::size_t n, std::size_t d,
                            std::uint64_t seed, float stddev = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  Tensor t = Tensor::from_shape({b, h, n, d});
  for (float& x : t) x = normal(rng);
  return t;
}

/// Entries uniform in [lo, hi) of shape [b, h, n] (a per-token input: g, beta), from `seed`.
inline TokenTensor uniform_tokens(std::size_t b, std::size_t h, std::size_t n, double lo, double hi,
                                  std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  TokenTensor t = TokenTensor::from_shape({b, h, n});
  for (float& x : t) x = static_cast<float>(dist(rng));
  return t;
}

/// One sequence's inputs for a variant: q, k, v, and g, beta where it takes them
/// (Support::log_decay, Support::beta), drawn from seeds seed .. seed + 4.
struct SequenceInputs {
  Tensor q, k, v;
  TokenTensor g, beta;
  bool with_g = false, with_beta = false;
  std::size_t per = 1;  ///< rows of k, v, g and beta per token (delta-product's steps)

  SequenceInputs() = default;
  /// [B, H, n] tokens: q, k [.., dk] and v [.., dv] standard normal, g uniform in [g_lo, 0)
  /// and beta in [beta_lo, 1); k, v, g and beta with `per` rows per token.
  SequenceInputs(const Attention& a, std::size_t B, std::size_t H, std::size_t n, std::size_t dk,
                 std::size_t dv, std::uint64_t seed, double g_lo = -1.5, double beta_lo = 0.05,
                 std::size_t per_ = 1)
      : q(random_tensor(B, H, n, dk, seed)),
        k(random_tensor(B, H, per_ * n, dk, seed + 1)),
        v(random_tensor(B, H, per_ * n, dv, seed + 2)),
        g(uniform_tokens(B, H, per_ * n, g_lo, 0, seed + 3)),
        beta(uniform_tokens(B, H, per_ * n, beta_lo, 1, seed + 4)),
        with_g(a.support().log_decay),
        with_beta(a.support().beta),
        per(per_) {}

  /// g and beta where the variant takes them.
  TokenInputs tokens() const {
    return TokenInputs::of(with_g ? &g : nullptr, with_beta ? &beta : nullptr);
  }

  /// Tokens [t0, t1) of every input.
  SequenceInputs slice(std::size_t t0, std::size_t t1) const {
    SequenceInputs s = *this;
    const std::size_t r0 = t0 * per, r1 = t1 * per;  // k, v, g and beta rows
    s.q = xt::view(q, xt::all(), xt::all(), xt::range(t0, t1), xt::all());
    s.k = xt::view(k, xt::all(), xt::all(), xt::range(r0, r1), xt::all());
    s.v = xt::view(v, xt::all(), xt::all(), xt::range(r0, r1), xt::all());
    s.g = xt::view(g, xt::all(), xt::all(), xt::range(r0, r1));
    s.beta = xt::view(beta, xt::all(), xt::all(), xt::range(r0, r1));
    return s;
  }
};

/// |out - ref| <= atol + rtol * |ref| everywhere; on failure reports the first bad element.
inline void require_close(const Tensor& out, const Tensor64& ref, double rtol, double atol) {
  REQUIRE(std::equal(out.shape().begin(), out.shape().end(), ref.shape().begin()));
  for (std::size_t i = 0; i < out.size(); ++i) {
    const double o = out.data()[i], r = ref.data()[i];
    if (!(std::abs(o - r) <= atol + rtol * std::abs(r))) {
      FAIL("element " << i << " of " << shape_string(out) << ": got " << o << ", expected " << r
                      << " (rtol " << rtol << ", atol " << atol << ")");
    }
  }
}

/// Runs `f` and checks that it throws E (attnlab::Error by default) whose message contains every
/// fragment: bad input must say what was wrong.
template <class E = Error, class F>
void require_error(F&& f, std::initializer_list<std::string> fragments) {
  try {
    f();
  } catch (const E& e) {
    const std::string what = e.what();
    INFO("message: " << what);
    for (const auto& part : fragments) CHECK(what.find(part) != std::string::npos);
    return;
  }
  FAIL("expected an exception mentioning " << *fragments.begin());
}

/// The registered variants that declare everything the softmax engine honours
/// (Support::softmax_engine(): its clients, full, sliding and bigbird today), so that a new
/// client is tested without an edit here.
inline std::vector<std::string> engine_clients() {
  const Support engine = Support::softmax_engine();
  std::vector<std::string> out;
  for (const std::string& name : attention_names()) {
    const Support s = make_attention(name)->support();
    if (s.backward == engine.backward && s.grouped_heads && s.window && s.documents && s.prefix &&
        s.custom && s.softcap && s.bias && s.sinks && s.alibi && s.forgetting_gate)
      out.push_back(name);
  }
  return out;
}

}  // namespace attnlab::test
