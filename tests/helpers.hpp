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
